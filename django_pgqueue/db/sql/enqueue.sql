-- Enqueue: a task's row inserted in the caller's transaction, one or many, with a
-- unique key or fair and sequence keys, and the id handed out before the insert.
--
-- The context every statement here relies on (the indexes, the states, the bounded
-- columns, the wake-ups) is in contract.sql; "the header" in a comment below means
-- that file's.


-- name: enqueue
-- One task, in the caller's transaction. run_at NULL means "now" in the database's
-- clock; a delay (an interval) is added to the database's now(), never to the caller's
-- clock. A task with a delay or a run_at is inserted 'scheduled' (the caller decides,
-- see enqueue.py), outside the claim's index: the stager makes it pending when due.
-- The statement is kept plain because a web request pays for it: one INSERT, no CTE,
-- no function call or cast the planner must resolve per call (the id's sequence is
-- named: PostgreSQL names an identity column's sequence <table>_<column>_seq), since
-- Django sends it as text and the server plans it every time. expires_at (NULL: never)
-- is the given time, or the expiry in seconds (an interval) after this statement, on
-- the database's clock like the delay; both NULL leave it NULL.
INSERT INTO pgqueue_task (
    id, queue, task_name, handler_version, priority, args, kwargs, run_at, state,
    max_attempts, retry_policy, timeout, unique_key, metadata, concurrency_key, expires_at
)
    VALUES (
        COALESCE(%(id)s, nextval('pgqueue_task_id_seq')),
        %(queue)s, %(task_name)s, %(handler_version)s, %(priority)s, %(args)s, %(kwargs)s,
        COALESCE(%(run_at)s, statement_timestamp() + %(delay)s),
        %(state)s, %(max_attempts)s, %(retry_policy)s, %(timeout)s, %(unique_key)s,
        %(metadata)s, %(concurrency_key)s,
        COALESCE(%(expires_at)s, statement_timestamp() + %(expires)s)
    )
    RETURNING id, enqueued_at,
        CASE -- the wake-up (see the header): notify only when a worker may be parked
            WHEN NOT pg_try_advisory_xact_lock_shared(1885827328, hashtext(queue) & 63)
                -- a claimer is checking in flight enqueues at this instant: notify
                THEN pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text
            WHEN pg_try_advisory_lock(1885827329, hashtext(queue) & 63)
                -- no claimer of this channel is parked: release the probe, no notify
                THEN pg_advisory_unlock(1885827329, hashtext(queue) & 63)::text
            ELSE pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text
        END AS woke;


-- name: enqueue_unique
-- As enqueue, but a live row (scheduled, pending, running, waiting) with the same
-- unique_key wins: ON CONFLICT on the partial unique index pgqueue_task_unique_live
-- inserts nothing and returns no row (and takes no lock, sends no notification); the
-- caller then reads the existing id with find_live_unique.
INSERT INTO pgqueue_task (
    id, queue, task_name, handler_version, priority, args, kwargs, run_at, state,
    max_attempts, retry_policy, timeout, unique_key, metadata, concurrency_key, expires_at
)
    VALUES (
        COALESCE(%(id)s, nextval('pgqueue_task_id_seq')),
        %(queue)s, %(task_name)s, %(handler_version)s, %(priority)s, %(args)s, %(kwargs)s,
        COALESCE(%(run_at)s, statement_timestamp() + %(delay)s),
        %(state)s, %(max_attempts)s, %(retry_policy)s, %(timeout)s, %(unique_key)s,
        %(metadata)s, %(concurrency_key)s,
        COALESCE(%(expires_at)s, statement_timestamp() + %(expires)s)
    )
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
                                AND state IN ('scheduled', 'pending', 'running', 'waiting')
    DO NOTHING
    RETURNING id, enqueued_at,
        CASE -- the wake-up (see the header): notify only when a worker may be parked
            WHEN NOT pg_try_advisory_xact_lock_shared(1885827328, hashtext(queue) & 63)
                -- a claimer is checking in flight enqueues at this instant: notify
                THEN pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text
            WHEN pg_try_advisory_lock(1885827329, hashtext(queue) & 63)
                -- no claimer of this channel is parked: release the probe, no notify
                THEN pg_advisory_unlock(1885827329, hashtext(queue) & 63)::text
            ELSE pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text
        END AS woke;


-- name: enqueue_keyed
-- One call of a fair or sequenced task (docs/tenants.md), in the caller's transaction:
-- as enqueue_unique (a live duplicate of its unique_key wins; without a key nothing
-- conflicts), with its keys.
-- A sequenced call (a sequence_key) is inserted waiting its turn ('waiting',
-- wait_reason 'sequence'); the pgqueue_sequence_join trigger starts it at the commit
-- if its sequence has no head (migration 0017), and sends the wake-up then.
-- A fair call (a fair_key) gets, when it is due now, its place in its key's flow:
-- fair_tag, the virtual start time the claim orders it by within its priority.
-- * The place is one step (1 / weight) after the last pending task of its flow (its
--   route, key and priority; pgqueue_task_fair_flow, one probe), and never before the
--   head of its line (the first pending task of its route and priority;
--   pgqueue_task_fair, one probe); 0 when the line is empty. So keys take turns in
--   proportion to their weights, whatever their backlogs, and a key back from an idle
--   spell starts at the head: its turn comes at once, never as a burst of the turns it
--   did not use. Two probes whatever the number of keys.
-- * The weight is the key's row of pgqueue_fair_weight (the key itself, else its
--   longest prefix 'stem*'), set at runtime, else %(fair_weight)s (FAIR_WEIGHTS, which
--   the caller resolved). pgqueue_fair_weight holds a few rows: read whole.
-- * Both probes are plain reads, never a lock: two enqueues of one key in concurrent
--   transactions may get the same place. A scheduled task gets its place when it
--   becomes due (stage).
INSERT INTO pgqueue_task (
    id, queue, task_name, handler_version, priority, args, kwargs, run_at, state,
    max_attempts, retry_policy, timeout, unique_key, metadata, concurrency_key, expires_at,
    fair_key, fair_tag, sequence_key, sequence_hold, wait_reason
)
    VALUES (
        COALESCE(%(id)s, nextval('pgqueue_task_id_seq')),
        %(queue)s::text, %(task_name)s::text, %(handler_version)s::int, %(priority)s::int,
        %(args)s, %(kwargs)s, COALESCE(%(run_at)s, statement_timestamp() + %(delay)s),
        %(state)s::text, %(max_attempts)s, %(retry_policy)s, %(timeout)s, %(unique_key)s,
        %(metadata)s, %(concurrency_key)s,
        COALESCE(%(expires_at)s, statement_timestamp() + %(expires)s),
        %(fair_key)s::text,
        CASE WHEN %(state)s::text = 'pending' AND %(fair_key)s::text IS NOT NULL
             THEN COALESCE(GREATEST(
            (SELECT h.fair_tag
               FROM pgqueue_task AS h
              WHERE h.state = 'pending' AND h.fair_key IS NOT NULL
                AND h.queue = %(queue)s::text AND h.task_name = %(task_name)s::text
                AND h.handler_version = %(handler_version)s::int
                AND h.priority = %(priority)s::int AND h.fair_tag IS NOT NULL
              ORDER BY h.fair_tag NULLS FIRST
              LIMIT 1),
            (SELECT f.fair_tag
               FROM pgqueue_task AS f
              WHERE f.state = 'pending' AND f.fair_key IS NOT NULL
                AND f.queue = %(queue)s::text AND f.task_name = %(task_name)s::text
                AND f.handler_version = %(handler_version)s::int
                AND f.fair_key = %(fair_key)s::text AND f.priority = %(priority)s::int
                AND f.fair_tag IS NOT NULL
              ORDER BY f.fair_tag DESC
              LIMIT 1)
            + 1.0 / COALESCE(
                (SELECT w.weight
                   FROM pgqueue_fair_weight AS w
                  WHERE w.key = %(fair_key)s::text
                     OR (right(w.key, 1) = '*'
                         AND starts_with(%(fair_key)s::text, left(w.key, -1)))
                  ORDER BY w.key = %(fair_key)s::text DESC, length(w.key) DESC
                  LIMIT 1),
                %(fair_weight)s::float8)), 0) END,
        %(sequence_key)s::text, %(sequence_hold)s::bool,
        CASE WHEN %(sequence_key)s::text IS NOT NULL THEN 'sequence' END
    )
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
                                AND state IN ('scheduled', 'pending', 'running', 'waiting')
    DO NOTHING
    RETURNING id, enqueued_at,
        CASE -- the wake-up (see the header): notify only when a worker may be parked
            WHEN state = 'waiting' THEN NULL -- its turn's start wakes the queue
            WHEN NOT pg_try_advisory_xact_lock_shared(1885827328, hashtext(queue) & 63)
                -- a claimer is checking in flight enqueues at this instant: notify
                THEN pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text
            WHEN pg_try_advisory_lock(1885827329, hashtext(queue) & 63)
                -- no claimer of this channel is parked: release the probe, no notify
                THEN pg_advisory_unlock(1885827329, hashtext(queue) & 63)::text
            ELSE pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text
        END AS woke;


