"""Unique jobs with options (docs/tasks.md, "unique_key"): ``pgqueue_task_unique_key``.

``unique_for`` and ``unique_states`` count finished tasks too, which the live unique
index does not hold: this index holds every row that has a unique key, whatever its
state. It is built CONCURRENTLY (this migration cannot run in a transaction), so
enqueues and claims go on while it builds. Rows without a key, the common case, are
not in it: an enqueue without a unique_key writes nothing more.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_pgqueue", "0009_task_expires_at"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                condition=models.Q(("unique_key__isnull", False)),
                fields=["unique_key", "enqueued_at"],
                name="pgqueue_task_unique_key",
            ),
        ),
    ]
