"""The outbox tables at outboxer's schema version 6: PostgreSQL's NOTIFY trigger is dropped
(relays poll adaptively; nothing changes on SQLite and MySQL)."""

from __future__ import annotations

from django.db import migrations

from outboxer.integrations.django.operations import UpgradeOutbox


class Migration(migrations.Migration):
    dependencies = [("outboxer", "0002_crash_isolation")]
    operations = [UpgradeOutbox(6)]