-- name: find_live_unique
-- Uses pgqueue_task_unique_live.
SELECT id, enqueued_at
  FROM pgqueue_task
 WHERE unique_key = %(unique_key)s
   AND state IN ('scheduled', 'pending', 'running', 'waiting');


-- name: lock_unique_key
-- A unique_key with options (unique_for, unique_states, on_conflict; docs/tasks.md):
-- first, in the caller's transaction, the key's advisory transaction lock (class
-- 1885827335, object hashtext(key)), held to its commit or rollback. A concurrent
-- enqueuer of the key waits here; READ COMMITTED gives each statement a new snapshot,
-- so its find_unique that follows sees the first one's row once committed (and none
-- after a rollback: it inserts its own). Keys that share a hash only take turns.
-- Enqueues of the key without options take no lock: the live index
-- (pgqueue_task_unique_live) arbitrates between the two kinds.
SELECT pg_advisory_xact_lock(1885827335, hashtext(%(unique_key)s::text));


-- name: find_unique
-- Under lock_unique_key: the task that holds the key for this call, if any. A live
-- one always does (at most one, by pgqueue_task_unique_live); otherwise the newest in
-- one of unique_states enqueued within unique_for (NULL: whenever). replaceable: it is
-- queued, has never started and is the same task (on_conflict="replace" may give it
-- the new call's arguments). Uses pgqueue_task_unique_key (every row with a key, by
-- enqueued_at), whatever the state.
SELECT id, enqueued_at,
       state IN ('scheduled', 'pending') AND started_at IS NULL
           AND task_name = %(task_name)s::text AS replaceable
  FROM pgqueue_task
 WHERE unique_key = %(unique_key)s::text
   AND (state IN ('scheduled', 'pending', 'running', 'waiting')
        OR state = ANY (%(unique_states)s::text[])
           AND (%(unique_for)s::interval IS NULL
                OR enqueued_at > statement_timestamp() - %(unique_for)s::interval))
 ORDER BY state IN ('scheduled', 'pending', 'running', 'waiting') DESC, id DESC
 LIMIT 1;


