"""Schedules at runtime (docs/periodic.md): three nullable columns on
``pgqueue_schedule``.

- ``definition``: NULL for a schedule declared in code; the schedule itself (task name,
  cron or interval, arguments, options) for one added with ``add_schedule`` or the
  admin.
- ``paused_at``: when the schedule was paused; NULL while it runs.
- ``resumed_at``: when it was last resumed; no tick before it runs.

Nullable columns without a default change only the catalog (no rewrite of the small
schedule table, and pgqueue_task is not touched). A worker of the previous release
reads only the rows of the schedules declared in its code, by name: it never fires a
runtime schedule, and it does not know of pauses (docs/periodic.md, "Upgrading").
"""

from django.db import migrations, models

from django_pgqueue.migrations._reverse import refuse_back


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0011_rate_keys"),
    ]

    operations = [
        migrations.AddField(
            model_name="schedule",
            name="definition",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="schedule",
            name="paused_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="schedule",
            name="resumed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        # Undone first: a runtime schedule is its definition; without the column it
        # would be lost, and its row would read as a schedule removed from the code.
        refuse_back(
            "0012_runtime_schedules",
            "SELECT count(*) FROM pgqueue_schedule WHERE definition IS NOT NULL",
            lambda n: (
                f"{n} runtime schedule{'' if n == 1 else 's'} would be lost (the schema "
                "before it has no column for a schedule's definition); remove them "
                "(remove_schedule, or the admin) or keep this migration"
            ),
        ),
    ]
