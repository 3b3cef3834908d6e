-- The claim: a worker lane's pending rows leased to it in one statement (claim, and
-- the reduced forms for lanes without limits), and the rows a lost claim took.
-- The locks and rates a limited claim takes first are in limits.sql.
--
-- The context every statement here relies on (the indexes, the states, the bounded
-- columns, the wake-ups) is in contract.sql; "the header" in a comment below means
-- that file's.


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
--   only. keyed ranks a key's rows twice, in the claim's order: among the rows of its
--   rated routes (nth_of_rated, against the budget, key_budget, looked up for those
--   rows only: a row of a route without a rate neither spends nor takes a place of
--   it), then among the rows the budget lets start (nth_of_key, against the per-key
--   concurrency: a rated row held by its budget does not take the place of another
--   task's row of the key). A row within the budget but held by its concurrency still
--   takes a place of the budget in this claim (with one key limit per key, nothing
--   after it of the key could start either). The queue's lock (lock_limited_queues: a
--   queue with rate-keyed routes is locked like a limited one) makes reading and
--   spending a key's budget race-free. Every claim
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
key_rates AS MATERIALIZED (
    SELECT c.queue, c.key,
           GREATEST((SELECT kr.tat
                       FROM pgqueue_key_rate AS kr
                      WHERE kr.queue = c.queue AND kr.key = c.key), statement_timestamp()) AS tat
      FROM (SELECT DISTINCT queue, concurrency_key AS key
              FROM candidates
             WHERE key_rate_interval IS NOT NULL AND concurrency_key IS NOT NULL) AS c
),
keyed AS MATERIALIZED (
    SELECT r.*,
           count(*) FILTER (WHERE r.key_rate_interval IS NULL OR r.concurrency_key IS NULL
                                  OR r.nth_of_rated <= r.key_budget)
               OVER (PARTITION BY r.queue, r.concurrency_key
                     ORDER BY r.priority DESC, r.pos, r.run_at, r.id) AS nth_of_key
      FROM (SELECT c.*,
                   row_number() OVER (PARTITION BY c.queue, c.concurrency_key,
                                                   c.key_rate_interval IS NULL
                                      ORDER BY c.priority DESC, c.pos, c.run_at, c.id)
                       AS nth_of_rated,
                   CASE WHEN c.key_rate_interval IS NOT NULL THEN (
                       SELECT floor(((c.key_rate_burst - 1) * c.key_rate_interval
                                     - EXTRACT(EPOCH FROM kr.tat - statement_timestamp()))
                                    / c.key_rate_interval)::int + 1
                         FROM key_rates AS kr
                        WHERE kr.queue = c.queue AND kr.key = c.concurrency_key) END
                       AS key_budget
              FROM candidates AS c) AS r
),
allowed AS MATERIALIZED (
    SELECT k.id, k.priority, k.pos, k.run_at, k.queue, k.bytes, k.concurrency_key,
           k.key_rate_interval,
           row_number() OVER (PARTITION BY k.queue
                              ORDER BY k.priority DESC, k.pos, k.run_at, k.id) AS nth_of_queue
      FROM keyed AS k
     WHERE (k.key_rate_interval IS NULL OR k.concurrency_key IS NULL
            OR k.nth_of_rated <= k.key_budget)
       AND (k.key_limit IS NULL OR k.concurrency_key IS NULL
            OR k.nth_of_key <= k.key_limit - COALESCE((
                   SELECT b.running
                     FROM busy_keys AS b
                    WHERE b.queue = k.queue AND b.key = k.concurrency_key), 0))
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
