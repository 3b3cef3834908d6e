"""The permission to see encrypted tasks' payloads in clear in the admin
(``django_pgqueue.decrypt_task``, on Task): ``view_task`` shows an encrypted task's
page with its payloads withheld (docs/security.md, "Encrypted payloads"). No schema
change: Django creates the permission row after migrating. Reversing changes only the
model's options; as always, Django leaves the permission row, and whom it was granted
to, in place."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0015_worker_version"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="task",
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("enqueue_task", "Can enqueue any registered task from the admin"),
                    ("decrypt_task", "Can see the cleartext of encrypted tasks in the admin"),
                ],
            },
        ),
    ]
