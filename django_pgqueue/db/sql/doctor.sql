-- The queue doctor's reads (django_pgqueue/doctor.py): what the queue depends on, from
-- PostgreSQL's catalogs and statistics. None writes; none walks the task table but
-- the claim probe (one index-ordered row per route) and the backlog and wait reads,
-- which read what queue_history reads. Run on DATABASE (the primary: the vacuum
-- horizon, the statistics and the connections are its own), each check in its own
-- short transaction under a statement timeout.
--
-- Seeing other roles' sessions (their state, query, xmin) needs the pg_read_all_stats
-- role (or pg_monitor); without it, their rows show only a pid.


-- name: doctor_horizon_backends
-- What holds back vacuum in this database: sessions whose transaction holds a snapshot
-- (backend_xmin) or a transaction id (backend_xid), oldest first. VACUUM cannot remove
-- a row version that one of them may still see, so every claim walks the claim index's
-- dead entries until that transaction ends. Only this database's sessions hold back
-- its tables (since PostgreSQL 14, and before for a table's own rows). Autovacuum and
-- VACUUM themselves are left out (a vacuum's xmin holds nothing back), and so is
-- this session. age is in seconds since the transaction began; xid_age counts the
-- transactions begun since its snapshot (age()).
SELECT a.pid,
       a.state,
       a.usename AS "user",
       a.application_name,
       host(a.client_addr) AS client_addr,
       EXTRACT(EPOCH FROM now() - a.xact_start)::float8 AS age_seconds,
       EXTRACT(EPOCH FROM now() - a.state_change)::float8 AS state_seconds,
       GREATEST(age(a.backend_xmin), age(a.backend_xid)) AS xid_age,
       left(a.query, 200) AS query
  FROM pg_stat_activity AS a
 WHERE a.datname = current_database()
   AND a.pid <> pg_backend_pid()
   AND a.backend_type = 'client backend'
   AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
   AND a.xact_start < now() - make_interval(secs => %(min_seconds)s)
   AND NOT (a.state = 'active' AND a.query ~* '^\s*(vacuum|analyze)\M')
 ORDER BY a.xact_start
 LIMIT 20;


-- name: doctor_prepared_transactions
-- Prepared transactions (two-phase commit) of this database: each holds its snapshot
-- and its locks until COMMIT PREPARED or ROLLBACK PREPARED, across restarts, with no
-- session to end. A transaction manager that lost track of one leaves it forever.
SELECT gid,
       owner,
       EXTRACT(EPOCH FROM now() - prepared)::float8 AS age_seconds,
       age(transaction) AS xid_age
  FROM pg_prepared_xacts
 WHERE database = current_database()
 ORDER BY prepared;


-- name: doctor_replication_slots
-- Replication slots, server-wide. A slot's xmin (a physical slot whose standby sends
-- hot_standby_feedback) holds back vacuum of every table; a logical slot's
-- catalog_xmin holds back the system catalogs only; every slot keeps the WAL from its
-- restart_lsn on, and an inactive one keeps it growing until the disk is full.
SELECT slot_name,
       slot_type,
       database,
       active,
       active_pid,
       age(xmin) AS xmin_age,
       age(catalog_xmin) AS catalog_xmin_age,
       pg_wal_lsn_diff(
           CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn()
                ELSE pg_current_wal_lsn() END,
           restart_lsn)::bigint AS retained_wal_bytes,
       wal_status
  FROM pg_replication_slots
 ORDER BY slot_name;


-- name: doctor_standby_feedback
-- Standbys connected without a slot whose hot_standby_feedback holds back vacuum of
-- every table of the primary (a standby with a slot shows in the slot's xmin).
SELECT pid,
       application_name,
       host(client_addr) AS client_addr,
       age(backend_xmin) AS xmin_age
  FROM pg_stat_replication
 WHERE backend_xmin IS NOT NULL
 ORDER BY age(backend_xmin) DESC;


-- name: doctor_task_table
-- The task table: its size, its live and dead tuples (the statistics, as of the last
-- report of each session's counts), when it was vacuumed (last_vacuum: a VACUUM run by
-- hand or by the workers' vacuumer; last_autovacuum), whether autovacuum may run on
-- it, how old its oldest unfrozen transaction id is against autovacuum_freeze_max_age
-- (a table that reaches it is vacuumed to prevent wraparound, whatever autovacuum's
-- settings), and whether this role owns it (the vacuumer needs the owner).
-- estimated_live_bytes: the live rows (n_live_tup, kept current by the statistics;
-- reltuples, as of the last VACUUM or ANALYZE, without them) x their average width in
-- pg_stats with a tuple's header and line pointer, packed into full pages; the
-- table's size beyond it is the estimated bloat. NULL until the table was analyzed.
SELECT pg_relation_size(c.oid) AS table_bytes,
       pg_total_relation_size(c.oid) AS total_bytes,
       GREATEST(c.reltuples, 0)::bigint AS estimated_rows,
       s.n_live_tup AS live_tuples,
       s.n_dead_tup AS dead_tuples,
       s.n_mod_since_analyze AS modified_since_analyze,
       EXTRACT(EPOCH FROM now() - s.last_vacuum)::float8 AS last_vacuum_seconds,
       EXTRACT(EPOCH FROM now() - s.last_autovacuum)::float8 AS last_autovacuum_seconds,
       EXTRACT(EPOCH FROM now() - GREATEST(s.last_analyze, s.last_autoanalyze))::float8
           AS last_analyze_seconds,
       s.vacuum_count,
       s.autovacuum_count,
       current_setting('autovacuum')::bool AS autovacuum_server,
       COALESCE((SELECT o.option_value::bool
                   FROM pg_options_to_table(c.reloptions) AS o
                  WHERE o.option_name = 'autovacuum_enabled'), true) AS autovacuum_table,
       age(c.relfrozenxid) AS frozen_xid_age,
       current_setting('autovacuum_freeze_max_age')::bigint AS freeze_max_age,
       pg_has_role(current_user, c.relowner, 'USAGE') AS owned,
       (SELECT ceil(COALESCE(s.n_live_tup, GREATEST(c.reltuples, 0))
                    * (sum(st.avg_width) + 28)
                    / (current_setting('block_size')::int - 24))
               * current_setting('block_size')::int
          FROM pg_stats AS st
         WHERE st.schemaname = n.nspname AND st.tablename = c.relname
        HAVING count(*) > 0)::bigint AS estimated_live_bytes
  FROM pg_class AS c
  JOIN pg_namespace AS n ON n.oid = c.relnamespace
  LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
 WHERE c.oid = 'pgqueue_task'::regclass;


-- name: doctor_task_indexes
-- Each index of the task table: its size, its entries (reltuples, as of the last
-- VACUUM or ANALYZE), and the estimated size of those entries packed at a B-tree's
-- leaf fill (90%): entries x (key width from pg_stats + 8 bytes of tuple header + 4 of
-- line pointer), plus the metapage. The size beyond it is the estimated bloat: pages
-- of dead entries a VACUUM has not cleaned yet, or emptied pages an index never gives
-- back (only REINDEX does). Expression columns have no width: those indexes get none.
SELECT ci.relname AS index,
       pg_relation_size(ci.oid) AS index_bytes,
       GREATEST(ci.reltuples, 0)::bigint AS entries,
       (SELECT (ceil(ci.reltuples * (sum(st.avg_width) + 12)
                     / ((current_setting('block_size')::int - 24) * 0.9)) + 1)
               * current_setting('block_size')::int
          FROM pg_attribute AS a
          JOIN pg_stats AS st
            ON st.schemaname = n.nspname AND st.tablename = ct.relname
           AND st.attname = a.attname
         WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
        HAVING count(*) = i.indnkeyatts AND ci.reltuples >= 0)::bigint AS estimated_bytes,
       s.idx_scan AS scans
  FROM pg_index AS i
  JOIN pg_class AS ci ON ci.oid = i.indexrelid
  JOIN pg_class AS ct ON ct.oid = i.indrelid
  JOIN pg_namespace AS n ON n.oid = ct.relnamespace
  LEFT JOIN pg_stat_user_indexes AS s ON s.indexrelid = i.indexrelid
 WHERE i.indrelid = 'pgqueue_task'::regclass
 ORDER BY ci.relname;


-- name: doctor_claim_probe
-- What the claim walks to find the head of one route, measured: the claim's pick
-- (its ORDER BY is pgqueue_task_claim's, after the route's equalities) for one row,
-- without a lock, EXPLAIN ANALYZE with its buffers, run in the doctor's transaction
-- with the worker's planner settings (no sort, no bitmap scan: the index order). On a
-- healthy index that is a few buffers (the index's root and a leaf, the row's page),
-- whatever the backlog; every dead entry in front of the head (rows claimed since the
-- last VACUUM, or kept by an old snapshot) adds to it, and so to every claim.
EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON)
SELECT id
  FROM pgqueue_task
 WHERE state = 'pending'
   AND queue = %(queue)s::text
   AND task_name = %(task_name)s::text
   AND handler_version = %(handler_version)s::int
 ORDER BY priority DESC, run_at, id
 LIMIT 1;


-- name: doctor_queue_waits
-- Per queue of %(queues)s: the wait from due (run_at) to start (last_attempted_at)
-- of the attempts that started in the last %(minutes)s minutes and are running or
-- finished: how many, the median, the 95th percentile and the longest, in seconds.
-- Read per state through pgqueue_task_lease and pgqueue_task_retention, as
-- queue_history reads them; a finished row whose run_at was moved past its last start
-- (a retry scheduled, then cancelled) is left out.
WITH started AS (
    SELECT queue, last_attempted_at, run_at
      FROM pgqueue_task
     WHERE state = 'running'
    UNION ALL
    SELECT queue, last_attempted_at, run_at
      FROM pgqueue_task
     WHERE state = 'succeeded'
       AND finished_at >= now() - make_interval(mins => %(minutes)s)
    UNION ALL
    SELECT queue, last_attempted_at, run_at
      FROM pgqueue_task
     WHERE state = 'failed'
       AND finished_at >= now() - make_interval(mins => %(minutes)s)
    UNION ALL
    SELECT queue, last_attempted_at, run_at
      FROM pgqueue_task
     WHERE state = 'cancelled'
       AND finished_at >= now() - make_interval(mins => %(minutes)s)
),
waits AS (
    SELECT queue, EXTRACT(EPOCH FROM last_attempted_at - run_at)::float8 AS wait
      FROM started
     WHERE queue = ANY (%(queues)s::text[])
       AND last_attempted_at >= now() - make_interval(mins => %(minutes)s)
       AND last_attempted_at >= run_at
)
SELECT queue,
       count(*) AS started,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY wait) AS p50_seconds,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY wait) AS p95_seconds,
       max(wait) AS max_seconds
  FROM waits
 GROUP BY queue
 ORDER BY queue;


