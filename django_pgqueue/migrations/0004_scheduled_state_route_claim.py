"""The scheduled state, claims per route, and the queue table.

* Rows due later get their own state, ``scheduled``, outside the claim's index; the
  existing pending rows whose run_at is in the future move there.
* The claim and due indexes lead with (queue, task_name, handler_version): a claim
  walks only the routes it can run.
* ``pgqueue_queue`` holds fleet-wide queue state (the starvation escape's window).

Indexes are built CONCURRENTLY under a new name, then swapped in, so a deployed queue
keeps taking writes while they build (this migration cannot run in a transaction).

Reversed, every step is undone in the same way: scheduled rows become pending again
(the state that schema gave a task due later), the indexes of 0003 are built
CONCURRENTLY and swapped back, and 0003's CHECK on the states is added NOT VALID, then
validated (a scan that does not block writes).
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

LIVE = "('scheduled', 'pending', 'running', 'waiting')"
LIVE_BEFORE = "('pending', 'running', 'waiting')"
STATES_BEFORE = "('pending', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')"


def swap_index(name: str, create: str) -> list[str]:
    """Build the new index beside the old one, then replace it."""
    return [
        f"DROP INDEX CONCURRENTLY IF EXISTS {name}_new",
        create.format(name=f"{name}_new"),
        f"DROP INDEX CONCURRENTLY IF EXISTS {name}",
        f"ALTER INDEX {name}_new RENAME TO {name}",
    ]


def swapped(name: str, create: str, create_before: str) -> migrations.RunSQL:
    """Index ``name`` rebuilt as ``create``; reversed, as ``create_before`` again."""
    return migrations.RunSQL(
        swap_index(name, create), reverse_sql=swap_index(name, create_before)
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_pgqueue", "0003_executions_hard_cancel"),
    ]

    operations = [
        migrations.CreateModel(
            name="Queue",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("last_escape_at", models.DateTimeField(db_default=models.Value("-infinity"))),
            ],
            options={"db_table": "pgqueue_queue", "ordering": ["name"]},
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    'ALTER TABLE "pgqueue_task" DROP CONSTRAINT "pgqueue_task_state_valid"',
                    reverse_sql=[
                        "ALTER TABLE pgqueue_task DROP CONSTRAINT IF EXISTS "
                        "pgqueue_task_state_valid",
                        "ALTER TABLE pgqueue_task ADD CONSTRAINT pgqueue_task_state_valid "
                        f"CHECK (state IN {STATES_BEFORE}) NOT VALID",
                        "ALTER TABLE pgqueue_task VALIDATE CONSTRAINT pgqueue_task_state_valid",
                    ],
                )
            ],
            state_operations=[
                migrations.RemoveConstraint(model_name="task", name="pgqueue_task_state_valid"),
            ],
        ),
        migrations.AlterField(
            model_name="task",
            name="state",
            field=models.CharField(
                choices=[
                    ("scheduled", "scheduled"),
                    ("pending", "pending"),
                    ("running", "running"),
                    ("waiting", "waiting"),
                    ("succeeded", "succeeded"),
                    ("failed", "failed"),
                    ("cancelled", "cancelled"),
                ],
                db_default="pending",
                max_length=16,
            ),
        ),
        migrations.AddConstraint(
            model_name="task",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "state__in",
                        [
                            "scheduled",
                            "pending",
                            "running",
                            "waiting",
                            "succeeded",
                            "failed",
                            "cancelled",
                        ],
                    )
                ),
                name="pgqueue_task_state_valid",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                swapped(
                    "pgqueue_task_unique_live",
                    "CREATE UNIQUE INDEX CONCURRENTLY {name} ON pgqueue_task (unique_key) "
                    f"WHERE unique_key IS NOT NULL AND state IN {LIVE}",
                    "CREATE UNIQUE INDEX CONCURRENTLY {name} ON pgqueue_task (unique_key) "
                    f"WHERE unique_key IS NOT NULL AND state IN {LIVE_BEFORE}",
                ),
                swapped(
                    "pgqueue_task_claim",
                    "CREATE INDEX CONCURRENTLY {name} ON pgqueue_task "
                    "(queue, task_name, handler_version, priority DESC, run_at, id) "
                    "WHERE state = 'pending'",
                    "CREATE INDEX CONCURRENTLY {name} ON pgqueue_task "
                    "(queue, priority DESC, run_at, id) WHERE state = 'pending'",
                ),
                swapped(
                    "pgqueue_task_due",
                    "CREATE INDEX CONCURRENTLY {name} ON pgqueue_task "
                    "(queue, task_name, handler_version, run_at, id) WHERE state = 'pending'",
                    "CREATE INDEX CONCURRENTLY {name} ON pgqueue_task "
                    "(queue, run_at, id) WHERE state = 'pending'",
                ),
            ],
            state_operations=[
                migrations.RemoveConstraint(model_name="task", name="pgqueue_task_unique_live"),
                migrations.AddConstraint(
                    model_name="task",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(
                            ("unique_key__isnull", False),
                            ("state__in", ["scheduled", "pending", "running", "waiting"]),
                        ),
                        fields=("unique_key",),
                        name="pgqueue_task_unique_live",
                    ),
                ),
                migrations.RemoveIndex(model_name="task", name="pgqueue_task_claim"),
                migrations.AddIndex(
                    model_name="task",
                    index=models.Index(
                        models.F("queue"),
                        models.F("task_name"),
                        models.F("handler_version"),
                        models.OrderBy(models.F("priority"), descending=True),
                        models.F("run_at"),
                        models.F("id"),
                        condition=models.Q(("state", "pending")),
                        name="pgqueue_task_claim",
                    ),
                ),
                migrations.RemoveIndex(model_name="task", name="pgqueue_task_due"),
                migrations.AddIndex(
                    model_name="task",
                    index=models.Index(
                        condition=models.Q(("state", "pending")),
                        fields=["queue", "task_name", "handler_version", "run_at", "id"],
                        name="pgqueue_task_due",
                    ),
                ),
            ],
        ),
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                condition=models.Q(("state", "scheduled")),
                fields=["queue", "run_at", "id"],
                name="pgqueue_task_scheduled",
            ),
        ),
        # Pending rows due later become scheduled (they are staged back when due).
        migrations.RunSQL(
            "UPDATE pgqueue_task SET state = 'scheduled' "
            "WHERE state = 'pending' AND run_at > now()",
            reverse_sql="UPDATE pgqueue_task SET state = 'pending' WHERE state = 'scheduled'",
        ),
    ]
