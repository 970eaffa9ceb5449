"""The Django app of outboxer (label ``outboxer``)."""

from __future__ import annotations

from django.apps import AppConfig


class OutboxerConfig(AppConfig):
    """Migrations of the outbox tables, ``manage.py outboxer``, dead letters in the admin."""

    name = "outboxer.integrations.django"
    label = "outboxer"
    verbose_name = "Outbox"
    default_auto_field = "django.db.models.BigAutoField"
