"""``pgqueue_task.errors_dropped``: how many of a task's oldest errors were dropped.

A task keeps its last 100 errors, as it keeps its last 100 executions: every statement
that appends an error drops the oldest past that and counts them here. A column with a
constant default: adding it changes only the catalog (no table rewrite, no scan), so
the ACCESS EXCLUSIVE lock of the ALTER TABLE is held for an instant. The previous
release's statements do not write it (and append errors without a bound), which only
leaves the count low for rows they wrote. Migrating back drops the column, and the
counts with it; the errors themselves stay.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0013_enqueue_permission"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="errors_dropped",
            field=models.IntegerField(db_default=0),
        ),
    ]
