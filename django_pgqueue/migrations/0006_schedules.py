"""Periodic schedules (docs/periodic.md): ``pgqueue_schedule``, one row per schedule
name, holding the last tick enqueued. Schedules themselves are declared in code; a row
is created the first time a worker sees one, so adding a schedule needs no migration.
"""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0005_limits_pause"),
    ]

    operations = [
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("name", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("task_name", models.CharField(max_length=255)),
                ("spec", models.CharField(max_length=255)),
                ("timezone", models.CharField(max_length=64)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("last_tick", models.DateTimeField(blank=True, null=True)),
                ("last_enqueued_at", models.DateTimeField(blank=True, null=True)),
                ("last_task_id", models.BigIntegerField(blank=True, null=True)),
                ("last_worker_id", models.CharField(blank=True, max_length=64, null=True)),
            ],
            options={
                "db_table": "pgqueue_schedule",
                "ordering": ["name"],
            },
        ),
    ]
