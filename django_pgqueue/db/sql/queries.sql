-- The database contract of django_pgqueue: every statement of the hot path, by name.
--
-- Python calls these by name (django_pgqueue/db/sql/__init__.py). Parameters use the
-- psycopg/Django pyformat style, %(name)s. Each statement says which index it relies on
-- and which race it closes. All time comparisons use the database's now(), never a
-- worker's clock.
--
-- Indexes (defined on the model, django_pgqueue/models.py):
--   pgqueue_task_claim      (queue, task_name, handler_version, priority DESC, run_at, id)
--                                                               WHERE state = 'pending'
--   pgqueue_task_due        (queue, task_name, handler_version, run_at, id)
--                                                               WHERE state = 'pending'
--   pgqueue_task_scheduled  (queue, run_at, id)                WHERE state = 'scheduled'
--   pgqueue_task_lease      (lease_expires_at)                 WHERE state = 'running'
--   pgqueue_task_running    (queue, concurrency_key)           WHERE state = 'running'
--   pgqueue_task_retention  (state, finished_at)               WHERE state is terminal
--   pgqueue_task_waiting    (queue, task_name)                 WHERE state = 'waiting'
--   pgqueue_task_wait_timeout (queue, wait_until, id)          WHERE state = 'waiting'
--                                                                 AND wait_until IS NOT NULL
--   pgqueue_dependency: pgqueue_dep_edge UNIQUE (parent_id, child_id), pgqueue_dep_child
--                       (child_id); the trigger pgqueue_release_dependents (migration
--                       0008) resolves a task's edges when it ends
--   pgqueue_task_unique_live UNIQUE (unique_key) WHERE unique_key IS NOT NULL AND live
--   pgqueue_key_rate: PRIMARY KEY (queue, key): one row per key with a per-key rate
--   pgqueue_task_unique_key (unique_key, enqueued_at)         WHERE unique_key IS NOT NULL
--   pgqueue_task_fair       (queue, task_name, handler_version, priority DESC,
--                            fair_tag NULLS FIRST, id)  WHERE state = 'pending'
--                                                          AND fair_key IS NOT NULL
--   pgqueue_task_fair_flow  (queue, task_name, handler_version, fair_key, priority,
--                            fair_tag)                  WHERE state = 'pending'
--                                                          AND fair_key IS NOT NULL
--   pgqueue_fair_weight: PRIMARY KEY (key): fair-share weights set at runtime (a few rows)
--   pgqueue_task_log: pgqueue_task_log_task (task_id, id): the log records of a task's
--                     attempts (TASK_LOGS, store_task_logs), deleted with the task
--
-- States: 'scheduled' rows are due later and sit outside the claim's indexes; the
-- stager makes them 'pending' when due, so every pending row is due.
--
-- Columns that grow by appending are bounded. A row keeps the last 100 entries of
-- executions and of errors: every statement that appends an error keeps the last 99
-- before it, jsonb_path_query_array(errors, '$[last - 98 to last]') (lax mode: a
-- shorter array is kept whole), and adds how many it dropped to errors_dropped, so a
-- task that failed a thousand times (a requeued dead letter, a Continue loop) stays
-- one small row. Only the pgqueue_release_dependents trigger appends without it: to a
-- task waiting for its parents, which never ran and holds no error. signals is
-- bounded by signal_task (names and bytes). pgqueue_queue.paused_tasks grows only by
-- an operator's pause of a task name, and shrinks at its resume.
--
-- Wake-ups: every path that makes a task due again sends
-- pg_notify('pgqueue_' || (hashtext(<queue>) & 63), <queue>) inside its own
-- transaction: one of 64 channels by the queue's hash, the queue name as payload. A
-- worker LISTENs only on its queues' channels (and ignores other queues sharing one),
-- so an enqueue never wakes the idle workers of other queues. A notification is
-- delivered on commit only, never for a rollback; PostgreSQL folds identical
-- notifications of one transaction into one: one wake per queue per transaction.
--
-- A single enqueue notifies only when a worker of its channel is parked (see
-- docs/worker.md, "Wake-ups"): a NOTIFY takes a cluster-wide lock through the
-- notifying transaction's commit, so notifying every enqueue serialises the commits
-- of concurrent web requests. Two advisory locks per channel (two-int form, class
-- PARKED = 1885827329 and ENQUEUING = 1885827328, object = the channel number) decide
-- it without losing a wake-up:
--   - a parked claimer holds PARKED shared (session lock on its LISTEN connection);
--   - an enqueue holds ENQUEUING shared until its transaction ends, then asks whether
--     PARKED is held (a momentary exclusive try) and notifies if it is;
--   - a claimer about to park takes PARKED, then waits until no enqueue that might
--     have asked before is still in flight (an exclusive try on ENQUEUING, retried),
--     then claims once more before it parks. An enqueue that saw no mark committed
--     before that claim, so the claim takes its row.


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


