-- Tasks that wait (docs/workflows.md): for other tasks (after=[...], context.wait_for,
-- context.parent_results) and for signals (signal() wakes a suspended task).
--
-- The context every statement here relies on (the indexes, the states, the bounded
-- columns, the wake-ups) is in contract.sql; "the header" in a comment below means
-- that file's.


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
