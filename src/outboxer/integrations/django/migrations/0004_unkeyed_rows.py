"""The outbox tables at outboxer's schema version 7: PostgreSQL indexes its unkeyed rows for the
ordered claim (nothing changes on SQLite and MySQL)."""

from __future__ import annotations

from django.db import migrations

from outboxer.integrations.django.operations import UpgradeOutbox


class Migration(migrations.Migration):
    dependencies = [("outboxer", "0003_polling_wakeup")]
    operations = [UpgradeOutbox(7)]