-- name: claim
-- The claim: up to %(limit)s pending tasks across the worker's queues, for one worker,
-- in one statement, by priority (higher first), then run_at, then id.
--
-- * Pending rows are due: rows due later are 'scheduled' (see stage), so a claim never
--   walks the future, whatever its priority.
-- * routes is every (queue, task_name, handler_version) the worker can run. candidates
--   walks pgqueue_task_claim once per route, an index-ordered top-N each, locking as it
--   goes, and stops: a row of a task or version the worker does not run, or of another
--   queue, is never read, at any count.
-- * The lock is FOR NO KEY UPDATE SKIP LOCKED: concurrent claimers never wait on, nor
--   take, a row another claimer is taking; under READ COMMITTED a locked row is
--   re-checked (EvalPlanQual), so a row claimed and committed by someone else meanwhile
--   no longer matches state = 'pending' and the walk goes on to the next. picked keeps
--   the best N of the routes' heads; with several busy routes the rest stay locked, and
--   unclaimed, only until this statement commits.
-- * The final UPDATE and every step look rows up by primary key (id = ANY(array)), so
--   even a generic plan, which cannot know how few they are, never turns a step into a
--   hash join over the backlog.
-- * The picks are MATERIALIZED CTEs: a plain subquery may be rescanned by the join
--   above it, and every rescan would lock (and claim) more rows than asked for.
-- * Starvation escape, bounded fleet-wide (looked for when %(look_for_starving)s: the
--   claimer asks once per window): when a queue's oldest due task (per route,
--   through pgqueue_task_due) has waited longer than the starvation timeout, one claim
--   in the whole fleet per window may take it regardless of priority. The window is
--   the queue's row in pgqueue_queue (last_escape_at, created on first use). It is
--   only read while closed (no lock: claims under a sustained backlog never queue up
--   on it); once it is open and a task is starving, the upsert in window_taken moves
--   it on, and a concurrent claim doing the same waits for this one, re-checks, and
--   escapes nothing. Under a sustained backlog of old work, priority still decides
--   every other start.
-- * attempt is incremented here, by the claim, so a task that kills its worker every
--   time still runs out of attempts (see recover_expired_leases).
-- * The lease token is the worker's, one per claim statement (%(token)s): if the reply
--   is lost after the server committed (a dropped connection), the worker finds what
--   it claimed with find_claimed instead of orphaning the rows until their lease lapses.
--   (id, attempt, token) still names each claim uniquely.
-- * The statement commits, durably, before any handler runs (a claim lost in a server
--   crash would put the row back to pending while its handler runs); it returns the
--   database's clock so the handler's deadline is derived from it. Every time it reads
--   or writes (due rows, rates, started_at, the lease, claimed_at) is the statement's
--   (statement_timestamp()), not the transaction's now(): a limited claim runs in a
--   transaction that may have waited for its queues' lock, and a task it takes may have
--   become due (a parent's settle committed) after that transaction began.
-- * Columns are returned by name: the worker reads them into ClaimedTask by name.
-- * Paused queues and paused task names (pgqueue_queue, by primary key) drop out of
--   routes: a pause is honoured by the next claim of every worker.
-- * Limits (docs/limits.md), for the queues in %(limit_queues)s (QUEUE_LIMITS) and the
--   routes with a key_limit (per-key concurrency). The claimer runs such a claim in a
--   transaction after lock_limited_queues, so that this statement's snapshot, taken
--   after the lock was granted, sees every claim of those queues committed before it:
--   counts of running rows cannot race. room is what each limited queue may still
--   start: its concurrency limit less its running rows (pgqueue_task_running), and
--   what its rate budget allows now (GCRA, limits.py: one start costs rate_interval
--   seconds of pgqueue_queue.rate_tat, at most rate_burst at once); rated spends it.
--   busy_keys counts running rows per (queue, concurrency_key); the walk skips rows of
--   a key at its limit (so they never block the rows behind them), and allowed keeps
--   at most what each key and each queue may start of what the walk found. A limited
--   queue takes no starvation escape (its limits already decide who starts). All of
--   it is empty for a worker without limits: four empty arrays.
-- * Per-key rates (docs/limits.md), for the routes with a key_rate_interval: the same
--   GCRA per (queue, concurrency_key), its state a row of pgqueue_key_rate (primary key
--   lookup per key the walk found, key_rates). allowed keeps at most what each key's
--   budget allows now (besides its concurrency); key_rated spends it, for the rows taken
--   only. The queue's lock (lock_limited_queues: a queue with rate-keyed routes is locked
--   like a limited one) makes reading and spending a key's budget race-free. Every claim
--   is a start: a retry or a recovered task spends its key's budget again. Rows of a key
--   out of budget that the walk met stay pending (locked by this statement only); a
--   claim that came back short, or whose walk found rows its keys held back (key_held,
--   returned on every row), is followed by snooze_throttled_keys in the same
--   transaction, which sets them aside, so that the walk does not meet them at every
--   claim (with several routes, a full claim may still hide a key at a route's head).
-- * Expiry (expires_at, docs/tasks.md): a picked row that never started and whose
--   expires_at has passed is not started. The final UPDATE ends it cancelled instead,
--   with an Expired error, and returns it flagged (expired) for the worker to count and
--   drop. Judged here, on the row the pick locked, by statement_timestamp() (this
--   statement's own start: a limited claim's transaction may have waited on its queue
--   lock): no check made earlier can pass a row that then starts after its expiry.
--   Ended here rather than filtered out of the walk, so the walk stays honest: a
--   filtered row would stay pending at the head of pgqueue_task_claim and be walked
--   over by every claim until something else ended it. An unexpired row costs one
--   comparison per column below and no read: expires_at is on the heap row the UPDATE
--   reads anyway. An expired row still fills a place of the batch (a rate-limited
--   queue spends one start of budget on it): the claim returns it, so the worker sees
--   a full batch and claims again at once. No executions entry: it never ran (like a
--   cancel). Its dependents follow after_failure (pgqueue_release_dependents).
-- * Batch bytes (%(claim_batch_bytes)s, CLAIM_BATCH_BYTES; NULL: no bound): a claim of
--   large rows takes fewer of them, so that one batch never loads more than the bound
--   into the worker. bytes is pg_column_size of the columns the worker loads (args,
--   kwargs, checkpoint, metadata, signals, wake): their stored size, read from the
--   heap row the walk fetched anyway (a TOASTed value is not fetched for it; a
--   compressed one counts compressed). picked sums them in its own order (a window
--   on the sort picked does anyway) and marks as fits the picks whose running sum,
--   after the escaped row's bytes, stays within the bound, always at least the first
--   row: a row larger than the bound is still claimed, alone. Only those are updated.
--   The picks left out were locked by this statement only: they stay pending, and
--   their locks end with this statement's transaction, so the next claim (of this
--   worker or another) takes them. The claim returns how many it left out (left_out):
--   the worker treats a cut batch as a full one and claims again at once, where a
--   short batch would make it park. The rate budget (rated) is spent on the rows
--   taken only.
-- * Fair share (docs/tenants.md), for the routes of fair tasks (route_fair): their walk
--   is pgqueue_task_fair, by priority, then virtual start time (fair_tag, which enqueue
--   and stage set), an index-ordered top-N like the other routes', whatever the number
--   of keys. Rows of all routes are then ordered by priority, then pos, their place in
--   line: for a fair route, how far its virtual start time lies behind its route's first
--   one here (so routes take turns), for the other routes, which together are one line,
--   their rank by run_at. With no fair route, pos follows run_at, and the order is the
--   plain one. The rows of a fair route without a key (enqueued by a release that did
--   not know the task as fair) are not in pgqueue_task_fair: the plain walk of the route
--   takes them, with them in its line, for the places its fair walk (fair_walk) left in
--   the batch; when the fair walk fills it, that walk does not start (LIMIT 0).
WITH routes AS (
    SELECT r.*
      FROM unnest(%(route_queues)s::text[], %(route_names)s::text[],
                  %(route_versions)s::int[], %(route_key_limits)s::int[],
                  %(route_key_rate_intervals)s::float8[], %(route_key_rate_bursts)s::int[],
                  %(route_fair)s::bool[])
           AS r(queue, task_name, version, key_limit, key_rate_interval, key_rate_burst, fair)
     WHERE NOT EXISTS (
               SELECT 1
                 FROM pgqueue_queue AS p
                WHERE p.name = r.queue
                  AND (p.paused OR p.paused_tasks ? r.task_name))
),
limits AS MATERIALIZED (
    SELECT l.queue, l.concurrency, l.rate_interval, l.rate_burst,
           (SELECT count(*)
              FROM pgqueue_task AS t
             WHERE t.state = 'running' AND t.queue = l.queue) AS running,
           GREATEST(q.rate_tat, statement_timestamp()) AS tat
      FROM unnest(%(limit_queues)s::text[], %(limit_concurrency)s::int[],
                  %(limit_rate_intervals)s::float8[], %(limit_rate_bursts)s::int[])
           AS l(queue, concurrency, rate_interval, rate_burst)
      LEFT JOIN pgqueue_queue AS q ON q.name = l.queue
),
room AS MATERIALIZED (
    SELECT queue, rate_interval, tat,
           LEAST(CASE WHEN concurrency IS NOT NULL
                      THEN GREATEST(0, concurrency - running) END,
                 CASE WHEN rate_interval IS NOT NULL
                      THEN GREATEST(0, floor(((rate_burst - 1) * rate_interval
                                              - EXTRACT(EPOCH FROM tat - statement_timestamp()))
                                             / rate_interval)::int + 1) END
           ) AS room
      FROM limits
),
busy_keys AS MATERIALIZED (
    SELECT t.queue, t.concurrency_key AS key, count(*) AS running
      FROM pgqueue_task AS t
     WHERE t.state = 'running'
       AND t.queue = ANY (%(keyed_queues)s::text[])
       AND t.concurrency_key IS NOT NULL
     GROUP BY 1, 2
),
window_open AS MATERIALIZED (
    SELECT q.queue
      FROM unnest(%(queues)s::text[]) AS q(queue)
     WHERE %(look_for_starving)s::bool
       AND q.queue <> ALL (%(limit_queues)s::text[])
       AND NOT EXISTS (
               SELECT 1
                 FROM pgqueue_queue AS w
                WHERE w.name = q.queue
                  AND w.last_escape_at > statement_timestamp() - make_interval(secs => %(escape_window_seconds)s))
),
starving AS MATERIALIZED (
    SELECT s.queue, s.id
      FROM window_open AS q,
           LATERAL (
               SELECT o.id, q.queue
                 FROM routes AS r,
                      LATERAL (
                          SELECT t.id, t.run_at
                            FROM pgqueue_task AS t
                           WHERE t.state = 'pending'
                             AND t.queue = r.queue AND t.task_name = r.task_name
                             AND t.handler_version = r.version
                             AND t.run_at <= statement_timestamp() - make_interval(secs => %(starvation_seconds)s)
                           ORDER BY t.run_at, t.id
                           LIMIT 1
                      ) AS o
                WHERE r.queue = q.queue AND r.key_limit IS NULL AND r.key_rate_interval IS NULL
                ORDER BY o.run_at, o.id
                LIMIT 1
           ) AS s
),
window_taken AS (
    INSERT INTO pgqueue_queue AS w (name, last_escape_at)
    SELECT queue, statement_timestamp() FROM starving
        ON CONFLICT (name) DO UPDATE
       SET last_escape_at = statement_timestamp()
     WHERE w.last_escape_at <= statement_timestamp() - make_interval(secs => %(escape_window_seconds)s)
    RETURNING w.name
),
escaped AS MATERIALIZED (
    SELECT t.id,
           pg_column_size(t.args) + pg_column_size(t.kwargs) + pg_column_size(t.metadata)
           + pg_column_size(t.signals) + COALESCE(pg_column_size(t.checkpoint), 0)
           + COALESCE(pg_column_size(t.wake), 0) AS bytes
      FROM starving AS s
      JOIN window_taken AS w ON w.name = s.queue
      JOIN pgqueue_task AS t ON t.id = s.id
     WHERE t.state = 'pending'
     LIMIT %(limit)s
       FOR NO KEY UPDATE OF t SKIP LOCKED
),
fair_walk AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_at, r.queue, r.task_name, r.version, c.concurrency_key,
           r.key_limit, c.bytes, r.key_rate_interval, r.key_rate_burst,
           COALESCE(c.fair_tag - min(c.fair_tag) OVER (PARTITION BY r.queue, r.task_name,
                                                                    r.version, c.priority),
                    0) AS pos
      FROM routes AS r
      LEFT JOIN room AS rm ON rm.queue = r.queue
     CROSS JOIN LATERAL (
               SELECT t.id, t.priority, t.run_at, t.concurrency_key, t.fair_tag,
                      pg_column_size(t.args) + pg_column_size(t.kwargs)
                      + pg_column_size(t.metadata) + pg_column_size(t.signals)
                      + COALESCE(pg_column_size(t.checkpoint), 0)
                      + COALESCE(pg_column_size(t.wake), 0) AS bytes
                 FROM pgqueue_task AS t
                WHERE t.state = 'pending' AND t.fair_key IS NOT NULL
                  AND t.queue = r.queue AND t.task_name = r.task_name
                  AND t.handler_version = r.version
                  AND t.id NOT IN (SELECT id FROM escaped)
                  AND (r.key_limit IS NULL OR t.concurrency_key IS NULL OR NOT EXISTS (
                          SELECT 1
                            FROM busy_keys AS b
                           WHERE b.queue = t.queue AND b.key = t.concurrency_key
                             AND b.running >= r.key_limit))
                ORDER BY t.priority DESC, t.fair_tag NULLS FIRST, t.id
                LIMIT LEAST(%(limit)s - (SELECT count(*) FROM escaped), rm.room)
                  FOR NO KEY UPDATE OF t SKIP LOCKED
           ) AS c
     WHERE r.fair
),
candidates AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_at, r.queue, c.concurrency_key, r.key_limit, c.bytes,
           r.key_rate_interval, r.key_rate_burst,
           row_number() OVER (PARTITION BY c.priority ORDER BY c.run_at, c.id) - 1 AS pos
      FROM routes AS r
      LEFT JOIN room AS rm ON rm.queue = r.queue
     CROSS JOIN LATERAL (
               SELECT t.id, t.priority, t.run_at, t.concurrency_key,
                      pg_column_size(t.args) + pg_column_size(t.kwargs)
                      + pg_column_size(t.metadata) + pg_column_size(t.signals)
                      + COALESCE(pg_column_size(t.checkpoint), 0)
                      + COALESCE(pg_column_size(t.wake), 0) AS bytes
                 FROM pgqueue_task AS t
                WHERE t.state = 'pending'
                  AND t.queue = r.queue AND t.task_name = r.task_name
                  AND t.handler_version = r.version
                  AND (NOT r.fair OR t.fair_key IS NULL)
                  AND t.id NOT IN (SELECT id FROM escaped)
                  AND (r.key_limit IS NULL OR t.concurrency_key IS NULL OR NOT EXISTS (
                          SELECT 1
                            FROM busy_keys AS b
                           WHERE b.queue = t.queue AND b.key = t.concurrency_key
                             AND b.running >= r.key_limit))
                ORDER BY t.priority DESC, t.run_at, t.id
                LIMIT LEAST(%(limit)s - (SELECT count(*) FROM escaped)
                            - CASE WHEN r.fair THEN (
                                  SELECT count(*)
                                    FROM fair_walk AS f
                                   WHERE f.queue = r.queue AND f.task_name = r.task_name
                                     AND f.version = r.version) ELSE 0 END,
                            rm.room)
                  FOR NO KEY UPDATE OF t SKIP LOCKED
           ) AS c
    UNION ALL
    SELECT id, priority, run_at, queue, concurrency_key, key_limit, bytes, key_rate_interval,
           key_rate_burst, pos
      FROM fair_walk
),
keyed AS MATERIALIZED (
    SELECT c.*,
           row_number() OVER (PARTITION BY c.queue, c.concurrency_key
                              ORDER BY c.priority DESC, c.pos, c.run_at, c.id) AS nth_of_key
      FROM candidates AS c
),
key_rates AS MATERIALIZED (
    SELECT c.queue, c.key,
           GREATEST((SELECT kr.tat
                       FROM pgqueue_key_rate AS kr
                      WHERE kr.queue = c.queue AND kr.key = c.key), statement_timestamp()) AS tat
      FROM (SELECT DISTINCT queue, concurrency_key AS key
              FROM candidates
             WHERE key_rate_interval IS NOT NULL AND concurrency_key IS NOT NULL) AS c
),
allowed AS MATERIALIZED (
    SELECT k.id, k.priority, k.pos, k.run_at, k.queue, k.bytes, k.concurrency_key,
           k.key_rate_interval,
           row_number() OVER (PARTITION BY k.queue
                              ORDER BY k.priority DESC, k.pos, k.run_at, k.id) AS nth_of_queue
      FROM keyed AS k
     WHERE (k.key_limit IS NULL OR k.concurrency_key IS NULL
            OR k.nth_of_key <= k.key_limit - COALESCE((
                   SELECT b.running
                     FROM busy_keys AS b
                    WHERE b.queue = k.queue AND b.key = k.concurrency_key), 0))
       AND (k.key_rate_interval IS NULL OR k.concurrency_key IS NULL
            OR k.nth_of_key <= (
                   SELECT floor(((k.key_rate_burst - 1) * k.key_rate_interval
                                 - EXTRACT(EPOCH FROM kr.tat - statement_timestamp()))
                                / k.key_rate_interval)::int + 1
                     FROM key_rates AS kr
                    WHERE kr.queue = k.queue AND kr.key = k.concurrency_key))
),
picked AS MATERIALIZED (
    SELECT a.id, a.queue, a.concurrency_key, a.key_rate_interval,
           %(claim_batch_bytes)s::bigint IS NULL
           OR sum(a.bytes) OVER pick + (SELECT COALESCE(sum(e.bytes), 0) FROM escaped AS e)
              <= %(claim_batch_bytes)s::bigint
           OR (row_number() OVER pick = 1 AND NOT EXISTS (SELECT 1 FROM escaped)) AS fits
      FROM allowed AS a
      LEFT JOIN room AS rm ON rm.queue = a.queue
     WHERE rm.room IS NULL OR a.nth_of_queue <= rm.room
    WINDOW pick AS (ORDER BY a.priority DESC, a.pos, a.run_at, a.id)
     ORDER BY a.priority DESC, a.pos, a.run_at, a.id
     LIMIT %(limit)s - (SELECT count(*) FROM escaped)
),
rated AS (
    INSERT INTO pgqueue_queue AS q (name, rate_tat)
    SELECT rm.queue, rm.tat + make_interval(secs => rm.rate_interval * p.n)
      FROM room AS rm
      JOIN (SELECT queue, count(*) AS n FROM picked WHERE fits GROUP BY queue) AS p
        ON p.queue = rm.queue
     WHERE rm.rate_interval IS NOT NULL
        ON CONFLICT (name) DO UPDATE
       SET rate_tat = EXCLUDED.rate_tat
),
key_rated AS (
    INSERT INTO pgqueue_key_rate AS k (queue, key, tat)
    SELECT kr.queue, kr.key, kr.tat + make_interval(secs => p.spent)
      FROM key_rates AS kr
      JOIN (SELECT queue, concurrency_key AS key, sum(key_rate_interval) AS spent
              FROM picked
             WHERE fits AND key_rate_interval IS NOT NULL AND concurrency_key IS NOT NULL
             GROUP BY 1, 2) AS p
        ON p.queue = kr.queue AND p.key = kr.key
        ON CONFLICT (queue, key) DO UPDATE
       SET tat = EXCLUDED.tat
)
UPDATE pgqueue_task AS t
   SET state = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                    THEN 'cancelled' ELSE 'running' END,
       attempt = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                      THEN t.attempt ELSE t.attempt + 1 END,
       lease_token = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                          THEN NULL ELSE %(token)s::uuid END,
       lease_expires_at = CASE WHEN t.started_at IS NULL
                                    AND t.expires_at <= statement_timestamp() THEN NULL
                               ELSE statement_timestamp() + make_interval(secs => %(lease_seconds)s) END,
       started_at = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                         THEN NULL ELSE COALESCE(t.started_at, statement_timestamp()) END,
       last_attempted_at = CASE WHEN t.started_at IS NULL
                                     AND t.expires_at <= statement_timestamp()
                                THEN t.last_attempted_at ELSE statement_timestamp() END,
       worker_id = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                        THEN t.worker_id ELSE %(worker_id)s END,
       finished_at = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                          THEN statement_timestamp() ELSE t.finished_at END,
       errors_dropped = t.errors_dropped
                        + CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                               THEN GREATEST(jsonb_array_length(t.errors) - 99, 0) ELSE 0 END,
       errors = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                     THEN jsonb_path_query_array(t.errors, '$[last - 98 to last]') || jsonb_build_array(jsonb_build_object(
                         'attempt', t.attempt,
                         'type', 'Expired',
                         'message', 'expired at '
                                    || to_char(t.expires_at AT TIME ZONE 'UTC',
                                               'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                                    || ', before it started',
                         'traceback', NULL,
                         'outcome', 'expired',
                         'worker_id', %(worker_id)s::text,
                         'at', statement_timestamp()))
                     ELSE t.errors END
 WHERE t.id = ANY (ARRAY(SELECT id FROM escaped UNION ALL SELECT id FROM picked WHERE fits))
RETURNING t.id, t.task_name, t.handler_version, t.queue, t.priority, t.args, t.kwargs,
          t.attempt, t.max_attempts, t.retry_policy::text AS retry_policy_json,
          EXTRACT(EPOCH FROM t.timeout)::float8 AS timeout, t.lease_token::text AS lease_token,
          t.lease_expires_at, statement_timestamp() AS claimed_at, t.enqueued_at, t.run_at,
          t.checkpoint::text AS checkpoint_json, t.cancel_requested, t.cancel_hard,
          t.metadata::text AS metadata_json,
          NULLIF(t.signals, '{}')::text AS signals_json, t.wake::text AS wake_json,
          t.fair_key, t.state = 'cancelled' AS expired,
          (SELECT count(*) FROM picked WHERE NOT fits) AS left_out,
          (SELECT count(*) FROM keyed) - (SELECT count(*) FROM allowed) AS key_held;


-- name: claim_plain
-- The claim of a worker lane without limits: no queue in QUEUE_LIMITS among its queues,
-- no route with a per-key concurrency or rate, and no starvation escape looked for in
-- this call (the claimer asks once per escape window, with the full claim). For those
-- parameters claim's limits, room, busy_keys, key_rates, window_open, starving,
-- window_taken, escaped, rated and key_rated are empty and its filters on them pass
-- every row, so what is left is this statement: the same routes (pauses), the same walk
-- of pgqueue_task_claim per route with the same lock (FOR NO KEY UPDATE SKIP LOCKED),
-- the same pick (priority, run_at, id), the same batch-bytes cut, and the same UPDATE
-- (expiry included) and columns. Every point of claim's header holds as written there.
-- Why a statement of its own: PostgreSQL starts up every node of a plan at every
-- execution, and claim's empty parts (among them two INSERTs, whose relations and
-- indexes are opened and locked) cost a third of a short claim's time; an idle worker's
-- claim after a wake-up, and a draining worker's every claim, are this one. The UPDATE
-- and its RETURNING are claim's, less the escaped rows and key_held (always 0 here);
-- tests/test_claim.py keeps them identical otherwise, and checks that both statements
-- take the same rows.
WITH routes AS (
    SELECT r.*
      FROM unnest(%(route_queues)s::text[], %(route_names)s::text[],
                  %(route_versions)s::int[])
           AS r(queue, task_name, version)
     WHERE NOT EXISTS (
               SELECT 1
                 FROM pgqueue_queue AS p
                WHERE p.name = r.queue
                  AND (p.paused OR p.paused_tasks ? r.task_name))
),
candidates AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_at, c.bytes
      FROM routes AS r
     CROSS JOIN LATERAL (
               SELECT t.id, t.priority, t.run_at,
                      pg_column_size(t.args) + pg_column_size(t.kwargs)
                      + pg_column_size(t.metadata) + pg_column_size(t.signals)
                      + COALESCE(pg_column_size(t.checkpoint), 0)
                      + COALESCE(pg_column_size(t.wake), 0) AS bytes
                 FROM pgqueue_task AS t
                WHERE t.state = 'pending'
                  AND t.queue = r.queue AND t.task_name = r.task_name
                  AND t.handler_version = r.version
                ORDER BY t.priority DESC, t.run_at, t.id
                LIMIT %(limit)s
                  FOR NO KEY UPDATE OF t SKIP LOCKED
           ) AS c
),
picked AS MATERIALIZED (
    SELECT a.id,
           %(claim_batch_bytes)s::bigint IS NULL
           OR sum(a.bytes) OVER pick <= %(claim_batch_bytes)s::bigint
           OR row_number() OVER pick = 1 AS fits
      FROM candidates AS a
    WINDOW pick AS (ORDER BY a.priority DESC, a.run_at, a.id)
     ORDER BY a.priority DESC, a.run_at, a.id
     LIMIT %(limit)s
)
UPDATE pgqueue_task AS t
   SET state = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                    THEN 'cancelled' ELSE 'running' END,
       attempt = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                      THEN t.attempt ELSE t.attempt + 1 END,
       lease_token = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                          THEN NULL ELSE %(token)s::uuid END,
       lease_expires_at = CASE WHEN t.started_at IS NULL
                                    AND t.expires_at <= statement_timestamp() THEN NULL
                               ELSE statement_timestamp() + make_interval(secs => %(lease_seconds)s) END,
       started_at = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                         THEN NULL ELSE COALESCE(t.started_at, statement_timestamp()) END,
       last_attempted_at = CASE WHEN t.started_at IS NULL
                                     AND t.expires_at <= statement_timestamp()
                                THEN t.last_attempted_at ELSE statement_timestamp() END,
       worker_id = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                        THEN t.worker_id ELSE %(worker_id)s END,
       finished_at = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                          THEN statement_timestamp() ELSE t.finished_at END,
       errors_dropped = t.errors_dropped
                        + CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                               THEN GREATEST(jsonb_array_length(t.errors) - 99, 0) ELSE 0 END,
       errors = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                     THEN jsonb_path_query_array(t.errors, '$[last - 98 to last]') || jsonb_build_array(jsonb_build_object(
                         'attempt', t.attempt,
                         'type', 'Expired',
                         'message', 'expired at '
                                    || to_char(t.expires_at AT TIME ZONE 'UTC',
                                               'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                                    || ', before it started',
                         'traceback', NULL,
                         'outcome', 'expired',
                         'worker_id', %(worker_id)s::text,
                         'at', statement_timestamp()))
                     ELSE t.errors END
 WHERE t.id = ANY (ARRAY(SELECT id FROM picked WHERE fits))
RETURNING t.id, t.task_name, t.handler_version, t.queue, t.priority, t.args, t.kwargs,
          t.attempt, t.max_attempts, t.retry_policy::text AS retry_policy_json,
          EXTRACT(EPOCH FROM t.timeout)::float8 AS timeout, t.lease_token::text AS lease_token,
          t.lease_expires_at, statement_timestamp() AS claimed_at, t.enqueued_at, t.run_at,
          t.checkpoint::text AS checkpoint_json, t.cancel_requested, t.cancel_hard,
          t.metadata::text AS metadata_json,
          NULLIF(t.signals, '{}')::text AS signals_json, t.wake::text AS wake_json,
          t.fair_key, t.state = 'cancelled' AS expired,
          (SELECT count(*) FROM picked WHERE NOT fits) AS left_out,
          0 AS key_held;


-- name: claim_fair
-- The claim of a worker lane with fair tasks (docs/tenants.md) and no limits, and no
-- starvation escape looked for in this call: claim_plain, with the routes of fair tasks
-- (route_fair) walked through pgqueue_task_fair (fair_walk: by priority, then fair_tag:
-- an index-ordered top-N per route, whatever the number of keys) and every row ordered
-- by priority, then its place in line (pos), as in claim, whose header explains it
-- (and the rows of a fair route without a key): for those parameters claim reduces to
-- this statement. The UPDATE and its RETURNING are
-- claim_plain's (tests/test_claim.py keeps them identical, and checks that claim and
-- this statement take the same rows).
WITH routes AS (
    SELECT r.*
      FROM unnest(%(route_queues)s::text[], %(route_names)s::text[],
                  %(route_versions)s::int[], %(route_fair)s::bool[])
           AS r(queue, task_name, version, fair)
     WHERE NOT EXISTS (
               SELECT 1
                 FROM pgqueue_queue AS p
                WHERE p.name = r.queue
                  AND (p.paused OR p.paused_tasks ? r.task_name))
),
fair_walk AS MATERIALIZED (
    SELECT r.queue, r.task_name, r.version, c.id, c.priority, c.run_at, c.bytes,
           COALESCE(c.fair_tag - min(c.fair_tag) OVER (PARTITION BY r.queue, r.task_name,
                                                                    r.version, c.priority),
                    0) AS pos
      FROM routes AS r
     CROSS JOIN LATERAL (
               SELECT t.id, t.priority, t.run_at, t.fair_tag,
                      pg_column_size(t.args) + pg_column_size(t.kwargs)
                      + pg_column_size(t.metadata) + pg_column_size(t.signals)
                      + COALESCE(pg_column_size(t.checkpoint), 0)
                      + COALESCE(pg_column_size(t.wake), 0) AS bytes
                 FROM pgqueue_task AS t
                WHERE t.state = 'pending' AND t.fair_key IS NOT NULL
                  AND t.queue = r.queue AND t.task_name = r.task_name
                  AND t.handler_version = r.version
                ORDER BY t.priority DESC, t.fair_tag NULLS FIRST, t.id
                LIMIT %(limit)s
                  FOR NO KEY UPDATE OF t SKIP LOCKED
           ) AS c
     WHERE r.fair
),
candidates AS MATERIALIZED (
    SELECT c.id, c.priority, c.run_at, c.bytes,
           row_number() OVER (PARTITION BY c.priority ORDER BY c.run_at, c.id) - 1 AS pos
      FROM routes AS r
     CROSS JOIN LATERAL (
               SELECT t.id, t.priority, t.run_at,
                      pg_column_size(t.args) + pg_column_size(t.kwargs)
                      + pg_column_size(t.metadata) + pg_column_size(t.signals)
                      + COALESCE(pg_column_size(t.checkpoint), 0)
                      + COALESCE(pg_column_size(t.wake), 0) AS bytes
                 FROM pgqueue_task AS t
                WHERE t.state = 'pending'
                  AND t.queue = r.queue AND t.task_name = r.task_name
                  AND t.handler_version = r.version
                  AND (NOT r.fair OR t.fair_key IS NULL)
                ORDER BY t.priority DESC, t.run_at, t.id
                LIMIT %(limit)s - CASE WHEN r.fair THEN (
                          SELECT count(*)
                            FROM fair_walk AS f
                           WHERE f.queue = r.queue AND f.task_name = r.task_name
                             AND f.version = r.version) ELSE 0 END
                  FOR NO KEY UPDATE OF t SKIP LOCKED
           ) AS c
    UNION ALL
    SELECT id, priority, run_at, bytes, pos FROM fair_walk
),
picked AS MATERIALIZED (
    SELECT a.id,
           %(claim_batch_bytes)s::bigint IS NULL
           OR sum(a.bytes) OVER pick <= %(claim_batch_bytes)s::bigint
           OR row_number() OVER pick = 1 AS fits
      FROM candidates AS a
    WINDOW pick AS (ORDER BY a.priority DESC, a.pos, a.run_at, a.id)
     ORDER BY a.priority DESC, a.pos, a.run_at, a.id
     LIMIT %(limit)s
)
UPDATE pgqueue_task AS t
   SET state = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                    THEN 'cancelled' ELSE 'running' END,
       attempt = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                      THEN t.attempt ELSE t.attempt + 1 END,
       lease_token = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                          THEN NULL ELSE %(token)s::uuid END,
       lease_expires_at = CASE WHEN t.started_at IS NULL
                                    AND t.expires_at <= statement_timestamp() THEN NULL
                               ELSE statement_timestamp() + make_interval(secs => %(lease_seconds)s) END,
       started_at = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                         THEN NULL ELSE COALESCE(t.started_at, statement_timestamp()) END,
       last_attempted_at = CASE WHEN t.started_at IS NULL
                                     AND t.expires_at <= statement_timestamp()
                                THEN t.last_attempted_at ELSE statement_timestamp() END,
       worker_id = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                        THEN t.worker_id ELSE %(worker_id)s END,
       finished_at = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                          THEN statement_timestamp() ELSE t.finished_at END,
       errors_dropped = t.errors_dropped
                        + CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                               THEN GREATEST(jsonb_array_length(t.errors) - 99, 0) ELSE 0 END,
       errors = CASE WHEN t.started_at IS NULL AND t.expires_at <= statement_timestamp()
                     THEN jsonb_path_query_array(t.errors, '$[last - 98 to last]') || jsonb_build_array(jsonb_build_object(
                         'attempt', t.attempt,
                         'type', 'Expired',
                         'message', 'expired at '
                                    || to_char(t.expires_at AT TIME ZONE 'UTC',
                                               'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                                    || ', before it started',
                         'traceback', NULL,
                         'outcome', 'expired',
                         'worker_id', %(worker_id)s::text,
                         'at', statement_timestamp()))
                     ELSE t.errors END
 WHERE t.id = ANY (ARRAY(SELECT id FROM picked WHERE fits))
RETURNING t.id, t.task_name, t.handler_version, t.queue, t.priority, t.args, t.kwargs,
          t.attempt, t.max_attempts, t.retry_policy::text AS retry_policy_json,
          EXTRACT(EPOCH FROM t.timeout)::float8 AS timeout, t.lease_token::text AS lease_token,
          t.lease_expires_at, statement_timestamp() AS claimed_at, t.enqueued_at, t.run_at,
          t.checkpoint::text AS checkpoint_json, t.cancel_requested, t.cancel_hard,
          t.metadata::text AS metadata_json,
          NULLIF(t.signals, '{}')::text AS signals_json, t.wake::text AS wake_json,
          t.fair_key, t.state = 'cancelled' AS expired,
          (SELECT count(*) FROM picked WHERE NOT fits) AS left_out,
          0 AS key_held;


-- name: find_claimed
-- After a claim whose reply never arrived (the connection dropped): the rows that claim
-- took, if the server committed it. Walks pgqueue_task_lease (running rows only).
SELECT t.id, t.task_name, t.handler_version, t.queue, t.priority, t.args, t.kwargs,
       t.attempt, t.max_attempts, t.retry_policy::text AS retry_policy_json,
       EXTRACT(EPOCH FROM t.timeout)::float8 AS timeout, t.lease_token::text AS lease_token,
       t.lease_expires_at, t.last_attempted_at AS claimed_at, t.enqueued_at, t.run_at,
       t.checkpoint::text AS checkpoint_json, t.cancel_requested, t.cancel_hard,
       t.metadata::text AS metadata_json,
       NULLIF(t.signals, '{}')::text AS signals_json, t.wake::text AS wake_json, t.fair_key
  FROM pgqueue_task AS t
 WHERE t.state = 'running'
   AND t.lease_token = ANY (%(tokens)s::uuid[]);


-- name: enqueue_after
-- A task that waits for others (after=[...], docs/workflows.md), in the caller's
-- transaction: waiting until its last parent ends (the pgqueue_release_dependents
-- trigger moves it on, in the transaction that ends that parent), or at once pending
-- (every parent succeeded already) or cancelled (a parent already failed or was
-- cancelled, unless it proceeds on failure).
-- * parents marks each parent has_dependents (by primary key). The UPDATE locks the
--   parent row, which is what closes the race with its end: a parent ending right now
--   either committed first (the UPDATE waits for it, then reads its end: the edge is
--   born resolved) or must wait for this transaction (its settlement skips the locked
--   row and retries; by then the edge is committed and the trigger sees it).
-- * Nothing is inserted when a parent does not exist: the caller gets no row back and
--   raises (a task can only wait for tasks that exist, so a cycle cannot be made).
-- * A waiting child with an expiry waits until it (wait_until = expires_at): the stager
--   finds it through pgqueue_task_wait_timeout and ends it cancelled (Expired) if its
--   parents have not released it by then (see stage).
-- * A fair task (docs/tenants.md) has its key, but no place in its key's flow: it
--   joins its line at the head when it becomes due (fair_tag NULL sorts first).
WITH parents AS MATERIALIZED (
    UPDATE pgqueue_task AS p
       SET has_dependents = true
     WHERE p.id = ANY (%(after)s::bigint[])
    RETURNING p.id, p.state, p.task_name
),
verdict AS MATERIALIZED (
    SELECT count(*) AS found,
           count(*) FILTER (WHERE state NOT IN ('succeeded', 'failed', 'cancelled')) AS open,
           min(id) FILTER (WHERE state IN ('failed', 'cancelled')) AS failed_id,
           min(state) FILTER (WHERE state IN ('failed', 'cancelled')) AS failed_state
      FROM parents
),
child AS (
    INSERT INTO pgqueue_task (
        id, queue, task_name, handler_version, priority, args, kwargs, run_at, state,
        max_attempts, retry_policy, timeout, unique_key, metadata, concurrency_key,
        parents_pending, wait_reason, finished_at, errors, expires_at, wait_until, fair_key
    )
    SELECT COALESCE(%(id)s, nextval('pgqueue_task_id_seq')),
           %(queue)s, %(task_name)s, %(handler_version)s, %(priority)s, %(args)s::jsonb,
           %(kwargs)s::jsonb, COALESCE(%(run_at)s, statement_timestamp() + %(delay)s),
           CASE WHEN v.failed_id IS NOT NULL AND NOT %(proceed)s THEN 'cancelled'
                WHEN v.open > 0 THEN 'waiting'
                ELSE %(state)s END,
           %(max_attempts)s, %(retry_policy)s::jsonb, %(timeout)s, NULL, %(metadata)s::jsonb,
           %(concurrency_key)s,
           v.open,
           CASE WHEN v.open > 0 AND (v.failed_id IS NULL OR %(proceed)s) THEN 'parents' END,
           CASE WHEN v.failed_id IS NOT NULL AND NOT %(proceed)s THEN now() END,
           CASE WHEN v.failed_id IS NOT NULL AND NOT %(proceed)s
                THEN jsonb_build_array(jsonb_build_object(
                         'attempt', 0, 'type', 'UpstreamFailed',
                         'message', 'task ' || v.failed_id || ', which this task waits for, '
                                    || 'had already ended ' || v.failed_state
                                    || '; enqueue with after_failure="run" to run anyway',
                         'traceback', NULL, 'outcome', 'cancelled', 'worker_id', NULL,
                         'at', now()))
                ELSE '[]'::jsonb END,
           e.expires_at,
           CASE WHEN v.open > 0 AND (v.failed_id IS NULL OR %(proceed)s) THEN e.expires_at END,
           %(fair_key)s
      FROM verdict AS v,
           (SELECT COALESCE(%(expires_at)s::timestamptz,
                            statement_timestamp() + %(expires)s::interval)) AS e(expires_at)
     WHERE v.found = cardinality(%(after)s::bigint[])
    RETURNING id, enqueued_at, state, queue
),
edges AS (
    INSERT INTO pgqueue_dependency (parent_id, child_id, resolved, proceed_on_failure)
    SELECT p.id, c.id, p.state IN ('succeeded', 'failed', 'cancelled'), %(proceed)s
      FROM parents AS p, child AS c
)
SELECT c.id, c.enqueued_at, c.state,
       CASE WHEN c.state = 'pending'
            THEN pg_notify('pgqueue_' || (hashtext(c.queue) & 63), c.queue)::text END
  FROM child AS c;


-- name: missing_tasks
-- Which of these ids name no task (enqueue_after's error message).
SELECT i FROM unnest(%(ids)s::bigint[]) AS i
 WHERE NOT EXISTS (SELECT 1 FROM pgqueue_task AS t WHERE t.id = i)
 ORDER BY i;


-- name: wait_for_tasks
-- A handler's context.wait_for(ids): edges from those tasks to its own, on the
-- handler's connection, fenced on its lease (a stale worker writes nothing and gets
-- no row back). Like enqueue_after, it marks each target has_dependents under its row
-- lock, so a target ending now is either seen ended (the edge is born resolved) or
-- sees the edge. proceed_on_failure: the waiting task resumes whatever the end. The
-- settlement of the suspension that follows decides waiting or pending (settle).
WITH me AS (
    SELECT id
      FROM pgqueue_task
     WHERE id = %(id)s AND attempt = %(attempt)s AND lease_token = %(token)s
       AND state = 'running'
),
targets AS MATERIALIZED (
    UPDATE pgqueue_task AS p
       SET has_dependents = true
      FROM me
     WHERE p.id = ANY (%(ids)s::bigint[]) AND p.id <> me.id
    RETURNING p.id, p.state
)
INSERT INTO pgqueue_dependency AS d (parent_id, child_id, resolved, proceed_on_failure)
SELECT t.id, me.id, t.state IN ('succeeded', 'failed', 'cancelled'), true
  FROM targets AS t, me
    ON CONFLICT (parent_id, child_id) DO UPDATE
   SET resolved = EXCLUDED.resolved, proceed_on_failure = true
RETURNING d.parent_id;


-- name: parent_results
-- context.parent_results(): the tasks this one waited for and how they ended, through
-- pgqueue_dep_child, then each parent by primary key; encrypted: the parent's result is
-- encrypted (its args are an object: encryption.py), for the reader to decrypt.
SELECT p.id, p.task_name, p.state, p.result, p.errors -> -1 ->> 'message',
       jsonb_typeof(p.args) = 'object' AS encrypted
  FROM pgqueue_dependency AS d
  JOIN pgqueue_task AS p ON p.id = d.parent_id
 WHERE d.child_id = %(id)s
 ORDER BY p.id;


-- name: signal_task
-- signal(task_id, name, payload): deliver a signal. It is kept in signals whatever the
-- task's state (a signal sent before the task suspends is not lost: the suspension's
-- settlement finds it); a task waiting for this very signal becomes pending at once,
-- with wake naming it, and its queue is woken. State-checked, not fenced: signals come
-- from outside the worker. The row lock (old, by primary key) serialises it with a
-- settlement of the same row: either the settlement sees the signal, or this sees the
-- task waiting. A finished task takes no signal (no row is returned).
-- Encrypted: the payload is sealed (%(sealed)s) for an encrypted row (its args are an
-- object: encryption.py), plain for a plain row; the sender reads which first
-- (task_encrypted), so no cleartext is sent for an encrypted row. A row of the other
-- kind (replaced meanwhile by an enqueue with on_conflict="replace") takes nothing and
-- comes back with its own kind, for the sender to send again.
-- Bounded: signals keeps each name's last payload until the task ends, so the value
-- the row would hold with this signal (names, and bytes as PostgreSQL writes it as
-- JSON text) is measured on the locked row, and past %(max_names)s or %(max_bytes)s
-- (MAX_TASK_SIGNALS, MAX_TASK_SIGNALS_BYTES; NULL: no bound) nothing is written: the
-- row comes back with fits false. Measured under the row lock, so two signals sent
-- at once cannot both pass a bound that only one fits. The bytes are only counted
-- with a bound (the value is written out as text for it).
WITH old AS MATERIALIZED (
    SELECT t.id, jsonb_typeof(t.args) = 'object' AS encrypted,
           (t.state = 'waiting' AND t.wait_reason = 'signal'
            AND t.wait_signal = %(name)s::text) AS resumes,
           (SELECT count(*) FROM jsonb_object_keys(t.signals || n.signal)) AS names,
           CASE WHEN %(max_bytes)s::bigint IS NOT NULL
                THEN octet_length((t.signals || n.signal)::text) END AS bytes
      FROM pgqueue_task AS t,
           (SELECT jsonb_build_object(%(name)s::text, %(payload)s::jsonb)) AS n(signal)
     WHERE t.id = %(id)s
       AND t.state IN ('scheduled', 'pending', 'running', 'waiting')
       FOR NO KEY UPDATE OF t
),
bounded AS MATERIALIZED (
    SELECT o.*,
           (%(max_names)s::int IS NULL OR o.names <= %(max_names)s::int)
           AND (%(max_bytes)s::bigint IS NULL OR o.bytes <= %(max_bytes)s::bigint) AS fits
      FROM old AS o
),
signalled AS (
    UPDATE pgqueue_task AS t
       SET signals = t.signals || jsonb_build_object(%(name)s::text, %(payload)s::jsonb),
           state = CASE WHEN o.resumes THEN 'pending' ELSE t.state END,
           run_at = CASE WHEN o.resumes THEN now() ELSE t.run_at END,
           wake = CASE WHEN o.resumes
                       THEN jsonb_build_object('reason', 'signal', 'signal', %(name)s::text,
                                               'payload', %(payload)s::jsonb)
                       ELSE t.wake END,
           wait_reason = CASE WHEN o.resumes THEN NULL ELSE t.wait_reason END,
           wait_signal = CASE WHEN o.resumes THEN NULL ELSE t.wait_signal END,
           wait_until = CASE WHEN o.resumes THEN NULL ELSE t.wait_until END
      FROM bounded AS o
     WHERE t.id = o.id
       AND o.fits
       AND o.encrypted = %(sealed)s
    RETURNING t.id, t.queue, t.state, o.resumes
)
SELECT o.id, s.state, COALESCE(s.resumes, false) AS resumes,
       CASE WHEN s.resumes
            THEN pg_notify('pgqueue_' || (hashtext(s.queue) & 63), s.queue)::text END,
       o.fits, o.names, o.bytes, o.encrypted
  FROM bounded AS o
  LEFT JOIN signalled AS s ON s.id = o.id;


