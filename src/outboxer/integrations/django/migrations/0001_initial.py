"""The outbox tables at outboxer's schema version 4 (``outboxer db upgrade``'s schema), and the
unmanaged model of the dead letters (the admin's view of a table the first operation creates)."""

from __future__ import annotations

from django.db import migrations, models

import outboxer.integrations.django.models
from outboxer.integrations.django.operations import UpgradeOutbox


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [
        UpgradeOutbox(4),
        migrations.CreateModel(
            name="DeadLetter",
            fields=[
                (
                    "dl_seq",
                    models.BigIntegerField(primary_key=True, serialize=False, verbose_name="#"),
                ),
                (
                    "message_id",
                    outboxer.integrations.django.models.IdentifierField(
                        db_column="id", max_length=255, verbose_name="message id"
                    ),
                ),
                ("topic", outboxer.integrations.django.models.IdentifierField(max_length=255)),
                (
                    "key",
                    outboxer.integrations.django.models.IdentifierField(max_length=512, null=True),
                ),
                (
                    "type",
                    outboxer.integrations.django.models.IdentifierField(max_length=255, null=True),
                ),
                ("payload", models.BinaryField()),
                (
                    "content_type",
                    outboxer.integrations.django.models.IdentifierField(max_length=255),
                ),
                ("headers", models.TextField()),
                ("created_at", outboxer.integrations.django.models.MomentField()),
                ("dead_lettered_at", outboxer.integrations.django.models.MomentField()),
                ("failure_reason", models.TextField()),
                ("attempts", models.IntegerField()),
                ("direction", outboxer.integrations.django.models.IdentifierField(max_length=7)),
            ],
            options={
                "verbose_name": "dead letter",
                # the table of the OUTBOXER setting, as the model's Meta: a TABLE or SCHEMA of the
                # project's own is no change for makemigrations
                "db_table": outboxer.integrations.django.models.table_name("_dead_letters"),
                "ordering": ("-dl_seq",),
                "managed": False,
            },
        ),
    ]
