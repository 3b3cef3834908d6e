-- A queue's own row and what operators set on it: pauses, fair-share weights and
-- shares (docs/tenants.md), held sequences, and every queue's pause state.
--
-- The context every statement here relies on (the indexes, the states, the bounded
-- columns, the wake-ups) is in contract.sql; "the header" in a comment below means
-- that file's.


-- name: ensure_queues
-- A worker's queues each get their pgqueue_queue row at registration, so that pause,
-- the rate budget and the starvation window have a row to read and lock.
INSERT INTO pgqueue_queue (name)
SELECT unnest(%(queues)s::text[])
    ON CONFLICT (name) DO NOTHING;


-- name: pause_queue
-- Pause a queue (task_name NULL) or one task name within it. Upserts the queue's row,
-- so a queue no worker serves yet can be paused before its first worker starts. The
-- next claim of every worker honours it (claim reads it); running tasks finish.
INSERT INTO pgqueue_queue AS q (name, paused, paused_tasks, paused_at)
VALUES (%(queue)s, %(task_name)s::text IS NULL,
        CASE WHEN %(task_name)s::text IS NULL THEN '[]'::jsonb
             ELSE jsonb_build_array(%(task_name)s::text) END,
        now())
    ON CONFLICT (name) DO UPDATE
   SET paused = q.paused OR %(task_name)s::text IS NULL,
       paused_tasks = CASE WHEN %(task_name)s::text IS NULL
                             OR q.paused_tasks ? %(task_name)s::text
                           THEN q.paused_tasks
                           ELSE q.paused_tasks || jsonb_build_array(%(task_name)s::text) END,
       paused_at = now()
RETURNING q.paused, q.paused_tasks::text AS paused_tasks;


-- name: resume_queue
-- Resume a queue (task_name NULL: the queue's own pause; paused task names stay paused)
-- or one task name. Wakes the queue's parked workers (a NOTIFY on its channel).
UPDATE pgqueue_queue AS q
   SET paused = CASE WHEN %(task_name)s::text IS NULL THEN false ELSE q.paused END,
       paused_tasks = CASE WHEN %(task_name)s::text IS NULL THEN q.paused_tasks
                           ELSE q.paused_tasks - %(task_name)s::text END,
       paused_at = CASE WHEN (%(task_name)s::text IS NOT NULL AND q.paused)
                          OR (CASE WHEN %(task_name)s::text IS NULL THEN q.paused_tasks
                                   ELSE q.paused_tasks - %(task_name)s::text END) <> '[]'
                        THEN q.paused_at END
 WHERE q.name = %(queue)s
RETURNING q.paused, q.paused_tasks::text AS paused_tasks,
          pg_notify('pgqueue_' || (hashtext(q.name) & 63), q.name)::text AS notified;


-- name: set_fair_weight
-- A fair-share weight at runtime (docs/tenants.md), for a key or a prefix ('stem*'):
-- one row of pgqueue_fair_weight, by primary key. enqueue_keyed, enqueue_many_keyed and
-- stage read it for every task of a matching key that becomes due after this commits
-- (it wins over FAIR_WEIGHTS); tasks already due keep their places.
INSERT INTO pgqueue_fair_weight AS w (key, weight, set_at)
VALUES (%(key)s, %(weight)s, now())
    ON CONFLICT (key) DO UPDATE
   SET weight = EXCLUDED.weight, set_at = EXCLUDED.set_at;


-- name: clear_fair_weight
-- Remove a runtime weight: the keys it matched fall back on FAIR_WEIGHTS.
DELETE FROM pgqueue_fair_weight WHERE key = %(key)s RETURNING key;


-- name: fair_weights
-- Every runtime weight (a few rows).
SELECT key, weight, set_at FROM pgqueue_fair_weight ORDER BY key;


-- name: fair_shares
-- Who is getting what (docs/tenants.md; the overview, pgqueue_fair shares): per fair
-- key of a queue (NULL: all), its tasks due now (pending), running, and started within
-- the last %(seconds)s seconds, for the keys with the most of those, at most
-- %(limit)s of them; %(search)s (NULL: any) keeps the keys that contain it.
-- The due ones are counted from pgqueue_task_fair_flow (pending rows with a fair key
-- only); the running ones from pgqueue_task_running (running rows only); the started
-- ones are the running ones and those that started and finished within the window,
-- read from the most recent ends back (pgqueue_task_retention, per terminal state) at
-- most %(sample)s rows per state: on a busy queue, a sample of the most recent starts,
-- which is what a share is about. A read for an operator (bounded by the backlog of
-- fair tasks and the sample), never a worker's.
WITH due AS (
    SELECT queue, fair_key AS key, count(*) AS pending
      FROM pgqueue_task
     WHERE state = 'pending' AND fair_key IS NOT NULL
       AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
     GROUP BY 1, 2
),
running AS (
    SELECT queue, fair_key AS key, count(*) AS running
      FROM pgqueue_task
     WHERE state = 'running' AND fair_key IS NOT NULL
       AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
     GROUP BY 1, 2
),
recent AS (
    SELECT f.queue, f.fair_key AS key, count(*) AS started
      FROM unnest(ARRAY['succeeded', 'failed', 'cancelled']) AS s(state),
           LATERAL (
               SELECT t.queue, t.fair_key, t.started_at
                 FROM pgqueue_task AS t
                WHERE t.state = s.state
                  AND t.finished_at > now() - make_interval(secs => %(seconds)s)
                ORDER BY t.finished_at DESC
                LIMIT %(sample)s
           ) AS f
     WHERE f.fair_key IS NOT NULL
       AND f.started_at > now() - make_interval(secs => %(seconds)s)
       AND (%(queue)s::text IS NULL OR f.queue = %(queue)s::text)
     GROUP BY 1, 2
),
every AS (
    SELECT queue, key FROM due
    UNION SELECT queue, key FROM running
    UNION SELECT queue, key FROM recent
)
SELECT e.queue, e.key, COALESCE(d.pending, 0) AS pending, COALESCE(r.running, 0) AS running,
       COALESCE(s.started, 0) + COALESCE(r.running, 0) AS started
  FROM every AS e
  LEFT JOIN due AS d ON d.queue = e.queue AND d.key = e.key
  LEFT JOIN running AS r ON r.queue = e.queue AND r.key = e.key
  LEFT JOIN recent AS s ON s.queue = e.queue AND s.key = e.key
 WHERE %(search)s::text IS NULL OR strpos(e.key, %(search)s::text) > 0
 ORDER BY COALESCE(r.running, 0) + COALESCE(s.started, 0) DESC, COALESCE(d.pending, 0) DESC,
          e.queue, e.key
 LIMIT %(limit)s;


-- name: release_sequence
-- An operator releases a held sequence (docs/tenants.md): its failed task that holds it
-- stops holding it (sequence_hold), and its next waiting task starts
-- (pgqueue_sequence_start_next, migration 0017: in id order, pending with a wake-up),
-- in this one transaction. The sequence's advisory lock first (class 1885827336, as
-- the pgqueue_sequence_join trigger takes it at an enqueue's commit): the two take
-- turns. The failed task stays a dead letter (retry it instead to run it again, at the
-- head). By (queue, sequence_key) through pgqueue_task_sequence. Returns the released
-- task's id and the started one's (NULL: none waited).
WITH locked AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(1885827336, hashtext(%(queue)s::text || ' ' || %(key)s::text))
),
released AS (
    UPDATE pgqueue_task AS t
       SET sequence_hold = false
      FROM locked
     WHERE t.queue = %(queue)s::text AND t.sequence_key = %(key)s::text
       AND t.state = 'failed' AND t.sequence_hold
    RETURNING t.id
)
SELECT (SELECT min(id) FROM released) AS released;