-- name: task_encrypted
-- signal(): whether a task's payloads are encrypted (its args are an object), read
-- before signal_task so that an encrypted task's payload is sent sealed only. By
-- primary key; no row for no task.
SELECT jsonb_typeof(args) = 'object' FROM pgqueue_task WHERE id = %(id)s;


-- name: lock_limited_queues
-- Before a limited claim, in its transaction: one advisory transaction lock per limited
-- (or keyed) queue (class 1885827330, object hashtext(queue)), taken in one order (by
-- the lock's object) so two claimers never deadlock. Claims of one limited queue take
-- turns for the length of one claim. It is a statement of its own because READ
-- COMMITTED takes a statement's snapshot when it starts: the claim that follows sees
-- everything the previous holder committed.
-- It waits at most %(lock_timeout)s ms (lock_timeout, for this transaction only: set
-- first, as the lateral join orders it): a worker frozen inside its claim (SIGSTOP, a
-- VM pause) would otherwise hold up every other worker's claims, of every queue claimed
-- together with a limited one, until its transaction ended. Past it the statement
-- fails (lock_not_available); the claimer claims its other queues and, for a while,
-- only tries these locks (try_lock_limited_queues).
SELECT count(pg_advisory_xact_lock(1885827330, s.h))
  FROM (SELECT set_config('lock_timeout', %(lock_timeout)s, true) AS t) AS c,
       LATERAL (SELECT DISTINCT hashtext(q) AS h
                  FROM unnest(%(queues)s::text[]) AS q
                 WHERE c.t IS NOT NULL
                 ORDER BY 1
                OFFSET 0) AS s;


-- name: try_lock_limited_queues
-- lock_limited_queues without waiting, while a lock of these queues was found held
-- past its lock_timeout (its holder is likely frozen): the queues it locked. The
-- claimer claims those and its other queues, and leaves out the rest. Try-locks never
-- deadlock, whatever their order.
SELECT coalesce(array_agg(q ORDER BY q) FILTER (WHERE locked), '{}')
  FROM (SELECT q, pg_try_advisory_xact_lock(1885827330, hashtext(q)) AS locked
          FROM (SELECT DISTINCT q FROM unnest(%(queues)s::text[]) AS q
                 ORDER BY 1
                OFFSET 0) AS d) AS t;


-- name: snooze_throttled_keys
-- After a short claim of routes with a per-key rate, in the claim's transaction (so
-- under its queue locks, and seeing the budget the claim just spent): the rows among
-- the first %(limit)s of each such route (pgqueue_task_claim, in the claim's order) whose
-- key has no budget now are set aside: 'scheduled' until their key's next start, so the
-- claims that follow walk past them in no time, and the stager makes them pending when
-- they are due. Without it, a key with a long backlog at its rate would be walked over
-- (read, locked and left) by every claim before the rows of the keys behind it.
-- The rows of one key are spaced by its rate from its next start, or from where the
-- rows it set aside before end (pgqueue_key_rate.snoozed_until), so that each comes due
-- about when its key has budget for it: a row is set aside about once, not at every
-- claim. They keep their priority; their run_at becomes that time (not before what it
-- was). SKIP LOCKED: a row another claimer (of a worker without the rate) is taking is
-- left to it. Returns how many rows it set aside.
WITH routes AS (
    SELECT r.*
      FROM unnest(%(route_queues)s::text[], %(route_names)s::text[],
                  %(route_versions)s::int[], %(route_key_rate_intervals)s::float8[],
                  %(route_key_rate_bursts)s::int[])
           AS r(queue, task_name, version, rate_interval, rate_burst)
     WHERE r.rate_interval IS NOT NULL
),
heads AS MATERIALIZED (
    SELECT h.id, h.priority, h.run_at, r.queue, h.concurrency_key AS key,
           r.rate_interval, r.rate_burst
      FROM routes AS r
     CROSS JOIN LATERAL (
               SELECT t.id, t.priority, t.run_at, t.concurrency_key
                 FROM pgqueue_task AS t
                WHERE t.state = 'pending'
                  AND t.queue = r.queue AND t.task_name = r.task_name
                  AND t.handler_version = r.version
                ORDER BY t.priority DESC, t.run_at, t.id
                LIMIT %(limit)s
           ) AS h
     WHERE h.concurrency_key IS NOT NULL
),
throttled AS MATERIALIZED (
    SELECT h.id, h.queue, h.key,
           k.base + make_interval(secs => h.rate_interval
                                          * (row_number() OVER (PARTITION BY h.queue, h.key
                                                                ORDER BY h.priority DESC,
                                                                         h.run_at, h.id)
                                             - 1)) AS due,
           k.base + make_interval(secs => h.rate_interval
                                          * count(*) OVER (PARTITION BY h.queue, h.key))
               AS until
      FROM heads AS h
     CROSS JOIN LATERAL (
               SELECT GREATEST(k.tat - make_interval(secs => (h.rate_burst - 1)
                                                             * h.rate_interval),
                               k.snoozed_until) AS base
                 FROM pgqueue_key_rate AS k
                WHERE k.queue = h.queue AND k.key = h.key
                  AND k.tat - make_interval(secs => (h.rate_burst - 1) * h.rate_interval)
                      > now()
               OFFSET 0
           ) AS k
),
locked AS MATERIALIZED (
    SELECT t.id, th.due
      FROM throttled AS th
      JOIN pgqueue_task AS t ON t.id = th.id
     WHERE t.state = 'pending'
       FOR NO KEY UPDATE OF t SKIP LOCKED
),
snoozed AS (
    UPDATE pgqueue_task AS t
       SET state = 'scheduled',
           run_at = GREATEST(t.run_at, (SELECT l.due FROM locked AS l WHERE l.id = t.id))
     WHERE t.id = ANY (ARRAY(SELECT id FROM locked))
    RETURNING t.id
),
spaced AS (
    UPDATE pgqueue_key_rate AS k
       SET snoozed_until = (SELECT max(th.until)
                              FROM throttled AS th
                             WHERE th.queue = k.queue AND th.key = k.key)
     WHERE k.queue = ANY (ARRAY(SELECT DISTINCT queue FROM throttled))
       AND k.key = ANY (ARRAY(SELECT DISTINCT key FROM throttled))
)
SELECT count(*) FROM snoozed;


-- name: prune_key_rates
-- The sweeper: rows of pgqueue_key_rate whose budget is whole again (tat past) and
-- that space no set-aside rows any more are the same as no row: deleted, in batches.
-- A claim that read such a row before it went spends from now() either way (GREATEST),
-- and inserts it again (ON CONFLICT on a row that is gone inserts).
WITH gone AS (
    DELETE FROM pgqueue_key_rate AS k
     USING (SELECT queue, key
              FROM pgqueue_key_rate
             WHERE tat < now() AND (snoozed_until IS NULL OR snoozed_until < now())
             LIMIT %(limit)s
               FOR UPDATE SKIP LOCKED) AS old
     WHERE k.queue = old.queue AND k.key = old.key
    RETURNING 1
)
SELECT count(*) FROM gone;


-- name: limit_state
-- After a claim of a rate-limited lane came back short: why. Per limited queue,
-- whether it still has pending rows of the worker's routes (one probe of
-- pgqueue_task_claim per route), its running rows (pgqueue_task_running), and when its
-- rate budget allows the next start (seconds from now; <= 0: now). The claimer parks
-- until then, or until a settlement in the queue notifies that a running task ended.
SELECT l.queue,
       EXISTS (SELECT 1
                 FROM unnest(%(route_queues)s::text[], %(route_names)s::text[],
                             %(route_versions)s::int[]) AS r(queue, task_name, version)
                WHERE r.queue = l.queue
                  AND EXISTS (SELECT 1
                                FROM pgqueue_task AS t
                               WHERE t.state = 'pending' AND t.queue = r.queue
                                 AND t.task_name = r.task_name
                                 AND t.handler_version = r.version)) AS backlog,
       (SELECT count(*)
          FROM pgqueue_task AS t
         WHERE t.state = 'running' AND t.queue = l.queue) AS running,
       EXTRACT(EPOCH FROM q.rate_tat - now())::float8 AS rate_tat_in
  FROM unnest(%(queues)s::text[]) AS l(queue)
  LEFT JOIN pgqueue_queue AS q ON q.name = l.queue;


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


