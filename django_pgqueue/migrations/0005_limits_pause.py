"""Pausing and fleet-wide limits (docs/limits.md).

* ``pgqueue_queue`` gains the pause (of the queue, or of task names in it) and the rate
  limit's state; every claim reads the row of each of its queues by primary key.
* ``pgqueue_task.concurrency_key``: rows of one (queue, key) are limited to the task's
  ``key_concurrency`` running at once. A nullable column without a default: adding it
  rewrites nothing.
* ``pgqueue_task_running``: the running rows per (queue, concurrency_key), which limited
  claims count; built CONCURRENTLY (this migration cannot run in a transaction).
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_pgqueue", "0004_scheduled_state_route_claim"),
    ]

    operations = [
        migrations.AddField(
            model_name="queue",
            name="paused",
            field=models.BooleanField(db_default=False),
        ),
        migrations.AddField(
            model_name="queue",
            name="paused_tasks",
            field=models.JSONField(db_default=models.Value([], models.JSONField())),
        ),
        migrations.AddField(
            model_name="queue",
            name="paused_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_tat",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                condition=models.Q(("state", "running")),
                fields=["queue", "concurrency_key"],
                name="pgqueue_task_running",
            ),
        ),
    ]