-- name: replace_unique
-- on_conflict="replace": the queued duplicate find_unique found takes the new call's
-- args, kwargs, priority, run_at (so its state: scheduled or pending, as an enqueue's),
-- expiry and concurrency key, and keeps its id, queue, enqueued_at and other options.
-- Only while it has never started: a claim that locked it first commits before this
-- UPDATE goes on (READ COMMITTED re-checks the WHERE on the row as the claim left it:
-- running, so no row returns and the caller keeps it as it is); a claim arriving while
-- this UPDATE holds the row skips it (SKIP LOCKED) until the caller's transaction
-- ends. By primary key. Wakes the queue when the row becomes pending. A fair task
-- (docs/tenants.md) keeps its place in its key's flow if it stays due with the same
-- key, else it has none (NULL: the head of its line, or its place when staged).
UPDATE pgqueue_task
   SET args = %(args)s, kwargs = %(kwargs)s, priority = %(priority)s,
       run_at = COALESCE(%(run_at)s, statement_timestamp() + %(delay)s),
       state = %(state)s::text,
       concurrency_key = %(concurrency_key)s,
       fair_key = %(fair_key)s::text,
       fair_tag = CASE WHEN %(state)s::text = 'pending'
                        AND fair_key IS NOT DISTINCT FROM %(fair_key)s::text
                       THEN fair_tag END,
       expires_at = COALESCE(%(expires_at)s, statement_timestamp() + %(expires)s)
 WHERE id = %(target)s
   AND state IN ('scheduled', 'pending')
   AND started_at IS NULL
RETURNING id,
    CASE -- the wake-up (see the header), only for a row now due
        WHEN state <> 'pending' THEN NULL
        WHEN NOT pg_try_advisory_xact_lock_shared(1885827328, hashtext(queue) & 63)
            THEN pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text
        WHEN pg_try_advisory_lock(1885827329, hashtext(queue) & 63)
            THEN pg_advisory_unlock(1885827329, hashtext(queue) & 63)::text
        ELSE pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text
    END AS woke;


-- name: enqueue_many
-- Many calls of one task in one statement. What differs per call (args, kwargs)
-- travels as two JSON arrays, zipped by ROWS FROM; the options shared by the batch are
-- scalars. ORDER BY ordinality makes ids follow the input order. No ON CONFLICT: a
-- batch with a unique_key is a single enqueue_unique (the batch shares the key), and
-- without one, speculative insertion would only slow every row down. One notification
-- per batch (it has one queue). keys_list: each call's concurrency_key, when the task
-- computes one per call (NULL otherwise: ROWS FROM pads the missing column with NULLs).
WITH inserted AS (
    INSERT INTO pgqueue_task (
        queue, task_name, handler_version, priority, args, kwargs, run_at, state,
        max_attempts, retry_policy, timeout, unique_key, metadata, concurrency_key, expires_at
    )
    SELECT %(queue)s, %(task_name)s, %(handler_version)s, %(priority)s,
           c.args, c.kwargs,
           COALESCE(%(run_at)s, statement_timestamp() + %(delay)s),
           %(state)s, %(max_attempts)s, %(retry_policy)s::jsonb, %(timeout)s::interval,
           NULL, %(metadata)s::jsonb, COALESCE(c.key, %(concurrency_key)s::text),
           COALESCE(%(expires_at)s::timestamptz, statement_timestamp() + %(expires)s::interval)
      FROM ROWS FROM (jsonb_array_elements(%(args_list)s::jsonb),
                      jsonb_array_elements(%(kwargs_list)s::jsonb),
                      jsonb_array_elements_text(COALESCE(%(keys_list)s::jsonb, '[]')))
           WITH ORDINALITY AS c(args, kwargs, key, n)
     ORDER BY c.n
    RETURNING id
)
SELECT id, (SELECT pg_notify('pgqueue_' || (hashtext(%(queue)s) & 63), %(queue)s)::text)
  FROM inserted
 ORDER BY id;


-- name: enqueue_many_keyed
-- enqueue_many for a fair or sequenced task (docs/tenants.md), with each call's keys as
-- enqueue_keyed inserts them: its sequence (sequence_keys_list; NULL: none), waiting
-- its turn, started at the commit by the pgqueue_sequence_join trigger; its fair key
-- (fair_keys_list; NULL: none) and the weight FAIR_WEIGHTS gives it
-- (fair_weights_list, which a pgqueue_fair_weight row of the key overrides), and, when
-- the calls are due now, their places: as enqueue_keyed's, per key of the batch (flows: one probe of
-- pgqueue_task_fair_flow per key, one of pgqueue_task_fair for the batch's line), then
-- one step (1 / weight) apart within the key, in the order of the calls. A backlog of
-- one key enqueued at once so spreads over its turns, and other keys' tasks enqueued
-- later take theirs between them.
WITH calls AS (
    SELECT c.args, c.kwargs, c.key, c.fair_key, c.fair_weight::float8 AS fair_weight,
           c.sequence_key, c.n
      FROM ROWS FROM (jsonb_array_elements(%(args_list)s::jsonb),
                      jsonb_array_elements(%(kwargs_list)s::jsonb),
                      jsonb_array_elements_text(COALESCE(%(keys_list)s::jsonb, '[]')),
                      jsonb_array_elements_text(COALESCE(%(fair_keys_list)s::jsonb, '[]')),
                      jsonb_array_elements_text(COALESCE(%(fair_weights_list)s::jsonb, '[]')),
                      jsonb_array_elements_text(COALESCE(%(sequence_keys_list)s::jsonb, '[]')))
           WITH ORDINALITY AS c(args, kwargs, key, fair_key, fair_weight, sequence_key, n)
),
line AS MATERIALIZED (
    SELECT (SELECT h.fair_tag
              FROM pgqueue_task AS h
             WHERE h.state = 'pending' AND h.fair_key IS NOT NULL
               AND h.queue = %(queue)s::text AND h.task_name = %(task_name)s::text
               AND h.handler_version = %(handler_version)s::int
               AND h.priority = %(priority)s::int AND h.fair_tag IS NOT NULL
             ORDER BY h.fair_tag NULLS FIRST
             LIMIT 1) AS head
),
flows AS MATERIALIZED (
    SELECT f.fair_key, s.step,
           COALESCE(GREATEST(
               (SELECT line.head FROM line),
               (SELECT t.fair_tag
                  FROM pgqueue_task AS t
                 WHERE t.state = 'pending' AND t.fair_key IS NOT NULL
                   AND t.queue = %(queue)s::text AND t.task_name = %(task_name)s::text
                   AND t.handler_version = %(handler_version)s::int
                   AND t.fair_key = f.fair_key AND t.priority = %(priority)s::int
                   AND t.fair_tag IS NOT NULL
                 ORDER BY t.fair_tag DESC
                 LIMIT 1) + s.step), 0) AS base
      FROM (SELECT DISTINCT fair_key, fair_weight FROM calls WHERE fair_key IS NOT NULL) AS f
     CROSS JOIN LATERAL (
               SELECT 1.0 / COALESCE(
                          (SELECT w.weight
                             FROM pgqueue_fair_weight AS w
                            WHERE w.key = f.fair_key
                               OR (right(w.key, 1) = '*'
                                   AND starts_with(f.fair_key, left(w.key, -1)))
                            ORDER BY w.key = f.fair_key DESC, length(w.key) DESC
                            LIMIT 1),
                          f.fair_weight) AS step
           ) AS s
),
inserted AS (
    INSERT INTO pgqueue_task (
        queue, task_name, handler_version, priority, args, kwargs, run_at, state,
        max_attempts, retry_policy, timeout, unique_key, metadata, concurrency_key, expires_at,
        fair_key, fair_tag, sequence_key, sequence_hold, wait_reason
    )
    SELECT %(queue)s::text, %(task_name)s::text, %(handler_version)s::int, %(priority)s::int,
           c.args, c.kwargs,
           COALESCE(%(run_at)s, statement_timestamp() + %(delay)s),
           CASE WHEN c.sequence_key IS NOT NULL THEN 'waiting' ELSE %(state)s::text END,
           %(max_attempts)s, %(retry_policy)s::jsonb, %(timeout)s::interval,
           NULL, %(metadata)s::jsonb, COALESCE(c.key, %(concurrency_key)s::text),
           COALESCE(%(expires_at)s::timestamptz, statement_timestamp() + %(expires)s::interval),
           c.fair_key,
           CASE WHEN %(state)s::text = 'pending' AND c.sequence_key IS NULL
                THEN f.base + (row_number() OVER (PARTITION BY c.fair_key ORDER BY c.n) - 1)
                              * f.step END,
           c.sequence_key, %(sequence_hold)s::bool,
           CASE WHEN c.sequence_key IS NOT NULL THEN 'sequence' END
      FROM calls AS c
      LEFT JOIN flows AS f ON f.fair_key = c.fair_key
     ORDER BY c.n
    RETURNING id
)
SELECT id, (SELECT pg_notify('pgqueue_' || (hashtext(%(queue)s::text) & 63),
                            %(queue)s::text)::text)
  FROM inserted
 ORDER BY id;


-- name: reserve_id
-- enqueue_on_commit hands out the id before the insert runs (sequences are not
-- transactional, so a rolled-back caller only leaves a gap in the ids).
SELECT nextval('pgqueue_task_id_seq');
