-- What a worker does besides running tasks: the lease sweep and the unroutable
-- sweep, the vacuum, the connection watchdog, its own row in pgqueue_worker, and
-- retention (prune, with or without an archive).
--
-- The context every statement here relies on (the indexes, the states, the bounded
-- columns, the wake-ups) is in contract.sql; "the header" in a comment below means
-- that file's.


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
