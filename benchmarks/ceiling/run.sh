#!/bin/sh
# The single enqueue's ceiling on this server: the enqueue statement exactly as
# enqueue() sends it (literal parameters, wake-up CASE included), the same INSERT
# without the wake-up, pgbench's one-INSERT-per-transaction baseline, and PgQueuer's
# enqueue statement for one job (pgqueuer_enqueue.sql, from its Queries.enqueue: a
# MATERIALIZED CTE, the INSERT, an INSERT into its log table, and its table's
# statement-level NOTIFY trigger), all through pgbench (no Python, no Django),
# interleaved rounds, the tables truncated before each run.
#
# Usage: benchmarks/ceiling/run.sh [rounds] [seconds]
#   PGQUEUE_BENCH_DB   the database (default pgqueue_bench; `python -m benchmarks` creates
#                      and migrates it, `--peer pgqueuer` also installs PgQueuer's schema;
#                      without that schema the PgQueuer script is skipped)
#   PROTOCOLS          pgbench -M modes, interleaved (default "simple"; "simple prepared"
#                      also runs each script as a prepared statement)
#   CLIENTS            pgbench clients (default 1)
#   SYNC_COMMIT        "off" runs pgbench's sessions with synchronous_commit = off: the
#                      statements' CPU path without the wait for the WAL flush (which a
#                      shared machine's disk makes the noisiest part)
set -e
here=$(dirname "$0")
db=${PGQUEUE_BENCH_DB:-pgqueue_bench}
rounds=${1:-3}
seconds=${2:-4}
protocols=${PROTOCOLS:-simple}
clients=${CLIENTS:-1}
conn="-h ${PGHOST:-127.0.0.1} -U ${PGUSER:-postgres}"
sync_commit=${SYNC_COMMIT:-on}
psql $conn -d "$db" -qc "CREATE TABLE IF NOT EXISTS bench_insert (k bigserial PRIMARY KEY, v int)"
scripts="one_insert enqueue enqueue_no_wakeup"
if [ "$(psql $conn -d "$db" -Atc "SELECT to_regclass('pgqueuer') IS NOT NULL")" = t ]; then
    scripts="$scripts pgqueuer_enqueue"
else
    echo "no PgQueuer schema in $db: pgqueuer_enqueue skipped (python -m benchmarks --peer pgqueuer installs it)"
fi
for round in $(seq "$rounds"); do
    for protocol in $protocols; do
        for script in $scripts; do
            case $script in
                pgqueuer_enqueue) tables="pgqueuer, pgqueuer_log" ;;
                one_insert) tables="bench_insert" ;;
                *) tables="pgqueue_task CASCADE" ;;
            esac
            psql $conn -d "$db" -qc "TRUNCATE $tables"
            tps=$(PGOPTIONS="-c synchronous_commit=$sync_commit" pgbench $conn -n -M "$protocol" -c "$clients" -j "$clients" \
                -f "$here/$script.sql" -T "$seconds" "$db" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
            echo "round $round  $protocol  $clients client(s)  sync=$sync_commit  $script  $tps tps"
        done
    done
done
