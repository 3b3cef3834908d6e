"""Per-key rate limits (docs/limits.md): the table ``pgqueue_key_rate``.

A new table only: pgqueue_task is not touched (the key is the existing
``concurrency_key`` column), so enqueues never wait on this migration, and workers of
the previous release, which never read the table, keep working beside it.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0010_unique_options"),
    ]

    operations = [
        migrations.CreateModel(
            name="KeyRate",
            fields=[
                ("pk", models.CompositePrimaryKey("queue", "key", blank=True, editable=False,
                                                  primary_key=True, serialize=False)),
                ("queue", models.CharField(max_length=100)),
                ("key", models.CharField(max_length=255)),
                ("tat", models.DateTimeField()),
                ("snoozed_until", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "db_table": "pgqueue_key_rate",
            },
        ),
    ]
