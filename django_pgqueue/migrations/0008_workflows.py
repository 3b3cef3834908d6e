"""Waiting work (docs/workflows.md): dependencies, suspend and signal.

* ``pgqueue_task`` gains the waiting columns (why and until when a row waits, the
  signals delivered to it, what woke it) and ``has_dependents``.
* ``pgqueue_dependency``: one row per edge, child waits for parent.
* ``pgqueue_task_wait_timeout``: suspensions with a timeout, by when they time out.
* The trigger ``pgqueue_release_dependents``: when a task that others wait for ends,
  its dependents move on in the same transaction, whichever statement ended it (a
  settlement, the lease sweep, a cancel, the unroutable sweep, an operator).

Why a trigger: five statements end tasks, and a dependent must never miss its
parent's end; one function called by the database on every such end cannot be
forgotten by a sixth. It costs nothing to other rows: it only fires for an UPDATE that
sets ``state`` (not for heartbeats), and its WHEN clause, evaluated in the executor,
lets through only rows with ``has_dependents`` that just became terminal.

What the function does, in three statements (each a new snapshot in READ COMMITTED):

1. Resolve the edges of the task that ended (``resolved = true``). The UPDATE locks
   them: a settlement that suspends a task on a child (``settle``: waits) locks the same
   edges, so the two serialise, and whichever comes second sees the other's write.
2. Children that may go on (the parent succeeded, or the edge proceeds on failure):
   one parent fewer; with none left, pending (scheduled if their run_at is ahead) and
   a wake-up on their queue. The decrement locks each child row, so parents ending
   in concurrent transactions count down one after the other: the last one, and only
   it, releases the child (a group's callback runs exactly once).
3. Children that may not (the parent failed or was cancelled): cancelled with an
   error naming the task, and so is everything downstream that waits on them through
   such edges, in one statement (a recursive walk of waiting rows), so a chain of a
   thousand steps is cancelled without nesting a thousand triggers.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from django_pgqueue.migrations._reverse import refuse_back

TERMINAL = "('succeeded', 'failed', 'cancelled')"

RELEASE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION pgqueue_release_dependents() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    proceed bigint[];
    doomed bigint[];
    woken int;
BEGIN
    WITH resolved AS (
        UPDATE pgqueue_dependency AS d
           SET resolved = true
         WHERE d.parent_id = NEW.id AND NOT d.resolved
        RETURNING d.child_id, d.proceed_on_failure
    )
    SELECT COALESCE(array_agg(child_id) FILTER (
                        WHERE NEW.state = 'succeeded' OR proceed_on_failure), '{{}}'),
           COALESCE(array_agg(child_id) FILTER (
                        WHERE NOT (NEW.state = 'succeeded' OR proceed_on_failure)), '{{}}')
      INTO proceed, doomed
      FROM resolved;

    IF cardinality(proceed) > 0 THEN
        WITH released AS (
            UPDATE pgqueue_task AS c
               SET parents_pending = c.parents_pending - 1,
                   state = CASE WHEN c.parents_pending > 1 THEN 'waiting'
                                WHEN c.run_at > now() THEN 'scheduled'
                                ELSE 'pending' END,
                   run_at = CASE WHEN c.parents_pending > 1 THEN c.run_at
                                 ELSE GREATEST(c.run_at, now()) END,
                   wait_reason = CASE WHEN c.parents_pending > 1 THEN c.wait_reason END,
                   wait_until = CASE WHEN c.parents_pending > 1 THEN c.wait_until END,
                   wake = CASE WHEN c.parents_pending > 1 THEN c.wake
                               ELSE jsonb_build_object('reason', c.wait_reason,
                                                       'task', NEW.id, 'state', NEW.state)
                          END
             WHERE c.id = ANY (proceed)
               AND c.state = 'waiting'
               AND c.wait_reason IN ('parents', 'child')
            RETURNING c.queue, c.state
        )
        SELECT count(pg_notify('pgqueue_' || (hashtext(queue) & 63), queue))
          INTO woken
          FROM released
         WHERE state = 'pending';
    END IF;

    IF cardinality(doomed) > 0 THEN
        WITH RECURSIVE downstream (id) AS (
            SELECT unnest(doomed)
            UNION
            SELECT d.child_id
              FROM downstream AS s
              JOIN pgqueue_dependency AS d ON d.parent_id = s.id
              JOIN pgqueue_task AS w ON w.id = d.child_id
             WHERE NOT d.resolved AND NOT d.proceed_on_failure AND w.state = 'waiting'
        )
        UPDATE pgqueue_task AS c
           SET state = 'cancelled',
               finished_at = now(),
               wait_reason = NULL,
               wait_until = NULL,
               errors = c.errors || jsonb_build_array(jsonb_build_object(
                   'attempt', c.attempt,
                   'type', 'UpstreamFailed',
                   'message', 'task ' || NEW.id || ' (' || NEW.task_name || '), which this '
                              || 'task waited for'
                              || CASE WHEN c.id = ANY (doomed) THEN ''
                                      ELSE ' through other tasks' END
                              || ', ended ' || NEW.state
                              || '; enqueue with after_failure="run" to run anyway',
                   'traceback', NULL,
                   'outcome', 'cancelled',
                   'worker_id', NULL,
                   'at', now()))
         WHERE c.id IN (SELECT id FROM downstream)
           AND c.state = 'waiting';
    END IF;
    RETURN NULL;
END
$$;
"""

