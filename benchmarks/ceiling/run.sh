#!/bin/sh
# The single enqueue's ceiling on this server: the enqueue statement exactly as
# enqueue() sends it (literal parameters, wake-up CASE included), the same INSERT
# without the wake-up, and pgbench's one-INSERT-per-transaction baseline, all through
# pgbench (no Python, no Django), 1 client, interleaved rounds, the task table
# truncated before each run. Needs a migrated database: PGQUEUE_BENCH_DB (default
# pgqueue_bench, which `python -m benchmarks` creates). Usage: benchmarks/ceiling/run.sh [rounds] [seconds]
set -e
here=$(dirname "$0")
db=${PGQUEUE_BENCH_DB:-pgqueue_bench}
rounds=${1:-3}
seconds=${2:-4}
conn="-h ${PGHOST:-127.0.0.1} -U ${PGUSER:-postgres}"
psql $conn -d "$db" -qc "CREATE TABLE IF NOT EXISTS bench_insert (k bigserial PRIMARY KEY, v int)"
for round in $(seq "$rounds"); do
    for script in one_insert enqueue enqueue_no_wakeup; do
        psql $conn -d "$db" -qc "TRUNCATE pgqueue_task CASCADE"
        tps=$(pgbench $conn -n -f "$here/$script.sql" -T "$seconds" "$db" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
        echo "round $round  $script  $tps tps"
    done
done