-- name: stage
-- The stager: scheduled rows of these queues whose run_at has come become pending, in
-- batches of %(limit)s, through pgqueue_task_scheduled (an index range scan that stops
-- at the first row not yet due). Run by each claimer before a claim when a scheduled
-- task of its queues is due (it sleeps until the next one) and at most every
-- STAGE_INTERVAL while busy. SKIP LOCKED: claimers of one queue stage in parallel
-- without waiting on each other. Wakes the queues it made due: other workers may be
-- idle. It also ends suspensions whose timeout passed (pgqueue_task_wait_timeout, the
-- same stop-at-the-first-not-due range scan): pending, with wake saying so.
-- Expiry (see claim): a row it finds that never started and whose expires_at has passed
-- ends cancelled with an Expired error instead of becoming pending: a scheduled row
-- when it comes due (so at its run_at, if that is later than its expiry), a row
-- waiting for its parents at its expiry (enqueue_after sets its wait_until to it).
-- expired counts them per queue; only queues with rows made pending are woken.
-- Fair tasks (docs/tenants.md) get their places in their keys' flows as they become
-- due, as enqueue_keyed gives them to tasks due at once: per flow of the batch, one
-- probe of pgqueue_task_fair_flow and one of pgqueue_task_fair, then one step
-- (1 / weight) apart in the order they were due. Weights: pgqueue_fair_weight, else
-- FAIR_WEIGHTS (%(fair_weight_keys)s, %(fair_weight_values)s), else 1. So a key's
-- tasks scheduled for one moment take their turns then, not all at the head; a batch
-- without fair tasks skips it (fair_due is empty).
WITH due AS MATERIALIZED (
    SELECT id, queue, task_name, handler_version, priority, fair_key, run_at
      FROM pgqueue_task
     WHERE state = 'scheduled'
       AND queue = ANY (%(queues)s::text[])
       AND run_at <= now()
     LIMIT %(limit)s
       FOR NO KEY UPDATE SKIP LOCKED
),
fair_flows AS MATERIALIZED (
    SELECT f.queue, f.task_name, f.handler_version, f.fair_key, f.priority, s.step,
           COALESCE(GREATEST(
               (SELECT h.fair_tag
                  FROM pgqueue_task AS h
                 WHERE h.state = 'pending' AND h.fair_key IS NOT NULL
                   AND h.queue = f.queue AND h.task_name = f.task_name
                   AND h.handler_version = f.handler_version AND h.priority = f.priority
                   AND h.fair_tag IS NOT NULL
                 ORDER BY h.fair_tag NULLS FIRST
                 LIMIT 1),
               (SELECT t.fair_tag
                  FROM pgqueue_task AS t
                 WHERE t.state = 'pending' AND t.fair_key IS NOT NULL
                   AND t.queue = f.queue AND t.task_name = f.task_name
                   AND t.handler_version = f.handler_version AND t.fair_key = f.fair_key
                   AND t.priority = f.priority AND t.fair_tag IS NOT NULL
                 ORDER BY t.fair_tag DESC
                 LIMIT 1) + s.step), 0) AS base
      FROM (SELECT DISTINCT queue, task_name, handler_version, fair_key, priority
              FROM due
             WHERE fair_key IS NOT NULL) AS f
     CROSS JOIN LATERAL (
               SELECT 1.0 / COALESCE(
                          (SELECT w.weight
                             FROM pgqueue_fair_weight AS w
                            WHERE w.key = f.fair_key
                               OR (right(w.key, 1) = '*'
                                   AND starts_with(f.fair_key, left(w.key, -1)))
                            ORDER BY w.key = f.fair_key DESC, length(w.key) DESC
                            LIMIT 1),
                          (SELECT c.weight
                             FROM unnest(%(fair_weight_keys)s::text[],
                                         %(fair_weight_values)s::float8[]) AS c(key, weight)
                            WHERE c.key = f.fair_key
                               OR (right(c.key, 1) = '*'
                                   AND starts_with(f.fair_key, left(c.key, -1)))
                            ORDER BY c.key = f.fair_key DESC, length(c.key) DESC
                            LIMIT 1),
                          1) AS step
           ) AS s
),
fair_due AS MATERIALIZED (
    SELECT d.id,
           f.base + (row_number() OVER (PARTITION BY f.queue, f.task_name, f.handler_version,
                                                     f.fair_key, f.priority
                                        ORDER BY d.run_at, d.id) - 1) * f.step AS tag
      FROM due AS d
      JOIN fair_flows AS f
        ON f.queue = d.queue AND f.task_name = d.task_name
       AND f.handler_version = d.handler_version AND f.fair_key = d.fair_key
       AND f.priority = d.priority
),
staged AS (
    UPDATE pgqueue_task AS t
       SET state = CASE WHEN t.started_at IS NULL AND t.expires_at <= now()
                        THEN 'cancelled' ELSE 'pending' END,
           fair_tag = CASE WHEN t.fair_key IS NULL THEN t.fair_tag ELSE f.tag END,
           finished_at = CASE WHEN t.started_at IS NULL AND t.expires_at <= now()
                              THEN now() END,
           errors_dropped = t.errors_dropped
                            + CASE WHEN t.started_at IS NULL AND t.expires_at <= now()
                                   THEN GREATEST(jsonb_array_length(t.errors) - 99, 0) ELSE 0 END,
           errors = CASE WHEN t.started_at IS NULL AND t.expires_at <= now()
                         THEN jsonb_path_query_array(t.errors, '$[last - 98 to last]') || jsonb_build_array(jsonb_build_object(
                             'attempt', t.attempt, 'type', 'Expired',
                             'message', 'expired at '
                                        || to_char(t.expires_at AT TIME ZONE 'UTC',
                                                   'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                                        || ', before it started',
                             'traceback', NULL, 'outcome', 'expired', 'worker_id', NULL,
                             'at', now()))
                         ELSE t.errors END
      FROM due
      LEFT JOIN fair_due AS f ON f.id = due.id
     WHERE t.id = due.id
    RETURNING t.queue, t.state
),
timed_out AS MATERIALIZED (
    SELECT id
      FROM pgqueue_task
     WHERE state = 'waiting'
       AND queue = ANY (%(queues)s::text[])
       AND wait_until <= now()
     LIMIT %(limit)s
       FOR NO KEY UPDATE SKIP LOCKED
),
woken AS (
    UPDATE pgqueue_task AS t
       SET state = CASE WHEN t.started_at IS NULL AND t.expires_at <= now()
                        THEN 'cancelled' ELSE 'pending' END,
           run_at = now(),
           wake = CASE WHEN t.started_at IS NULL AND t.expires_at <= now() THEN t.wake
                       ELSE jsonb_build_object('reason', 'timeout', 'waited_for', t.wait_reason,
                                               'signal', t.wait_signal) END,
           finished_at = CASE WHEN t.started_at IS NULL AND t.expires_at <= now()
                              THEN now() END,
           errors_dropped = t.errors_dropped
                            + CASE WHEN t.started_at IS NULL AND t.expires_at <= now()
                                   THEN GREATEST(jsonb_array_length(t.errors) - 99, 0) ELSE 0 END,
           errors = CASE WHEN t.started_at IS NULL AND t.expires_at <= now()
                         THEN jsonb_path_query_array(t.errors, '$[last - 98 to last]') || jsonb_build_array(jsonb_build_object(
                             'attempt', t.attempt, 'type', 'Expired',
                             'message', 'expired at '
                                        || to_char(t.expires_at AT TIME ZONE 'UTC',
                                                   'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                                        || ', before it started (still waiting for '
                                        || COALESCE(t.wait_reason, '?') || ')',
                             'traceback', NULL, 'outcome', 'expired', 'worker_id', NULL,
                             'at', now()))
                         ELSE t.errors END,
           wait_reason = NULL,
           wait_signal = NULL,
           wait_until = NULL
      FROM timed_out
     WHERE t.id = timed_out.id
    RETURNING t.queue, t.state
)
SELECT queue, count(*) FILTER (WHERE state = 'pending') AS staged,
       CASE WHEN count(*) FILTER (WHERE state = 'pending') > 0
            THEN pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text END AS notified,
       count(*) FILTER (WHERE state = 'cancelled') AS expired
  FROM (SELECT queue, state FROM staged UNION ALL SELECT queue, state FROM woken) AS s
 GROUP BY queue;


-- name: next_due
-- When the claimer found nothing more to take: how long until the earliest scheduled
-- task of its queues is due (or a suspension times out, pgqueue_task_wait_timeout), so
-- it sleeps until then rather than until the next poll.
-- One index probe per queue on pgqueue_task_scheduled (a LIMIT 1 each; a min() over
-- queue = ANY(...) would read every scheduled row).
SELECT EXTRACT(EPOCH FROM min(n.run_at) - now())::float8 AS seconds
  FROM unnest(%(queues)s::text[]) AS q(queue),
       LATERAL (
           (SELECT run_at
              FROM pgqueue_task
             WHERE state = 'scheduled' AND queue = q.queue
             ORDER BY run_at, id
             LIMIT 1)
           UNION ALL
           (SELECT wait_until
              FROM pgqueue_task
             WHERE state = 'waiting' AND wait_until IS NOT NULL AND queue = q.queue
             ORDER BY wait_until, id
             LIMIT 1)
       ) AS n(run_at);


-- name: schedules_changed
-- A schedule was added, changed, paused, resumed or removed (runtime_schedules.py), in
-- the caller's transaction: tell every worker, delivered at its commit. Every one of the
-- 64 channels (each claimer LISTENs on its queues' channels), with a payload no queue
-- name can be (QUEUE_NAME has no space): the listener passes it to its scheduler, which
-- reads the schedule rows at once (scheduler.py). An operator's action, rare: the 64
-- notifications cost nothing that matters.
SELECT count(pg_notify('pgqueue_' || n, 'schedules changed')) FROM generate_series(0, 63) AS n;


-- name: listen_channels
-- The notification channels of these queues: one of 64 per queue, by hashtext, the
-- same expression every notifying statement uses (keep them in step), with the
-- channel's number (the object of its two advisory locks, see the header).
SELECT DISTINCT 'pgqueue_' || (hashtext(q) & 63) AS channel, hashtext(q) & 63 AS number
  FROM unnest(%(queues)s::text[]) AS q;


-- name: park_prepare
-- A claimer about to park (see the header, "Wake-ups"), per channel number: take the
-- parked mark (PARKED shared, a session lock kept while parked) unless it holds it
-- already, then check that no enqueue is in flight that may have asked before the mark
-- was taken (an exclusive try on ENQUEUING, released at once; never a blocking wait,
-- which would queue every new enqueue behind it). 'clear': the claimer claims once
-- more and may then park for as long as it likes; 'in_flight': it retries shortly;
-- 'unmarked': an enqueue held the mark's lock for its probe at this instant, retry.
SELECT c AS number,
       CASE
           WHEN NOT (CASE WHEN c = ANY(%(held)s::int[]) THEN true
                          ELSE pg_try_advisory_lock_shared(1885827329, c) END)
               THEN 'unmarked'
           WHEN pg_try_advisory_lock(1885827328, c)
               THEN CASE WHEN pg_advisory_unlock(1885827328, c) THEN 'clear' END
           ELSE 'in_flight'
       END AS status
  FROM unnest(%(channels)s::int[]) AS c;


-- name: park_release
-- A claimer that is busy again drops its parked marks: enqueues stop notifying it.
SELECT pg_advisory_unlock_shared(1885827329, c) FROM unnest(%(channels)s::int[]) AS c;


-- name: settle
-- Write back a batch of outcomes in one statement. Each row is fenced on
-- (id, attempt, lease_token, state = 'running'): a worker whose lease was recovered
-- and re-claimed by another worker matches nothing, and learns it from the returned
-- leases (the missing ones are checked with settle_check). The worker computes each
-- row's target state (it holds the claimed row's attempt, max_attempts and frozen
-- retry policy).
--
-- * mine takes the row locks with SKIP LOCKED: a row locked by someone else (its own
--   handler's open transaction after a checkpoint inside atomic(), then a hang) is
--   skipped and retried later, so one row can never stall the settlement of the batch.
-- * A cancel requested while the handler ran wins over a retry: such a row ends
--   cancelled instead of going back to pending. A retry with a delay is 'scheduled'.
-- * Each settlement appends an executions entry with the lease token (source
--   'settle'): a settle replayed after its reply was lost recognises its own earlier
--   write by it (settle_check). The history keeps the last 100 executions.
-- * A suspension (state 'waiting', docs/workflows.md) refunds the attempt and waits for
--   its signal, or for the tasks wait_for named (their pgqueue_dependency edges, locked
--   FOR UPDATE by waits: the trigger that resolves an edge locks it too, so either this
--   statement sees the edge resolved, or the trigger sees this row waiting). It is
--   pending at once when the signal already came (signals) or no edge is left open.
-- * Rows made due again send a wake-up. So does a settlement that frees room workers
--   may be parked for: in a queue of %(limit_queues)s that was at its concurrency limit
--   (%(limit_concurrency)s) when the statement began (a count of pgqueue_task_running;
--   below the limit nobody waits for room), or of a row with a concurrency_key.
-- * Times are statement_timestamp(): the settler runs this in autocommit, where it is
--   now(); an atomic task runs it as the last statement of its handler's transaction
--   (after hold_lease), whose now() is the handler's start.
WITH v AS (
    SELECT *
      FROM jsonb_to_recordset(%(outcomes)s::jsonb) AS v(
               id bigint, attempt int, token uuid, label text, state text, result jsonb,
               error jsonb, delay float8, attempt_reset bool, attempt_refund bool,
               checkpoint jsonb, save_checkpoint bool, wait_reason text, wait_signal text,
               wait_seconds float8)
),
waits AS MATERIALIZED (
    SELECT d.child_id
      FROM v
      JOIN pgqueue_dependency AS d ON d.child_id = v.id
     WHERE v.wait_reason = 'child' AND NOT d.resolved
       FOR UPDATE OF d
),
mine AS MATERIALIZED (
    SELECT t.id, v.attempt AS held_attempt, v.token AS held_token,
           CASE WHEN t.cancel_requested AND v.state IN ('pending', 'waiting') THEN 'cancelled'
                WHEN v.state = 'pending' AND COALESCE(v.delay, 0) > 0 THEN 'scheduled'
                WHEN v.state = 'waiting' AND v.wait_reason = 'signal'
                     AND t.signals ? v.wait_signal THEN 'pending'
                WHEN v.state = 'waiting' AND v.wait_reason = 'child'
                     AND NOT EXISTS (SELECT 1 FROM waits AS w WHERE w.child_id = t.id)
                     THEN 'pending'
                ELSE v.state END AS new_state,
           (SELECT count(*) FROM waits AS w WHERE w.child_id = t.id) AS open_waits
      FROM pgqueue_task AS t
      JOIN v ON t.id = v.id AND t.attempt = v.attempt AND t.lease_token = v.token
     WHERE t.state = 'running'
       FOR NO KEY UPDATE OF t SKIP LOCKED
),
settled AS (
    UPDATE pgqueue_task AS t
       SET state = m.new_state,
           result = CASE WHEN v.state = 'succeeded' THEN v.result ELSE t.result END,
           errors = CASE WHEN v.error IS NULL THEN t.errors
                         ELSE jsonb_path_query_array(t.errors, '$[last - 98 to last]') || jsonb_build_array(
                             v.error || jsonb_build_object('at', statement_timestamp(),
                                                           'worker_id', t.worker_id))
                    END,
           errors_dropped = t.errors_dropped
                            + CASE WHEN v.error IS NULL THEN 0 ELSE GREATEST(jsonb_array_length(t.errors) - 99, 0) END,
           executions = CASE WHEN jsonb_array_length(t.executions) >= 100
                             THEN t.executions - 0 ELSE t.executions END
                        || jsonb_build_array(jsonb_build_object(
                               'attempt', t.attempt, 'token', t.lease_token,
                               'worker', t.worker_id, 'started', t.last_attempted_at,
                               'ended', statement_timestamp(), 'outcome', v.label, 'state', m.new_state,
                               'source', 'settle')),
           run_at = CASE WHEN m.new_state IN ('pending', 'scheduled')
                         THEN statement_timestamp() + make_interval(secs => COALESCE(v.delay, 0))
                         ELSE t.run_at END,
           finished_at = CASE WHEN m.new_state IN ('pending', 'scheduled', 'waiting') THEN NULL
                              ELSE statement_timestamp() END,
           wait_reason = CASE WHEN m.new_state = 'waiting' THEN v.wait_reason END,
           wait_signal = CASE WHEN m.new_state = 'waiting' THEN v.wait_signal END,
           wait_until = CASE WHEN m.new_state = 'waiting' AND v.wait_seconds IS NOT NULL
                             THEN statement_timestamp() + make_interval(secs => v.wait_seconds) END,
           parents_pending = CASE WHEN m.new_state = 'waiting' AND v.wait_reason = 'child'
                                  THEN m.open_waits ELSE t.parents_pending END,
           wake = CASE WHEN v.state = 'waiting' AND m.new_state = 'pending'
                       THEN jsonb_build_object('reason', v.wait_reason, 'signal', v.wait_signal,
                                               'payload', t.signals -> v.wait_signal) END,
           attempt = CASE WHEN v.attempt_reset THEN 0
                          WHEN v.attempt_refund THEN t.attempt - 1
                          ELSE t.attempt END,
           checkpoint = CASE WHEN v.save_checkpoint THEN v.checkpoint ELSE t.checkpoint END,
           lease_token = NULL,
           lease_expires_at = NULL
      FROM mine AS m, v
     WHERE t.id = m.id
       AND v.id = m.id AND v.attempt = m.held_attempt AND v.token = m.held_token
    RETURNING t.id, m.held_attempt, m.held_token, t.queue, t.state, t.concurrency_key
),
at_limit AS MATERIALIZED (
    SELECT l.queue
      FROM unnest(%(limit_queues)s::text[], %(limit_concurrency)s::int[])
           AS l(queue, concurrency)
     WHERE (SELECT count(*)
              FROM pgqueue_task AS t
             WHERE t.state = 'running' AND t.queue = l.queue) >= l.concurrency
)
SELECT id, held_attempt AS attempt, held_token::text AS token, state,
       CASE WHEN state IN ('pending', 'scheduled') OR concurrency_key IS NOT NULL
                 OR queue IN (SELECT queue FROM at_limit)
            THEN pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text END AS notified
  FROM settled;


-- name: hold_lease
-- An atomic task's commit of a Continue or a Suspend (worker/atomic.py; a success has
-- settle_atomic), in its handler's own transaction, just before its settle: lock the
-- task's row if this attempt still holds its lease, on
-- (id, attempt, lease_token, state = 'running') and, unless %(any_expiry)s, a lease
-- that has not lapsed at this instant (clock_timestamp(): the transaction's now() is
-- the handler's start). No row: the lease is lost, and the caller rolls the whole
-- transaction back. By primary key.
-- The row is not locked while the handler runs (heartbeats, cancels, the sweep and the
-- admin write it meanwhile); only from here to the commit, a few milliseconds. This
-- waits for a lock another transaction holds on the row (a renewal, a sweep, a cancel:
-- one statement each), then checks the row as that one left it (READ COMMITTED checks
-- a locked row's WHERE again on its latest version): a sweep that recovered the lease
-- first makes it match nothing; a renewal keeps it matching. Once it has the row,
-- nothing else writes it before the commit (the sweep and the heartbeat skip locked
-- rows), so the settle that follows (whose SKIP LOCKED skips only other transactions'
-- locks) writes it.
SELECT id
  FROM pgqueue_task
 WHERE id = %(id)s AND attempt = %(attempt)s AND lease_token = %(token)s::uuid
   AND state = 'running'
   AND (%(any_expiry)s OR lease_expires_at > clock_timestamp())
   FOR NO KEY UPDATE;


-- name: settle_atomic
-- An atomic task's success (worker/atomic.py), as the last statement of its handler's
-- transaction: hold_lease and settle in one, for the outcome nearly every attempt
-- has. Fenced as hold_lease is (token, state, and, unless %(any_expiry)s, a lease not
-- lapsed at this instant): an UPDATE waits for a lock another transaction holds on the
-- row (a renewal, a sweep, a cancel), then checks the row again as that one left it, so
-- a lease recovered first matches nothing, and the caller rolls everything back. By
-- primary key. It writes the columns settle writes for a success (keep the two in step:
-- tests/test_atomic.py compares them), with the checkpoint and progress the handler
-- held back (%(save_checkpoint)s, %(save_progress)s). Times are statement_timestamp()
-- (the transaction's now() is the handler's start). Wakes parked workers as settle
-- does: for a row with a concurrency_key, or in %(limit_queue)s when it was at its
-- concurrency limit %(limit_concurrency)s (running rows, counted as the statement
-- began).
WITH settled AS (
    UPDATE pgqueue_task AS t
       SET state = 'succeeded',
           result = %(result)s::jsonb,
           executions = CASE WHEN jsonb_array_length(t.executions) >= 100
                             THEN t.executions - 0 ELSE t.executions END
                        || jsonb_build_array(jsonb_build_object(
                               'attempt', t.attempt, 'token', t.lease_token,
                               'worker', t.worker_id, 'started', t.last_attempted_at,
                               'ended', statement_timestamp(), 'outcome', 'success',
                               'state', 'succeeded', 'source', 'settle')),
           finished_at = statement_timestamp(),
           wait_reason = NULL,
           wait_signal = NULL,
           wait_until = NULL,
           wake = NULL,
           checkpoint = CASE WHEN %(save_checkpoint)s THEN %(checkpoint)s::jsonb
                             ELSE t.checkpoint END,
           progress = CASE WHEN %(save_progress)s THEN %(progress)s::jsonb ELSE t.progress END,
           lease_token = NULL,
           lease_expires_at = NULL
     WHERE t.id = %(id)s AND t.attempt = %(attempt)s AND t.lease_token = %(token)s::uuid
       AND t.state = 'running'
       AND (%(any_expiry)s OR t.lease_expires_at > clock_timestamp())
    RETURNING t.queue, t.concurrency_key
)
SELECT CASE WHEN concurrency_key IS NOT NULL
                 OR (%(limit_queue)s::text IS NOT NULL AND queue = %(limit_queue)s::text
                     AND (SELECT count(*) FROM pgqueue_task AS r
                           WHERE r.state = 'running' AND r.queue = %(limit_queue)s::text)
                         >= %(limit_concurrency)s::int)
            THEN pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text END AS notified
  FROM settled;


-- name: store_task_logs
-- The log records of settled attempts (TASK_LOGS, docs/logging.md): one row of
-- pgqueue_task_log per attempt, run in the transaction of their settlement, right
-- after it (settle, settle_atomic): the records commit with the settlement, or
-- neither does. Fenced on the settlement: an attempt is stored only if its task's
-- executions hold its settlement (the entry settle and settle_atomic append with its
-- lease token, as settle_check reads it), and only once. So the records of an attempt
-- whose lease was lost (its settle matched no row), or whose row was locked (skipped,
-- retried later with them), are not stored, never as the current attempt's, and a
-- settlement replayed after a lost reply stores nothing twice. Past an entry's
-- task_bytes (TASK_LOG_TASK_BYTES), the task's older rows go (trimmed sees the table
-- as the statement began: it counts the new row's bytes itself). Run only for
-- outcomes with records: settle pays nothing for the feature. By primary key and
-- pgqueue_task_log_task.
WITH v AS MATERIALIZED (
    SELECT v.*
      FROM jsonb_to_recordset(%(logs)s::jsonb) AS v(
               id bigint, attempt int, token uuid, records jsonb, dropped int, bytes int,
               task_bytes int)
      JOIN pgqueue_task AS t ON t.id = v.id
     WHERE t.executions @> jsonb_build_array(jsonb_build_object(
               'token', v.token, 'attempt', v.attempt, 'source', 'settle'))
       AND NOT EXISTS (SELECT 1 FROM pgqueue_task_log AS l
                        WHERE l.task_id = v.id AND l.lease_token = v.token)
),
stored AS (
    INSERT INTO pgqueue_task_log (task_id, attempt, lease_token, records, dropped, bytes,
                                  created_at)
    SELECT id, attempt, token, records, dropped, bytes, statement_timestamp()
      FROM v
),
trimmed AS (
    DELETE FROM pgqueue_task_log AS l
     WHERE l.id = ANY (ARRAY(
               SELECT o.id
                 FROM (SELECT o.id, n.bytes AS new_bytes, n.task_bytes,
                              sum(o.bytes) OVER (PARTITION BY o.task_id ORDER BY o.id DESC)
                                  AS newer_bytes
                         FROM pgqueue_task_log AS o
                         JOIN v AS n ON n.id = o.task_id
                        WHERE o.task_id = ANY (ARRAY(SELECT id FROM v))) AS o
                WHERE o.newer_bytes + o.new_bytes > o.task_bytes))
)
SELECT id FROM v;


-- name: settle_check
-- For the leases a settle did not write, or a heartbeat did not renew: why not. A plain
-- read (never waits on a lock), by primary key.
--   held     the lease is still ours: the row was locked (skipped); retry later.
--   written  an earlier settle with this very lease already wrote it (a replay after a
--            lost reply): state is what it wrote, or what became of it since.
--   lost     someone else owns the task now, or it was recovered: nothing written.
SELECT v.id, v.attempt, v.token::text AS token,
       CASE WHEN t.state = 'running' AND t.attempt = v.attempt AND t.lease_token = v.token
            THEN 'held'
            WHEN t.executions @> jsonb_build_array(jsonb_build_object(
                     'token', v.token, 'attempt', v.attempt, 'source', 'settle'))
            THEN 'written'
            ELSE 'lost' END AS status,
       (SELECT e ->> 'state'
          FROM jsonb_array_elements(t.executions) AS e
         WHERE e ->> 'token' = v.token::text AND e ->> 'source' = 'settle'
         LIMIT 1) AS written_state
  FROM jsonb_to_recordset(%(leases)s::jsonb) AS v(id bigint, attempt int, token uuid)
  LEFT JOIN pgqueue_task AS t ON t.id = v.id;


-- name: record_late_executions
-- History only: a run whose outcome was refused (its lease was lost, or its claim was
-- lost in a database crash) is still an execution; append it to the row's executions
-- (source 'late'). Never touches state, lease or attempt, so it cannot disturb the
-- current owner. Rows locked right now are skipped: history is best effort.
WITH v AS (
    SELECT * FROM jsonb_to_recordset(%(entries)s::jsonb) AS v(id bigint, entry jsonb)
),
target AS MATERIALIZED (
    SELECT t.id FROM pgqueue_task AS t JOIN v ON t.id = v.id
       FOR NO KEY UPDATE OF t SKIP LOCKED
)
UPDATE pgqueue_task AS t
   SET executions = CASE WHEN jsonb_array_length(t.executions) >= 100
                         THEN t.executions - 0 ELSE t.executions END
                    || jsonb_build_array(v.entry || jsonb_build_object('source', 'late',
                                                                       'recorded', now()))
  FROM target, v
 WHERE t.id = target.id AND v.id = target.id;


-- name: heartbeat
-- Renew the leases of all of one worker's in-flight tasks in one UPDATE, each fenced
-- on its token. The lease expiry itself is not part of the fence: an expired lease that
-- nobody recovered yet is still ours, and renewing it is safe (only a recovery or a
-- claim changes the token). SKIP LOCKED: a row locked by its own handler's open
-- transaction (a checkpoint written inside atomic()) is skipped this round instead of
-- stalling every other renewal behind it. Returns the renewed leases and their cancel
-- flags; the caller checks the leases that are missing with settle_check.
WITH v AS (
    SELECT *
      FROM jsonb_to_recordset(%(leases)s::jsonb) AS v(id bigint, attempt int, token uuid)
),
mine AS MATERIALIZED (
    SELECT t.id
      FROM pgqueue_task AS t
      JOIN v ON t.id = v.id AND t.attempt = v.attempt AND t.lease_token = v.token
     WHERE t.state = 'running'
       FOR NO KEY UPDATE OF t SKIP LOCKED
)
UPDATE pgqueue_task AS t
   SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
  FROM mine
 WHERE t.id = mine.id
RETURNING t.id, t.attempt, t.lease_token::text AS token, t.cancel_requested, t.cancel_hard;


-- name: save_checkpoint
-- A handler's fenced write of its checkpoint (runs on the handler's own connection,
-- so it commits with the handler's own transaction if one is open).
UPDATE pgqueue_task
   SET checkpoint = %(checkpoint)s::jsonb
 WHERE id = %(id)s AND attempt = %(attempt)s AND lease_token = %(token)s
   AND state = 'running'
RETURNING cancel_requested;


-- name: save_progress
-- A handler's fenced write of its progress report.
UPDATE pgqueue_task
   SET progress = %(progress)s::jsonb
 WHERE id = %(id)s AND attempt = %(attempt)s AND lease_token = %(token)s
   AND state = 'running'
RETURNING cancel_requested;


-- name: read_cancel_requested
-- A handler asking, now, whether it should stop. Fenced: a lost lease reads as no row.
SELECT cancel_requested
  FROM pgqueue_task
 WHERE id = %(id)s AND attempt = %(attempt)s AND lease_token = %(token)s
   AND state = 'running';


-- name: recover_expired_leases
-- The lease sweep: running rows whose lease lapsed (their worker died, hung or lost
-- the database) go back to pending, or to failed when the attempt the claim already
-- counted was the last one. That is what stops a task that kills its worker every
-- time from looping forever. Uses pgqueue_task_lease (only running rows are in it, so
-- the sweep is cheap however large the table). SKIP LOCKED: two sweepers never
-- recover the same row twice; a worker settling the row at this instant either wins
-- (its settle commits first; the row no longer matches) or loses (its fence fails).
-- The recovered run is recorded in executions (source 'sweep', outcome 'lost').
WITH expired AS MATERIALIZED (
    SELECT id
      FROM pgqueue_task
     WHERE state = 'running'
       AND lease_expires_at < now()
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR NO KEY UPDATE SKIP LOCKED
),
recovered AS (
    UPDATE pgqueue_task AS t
       SET state = CASE WHEN t.cancel_requested THEN 'cancelled'
                        WHEN t.attempt >= t.max_attempts THEN 'failed'
                        ELSE 'pending' END,
           finished_at = CASE WHEN t.cancel_requested OR t.attempt >= t.max_attempts
                              THEN now() END,
           run_at = now(),
           lease_token = NULL,
           lease_expires_at = NULL,
           errors_dropped = t.errors_dropped + GREATEST(jsonb_array_length(t.errors) - 99, 0),
           errors = jsonb_path_query_array(t.errors, '$[last - 98 to last]') || jsonb_build_array(jsonb_build_object(
               'attempt', t.attempt,
               'type', 'LeaseExpired',
               'message', 'the lease of worker ' || COALESCE(t.worker_id, '?')
                          || ' expired before the task was settled'
                          || ' (worker crashed, hung, or lost the database)',
               'traceback', NULL,
               'outcome', 'lost',
               'worker_id', t.worker_id,
               'at', now())),
           executions = CASE WHEN jsonb_array_length(t.executions) >= 100
                             THEN t.executions - 0 ELSE t.executions END
                        || jsonb_build_array(jsonb_build_object(
                               'attempt', t.attempt, 'token', t.lease_token,
                               'worker', t.worker_id, 'started', t.last_attempted_at,
                               'ended', NULL, 'outcome', 'lost',
                               'state', CASE WHEN t.cancel_requested THEN 'cancelled'
                                             WHEN t.attempt >= t.max_attempts THEN 'failed'
                                             ELSE 'pending' END,
                               'source', 'sweep', 'recovered', now()))
      FROM expired AS e
     WHERE t.id = e.id
    RETURNING t.id, t.queue, t.state
)
SELECT id, state,
       CASE WHEN state = 'pending'
            THEN pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text END
  FROM recovered;


-- name: fail_unroutable
-- Tasks their queue's workers cannot run, failed with an explanation once they have
-- waited past UNROUTABLE_TTL: pending and due for that long, in a queue that live
-- workers (heartbeat within the stale window) serve, none of which has registered the
-- task's (task_name, handler_version). Until then they stay pending and burn no
-- attempt (a producer deployed before its consumer just waits). A worker never imports
-- a name read from a row; this is how a row naming something its queue's workers do
-- not run ends, visibly, instead of waiting forever.
--
-- Unknown work is left alone: a queue no live worker serves (a nightly pool, a burst
-- pool, a pool down for the weekend) is never looked at, however old its backlog; only
-- the workers of a queue can tell what it should hold, never the workers of another.
-- So the statement is driven from served, the queues live workers serve. routes_seen
-- lists the (task_name, handler_version) pairs that have pending rows in each served
-- queue with a loose index scan of pgqueue_task_due (one descent per distinct pair,
-- whatever the number of rows); for the pairs no live worker of the queue has, doomed
-- walks pgqueue_task_due (queue, task_name, handler_version, run_at, id) over the rows
-- due before the cutoff only, oldest first, stopping at %(limit)s rows. Its cost
-- follows the number of distinct pairs and the overdue unroutable rows, never the rest
-- of the table. Runs rarely (with the stale-worker cleanup), in small batches. SKIP
-- LOCKED: a row a claimer is taking is left to it.
--
-- The error names the queue's live workers and the routes they registered (a few of
-- each, then "and N more"), so whoever reads it knows what is deployed where.
-- live_routes is the same definition as in queue_overview: keep the two in step, or a
-- task the overview calls routable could be failed here.
WITH RECURSIVE live_routes AS (
    SELECT DISTINCT q.queue, r.route ->> 0 AS task_name, (r.route ->> 1)::int AS version
      FROM pgqueue_worker AS w,
           jsonb_array_elements_text(w.queues) AS q(queue),
           jsonb_array_elements(w.routes) AS r(route)
     WHERE w.last_heartbeat_at > now() - make_interval(secs => %(stale_seconds)s)
),
live_workers AS (
    SELECT w.id, q.queue
      FROM pgqueue_worker AS w,
           jsonb_array_elements_text(w.queues) AS q(queue)
     WHERE w.last_heartbeat_at > now() - make_interval(secs => %(stale_seconds)s)
),
served AS MATERIALIZED (
    SELECT q.queue,
           (SELECT array_agg(lw.id ORDER BY lw.id)
              FROM live_workers AS lw
             WHERE lw.queue = q.queue) AS workers,
           (SELECT COALESCE(array_agg(lr.task_name || '@' || lr.version
                                      ORDER BY lr.task_name, lr.version), '{}')
              FROM live_routes AS lr
             WHERE lr.queue = q.queue) AS routes
      FROM (SELECT DISTINCT queue FROM live_workers) AS q
),
routes_seen (queue, task_name, version) AS (
    SELECT s.queue, f.task_name, f.handler_version
      FROM served AS s,
           LATERAL (SELECT t.task_name, t.handler_version
                      FROM pgqueue_task AS t
                     WHERE t.state = 'pending' AND t.queue = s.queue
                     ORDER BY t.task_name, t.handler_version
                     LIMIT 1) AS f
    UNION ALL
    SELECT w.queue, n.task_name, n.handler_version
      FROM routes_seen AS w,
           LATERAL (SELECT t.task_name, t.handler_version
                      FROM pgqueue_task AS t
                     WHERE t.state = 'pending' AND t.queue = w.queue
                       AND (t.task_name, t.handler_version) > (w.task_name, w.version)
                     ORDER BY t.task_name, t.handler_version
                     LIMIT 1) AS n
),
doomed AS MATERIALIZED (
    SELECT t.id, s.workers, s.routes
      FROM routes_seen AS rs
      JOIN served AS s ON s.queue = rs.queue
     CROSS JOIN LATERAL (
               SELECT t.id
                 FROM pgqueue_task AS t
                WHERE t.state = 'pending'
                  AND t.queue = rs.queue AND t.task_name = rs.task_name
                  AND t.handler_version = rs.version
                  AND t.run_at < now() - make_interval(secs => %(ttl_seconds)s)
                ORDER BY t.run_at, t.id
                LIMIT %(limit)s
                  FOR NO KEY UPDATE SKIP LOCKED
           ) AS t
     WHERE NOT EXISTS (SELECT 1 FROM live_routes AS lr
                        WHERE lr.queue = rs.queue AND lr.task_name = rs.task_name
                          AND lr.version = rs.version)
     LIMIT %(limit)s
)
UPDATE pgqueue_task AS t
   SET state = 'failed',
       finished_at = now(),
       errors_dropped = t.errors_dropped + GREATEST(jsonb_array_length(t.errors) - 99, 0),
       errors = jsonb_path_query_array(t.errors, '$[last - 98 to last]') || jsonb_build_array(jsonb_build_object(
           'attempt', t.attempt,
           'type', 'TaskNotRegistered',
           'message', 'no live worker serving queue ' || quote_literal(t.queue)
                      || ' has registered task ' || quote_literal(t.task_name)
                      || ' version ' || t.handler_version || ' for '
                      || %(ttl_seconds)s || ' s; the queue is served by '
                      || array_to_string(d.workers[1:3], ', ')
                      || CASE WHEN cardinality(d.workers) > 3
                              THEN ' and ' || (cardinality(d.workers) - 3) || ' more'
                              ELSE '' END
                      || ', which can run '
                      || CASE WHEN cardinality(d.routes) = 0 THEN 'nothing'
                              ELSE array_to_string(d.routes[1:10], ', ') END
                      || CASE WHEN cardinality(d.routes) > 10
                              THEN ' and ' || (cardinality(d.routes) - 10) || ' more'
                              ELSE '' END
                      || '; deploy a worker that serves the queue with this task and'
                      || ' version, then requeue this task',
           'traceback', NULL,
           'outcome', 'unroutable',
           'worker_id', NULL,
           'at', now()))
  FROM doomed AS d
 WHERE t.id = d.id
RETURNING t.id, t.errors -> -1 ->> 'message';


-- name: vacuum_due
-- Should the vacuumer run? Dead tuples in the task table (fleet-wide, from PostgreSQL's
-- statistics) past the threshold, and this session got the fleet-wide advisory lock
-- (released by vacuum_done), so only one worker vacuums at a time. The lock is taken
-- only when the threshold is met (CASE evaluates it last).
SELECT CASE WHEN COALESCE(s.n_dead_tup, 0) >= %(threshold)s
            THEN pg_try_advisory_lock(hashtext('django_pgqueue.vacuum'))
            ELSE false END,
       COALESCE(s.n_dead_tup, 0)
  FROM pg_class AS c
  LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
 WHERE c.oid = 'pgqueue_task'::regclass;


-- name: vacuum_task_table
-- Claims leave a dead entry at the head of pgqueue_task_claim for every task; the next
-- claims walk over them until a VACUUM removes them, so without one the claim slows
-- down as a busy queue drains. Autovacuum wakes at most once a minute per database and
-- then vacuums in one long pass; this runs as soon as enough dead tuples pile up.
-- SKIP_LOCKED: if autovacuum (or anyone) is vacuuming the table, do nothing. ANALYZE
-- keeps the statistics of a table whose size swings by millions of rows current.
VACUUM (ANALYZE, SKIP_LOCKED) pgqueue_task;


-- name: vacuum_done
SELECT pg_advisory_unlock(hashtext('django_pgqueue.vacuum'));


-- name: owns_task_table
-- VACUUM needs the table's owner (the role that ran the migrations).
SELECT pg_has_role(current_user, c.relowner, 'USAGE')
  FROM pg_class AS c
 WHERE c.oid = 'pgqueue_task'::regclass;


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


-- name: working_backends
-- The connection watchdog's question, asked on a fresh short connection about worker
-- connections whose statement has had no answer for DEAD_CONNECTION_TIMEOUT: which of
-- these backends are running a statement right now? One that is idle (the statement
-- or its answer was lost on the way) or blocked sending its answer (ClientWrite:
-- nobody reads it) is not working for us any more: the worker drops that socket and
-- reconnects. One that is running (a long VACUUM, a lock wait) is only slow, and its
-- statement gets more time.
SELECT pid
  FROM pg_stat_activity
 WHERE pid = ANY (%(pids)s)
   AND state = 'active'
   AND wait_event IS DISTINCT FROM 'ClientWrite';


-- name: register_worker
-- version: the django_pgqueue release of the worker (the doctor lists the fleet's).
INSERT INTO pgqueue_worker (id, hostname, pid, queues, routes, concurrency, in_flight,
                            started_at, last_heartbeat_at, version)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s::jsonb, %(routes)s::jsonb, %(concurrency)s, 0,
        now(), now(), %(version)s)
ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = now();


-- name: touch_worker
-- The worker's own liveness, written by its heartbeat beside the lease renewal, and the
-- number of live workers (heartbeat within the stale window): the fleet-wide duties
-- (sweeps, vacuum checks, pruning) run in each process N times less often in a fleet
-- of N, so the fleet's rate of them stays the same however many processes it has.
-- pgqueue_worker has one row per worker process: no index needed.
UPDATE pgqueue_worker
   SET last_heartbeat_at = now(), in_flight = %(in_flight)s
 WHERE id = %(id)s
RETURNING (SELECT count(*)
             FROM pgqueue_worker
            WHERE last_heartbeat_at > now() - make_interval(secs => %(stale_seconds)s))
          AS live_workers;


-- name: unregister_worker
DELETE FROM pgqueue_worker WHERE id = %(id)s;


-- name: delete_stale_workers
-- Workers that stopped heartbeating (killed, lost host). Their leases are recovered by
-- recover_expired_leases; this only cleans the registry the admin shows.
DELETE FROM pgqueue_worker
 WHERE last_heartbeat_at < now() - make_interval(secs => %(stale_seconds)s)
RETURNING id;


-- name: prune
-- Retention: delete a small batch of terminal rows past their time to live, oldest
-- first, through pgqueue_task_retention. A terminal row has no lease (settlement
-- clears it), so nothing a worker holds can be pruned. The pruned tasks' workflow
-- edges go with them (pgqueue_dep_child and pgqueue_dep_edge, by id): a live task
-- loses at most a finished parent from its parent_results. So do their log records
-- (pgqueue_task_log_task, by id): no foreign key cascades them, as its trigger would
-- cost every deleted row a statement of its own (ten times the delete's own time).
-- Every DELETE names its rows by "id = ANY (ARRAY(...))", never by a join: under the
-- worker's generic plans the batch's LIMIT is a parameter the planner prices at 10%
-- of the table, and a join then became a hash join over a sequential scan of the
-- whole task table for every batch (and the edges' "child OR parent" a nested loop
-- over every edge). An array of ids is an index scan of the primary key (and of each
-- edge index) whatever the statistics say: benchmarks/history.py.
WITH doomed AS MATERIALIZED (
    (SELECT id FROM pgqueue_task
      WHERE state = 'succeeded'
        AND finished_at < now() - make_interval(secs => %(result_ttl)s)
      ORDER BY state, finished_at LIMIT %(batch)s)
    UNION ALL
    (SELECT id FROM pgqueue_task
      WHERE state = 'cancelled'
        AND finished_at < now() - make_interval(secs => %(result_ttl)s)
      ORDER BY state, finished_at LIMIT %(batch)s)
    UNION ALL
    (SELECT id FROM pgqueue_task
      WHERE state = 'failed'
        AND finished_at < now() - make_interval(secs => %(dead_ttl)s)
      ORDER BY state, finished_at LIMIT %(batch)s)
),
pruned AS (
    -- doomed read the rows without a lock: one changed since (a dead letter that
    -- retry_now or requeue_dead made pending, and maybe failed again since) is deleted
    -- only if it is still terminal and expired. The DELETE re-checks its WHERE on the
    -- row's newest version once it has the row's lock.
    DELETE FROM pgqueue_task AS t
     WHERE t.id = ANY (ARRAY(SELECT id FROM doomed))
       AND t.lease_token IS NULL
       AND t.state IN ('succeeded', 'failed', 'cancelled')
       AND t.finished_at < now() - make_interval(
               secs => CASE WHEN t.state = 'failed' THEN %(dead_ttl)s ELSE %(result_ttl)s END)
    RETURNING t.id, t.state
),
parent_edges AS (
    -- An edge between two tasks of the batch matches both DELETEs: the second finds
    -- it deleted by this statement and skips it.
    DELETE FROM pgqueue_dependency AS e
     WHERE e.child_id = ANY (ARRAY(SELECT id FROM pruned))
),
child_edges AS (
    DELETE FROM pgqueue_dependency AS e
     WHERE e.parent_id = ANY (ARRAY(SELECT id FROM pruned))
),
logs AS (
    DELETE FROM pgqueue_task_log AS l
     WHERE l.task_id = ANY (ARRAY(SELECT id FROM pruned))
)
SELECT state FROM pruned;


-- name: prune_archive_batch
-- Retention with an archive (PRUNE_ARCHIVE_DIR, pgqueue_prune --archive; archive.py),
-- step 1 of 2, inside the caller's transaction: lock and read the rows prune would
-- delete, whole (to_jsonb of the row), for the caller to write to the archive before
-- it deletes them (prune_archived, same transaction). The same pick as prune, through
-- pgqueue_task_retention. FOR UPDATE SKIP LOCKED: two pruners archive different rows,
-- never one row twice at once; the lock also keeps retry_now, requeue_dead and the
-- admin's delete off a row between its archive write and its delete. The WHERE
-- re-checks, on the locked row, that it is still terminal and expired (see prune).
-- Bounded in bytes too: rows are returned in id order while the stored size of those
-- before them is at most %(max_bytes)s (always at least one), so one batch of large
-- rows does not have to fit in memory; the rows left out stay locked until the
-- transaction ends, and are not deleted. locked_rows says how many were locked.
WITH doomed AS MATERIALIZED (
    (SELECT id FROM pgqueue_task
      WHERE state = 'succeeded'
        AND finished_at < now() - make_interval(secs => %(result_ttl)s)
      ORDER BY state, finished_at LIMIT %(batch)s)
    UNION ALL
    (SELECT id FROM pgqueue_task
      WHERE state = 'cancelled'
        AND finished_at < now() - make_interval(secs => %(result_ttl)s)
      ORDER BY state, finished_at LIMIT %(batch)s)
    UNION ALL
    (SELECT id FROM pgqueue_task
      WHERE state = 'failed'
        AND finished_at < now() - make_interval(secs => %(dead_ttl)s)
      ORDER BY state, finished_at LIMIT %(batch)s)
),
locked AS MATERIALIZED (
    SELECT t.*
      FROM pgqueue_task AS t
     WHERE t.id = ANY (ARRAY(SELECT id FROM doomed))
       AND t.lease_token IS NULL
       AND t.state IN ('succeeded', 'failed', 'cancelled')
       AND t.finished_at < now() - make_interval(
               secs => CASE WHEN t.state = 'failed' THEN %(dead_ttl)s ELSE %(result_ttl)s END)
       FOR UPDATE SKIP LOCKED
),
sized AS (
    SELECT l.id,
           to_char(l.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day,
           to_jsonb(l)::text AS body,
           sum(pg_column_size(l.*)) OVER (ORDER BY l.id) - pg_column_size(l.*) AS before,
           count(*) OVER () AS locked_rows
      FROM locked AS l
)
SELECT id, day, body, locked_rows
  FROM sized
 WHERE before <= %(max_bytes)s
 ORDER BY id;


-- name: prune_archived
-- Retention with an archive, step 2 of 2: delete the rows prune_archive_batch locked
-- and the caller wrote to the archive, by id, and only those (a row left out of the
-- archive write stays). They are locked by this transaction, so still terminal and
-- without a lease; the conditions are kept as a guard. Their workflow edges go with
-- them, and their log records, as in prune. By primary key.
WITH pruned AS (
    DELETE FROM pgqueue_task AS t
     WHERE t.id = ANY (%(ids)s::bigint[])
       AND t.lease_token IS NULL
       AND t.state IN ('succeeded', 'failed', 'cancelled')
    RETURNING t.id, t.state
),
parent_edges AS (
    DELETE FROM pgqueue_dependency AS e
     WHERE e.child_id = ANY (ARRAY(SELECT id FROM pruned))
),
child_edges AS (
    DELETE FROM pgqueue_dependency AS e
     WHERE e.parent_id = ANY (ARRAY(SELECT id FROM pruned))
),
logs AS (
    DELETE FROM pgqueue_task_log AS l
     WHERE l.task_id = ANY (ARRAY(SELECT id FROM pruned))
)
SELECT state FROM pruned;


-- name: queue_overview
-- Per queue, task name and handler version: what is waiting, whether anyone can run
-- it, and what finished lately. A pending (so due) task is "routable" when a live worker (heartbeat
-- within the stale window) serves its queue and has registered its (task_name,
-- handler_version); otherwise it is "unroutable": a producer was deployed without its
-- consumer. "completed" means succeeded; "failed" means dead-lettered (a failed
-- attempt that will be retried is still pending). oldest_running_seconds is the age of
-- the oldest running attempt, since its claim (last_attempted_at): a handler hung past
-- its timeout, or one run with timeout=None, shows there while its heartbeat keeps the
-- lease alive.
--
-- Each state is read through its own partial index, so the cost follows the backlog
-- and the last hour, never the history (which is most of the table). That is why the
-- states are a UNION ALL and not one "state IN (...)", which the planner answers with
-- a scan of the whole table:
--   scheduled  pgqueue_task_scheduled
--   pending    pgqueue_task_due
--   running    pgqueue_task_lease
--   waiting    pgqueue_task_waiting
--   failed     pgqueue_task_retention  (every dead letter, with when it died)
--   succeeded  pgqueue_task_retention  (finished_at within the last hour only)
-- Waiting rows are also counted by what they wait for (wait_reason: 'parents',
-- 'signal', 'child', 'sequence'); wait_reason is not in pgqueue_task_waiting, so that branch reads
-- the heap row of each waiting row, and of nothing else.
-- live_routes: the same definition as in fail_unroutable (keep them in step).
WITH live_routes AS (
    SELECT DISTINCT q.queue, r.route ->> 0 AS task_name, (r.route ->> 1)::int AS version
      FROM pgqueue_worker AS w,
           jsonb_array_elements_text(w.queues) AS q(queue),
           jsonb_array_elements(w.routes) AS r(route)
     WHERE w.last_heartbeat_at > now() - make_interval(secs => %(stale_seconds)s)
),
tasks AS (
    SELECT queue, task_name, handler_version, state, run_at,
           NULL::timestamptz AS finished_at, NULL::timestamptz AS attempted_at,
           NULL::text AS wait_reason
      FROM pgqueue_task
     WHERE state = 'scheduled'
    UNION ALL
    SELECT queue, task_name, handler_version, state, run_at, NULL, NULL, NULL
      FROM pgqueue_task
     WHERE state = 'pending'
    UNION ALL
    SELECT queue, task_name, handler_version, state, run_at, NULL, last_attempted_at, NULL
      FROM pgqueue_task
     WHERE state = 'running'
    UNION ALL
    SELECT queue, task_name, handler_version, state, run_at, NULL, NULL, wait_reason
      FROM pgqueue_task
     WHERE state = 'waiting'
    UNION ALL
    SELECT queue, task_name, handler_version, state, run_at, finished_at, NULL, NULL
      FROM pgqueue_task
     WHERE state = 'failed'
    UNION ALL
    SELECT queue, task_name, handler_version, state, run_at, finished_at, NULL, NULL
      FROM pgqueue_task
     WHERE state = 'succeeded'
       AND finished_at >= now() - interval '1 hour'
)
SELECT t.queue,
       t.task_name,
       t.handler_version,
       count(*) FILTER (WHERE t.state IN ('pending', 'scheduled') AND t.run_at <= now()
                          AND lr.task_name IS NOT NULL) AS pending_routable,
       count(*) FILTER (WHERE t.state IN ('pending', 'scheduled') AND t.run_at <= now()
                          AND lr.task_name IS NULL) AS pending_unroutable,
       count(*) FILTER (WHERE t.state = 'scheduled' AND t.run_at > now()) AS scheduled,
       count(*) FILTER (WHERE t.state = 'running') AS running,
       count(*) FILTER (WHERE t.state = 'waiting') AS waiting,
       count(*) FILTER (WHERE t.wait_reason = 'parents') AS waiting_parents,
       count(*) FILTER (WHERE t.wait_reason = 'signal') AS waiting_signal,
       count(*) FILTER (WHERE t.wait_reason = 'child') AS waiting_child,
       count(*) FILTER (WHERE t.wait_reason = 'sequence') AS waiting_sequence,
       count(*) FILTER (WHERE t.state = 'failed') AS failed,
       EXTRACT(EPOCH FROM now() - min(t.run_at) FILTER (
           WHERE t.state IN ('pending', 'scheduled') AND t.run_at <= now()
       ))::float8 AS oldest_due_seconds,
       EXTRACT(EPOCH FROM now() - min(t.attempted_at) FILTER (
           WHERE t.state = 'running'))::float8 AS oldest_running_seconds,
       count(*) FILTER (WHERE t.state = 'succeeded'
                          AND t.finished_at >= now() - interval '5 minutes') AS completed_5m,
       count(*) FILTER (WHERE t.state = 'succeeded') AS completed_1h,
       count(*) FILTER (WHERE t.state = 'failed'
                          AND t.finished_at >= now() - interval '5 minutes') AS failed_5m,
       count(*) FILTER (WHERE t.state = 'failed'
                          AND t.finished_at >= now() - interval '1 hour') AS failed_1h
  FROM tasks AS t
  LEFT JOIN live_routes AS lr
    ON t.state IN ('pending', 'scheduled')
   AND lr.queue = t.queue AND lr.task_name = t.task_name AND lr.version = t.handler_version
 GROUP BY t.queue, t.task_name, t.handler_version
 ORDER BY t.queue, t.task_name, t.handler_version;


-- name: queue_history
-- The overview's chart: per minute of the last %(minutes)s, how many tasks completed
-- (succeeded) and were dead-lettered, and the queue depth (tasks due and not yet
-- started) at the end of the minute. Nothing is sampled or stored: the depth is
-- rebuilt from the rows, each task being "in the queue" from its run_at (when it
-- became due) until its last claim (last_attempted_at) or, never claimed, until it
-- was cancelled (finished_at); still pending means still in the queue. Earlier waits
-- of a task that was retried are not counted (its run_at was moved on). Reads only
-- the backlog and the rows finished inside the window, per state, through
-- pgqueue_task_due, pgqueue_task_lease and pgqueue_task_retention (a "state IN (...)"
-- on the terminal states makes the planner scan the whole table).
WITH spans AS MATERIALIZED (
    SELECT run_at AS entered, NULL::timestamptz AS left_at,
           NULL::text AS outcome, NULL::timestamptz AS finished_at
      FROM pgqueue_task
     WHERE state = 'pending' AND run_at <= now()
    UNION ALL
    SELECT run_at, last_attempted_at, NULL, NULL
      FROM pgqueue_task
     WHERE state = 'running'
    UNION ALL
    SELECT run_at,
           CASE WHEN last_attempted_at >= run_at THEN last_attempted_at ELSE finished_at END,
           'completed', finished_at
      FROM pgqueue_task
     WHERE state = 'succeeded'
       AND finished_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
    UNION ALL
    SELECT run_at,
           CASE WHEN last_attempted_at >= run_at THEN last_attempted_at ELSE finished_at END,
           'failed', finished_at
      FROM pgqueue_task
     WHERE state = 'failed'
       AND finished_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
    UNION ALL
    SELECT run_at,
           CASE WHEN last_attempted_at >= run_at THEN last_attempted_at ELSE finished_at END,
           NULL, NULL
      FROM pgqueue_task
     WHERE state = 'cancelled'
       AND finished_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
),
-- Per minute: tasks that became due (those already waiting when the window opened
-- count in its first minute; those that had left by then, not at all), tasks that
-- left the queue, tasks that finished. The depth is the running sum of the first
-- minus the second.
entered AS (
    SELECT date_trunc('minute', GREATEST(
               entered,
               date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1))) AS minute,
           count(*) AS n
      FROM spans
     WHERE entered < COALESCE(left_at, 'infinity')
       AND COALESCE(left_at, 'infinity')
           >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
     GROUP BY 1
),
departed AS (
    SELECT date_trunc('minute', left_at) AS minute, count(*) AS n
      FROM spans
     WHERE entered < left_at
     GROUP BY 1
),
finished AS (
    SELECT date_trunc('minute', finished_at) AS minute,
           count(*) FILTER (WHERE outcome = 'completed') AS completed,
           count(*) FILTER (WHERE outcome = 'failed') AS failed
      FROM spans
     WHERE outcome IS NOT NULL
     GROUP BY 1
)
SELECT m.minute,
       COALESCE(f.completed, 0) AS completed,
       COALESCE(f.failed, 0) AS failed,
       (sum(COALESCE(e.n, 0) - COALESCE(d.n, 0)) OVER (ORDER BY m.minute))::bigint AS depth
  FROM generate_series(date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1),
                       date_trunc('minute', now()),
                       interval '1 minute') AS m(minute)
  LEFT JOIN entered AS e ON e.minute = m.minute
  LEFT JOIN departed AS d ON d.minute = m.minute
  LEFT JOIN finished AS f ON f.minute = m.minute
 ORDER BY m.minute;


-- name: queue_capacity
-- Live workers per queue: how many, their slots and tasks in flight. A worker serving
-- several queues counts in each (its slots are shared between them). pgqueue_worker
-- has one row per worker process: no index needed.
SELECT q.queue,
       count(*) AS workers,
       sum(w.concurrency)::bigint AS slots,
       sum(w.in_flight)::bigint AS in_flight
  FROM pgqueue_worker AS w,
       jsonb_array_elements_text(w.queues) AS q(queue)
 WHERE w.last_heartbeat_at > now() - make_interval(secs => %(stale_seconds)s)
 GROUP BY q.queue
 ORDER BY q.queue;


-- name: replica_lag
-- How far READ_DATABASE (a streaming replica the overview, pgqueue_status and the
-- queue gauges read from) is behind its primary, read on the replica: the age, by its
-- clock, of the primary's commit of the last transaction it has replayed. Its reads
-- show the queue as it was that long ago. in_recovery tells a standby from a primary:
-- pg_last_xact_replay_timestamp() is NULL on a server that never was a standby, but a
-- standby promoted since keeps its last value, and a primary is behind nothing.
-- lag_seconds is NULL on a standby that has replayed no transaction since it started.
-- Not zeroed when all WAL received is replayed: a standby cut off from its primary has
-- nothing left to replay either, and falls further behind each second. The price: an
-- idle primary (no commits) reads as a growing lag; every running worker commits its
-- heartbeat each HEARTBEAT_SECONDS, so a caught-up replica of a live fleet reads at
-- most about that. GREATEST: the two servers' clocks may differ by a little, and a
-- replica is never ahead (GREATEST ignores a NULL, hence the IS NOT NULL). Reads no
-- table.
SELECT pg_is_in_recovery() AS in_recovery,
       CASE WHEN pg_is_in_recovery() AND pg_last_xact_replay_timestamp() IS NOT NULL THEN
           GREATEST(0, EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()))::float8
       END AS lag_seconds;


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


-- Periodic schedules (docs/periodic.md). Schedules are declared in code, or added at
-- runtime (their row holds their definition); each has a row in pgqueue_schedule, by
-- name (its primary key), created the first time a worker serving its queue sees it
-- (code) or by add_schedule (runtime). The row holds the last tick enqueued: the database, not a
-- leader, decides that each tick is enqueued once across the fleet (enqueue_tick).

-- name: schedule_state
-- The scheduler's wake-up without a due tick (every POLL_INTERVAL, at most every few
-- seconds): the database's clock, the row of each of its schedules declared in code
-- (by primary key; a missing row: not seen yet), and every runtime schedule (a row
-- with a definition) of its queues (a scan of the schedule table: one row per
-- schedule, a few hundred at most). The first row carries only the clock, so that
-- there is one even without any schedule.
SELECT NULL::text AS name, NULL::timestamptz AS last_tick, NULL::timestamptz AS created_at,
       NULL::timestamptz AS paused_at, NULL::timestamptz AS resumed_at,
       NULL::jsonb AS definition, now() AS now
UNION ALL
SELECT s.name, s.last_tick, s.created_at, s.paused_at, s.resumed_at, s.definition, now()
  FROM pgqueue_schedule AS s
 WHERE s.name = ANY(%(names)s::text[])
    OR (s.definition IS NOT NULL AND s.definition->>'queue' = ANY(%(queues)s::text[]));


-- name: schedule_seen
-- First sight of schedules: their rows, created_at = now(). ON CONFLICT DO NOTHING:
-- workers seeing a new schedule at once create one row, the first to commit; the
-- others keep it. A schedule's first tick is its first at or after created_at
-- (enqueue_tick refuses earlier ones): a new schedule does not run for the ticks
-- before it existed.
INSERT INTO pgqueue_schedule (name, task_name, spec, timezone, created_at)
SELECT n.name, n.task_name, n.spec, n.timezone, now()
  FROM unnest(%(names)s::text[], %(task_names)s::text[], %(specs)s::text[],
              %(timezones)s::text[]) AS n(name, task_name, spec, timezone)
    ON CONFLICT (name) DO NOTHING;


-- name: enqueue_tick
-- One tick of one schedule, exactly once across the fleet: the row advances to the
-- tick only if its last tick is older, and the task is inserted only by the statement
-- that advanced it, in the same statement (one transaction). Workers racing for one
-- tick queue on the row's lock (the primary key); under READ COMMITTED the later ones
-- re-check the WHERE on the row as committed by the first (EvalPlanQual), find
-- last_tick = tick, update nothing and insert nothing. The row never moves back, so a
-- worker late for a tick, or with another version of the schedule, cannot enqueue a
-- tick older than the last one. Also refused: a tick before the row existed (a new
-- schedule does not run for the past), and a tick after the database's now() (a tick
-- is due by the database's clock, never a worker's). Refused too: a paused schedule,
-- a tick before it was last resumed (the ticks of a pause are skipped), and a worker's
-- version of the schedule that is not the row's: a runtime schedule's definition as the
-- worker read it must be the row's (a change commits, and no worker fires the old
-- version after it); a schedule from code has none (a runtime schedule of the same
-- name takes precedence). row_current says whether the row is there, running, and the
-- worker's version: when it is not, the worker reads the rows again.
-- The task's columns and parameters are those of enqueue (build_row: validated the
-- same way; a fair task's key, with no place in its flow: the head of its line; a
-- sequenced task waiting its turn, as enqueue_keyed inserts it); it is pending, due now, with the schedule and tick in its metadata. An
-- expiry in seconds counts from now(), the tick's enqueue (not the tick's own time).
-- Wakes the queue's workers (as enqueue_many: no parked-claimer check, ticks are rare)
-- only when a task was inserted. Returns the database's now() either way: the
-- scheduler's clock.
WITH advanced AS (
    UPDATE pgqueue_schedule AS s
       SET last_tick = %(tick)s::timestamptz,
           last_enqueued_at = now(),
           last_task_id = nextval('pgqueue_task_id_seq'),
           last_worker_id = %(worker_id)s::text,
           task_name = %(task_name)s::text,
           spec = %(spec)s::text,
           timezone = %(timezone)s::text
     WHERE s.name = %(name)s::text
       AND (s.last_tick IS NULL OR s.last_tick < %(tick)s::timestamptz)
       AND s.created_at <= %(tick)s::timestamptz
       AND %(tick)s::timestamptz <= now()
       AND s.paused_at IS NULL
       AND (s.resumed_at IS NULL OR s.resumed_at <= %(tick)s::timestamptz)
       AND s.definition IS NOT DISTINCT FROM %(definition)s::jsonb
    RETURNING s.last_task_id
),
inserted AS (
    INSERT INTO pgqueue_task (
        id, queue, task_name, handler_version, priority, args, kwargs, run_at, state,
        max_attempts, retry_policy, timeout, unique_key, metadata, concurrency_key, expires_at,
        fair_key, sequence_key, sequence_hold, wait_reason
    )
    SELECT a.last_task_id, %(queue)s::text, %(task_name)s::text, %(handler_version)s::int,
           %(priority)s::int, %(args)s::jsonb, %(kwargs)s::jsonb, now(),
           CASE WHEN %(sequence_key)s::text IS NULL THEN 'pending' ELSE 'waiting' END,
           %(max_attempts)s::int, %(retry_policy)s::jsonb, %(timeout)s::interval,
           %(unique_key)s::text, %(metadata)s::jsonb, %(concurrency_key)s::text,
           COALESCE(%(expires_at)s::timestamptz, now() + %(expires)s::interval),
           %(fair_key)s::text, %(sequence_key)s::text, %(sequence_hold)s::bool,
           CASE WHEN %(sequence_key)s::text IS NOT NULL THEN 'sequence' END
      FROM advanced AS a
    RETURNING id, queue
)
SELECT (SELECT id FROM inserted) AS task_id,
       (SELECT EXISTS (SELECT 1 FROM pgqueue_schedule WHERE name = %(name)s::text))
           AS row_exists,
       (SELECT EXISTS (SELECT 1 FROM pgqueue_schedule
                        WHERE name = %(name)s::text AND paused_at IS NULL
                          AND definition IS NOT DISTINCT FROM %(definition)s::jsonb))
           AS row_current,
       now() AS now,
       (SELECT pg_notify('pgqueue_' || (hashtext(queue) & 63), queue)::text FROM inserted)
           AS notified;