-- name: start_sequence
-- After release_sequence, in its transaction (a statement of its own: its snapshot sees
-- the release): the sequence's next task, if nothing else holds it.
SELECT pgqueue_sequence_start_next(%(queue)s::text, %(key)s::text) AS started;


-- name: held_sequences
-- Sequences held by a failed task (docs/tenants.md; the overview, pgqueue_sequence):
-- per held (queue, key), the task that holds it and when it failed, and how many tasks
-- wait their turn behind it; the most recently held first, at most %(limit)s, of
-- %(queue)s (NULL: all) and of the keys that contain %(search)s (NULL: any). The held
-- rows through pgqueue_task_sequence (its failed part holds only these); the waiting
-- ones counted per sequence through the same index.
SELECT h.queue, h.sequence_key AS key, h.id AS task_id, h.task_name, h.finished_at,
       (SELECT count(*)
          FROM pgqueue_task AS w
         WHERE w.queue = h.queue AND w.sequence_key = h.sequence_key
           AND w.state = 'waiting' AND w.wait_reason = 'sequence') AS waiting
  FROM pgqueue_task AS h
 WHERE h.state = 'failed' AND h.sequence_hold AND h.sequence_key IS NOT NULL
   AND (%(queue)s::text IS NULL OR h.queue = %(queue)s::text)
   AND (%(search)s::text IS NULL OR strpos(h.sequence_key, %(search)s::text) > 0)
 ORDER BY h.finished_at DESC, h.id DESC
 LIMIT %(limit)s;


-- name: queue_pauses
-- Every queue's pause state (the overview, metrics, pgqueue_status), and its rate
-- budget: rate_tat_in is how far the rate limit's theoretical arrival time lies ahead
-- of the database's now(), in seconds (NULL: never rated), so that a reader with any
-- clock can tell whether the queue is out of budget (rate_tat_in > (burst - 1) *
-- interval, as the claim's room says). pgqueue_queue has one row per queue: no index
-- needed.
SELECT name AS queue, paused, paused_tasks::text AS paused_tasks, paused_at,
       EXTRACT(EPOCH FROM rate_tat - now())::float8 AS rate_tat_in
  FROM pgqueue_queue
 ORDER BY name;
