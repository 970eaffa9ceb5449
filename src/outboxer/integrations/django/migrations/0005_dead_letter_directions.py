"""The outbox tables at outboxer's schema version 8: an id may have a publish and a consume dead
letter (the dead letters' unique key becomes (id, direction))."""

from __future__ import annotations

from django.db import migrations

from outboxer.integrations.django.operations import UpgradeOutbox


class Migration(migrations.Migration):
    dependencies = [("outboxer", "0004_unkeyed_rows")]
    operations = [UpgradeOutbox(8)]
