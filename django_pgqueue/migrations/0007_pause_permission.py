"""The permission to pause and resume queues from the admin's queue overview
(``django_pgqueue.pause_queue``, on the QueueOverview proxy). No schema change: Django
creates the permission row after migrating."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0006_schedules"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="queueoverview",
            options={
                "default_permissions": (),
                "permissions": [("pause_queue", "Can pause and resume queues and task names")],
                "verbose_name": "queue overview",
                "verbose_name_plural": "queue overview",
            },
        ),
    ]