-- Runtime schedules (periodic.add_schedule and the others; the admin): each statement
-- runs in the caller's transaction, on the database of the schedule's queue. A worker
-- sees the change at its next schedule_state (within POLL_INTERVAL), and enqueue_tick
-- refuses a tick of a version of the schedule that is no longer the row's at once.

-- name: schedule_add
-- A new runtime schedule: its row, first seen now (no tick before). Nothing if the
-- name is taken (the caller says by what: schedule_get).
INSERT INTO pgqueue_schedule (name, task_name, spec, timezone, created_at, definition)
VALUES (%(name)s::text, %(task_name)s::text, %(spec)s::text, %(timezone)s::text, now(),
        %(definition)s::jsonb)
    ON CONFLICT (name) DO NOTHING
RETURNING name;


-- name: schedule_get
-- One schedule's row, locked until the caller's transaction ends (an update reads,
-- merges and writes it without losing a concurrent change).
SELECT name, task_name, spec, timezone, created_at, last_tick, paused_at, resumed_at,
       definition
  FROM pgqueue_schedule
 WHERE name = %(name)s::text
   FOR UPDATE;


-- name: schedule_update
-- A runtime schedule's new definition. Its last tick stays: the ticks of the new
-- definition after it count as missed (docs/periodic.md).
UPDATE pgqueue_schedule
   SET definition = %(definition)s::jsonb,
       task_name = %(task_name)s::text,
       spec = %(spec)s::text,
       timezone = %(timezone)s::text
 WHERE name = %(name)s::text
   AND definition IS NOT NULL
