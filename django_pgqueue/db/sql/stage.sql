-- When a task becomes due and how a claimer waits for it: the stager, the claimer's
-- sleep until the next due row, its notification channels and parked marks.
--
-- The context every statement here relies on (the indexes, the states, the bounded
-- columns, the wake-ups) is in contract.sql; "the header" in a comment below means
-- that file's.


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
