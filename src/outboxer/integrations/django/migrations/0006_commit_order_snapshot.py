"""The outbox tables at outboxer's schema version 9: PostgreSQL's commit-order gate also waits for
writers older than the latest transaction to complete before a row was written (nothing changes
on MySQL/MariaDB or SQLite)."""

from __future__ import annotations

from django.db import migrations

from outboxer.integrations.django.operations import UpgradeOutbox


class Migration(migrations.Migration):
    dependencies = [("outboxer", "0005_dead_letter_directions")]
    operations = [UpgradeOutbox(9)]