RELEASE_TRIGGER = f"""
CREATE TRIGGER pgqueue_release_dependents
AFTER UPDATE OF state ON pgqueue_task
FOR EACH ROW
WHEN (OLD.has_dependents AND NEW.state IN {TERMINAL} AND OLD.state NOT IN {TERMINAL})
EXECUTE FUNCTION pgqueue_release_dependents();
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_pgqueue", "0007_pause_permission"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="parents_pending",
            field=models.IntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="task",
            name="wait_reason",
            field=models.CharField(blank=True, max_length=16, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="wait_signal",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="wait_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="signals",
            field=models.JSONField(db_default=models.Value({}, models.JSONField())),
        ),
        migrations.AddField(
            model_name="task",
            name="wake",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="has_dependents",
            field=models.BooleanField(db_default=False),
        ),
        migrations.CreateModel(
            name="Dependency",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("parent_id", models.BigIntegerField()),
                ("child_id", models.BigIntegerField()),
                ("resolved", models.BooleanField(db_default=False)),
                ("proceed_on_failure", models.BooleanField(db_default=False)),
            ],
            options={
                "db_table": "pgqueue_dependency",
                "indexes": [models.Index(fields=["child_id"], name="pgqueue_dep_child")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("parent_id", "child_id"), name="pgqueue_dep_edge"
                    )
                ],
            },
        ),
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                condition=models.Q(("state", "waiting"), ("wait_until__isnull", False)),
                fields=["queue", "wait_until", "id"],
                name="pgqueue_task_wait_timeout",
            ),
        ),
        migrations.RunSQL(
            RELEASE_FUNCTION + RELEASE_TRIGGER,
            reverse_sql=(
                "DROP TRIGGER IF EXISTS pgqueue_release_dependents ON pgqueue_task;"
                "DROP FUNCTION IF EXISTS pgqueue_release_dependents();"
            ),
        ),
        # Undone first: a waiting task would wait forever without the columns that say
        # for what (and no statement of the older schema would wake it).
        refuse_back(
            "0008_workflows",
            "SELECT count(*) FROM pgqueue_task WHERE state = 'waiting'",
            lambda n: (
                f"{n} task{' is' if n == 1 else 's are'} waiting (for parents, a child or "
                "a signal), which the schema before it cannot say; let them finish or "
                "cancel them, then migrate back again"
            ),
        ),
    ]
