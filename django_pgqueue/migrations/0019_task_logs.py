"""``pgqueue_task_log``: the log records of a task's attempts (TASK_LOGS,
docs/logging.md), one row per attempt that logged, written by its settlement.

A new table, empty until a worker runs with TASK_LOGS: creating it locks nothing that
exists. Its rows name their task by id (no foreign key: the statements that delete
tasks delete their logs, by ``pgqueue_task_log_task``). Workers of the previous release
neither write nor delete it. Migrating back drops the table, and the logs with it.
"""

from django.db import migrations, models
from django.db.models.functions import Now


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0018_sequences"),
    ]

    operations = [
        migrations.CreateModel(
            name="TaskLog",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("task_id", models.BigIntegerField()),
                ("attempt", models.IntegerField()),
                ("lease_token", models.UUIDField()),
                ("records", models.JSONField()),
                ("dropped", models.IntegerField(db_default=0)),
                ("bytes", models.IntegerField(db_default=0)),
                ("created_at", models.DateTimeField(db_default=Now())),
            ],
            options={
                "db_table": "pgqueue_task_log",
                "default_permissions": (),
                "indexes": [models.Index(fields=["task_id", "id"], name="pgqueue_task_log_task")],
            },
        ),
    ]
