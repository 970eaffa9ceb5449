"""The outbox tables at outboxer's schema version 5: crash isolation (a message whose lease
expired is published alone, and counted when its relay dies)."""

from __future__ import annotations

from django.db import migrations

from outboxer.integrations.django.operations import UpgradeOutbox


class Migration(migrations.Migration):
    dependencies = [("outboxer", "0001_initial")]
    operations = [UpgradeOutbox(5)]
