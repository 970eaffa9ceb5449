"""The dead letters as a Django model, for the admin: read-only, over outboxer's own table.

The model is unmanaged (``migrate`` never alters the table: the outboxer schema does) and its
``db_table`` follows the ``OUTBOXER`` setting. Changes go through the store, never the ORM:
the admin's actions call the dead-letter port (:mod:`outboxer.integrations.django.admin`).

The columns differ per database (times are Unix seconds on SQLite, texts are bytes on MySQL),
so the fields here turn what the driver returns into one shape.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections, models

from outboxer.integrations.django.conf import ConfiguredOutbox, outbox


class IdentifierField(models.CharField):
    """Text; MySQL stores outboxer's identifiers as bytes (VARBINARY)."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else value


class MomentField(models.Field):
    """A time: ``timestamptz`` (PostgreSQL), naive UTC ``DATETIME`` (MySQL) or Unix seconds
    (SQLite), read as an aware datetime. Declared a float to Django: the one type no backend
    converts on reading (its date and text converters would misread the other backends'
    values), so :meth:`from_db_value` sees what the driver returned."""

    def get_internal_type(self) -> str:
        return "FloatField"

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if isinstance(value, int | float):
            return dt.datetime.fromtimestamp(value, dt.UTC)
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value


def table_name(suffix: str) -> str:
    """The outbox's table ending in ``suffix`` as the ``OUTBOXER`` setting names it: the
    model's and its migration's (so a project's own TABLE or SCHEMA is no change for
    ``makemigrations``)."""
    # A schema-qualified name arrives quoted, which Django then leaves as it is.
    try:
        conf = outbox()
    except ImproperlyConfigured:
        # Not here, while django.setup() imports the models (a traceback from every manage.py
        # command): the system check (apps.py) and each outboxer command say it in one line.
        conf = ConfiguredOutbox("outbox", None, DEFAULT_DB_ALIAS)
    vendor = connections[conf.database].vendor
    if conf.names.schema is None or vendor == "sqlite":
        return f"{conf.names.table}{suffix}"
    return conf.names.qualified(suffix, quote="`" if vendor == "mysql" else '"')


class DeadLetter(models.Model):
    """A message the relay (or a consumer) gave up on, as ``outboxer dlq show`` prints it."""

    dl_seq = models.BigIntegerField(primary_key=True, verbose_name="#")
    message_id = IdentifierField(max_length=255, db_column="id", verbose_name="message id")
    topic = IdentifierField(max_length=255)
    key = IdentifierField(max_length=512, null=True)
    type = IdentifierField(max_length=255, null=True)
    payload = models.BinaryField()
    content_type = IdentifierField(max_length=255)
    headers = models.TextField()
    created_at = MomentField()
    dead_lettered_at = MomentField()
    failure_reason = models.TextField()
    attempts = models.IntegerField()
    direction = IdentifierField(max_length=7)

    class Meta:
        managed = False
        db_table = table_name("_dead_letters")
        ordering = ("-dl_seq",)
        verbose_name = "dead letter"

    def __str__(self) -> str:
        return f"{self.message_id} ({self.topic})"

    @property
    def payload_text(self) -> str:
        """The payload as text (JSON mostly), undecodable bytes replaced."""
        return bytes(self.payload).decode("utf-8", "replace")
