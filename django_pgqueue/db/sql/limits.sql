-- The claim's limits (docs/limits.md): the queue locks a limited claim takes first,
-- the per-key rates (pgqueue_key_rate) and why a limited claim came back short.
--
-- The context every statement here relies on (the indexes, the states, the bounded
-- columns, the wake-ups) is in contract.sql; "the header" in a comment below means
-- that file's.


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
