"""Expiry (docs/tasks.md): ``pgqueue_task.expires_at``.

A nullable column without a default: adding it changes only the catalog (no table
rewrite, no scan), so the ACCESS EXCLUSIVE lock of the ALTER TABLE is held for an
instant. No index: the claim judges expiry on the rows it picked, and the stager on
the rows it finds through the indexes it already walks (pgqueue_task_scheduled,
pgqueue_task_wait_timeout).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0008_workflows"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