-- name: doctor_backlog
-- Per queue: its backlog (tasks due and not started) now and %(minutes)s minutes
-- ago, rebuilt from the rows as queue_history rebuilds its depth: a task was in the
-- backlog from its run_at until its last claim (or, never claimed, until it was
-- cancelled). Rows pruned since, and the earlier waits of a retried task, are not
-- counted. Reads the backlog and the rows finished in the window, per state, through
-- pgqueue_task_due, pgqueue_task_lease and pgqueue_task_retention.
WITH spans AS (
    SELECT queue, run_at AS entered, NULL::timestamptz AS left_at
      FROM pgqueue_task
     WHERE state = 'pending' AND run_at <= now()
    UNION ALL
    SELECT queue, run_at, last_attempted_at
      FROM pgqueue_task
     WHERE state = 'running'
    UNION ALL
    SELECT queue, run_at,
           CASE WHEN last_attempted_at >= run_at THEN last_attempted_at ELSE finished_at END
      FROM pgqueue_task
     WHERE state = 'succeeded'
       AND finished_at >= now() - make_interval(mins => %(minutes)s)
    UNION ALL
    SELECT queue, run_at,
           CASE WHEN last_attempted_at >= run_at THEN last_attempted_at ELSE finished_at END
      FROM pgqueue_task
     WHERE state = 'failed'
       AND finished_at >= now() - make_interval(mins => %(minutes)s)
    UNION ALL
    SELECT queue, run_at,
           CASE WHEN last_attempted_at >= run_at THEN last_attempted_at ELSE finished_at END
      FROM pgqueue_task
     WHERE state = 'cancelled'
       AND finished_at >= now() - make_interval(mins => %(minutes)s)
)
SELECT queue,
       count(*) FILTER (WHERE left_at IS NULL) AS depth_now,
       count(*) FILTER (
           WHERE entered <= now() - make_interval(mins => %(minutes)s)
             AND COALESCE(left_at, 'infinity') > now() - make_interval(mins => %(minutes)s)
       ) AS depth_before
  FROM spans
 GROUP BY queue
HAVING count(*) FILTER (WHERE left_at IS NULL) > 0
    OR count(*) FILTER (
           WHERE entered <= now() - make_interval(mins => %(minutes)s)
             AND COALESCE(left_at, 'infinity') > now() - make_interval(mins => %(minutes)s)
       ) > 0
 ORDER BY queue;


-- name: doctor_connections
-- Connections of the whole server against max_connections (less the slots kept for
-- superusers), and those of this database and of its workers (application_name
-- 'django_pgqueue worker', unless the database's OPTIONS set another).
SELECT current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int AS reserved,
       count(*) FILTER (WHERE backend_type = 'client backend') AS used,
       count(*) FILTER (WHERE backend_type = 'client backend'
                          AND datname = current_database()) AS this_database,
       count(*) FILTER (WHERE backend_type = 'client backend'
                          AND datname = current_database()
                          AND application_name = 'django_pgqueue worker') AS workers
  FROM pg_stat_activity;