RETURNING name;


-- name: schedule_pause
-- Pause a schedule: no tick is enqueued until it is resumed. A schedule from code that
-- no worker has seen yet gets its row now, paused (the columns are a copy of the
-- code's declaration; definition stays NULL). Pausing a paused schedule keeps its
-- paused_at. A runtime schedule must exist (the caller checks schedule_get first).
INSERT INTO pgqueue_schedule (name, task_name, spec, timezone, created_at, paused_at)
VALUES (%(name)s::text, %(task_name)s::text, %(spec)s::text, %(timezone)s::text, now(),
        now())
    ON CONFLICT (name) DO UPDATE
   SET paused_at = COALESCE(pgqueue_schedule.paused_at, now())
RETURNING name, paused_at;


-- name: schedule_resume
-- Resume a paused schedule: its first tick is the first after now (the ticks of the
-- pause are skipped, whatever its missed policy). Nothing if it was not paused.
UPDATE pgqueue_schedule
   SET paused_at = NULL,
       resumed_at = now()
 WHERE name = %(name)s::text
   AND paused_at IS NOT NULL
RETURNING name;


-- name: schedule_remove
-- Delete a runtime schedule's row: its workers drop it at their next schedule_state,
-- and enqueue_tick finds no row meanwhile. A schedule from code has no definition and
-- is never deleted here.
DELETE FROM pgqueue_schedule
 WHERE name = %(name)s::text
   AND definition IS NOT NULL
RETURNING name;


-- name: task_count_estimate
-- The task list's row count when nothing filters it (admin/counts.py): the planner's
-- estimate, the rows per page of the last ANALYZE scaled to the table's pages now (as
-- the planner scales it), instead of a count(*) that reads every row. NULL before the
-- table's first ANALYZE. Reads one pg_class row and the relation's size: no index.
SELECT CASE
         WHEN c.reltuples < 0 THEN NULL
         WHEN c.relpages = 0 THEN c.reltuples::bigint
         ELSE (c.reltuples / c.relpages
               * (pg_relation_size(c.oid) / current_setting('block_size')::int))::bigint
       END
  FROM pg_class AS c
 WHERE c.oid = 'pgqueue_task'::regclass;
