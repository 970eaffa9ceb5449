"""The ``inprocess://package.module:registry`` URL: which handler registry to run."""

from __future__ import annotations

from outboxer import urls

__all__ = ["SPEC", "registry_reference"]

SPEC = urls.UrlSpec(
    what="inprocess URL",
    schemes=("inprocess",),
    hosts="opaque",
    credentials=False,
    example="inprocess://myapp.handlers:registry",
)


def registry_reference(url: str) -> str:
    """The ``package.module:registry`` an ``inprocess://`` URL names."""
    return urls.parse(url, SPEC).authority
