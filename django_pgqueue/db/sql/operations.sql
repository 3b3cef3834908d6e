-- An operator's actions on tasks (operations.py, the admin, the pgqueue_* commands):
-- cancel, retry, requeue and restore, delete, prune's dry run, re-encryption.
--
-- The context every statement here relies on (the indexes, the states, the bounded
-- columns, the wake-ups) is in contract.sql; "the header" in a comment below means
-- that file's.


-- name: cancel_task
-- Cancel: a scheduled, pending or waiting task ends cancelled at once; a running one gets
-- cancel_requested, which its handler sees (context.cancel_requested) and its
-- settlement turns into cancelled. Terminal tasks are left alone. hard also sets
-- cancel_hard: the worker's heartbeat reads it (heartbeat) and, in process execution
-- mode, kills the handler's process. A hard request is never downgraded by a soft one;
-- a cancel_hard left without a cancel_requested (a task revived by an older release,
-- which cleared only cancel_requested) is no request, and a soft cancel stays soft.
-- A waiting task cancelled here stops waiting (its wait_* columns are cleared); the
-- pgqueue_release_dependents trigger cancels what waits for it, in this transaction.
UPDATE pgqueue_task
   SET state = CASE WHEN state = 'running' THEN state ELSE 'cancelled' END,
       finished_at = CASE WHEN state = 'running' THEN finished_at ELSE now() END,
       wait_reason = CASE WHEN state = 'running' THEN wait_reason END,
       wait_signal = CASE WHEN state = 'running' THEN wait_signal END,
       wait_until = CASE WHEN state = 'running' THEN wait_until END,
       cancel_requested = true,
       cancel_hard = (cancel_requested AND cancel_hard) OR %(hard)s
 WHERE id = %(id)s
   AND state IN ('scheduled', 'pending', 'waiting', 'running')
RETURNING id, state;


