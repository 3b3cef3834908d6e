-- The writes of a claimed row, fenced on its lease (id, attempt, lease_token, state =
-- 'running'): settlements and their task logs, the heartbeat's renewal, a handler's
-- checkpoint, progress and cancel read; and after a refused write, why
-- (settle_check) and the refused run's history (record_late_executions).
--
-- The context every statement here relies on (the indexes, the states, the bounded
-- columns, the wake-ups) is in contract.sql; "the header" in a comment below means
-- that file's.


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
