"""Ordered work per key (docs/tenants.md): two columns and an index on ``pgqueue_task``,
and the triggers that start each task of a sequence when its turn comes.

* ``sequence_key``: the sequence a task belongs to, within its queue. ``sequence_hold``:
  its failure holds the sequence (on_failure="hold"). Adding them changes only the
  catalog (a nullable column, and a boolean with a constant default).
* ``pgqueue_task_sequence`` (queue, sequence_key, id): the live rows of sequences, and
  the failed ones that hold theirs. Built CONCURRENTLY (this migration cannot run in a
  transaction); rows without a key are not in it.

One row of a sequence is its head: scheduled, pending, running or waiting on something
of its own (a signal, a task it suspended on). Every other live row of the sequence
waits its turn: state ``waiting``, wait_reason ``sequence``, out of the claim's way. A
task is enqueued waiting its turn; the database starts it:

1. ``pgqueue_sequence_start_next(queue, key)``: the first waiting row of the sequence,
   in id order, becomes pending (scheduled if its run_at is ahead), with a wake-up on
   its queue, unless a row of the sequence is its head, or a failed row holds it. One
   statement: that check and the start see the same snapshot. Its clock is the
   statement's (statement_timestamp(): at a commit, the COMMIT's), not the
   transaction's start, which comes before the run_at of a task enqueued in it.
2. When the head ends (succeeded, cancelled, or failed without holding), in the
   transaction that ends it, whichever statement does (``pgqueue_sequence_ended``, an
   AFTER UPDATE trigger whose WHEN lets through only such rows). A failure that holds
   starts nothing: the sequence is held until released (``release_sequence``), the
   failed task is retried, or it is deleted (``pgqueue_sequence_unheld``).
3. When a transaction that enqueued tasks of a sequence (or made a finished one due
   again: a retried dead letter) commits, a deferred constraint trigger
   (``pgqueue_sequence_join``), at its commit: it takes the sequence's advisory lock
   (class 1885827336, object hashtext(queue || ' ' || key)), so that two such commits
   take turns, and locks the sequence's head FOR SHARE, so that an end in flight
   commits first; then, with no head, it starts the first waiting row; and a row made
   due again while the sequence has a head waits its turn instead.

Why the commit, not the enqueue: the lock and the FOR SHARE are held from the commit's
start to its end, work of the server alone, so neither a web request's open
transaction nor a frozen worker ever holds them. A settlement that finds the head
locked skips it and settles it a moment later (it takes its locks with SKIP LOCKED).
The race they close: an enqueue that saw a head (and waits its turn) and the head's end
that saw no waiting row (its enqueue was not committed yet). Either the end commits
first (the join, after the FOR SHARE, sees no head and starts the first waiting row),
or the join does (the end, after it, sees the committed row and starts it).

Migrating back refuses while tasks wait their turn in a sequence: without the triggers
nothing would ever start them.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from django_pgqueue.migrations._reverse import refuse_back

# A row of a sequence that is its head, or holds it: every state of a row of the
# sequence but waiting its turn, finished, or failed without holding.
HEAD = """(a.state IN ('scheduled', 'pending', 'running')
             OR (a.state = 'waiting' AND a.wait_reason IS DISTINCT FROM 'sequence')
             OR (a.state = 'failed' AND a.sequence_hold))"""

START_NEXT = f"""
CREATE OR REPLACE FUNCTION pgqueue_sequence_start_next(q text, k text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    started_id bigint;
BEGIN
    WITH next AS (
        SELECT n.id
          FROM pgqueue_task AS n
         WHERE n.queue = q AND n.sequence_key = k
           AND n.state = 'waiting' AND n.wait_reason = 'sequence'
           AND NOT EXISTS (
                   SELECT 1
                     FROM pgqueue_task AS a
                    WHERE a.queue = q AND a.sequence_key = k AND {HEAD})
         ORDER BY n.id
         LIMIT 1
    ),
    started AS (
        UPDATE pgqueue_task AS t
           SET state = CASE WHEN t.run_at > statement_timestamp() THEN 'scheduled'
                            ELSE 'pending' END,
               run_at = GREATEST(t.run_at, statement_timestamp()),
               wait_reason = NULL
          FROM next
         WHERE t.id = next.id
           AND t.state = 'waiting' AND t.wait_reason = 'sequence'
        RETURNING t.id, t.queue, t.state
    )
    SELECT id INTO started_id
      FROM started
     WHERE state <> 'pending'
        OR pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text IS NOT NULL;
    RETURN started_id;
END
$$;
"""

ENDED = """
CREATE OR REPLACE FUNCTION pgqueue_sequence_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pgqueue_sequence_start_next(OLD.queue, OLD.sequence_key);
    ELSIF NOT (NEW.state = 'failed' AND NEW.sequence_hold) THEN
        PERFORM pgqueue_sequence_start_next(NEW.queue, NEW.sequence_key);
    END IF;
    RETURN NULL;
END
$$;
"""

JOIN = f"""
CREATE OR REPLACE FUNCTION pgqueue_sequence_join() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    mine_state text;
    heads int;
BEGIN
    PERFORM pg_advisory_xact_lock(1885827336, hashtext(NEW.queue || ' ' || NEW.sequence_key));
    SELECT state INTO mine_state FROM pgqueue_task WHERE id = NEW.id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT count(*) INTO heads
      FROM (SELECT 1
              FROM pgqueue_task AS a
             WHERE a.queue = NEW.queue AND a.sequence_key = NEW.sequence_key
               AND a.id <> NEW.id AND {HEAD}
               FOR SHARE OF a) AS h;
    IF heads = 0 THEN
        PERFORM pgqueue_sequence_start_next(NEW.queue, NEW.sequence_key);
    ELSIF mine_state IN ('scheduled', 'pending') THEN
        UPDATE pgqueue_task
           SET state = 'waiting', wait_reason = 'sequence'
         WHERE id = NEW.id AND state IN ('scheduled', 'pending');
    END IF;
    RETURN NULL;
END
$$;
"""

LIVE = "('scheduled', 'pending', 'running', 'waiting')"
TERMINAL = "('succeeded', 'failed', 'cancelled')"
TRIGGERS = f"""
CREATE TRIGGER pgqueue_sequence_ended
AFTER UPDATE OF state ON pgqueue_task
FOR EACH ROW
WHEN (OLD.sequence_key IS NOT NULL AND NEW.state IN {TERMINAL} AND OLD.state IN {LIVE}
      AND NOT (OLD.state = 'waiting' AND OLD.wait_reason IS NOT DISTINCT FROM 'sequence'))
EXECUTE FUNCTION pgqueue_sequence_ended();

CREATE TRIGGER pgqueue_sequence_unheld
AFTER DELETE ON pgqueue_task
FOR EACH ROW
WHEN (OLD.sequence_key IS NOT NULL AND OLD.state = 'failed' AND OLD.sequence_hold)
EXECUTE FUNCTION pgqueue_sequence_ended();

CREATE CONSTRAINT TRIGGER pgqueue_sequence_join
AFTER INSERT ON pgqueue_task
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW
WHEN (NEW.sequence_key IS NOT NULL)
EXECUTE FUNCTION pgqueue_sequence_join();

CREATE CONSTRAINT TRIGGER pgqueue_sequence_rejoin
AFTER UPDATE OF state ON pgqueue_task
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW
WHEN (NEW.sequence_key IS NOT NULL AND OLD.state IN {TERMINAL}
      AND NEW.state IN ('scheduled', 'pending'))
EXECUTE FUNCTION pgqueue_sequence_join();
"""

DROP_TRIGGERS = """
DROP TRIGGER IF EXISTS pgqueue_sequence_rejoin ON pgqueue_task;
DROP TRIGGER IF EXISTS pgqueue_sequence_join ON pgqueue_task;
DROP TRIGGER IF EXISTS pgqueue_sequence_unheld ON pgqueue_task;
DROP TRIGGER IF EXISTS pgqueue_sequence_ended ON pgqueue_task;
"""

DROP_FUNCTIONS = """
DROP FUNCTION IF EXISTS pgqueue_sequence_join();
DROP FUNCTION IF EXISTS pgqueue_sequence_ended();
DROP FUNCTION IF EXISTS pgqueue_sequence_start_next(text, text);
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_pgqueue", "0017_fair_share"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="sequence_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="sequence_hold",
            field=models.BooleanField(db_default=False),
        ),
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                condition=models.Q(
                    ("sequence_key__isnull", False),
                    models.Q(
                        ("state__in", ["scheduled", "pending", "running", "waiting"]),
                        models.Q(("sequence_hold", True), ("state", "failed")),
                        _connector="OR",
                    ),
                ),
                fields=["queue", "sequence_key", "id"],
                name="pgqueue_task_sequence",
            ),
        ),
        migrations.RunSQL(START_NEXT + ENDED + JOIN, DROP_FUNCTIONS),
        migrations.RunSQL(TRIGGERS, DROP_TRIGGERS),
        refuse_back(
            "0018_sequences",
            "SELECT count(*) FROM pgqueue_task "
            "WHERE state = 'waiting' AND wait_reason = 'sequence'",
            lambda count: (
                f"{count} task(s) wait their turn in a sequence, and without this "
                "migration's triggers nothing would start them; let them run (or cancel "
                "them) first"
            ),
        ),
    ]