-- name: retry_now
-- An operator's "retry now": a scheduled or pending task becomes due at once (pending);
-- a dead letter goes back to pending, due at once, with one more attempt (max_attempts
-- is raised to attempt + 1 if it was spent; requeue_dead gives a fresh budget instead).
-- Every cancel flag is cleared: the operator asked for the task to run, and a hard
-- cancel asked during its last attempt (which then failed) must not kill the new one.
-- State-checked, never fenced out of a worker's hands: only rows that are pending or
-- failed when the row lock is taken match. A row a worker claimed meanwhile is
-- running by then (READ COMMITTED re-checks the WHERE on the locked row) and is left
-- alone, its lease, token and attempt untouched; the claim's SKIP LOCKED skips a row
-- this statement holds. By primary key; wakes the queues it made due.
--
-- Unique keys: two live rows may not share one (pgqueue_task_unique_live). kept is
-- the dead letters asked for that stay dead, and why: a live row holds the key
-- (live_id, through pgqueue_task_unique_live), or a newer dead letter of the key among
-- them is revived instead (newer_id: only the highest id of a key is revived). Both
-- are judged in this statement's snapshot. The race left: another transaction makes
-- a row of the key live after that snapshot (an enqueue, another revive). The UPDATE's
-- insertion into pgqueue_task_unique_live then waits for it and, once it commits,
-- fails with a unique violation; no statement-level guard can see it coming, and an
-- UPDATE has no ON CONFLICT. The caller (operations.py, _revive) runs this in a
-- savepoint and, on that violation, revives the rows one at a time, newest first, each
-- in a savepoint of its own: each statement's new snapshot sees the row that won, and
-- keeps its dead letter dead. The other side never fails: an enqueue of the key
-- (enqueue_unique's ON CONFLICT) that meets this statement's uncommitted row waits for
-- it and returns the revived task. Advisory locks (lock_unique_key) would not close
-- the race: an enqueue without unique options takes none.
-- One row per task revived (revived) and per dead letter kept.
WITH keyed AS MATERIALIZED (
    SELECT t.id, t.unique_key,
           (SELECT l.id
              FROM pgqueue_task AS l
             WHERE l.unique_key = t.unique_key
               AND l.state IN ('scheduled', 'pending', 'running', 'waiting')) AS live_id,
           max(t.id) OVER (PARTITION BY t.unique_key) AS newest_id
      FROM pgqueue_task AS t
     WHERE t.id = ANY (%(ids)s::bigint[])
       AND t.state = 'failed'
       AND t.unique_key IS NOT NULL
),
kept AS MATERIALIZED (
    SELECT id, unique_key, live_id, CASE WHEN live_id IS NULL THEN newest_id END AS newer_id
      FROM keyed
     WHERE live_id IS NOT NULL OR id <> newest_id
),
retried AS (
    UPDATE pgqueue_task AS t
       SET state = 'pending',
           run_at = now(),
           max_attempts = CASE WHEN t.state = 'failed'
                               THEN GREATEST(t.max_attempts, t.attempt + 1)
                               ELSE t.max_attempts END,
           finished_at = NULL,
           cancel_requested = false,
           cancel_hard = false
     WHERE t.id = ANY (%(ids)s::bigint[])
       AND t.id <> ALL (ARRAY(SELECT id FROM kept))
       AND t.state IN ('scheduled', 'pending', 'failed')
    RETURNING t.id, t.queue
)
SELECT id, true AS revived, NULL::text AS unique_key, NULL::bigint AS live_id,
       NULL::bigint AS newer_id, pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text
  FROM retried
UNION ALL
SELECT id, false, unique_key, live_id, newer_id, NULL
  FROM kept
 ORDER BY id;


-- name: requeue_dead
-- Dead letters back to pending with a fresh attempt budget (attempt = 0), due now,
-- every cancel flag cleared (see retry_now); their errors are kept. Every filter is
-- optional (NULL matches all): ids, task_name, queue, and since (died at or after;
-- finished_at through pgqueue_task_retention). State-checked like retry_now (only rows
-- still failed under the row lock), and its unique keys the same way: kept, the race
-- with a row made live after its snapshot, and the caller's savepoints, as there. Wakes
-- the queues it made due. find_dead is its dry run: keep the two in step.
WITH keyed AS MATERIALIZED (
    SELECT t.id, t.unique_key,
           (SELECT l.id
              FROM pgqueue_task AS l
             WHERE l.unique_key = t.unique_key
               AND l.state IN ('scheduled', 'pending', 'running', 'waiting')) AS live_id,
           max(t.id) OVER (PARTITION BY t.unique_key) AS newest_id
      FROM pgqueue_task AS t
     WHERE t.state = 'failed'
       AND t.unique_key IS NOT NULL
       AND (%(ids)s::bigint[] IS NULL OR t.id = ANY (%(ids)s::bigint[]))
       AND (%(task_name)s::text IS NULL OR t.task_name = %(task_name)s::text)
       AND (%(queue)s::text IS NULL OR t.queue = %(queue)s::text)
       AND (%(since)s::timestamptz IS NULL OR t.finished_at >= %(since)s::timestamptz)
),
kept AS MATERIALIZED (
    SELECT id, unique_key, live_id, CASE WHEN live_id IS NULL THEN newest_id END AS newer_id
      FROM keyed
     WHERE live_id IS NOT NULL OR id <> newest_id
),
requeued AS (
    UPDATE pgqueue_task AS t
       SET state = 'pending',
           attempt = 0,
           run_at = now(),
           finished_at = NULL,
           cancel_requested = false,
           cancel_hard = false
     WHERE t.state = 'failed'
       AND (%(ids)s::bigint[] IS NULL OR t.id = ANY (%(ids)s::bigint[]))
       AND (%(task_name)s::text IS NULL OR t.task_name = %(task_name)s::text)
       AND (%(queue)s::text IS NULL OR t.queue = %(queue)s::text)
       AND (%(since)s::timestamptz IS NULL OR t.finished_at >= %(since)s::timestamptz)
       AND t.id <> ALL (ARRAY(SELECT id FROM kept))
    RETURNING t.id, t.queue
)
SELECT id, true AS revived, NULL::text AS unique_key, NULL::bigint AS live_id,
       NULL::bigint AS newer_id, pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text
  FROM requeued
UNION ALL
SELECT id, false, unique_key, live_id, newer_id, NULL
  FROM kept
 ORDER BY id;


-- name: restore_archived
-- pgqueue_requeue --from-archive: an archived task (a row as prune_archive_batch wrote
-- it, %(row)s) back in the table under its own id, pending and due now with a fresh
-- attempt budget, as requeue_dead does: its args, kwargs, metadata, checkpoint,
-- errors and executions kept, its result and its waits cleared. Ids come from the
-- table's identity and are never handed out twice, so a free id is this task's; ON
-- CONFLICT (id) DO NOTHING: a row with this id is still there (it was never pruned,
-- or was restored already) and nothing is written. A live task with the same
-- unique_key makes the INSERT fail (pgqueue_task_unique_live): two live rows may not
-- share a key. Columns the archive lacks take their defaults. Wakes the queue.
WITH archived AS (
    SELECT * FROM jsonb_populate_record(NULL::pgqueue_task, %(row)s::jsonb)
),
restored AS (
    INSERT INTO pgqueue_task (id, queue, task_name, handler_version, priority, state,
                              args, kwargs, run_at, enqueued_at, started_at,
                              last_attempted_at, attempt, max_attempts, retry_policy,
                              timeout, errors, unique_key, checkpoint, progress,
                              metadata, executions, concurrency_key, signals)
    SELECT a.id, a.queue, a.task_name, a.handler_version, a.priority, 'pending',
           a.args, a.kwargs, now(), a.enqueued_at, a.started_at,
           a.last_attempted_at, 0, a.max_attempts, a.retry_policy,
           a.timeout, a.errors, a.unique_key, a.checkpoint, a.progress,
           a.metadata, a.executions, a.concurrency_key, COALESCE(a.signals, '{}')
      FROM archived AS a
    ON CONFLICT (id) DO NOTHING
    RETURNING id, queue
)
SELECT id, pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text FROM restored;


-- name: find_dead
-- What requeue_dead would do with the same filters (its dry run), in the same rows:
-- the ids it would requeue (revived), and the dead letters it would keep, and why.
WITH keyed AS MATERIALIZED (
    SELECT t.id, t.unique_key,
           (SELECT l.id
              FROM pgqueue_task AS l
             WHERE l.unique_key = t.unique_key
               AND l.state IN ('scheduled', 'pending', 'running', 'waiting')) AS live_id,
           max(t.id) OVER (PARTITION BY t.unique_key) AS newest_id
      FROM pgqueue_task AS t
     WHERE t.state = 'failed'
       AND t.unique_key IS NOT NULL
       AND (%(ids)s::bigint[] IS NULL OR t.id = ANY (%(ids)s::bigint[]))
       AND (%(task_name)s::text IS NULL OR t.task_name = %(task_name)s::text)
       AND (%(queue)s::text IS NULL OR t.queue = %(queue)s::text)
       AND (%(since)s::timestamptz IS NULL OR t.finished_at >= %(since)s::timestamptz)
),
kept AS MATERIALIZED (
    SELECT id, unique_key, live_id, CASE WHEN live_id IS NULL THEN newest_id END AS newer_id
      FROM keyed
     WHERE live_id IS NOT NULL OR id <> newest_id
)
SELECT t.id, true AS revived, NULL::text AS unique_key, NULL::bigint AS live_id,
       NULL::bigint AS newer_id
  FROM pgqueue_task AS t
 WHERE t.state = 'failed'
   AND (%(ids)s::bigint[] IS NULL OR t.id = ANY (%(ids)s::bigint[]))
   AND (%(task_name)s::text IS NULL OR t.task_name = %(task_name)s::text)
   AND (%(queue)s::text IS NULL OR t.queue = %(queue)s::text)
   AND (%(since)s::timestamptz IS NULL OR t.finished_at >= %(since)s::timestamptz)
   AND t.id <> ALL (ARRAY(SELECT id FROM kept))
UNION ALL
SELECT id, false, unique_key, live_id, newer_id
  FROM kept
 ORDER BY id;


-- name: delete_finished
-- Delete rows an operator selected, if they are terminal and hold no lease (the same
-- guard as prune): a pending, running or waiting task is never deleted (cancel it
-- first). Their workflow edges (a finished task's are resolved: nothing waits on them)
-- and log records go with them, as prune's do (pgqueue_dep_child, the edge constraint
-- and pgqueue_task_log_task). By primary key.
WITH deleted AS (
    DELETE FROM pgqueue_task
     WHERE id = ANY (%(ids)s::bigint[])
       AND state IN ('succeeded', 'failed', 'cancelled')
       AND lease_token IS NULL
    RETURNING id
),
parent_edges AS (
    DELETE FROM pgqueue_dependency AS e
     WHERE e.child_id = ANY (ARRAY(SELECT id FROM deleted))
),
child_edges AS (
    DELETE FROM pgqueue_dependency AS e
     WHERE e.parent_id = ANY (ARRAY(SELECT id FROM deleted))
),
logs AS (
    DELETE FROM pgqueue_task_log AS l
     WHERE l.task_id = ANY (ARRAY(SELECT id FROM deleted))
)
SELECT id FROM deleted;


-- name: count_prunable
-- What prune would delete now, per state (its dry run): the same conditions, counted
-- through pgqueue_task_retention, one state at a time.
SELECT 'succeeded' AS state, count(*)
  FROM pgqueue_task
 WHERE state = 'succeeded'
   AND finished_at < now() - make_interval(secs => %(result_ttl)s)
   AND lease_token IS NULL
UNION ALL
SELECT 'cancelled', count(*)
  FROM pgqueue_task
 WHERE state = 'cancelled'
   AND finished_at < now() - make_interval(secs => %(result_ttl)s)
   AND lease_token IS NULL
UNION ALL
SELECT 'failed', count(*)
  FROM pgqueue_task
 WHERE state = 'failed'
   AND finished_at < now() - make_interval(secs => %(dead_ttl)s)
   AND lease_token IS NULL;


-- name: encrypted_batch
-- pgqueue_reencrypt (operations.reencrypt): the next %(batch)s encrypted rows after id
-- %(after)s (encrypted: args are an object, encryption.py), walked by primary key: no
-- index tells encrypted rows apart, so the command reads the table once, a batch per
-- transaction. Each row is locked (FOR NO KEY UPDATE) and returned with its payload
-- columns, which the command encrypts again and writes back with reencrypt_rows in the
-- same transaction: nothing can change them between the read and the write. Returned
-- with locked false, and left as they are for a later run: a running row (its handler
-- may write its checkpoint or progress, its settlement its result, at any moment) and
-- a row another transaction holds (SKIP LOCKED: a claim taking it, a signal). It never
-- waits for a lock, so it cannot deadlock with the worker's statements or a settlement's
-- trigger.
WITH walk AS MATERIALIZED (
    SELECT t.id
      FROM pgqueue_task AS t
     WHERE t.id > %(after)s
       AND jsonb_typeof(t.args) = 'object'
     ORDER BY t.id
     LIMIT %(batch)s
),
locked AS MATERIALIZED (
    SELECT t.id, t.args, t.kwargs, t.result, t.checkpoint, t.progress, t.signals, t.wake
      FROM pgqueue_task AS t
     WHERE t.id = ANY (ARRAY(SELECT id FROM walk))
       AND t.state <> 'running'
       AND jsonb_typeof(t.args) = 'object'
       FOR NO KEY UPDATE OF t SKIP LOCKED
)
SELECT w.id, l.id IS NOT NULL AS locked,
       l.args, l.kwargs, l.result, l.checkpoint, l.progress, l.signals, l.wake
  FROM walk AS w
  LEFT JOIN locked AS l ON l.id = w.id
 ORDER BY w.id;


-- name: reencrypt_rows
-- pgqueue_reencrypt: the payload columns of rows encrypted_batch locked, encrypted
-- again with the newest key, in the transaction that holds their locks; by primary
-- key. A column a row's entry leaves out (read as NULL) was already encrypted with the
-- newest key, or empty, and keeps its value.
UPDATE pgqueue_task AS t
   SET args = COALESCE(r.args, t.args),
       kwargs = COALESCE(r.kwargs, t.kwargs),
       result = COALESCE(r.result, t.result),
       checkpoint = COALESCE(r.checkpoint, t.checkpoint),
       progress = COALESCE(r.progress, t.progress),
       signals = COALESCE(r.signals, t.signals),
       wake = COALESCE(r.wake, t.wake)
  FROM jsonb_to_recordset(%(rows)s::jsonb)
       AS r(id bigint, args jsonb, kwargs jsonb, result jsonb, checkpoint jsonb,
            progress jsonb, signals jsonb, wake jsonb)
 WHERE t.id = r.id
RETURNING t.id;
