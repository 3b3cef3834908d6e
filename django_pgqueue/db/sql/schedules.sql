-- Periodic schedules (docs/periodic.md). Schedules are declared in code, or added at
-- runtime (their row holds their definition); each has a row in pgqueue_schedule, by
-- name (its primary key), created the first time a worker serving its queue sees it
-- (code) or by add_schedule (runtime). The row holds the last tick enqueued: the database, not a
-- leader, decides that each tick is enqueued once across the fleet (enqueue_tick).
--
-- The context every statement here relies on (the indexes, the states, the bounded
-- columns, the wake-ups) is in contract.sql; "the header" in a comment below means
-- that file's.


-- name: schedules_changed
-- A schedule was added, changed, paused, resumed or removed (runtime_schedules.py), in
-- the caller's transaction: tell every worker, delivered at its commit. Every one of the
-- 64 channels (each claimer LISTENs on its queues' channels), with a payload no queue
-- name can be (QUEUE_NAME has no space): the listener passes it to its scheduler, which
-- reads the schedule rows at once (scheduler.py). An operator's action, rare: the 64
-- notifications cost nothing that matters.
SELECT count(pg_notify('pgqueue_' || n, 'schedules changed')) FROM generate_series(0, 63) AS n;


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
