"""The public API is explicit: ``outboxer.__all__`` lists exactly what the package exports."""

from __future__ import annotations

import inspect
from importlib import resources

import outboxer


def test_all_lists_every_public_name_and_nothing_else() -> None:
    exported = set(outboxer.__all__)
    assert len(exported) == len(outboxer.__all__), "no duplicates"
    assert outboxer.__all__ == sorted(outboxer.__all__)
    public = {
        name
        for name, value in vars(outboxer).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public == exported


def test_every_export_resolves() -> None:
    for name in outboxer.__all__:
        assert getattr(outboxer, name) is not None


def test_errors_share_one_root() -> None:
    errors = [
        getattr(outboxer, name)
        for name in outboxer.__all__
        if inspect.isclass(getattr(outboxer, name))
        and issubclass(getattr(outboxer, name), Exception)
    ]
    assert errors and all(issubclass(e, outboxer.OutboxerError) for e in errors)


def test_package_is_typed() -> None:
    assert resources.files("outboxer").joinpath("py.typed").is_file()


def test_the_write_api_of_the_contract_is_exported() -> None:
    # The documented contract: enqueue/enqueue_async, and enqueue_many/enqueue_many_async for bulk
    write_api = {"Outbox", "enqueue", "enqueue_async", "enqueue_many", "enqueue_many_async"}
    assert write_api <= set(outboxer.__all__)
    for name in write_api - {"Outbox"}:
        assert callable(getattr(outboxer.Outbox, name))
    assert inspect.iscoroutinefunction(outboxer.enqueue_many_async)
    assert inspect.iscoroutinefunction(outboxer.Outbox.enqueue_many_async)
