"""The permission to enqueue a task from the admin (``django_pgqueue.enqueue_task``, on
Task). The enqueue form runs any registered task with any arguments, queue and
priority, which Django's ``add_task`` does not say. No schema change: Django creates
the permission row after migrating. Reversing changes only the model's options; as
always, Django leaves the permission row, and whom it was granted to, in place."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0012_runtime_schedules"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="task",
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("enqueue_task", "Can enqueue any registered task from the admin")
                ],
            },
        ),
    ]
