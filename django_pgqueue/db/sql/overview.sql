-- The reads of the overview, pgqueue_status and the metrics: what waits, runs and
-- finished per queue, its history, the workers' capacity, the replica's lag, the
-- task list's row count.
--
-- The context every statement here relies on (the indexes, the states, the bounded
-- columns, the wake-ups) is in contract.sql; "the header" in a comment below means
-- that file's.


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
