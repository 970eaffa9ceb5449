"""The Django app of outboxer (label ``outboxer``)."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


class OutboxerConfig(AppConfig):
    """Migrations of the outbox tables, ``manage.py outboxer``, dead letters in the admin."""

    name = "outboxer.integrations.django"
    label = "outboxer"
    verbose_name = "Outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        checks.register(_outboxer_setting)


def _outboxer_setting(app_configs: Any, **kwargs: Any) -> list[checks.CheckMessage]:
    """The ``OUTBOXER`` setting names an outbox (``manage.py check``, ``migrate``, ``runserver``
    refuse to go on otherwise)."""
    from outboxer.integrations.django.conf import outbox

    try:
        outbox()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="outboxer.E001")]
    return []
