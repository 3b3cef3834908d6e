"""``python -m benchmarks.fleet``: a fleet of worker processes on one database (issue 13).

A private PostgreSQL cluster (initdb + pg_ctl, tests/pgcluster.py) with room for the
fleet's connections (max_connections = 1000; fsync and synchronous_commit at their
defaults) holds the benchmark database for the run, and is stopped and deleted at the
end, also on failure or Ctrl-C. On it:

1. **Idle load.** 50 worker processes (``runtaskworker --concurrency 4``) start; once all
   have registered and at least 15 s have passed (a backend reports its statistics
   counters within 10 s of going idle, and the first heartbeat after 10 s counts the
   fleet), the growth of the database's ``xact_commit + xact_rollback`` over 30 s,
   divided by the processes and the seconds. Every worker statement is a transaction of
   its own (a limited claim's two statements are one), so this is the statements each
   idle process costs PostgreSQL per second. The statements are also logged
   (``log_statement = 'all'``) over the same window and counted by kind (the named
   statement of django_pgqueue/db/sql/ each one is); they are fewer than the
   transactions by the statements a session prepares for the first time (preparing is
   a transaction of its own) and by autovacuum's. Also: the server connections the
   fleet holds.
2. **Drain.** 100,000 no-op tasks (``enqueue_many``, into the paused queue, which is then
   resumed) drained by that fleet: from the first claim (``min(started_at)``) to the
   100,000th settlement (its ``finished_at``); every task must have succeeded once, with
   no error, and no worker may have logged an error. Then the same drain by 2 worker
   processes with the defaults (concurrency 10), on the same cluster, and the ratio.

Both drains report the machine's CPU: how busy its cores were, and what the workers and
PostgreSQL used. The table is printed as ``python -m benchmarks`` prints its own, and
the results written as JSON to benchmarks/results/. See docs/performance.md, "Fleet".
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.harness import (
    REPO,
    RESULTS,
    Row,
    WorkerProcess,
    cost_per_task,
    count,
    cpu_seconds,
    enqueue_backlog,
    print_table,
    raw_connection,
    reset_queue,
    rows_json,
    setup_django,
    wait_for,
    write_position,
    write_results,
)
from tests.pgcluster import PrivateCluster

FLEET_DB = "pgqueue_fleet"
SERVER = {
    "max_connections": "1000",
    # PostgreSQL's default (tests/pgcluster.py's clusters run on 16MB).
    "shared_buffers": "'128MB'",
}
# Who ran each logged statement, in which database: the worker's components set this
# application_name.
LOG_LINE_PREFIX = "%m [%p] <%a|%d> "
WORKER_APPLICATION = "django_pgqueue worker"
# The server log of the idle window, kept in RESULTS for a second look.
STATEMENT_LOG = "fleet-idle-statements.log"


# -- the fleet -------------------------------------------------------------------------
def start_workers(processes: int, *args: str, name: str) -> list[WorkerProcess]:
    workers = []
    for i in range(processes):
        log_name = f"{name}-{i}"
        (RESULTS / f"{log_name}.log").unlink(missing_ok=True)  # WorkerProcess appends
        workers.append(WorkerProcess(*args, log_name=log_name))
    return workers


def stop_workers(workers: list[WorkerProcess]) -> None:
    """SIGTERM to all at once (a graceful stop each), then wait for each."""
    for worker in workers:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGTERM)
    for worker in workers:
        worker.stop()  # waits; a worker still running 30 s later is killed


def ensure_running(workers: list[WorkerProcess]) -> None:
    exited = [worker.log_path.name for worker in workers if worker.proc.poll() is not None]
    if exited:
        raise RuntimeError(f"{len(exited)} worker process(es) exited; see {', '.join(exited)}")


def registered(conn) -> int:
    return conn.execute("SELECT count(*) FROM pgqueue_worker").fetchone()[0]


def wait_registered(workers: list[WorkerProcess], timeout: float) -> float:
    """Until every worker has its pgqueue_worker row; seconds since the first spawn."""
    with raw_connection() as conn:

        def all_in() -> bool:
            ensure_running(workers)
            return registered(conn) >= len(workers)

        wait_for(all_in, timeout, 0.5)
    return time.monotonic() - workers[0].started


def log_lines(workers: list[WorkerProcess], pattern: str) -> dict[str, list[str]]:
    """The lines of the workers' logs (--log-level WARNING) that match ``pattern``,
    per log file."""
    found = {}
    for worker in workers:
        text = worker.log_path.read_text(errors="replace")
        lines = [line for line in text.splitlines() if re.search(pattern, line)]
        if lines:
            found[worker.log_path.name] = lines
    return found


def log_errors(workers: list[WorkerProcess]) -> dict[str, list[str]]:
    return log_lines(workers, r"ERROR|CRITICAL|Traceback")


def log_warnings(workers: list[WorkerProcess]) -> dict[str, list[str]]:
    return log_lines(workers, r"WARNING")


# -- what the server sees --------------------------------------------------------------
def transactions(stats: psycopg.Connection) -> int:
    """The fleet database's transactions so far, read from another database (the
    ``postgres`` one), so that reading them adds none."""
    stats.execute("SELECT pg_stat_clear_snapshot()")
    return stats.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
        [FLEET_DB],
    ).fetchone()[0]


def connections_held(
    stats: psycopg.Connection, ours: psycopg.Connection | None = None
) -> dict[str, int]:
    """Server connections to the fleet database, by application_name, but for ``ours``
    (the benchmark's own, opened by the worker's connect(): it has its
    application_name)."""
    return dict(
        stats.execute(
            "SELECT coalesce(nullif(application_name, ''), backend_type), count(*)"
            " FROM pg_stat_activity WHERE datname = %s AND pid <> %s"
            " GROUP BY 1 ORDER BY 2 DESC",
            [FLEET_DB, ours.info.backend_pid if ours else 0],
        ).fetchall()
    )


def cluster_cpu(cluster: PrivateCluster) -> float:
    """CPU seconds used so far by the private cluster's processes (the postmaster and
    its children: backends, WAL writer, checkpointer, autovacuum), not by the
    machine's other PostgreSQL servers."""
    postmaster = int((cluster.data / "postmaster.pid").read_text().split("\n", 1)[0])
    return cpu_seconds([postmaster])[0]  # the pids given and their descendants


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    idle = fields[3] + fields[4]
    return (total - idle) / os.sysconf("SC_CLK_TCK"), total / os.sysconf("SC_CLK_TCK")


def _normalized(sql: str) -> str:
    """A statement's text with its placeholders (%(name)s as written, $1 as logged)
    and its whitespace made uniform."""
    sql = re.sub(r"%\(\w+\)s|%s|\$\d+", "?", sql).replace("%%", "%")
    return " ".join(sql.split())


def statement_kinds(log_text: str) -> Counter:
    """The statements run in the fleet's database, from a server log written with
    log_statement = 'all' and LOG_LINE_PREFIX, counted by the db/sql/ name each is
    (or, for one that is not there, its first words; for one run by another
    application than the worker, prefixed with that application's name)."""
    from django_pgqueue.db.sql import QUERIES

    names = {_normalized(text): name for name, text in QUERIES.items()}
    entry = re.compile(r"^\S+ \S+ \S+ \[\d+\] <([^|>]*)\|([^>]*)> (\w+):  (.*)$")
    statements: list[tuple[str, list[str]]] = []  # (application, the statement's lines)
    current: list[str] | None = None
    for line in log_text.splitlines():
        m = entry.match(line)
        if m is None:
            if current is not None:
                current.append(line)  # the statement's next line
            continue
        current = None
        application, database, level, message = m.groups()
        said = re.match(r"(?:statement|execute [^:]+): (.*)$", message)
        if database == FLEET_DB and level == "LOG" and said:
            current = [said.group(1)]
            statements.append((application, current))
    kinds: Counter = Counter()
    for application, lines in statements:
        text = _normalized("\n".join(lines))
        kind = names.get(text) or " ".join(text.split()[:4])
        kinds[kind if application == WORKER_APPLICATION else f"[{application}] {kind}"] += 1
    return kinds


# -- the measurements ------------------------------------------------------------------
def idle_load(
    cluster: PrivateCluster,
    stats: psycopg.Connection,
    workers: list[WorkerProcess],
    warmup: float,
    seconds: float,
) -> dict[str, Any]:
    """The fleet's transactions per second per process, once idle (see the module's
    docstring), and the statements of the same window by kind."""
    time.sleep(max(0.0, warmup - 3))
    # A backend applies the reload before its next statement (an idle one, too), so
    # turning the statement log on 3 s early logs the whole window.
    cluster.configure(log_line_prefix=LOG_LINE_PREFIX, log_statement="all")
    time.sleep(3)
    processes, pids = len(workers), [worker.proc.pid for worker in workers]
    log_from = cluster.logfile.stat().st_size
    cpu_before = (cpu_seconds(pids)[0], cluster_cpu(cluster))
    before, started = transactions(stats), time.monotonic()
    time.sleep(seconds)
    after, elapsed = transactions(stats), time.monotonic() - started
    cpu_after = (cpu_seconds(pids)[0], cluster_cpu(cluster))
    log_to = cluster.logfile.stat().st_size
    cluster.configure(log_statement="none")
    held = connections_held(stats)
    with open(cluster.logfile, "rb") as log:
        log.seek(log_from)
        window = log.read(log_to - log_from).decode(errors="replace")
    (RESULTS / STATEMENT_LOG).write_text(window)
    kinds = statement_kinds(window)
    per_kind = {name: n / elapsed / processes for name, n in kinds.most_common()}
    workers_held = held.get(WORKER_APPLICATION, 0)
    return {
        "per_process_per_second": (after - before) / elapsed / processes,
        "transactions": after - before,
        "seconds": elapsed,
        "logged_statements_per_process_per_second": sum(kinds.values()) / elapsed / processes,
        "statements_by_kind_per_process_per_second": per_kind,
        "connections": sum(held.values()),
        "connections_by_application": held,
        "worker_connections_per_process": workers_held / processes,
        # Per process, in percent of one core.
        "worker_cpu_pct_per_process": 100 * (cpu_after[0] - cpu_before[0]) / elapsed / processes,
        "pg_cpu_pct_per_process": 100 * (cpu_after[1] - cpu_before[1]) / elapsed / processes,
    }


def timed_drain(
    cluster: PrivateCluster, workers: list[WorkerProcess], total: int
) -> dict[str, Any]:
    """``total`` no-ops drained by running, registered, idle ``workers``: enqueued
    while their queue is paused, then resumed (one NOTIFY wakes them all). Timed on the
    database's clock, from the first claim to the ``total``-th settlement."""
    from django_pgqueue import pause, resume

    with raw_connection() as conn:
        # The workers' rows stay: they are running (harness.reset_queue drops them too).
        conn.execute("TRUNCATE pgqueue_task, pgqueue_dependency")
    pause("default")
    enqueue_backlog(total)
    pids = [worker.proc.pid for worker in workers]
    with raw_connection() as conn:
        conn.execute("VACUUM ANALYZE pgqueue_task")
        conn.execute("CHECKPOINT")  # the enqueue's WAL is not the drain's
        machine_start = machine_cpu()
        cost_start = (cpu_seconds(pids)[0], cluster_cpu(cluster), *write_position(conn))
        resume("default")

        def drained() -> bool:
            ensure_running(workers)
            return count(conn, "state = 'succeeded'") >= total

        wait_for(drained, 1800, 0.25)
        cost_end = (cpu_seconds(pids)[0], cluster_cpu(cluster), *write_position(conn))
        machine_end = machine_cpu()
        with cluster.connect() as stats:
            held = connections_held(stats, conn)  # busy: the settlers have connected
        first, nth = conn.execute(
            "SELECT (SELECT min(started_at) FROM pgqueue_task),"
            " (SELECT finished_at FROM pgqueue_task WHERE state = 'succeeded'"
            "   ORDER BY finished_at OFFSET %s LIMIT 1)",
            [total - 1],
        ).fetchone()
        duplicates = count(
            conn,
            "attempt > 1 OR jsonb_array_length(executions) > 1 OR jsonb_array_length(errors) > 0",
        )
        succeeded = count(conn, "state = 'succeeded'")
        rows = count(conn, "true")
        per_worker = [
            n
            for (n,) in conn.execute(
                "SELECT count(*) FROM pgqueue_task GROUP BY worker_id ORDER BY 1 DESC"
            ).fetchall()
        ]
    seconds = (nth - first).total_seconds()
    busy = machine_end[0] - machine_start[0]
    capacity = machine_end[1] - machine_start[1]  # CPU seconds of all cores: wall x cores
    cost = cost_per_task(cost_start, cost_end, total)
    return {
        "rate": total / seconds,
        "seconds": seconds,
        "succeeded": succeeded,
        "rows": rows,
        "duplicates": duplicates,
        "machine_busy_fraction": busy / capacity,
        # The workers' and the private cluster's share of the machine's cores.
        "ours_fraction": cost["cpu_ms_per_task"] * total / 1000 / capacity,
        "connections_after": held,
        "workers_that_ran_tasks": len(per_worker),
        "most_tasks_one_worker": per_worker[0] if per_worker else 0,
        "fewest_tasks_one_worker": per_worker[-1] if per_worker else 0,
        **cost,
    }


def check_drain(d: dict[str, Any], total: int, errors: dict[str, list[str]]) -> list[str]:
    """What went wrong in a drain, as sentences (empty: nothing)."""
    failures = []
    if d["succeeded"] != total or d["rows"] != total:
        failures.append(f"{d['succeeded']:,} of {d['rows']:,} rows succeeded, not {total:,}")
    if d["duplicates"]:
        failures.append(f"{d['duplicates']:,} tasks ran more than once or recorded an error")
    if errors:
        log, lines = next(iter(errors.items()))
        failures.append(f"{len(errors)} worker log(s) report errors, e.g. {log}: {lines[0]}")
    return failures


def report_drain(d: dict[str, Any], processes: int) -> None:
    held = d["connections_after"].get(WORKER_APPLICATION, 0)
    print(
        f"  {d['succeeded']:,} succeeded, {d['duplicates']:,} duplicates, in "
        f"{d['seconds']:.1f} s; {d['workers_that_ran_tasks']} workers ran tasks "
        f"({d['fewest_tasks_one_worker']:,}-{d['most_tasks_one_worker']:,} each); CPU "
        f"{d['cpu_ms_per_task']:.3f} ms/task (workers {d['worker_cpu_ms_per_task']:.3f} + "
        f"PostgreSQL {d['pg_cpu_ms_per_task']:.3f}), {d['write_txns_per_task']:.3f} write "
        f"txns/task; machine busy {100 * d['machine_busy_fraction']:.0f}% (the workers and "
        f"the cluster: {100 * d['ours_fraction']:.0f}% of the cores); worker connections "
        f"after it {held} ({held / processes:.1f} per process)",
        flush=True,
    )
    for kind, found in (("errors", d["log_errors"]), ("warnings", d["log_warnings"])):
        if found:
            log, lines = next(iter(found.items()))
            print(f"  {kind} in {len(found)} worker log(s), e.g. {log}: {lines[0]}")


# -- the run ---------------------------------------------------------------------------
def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--processes", type=int, default=50, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=4, help="each one's --concurrency")
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks of each drain")
    parser.add_argument(
        "--warmup",
        type=float,
        default=15.0,
        help="seconds from the last registration to the idle window",
    )
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--json", type=Path, help="where to write the results")
    args = parser.parse_args(argv)

    # A SIGTERM unwinds like Ctrl-C: the workers are stopped and the cluster deleted.
    signal.signal(signal.SIGTERM, _interrupted)
    started: list[WorkerProcess] = []
    cluster = PrivateCluster.create(**SERVER)
    try:
        return run(args, cluster, started)
    finally:
        stop_workers(started)
        cluster.destroy()


def code_version() -> dict[str, Any]:
    """The commit, and the files of the app that differ from it in the working tree."""

    def git(*command: str) -> str:
        return subprocess.run(
            ["git", *command], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted": git("status", "--porcelain", "--", "django_pgqueue").splitlines(),
    }


def run(args: argparse.Namespace, cluster: PrivateCluster, started: list[WorkerProcess]) -> int:
    from django.db import connections

    n, total = args.processes, args.tasks
    code = code_version()
    with cluster.connect() as conn:
        conn.execute(f"CREATE DATABASE {FLEET_DB}")
        version = conn.execute("SHOW server_version").fetchone()[0]
    setup_django(cluster.url(FLEET_DB))
    connections.close_all()  # the migration's connection is not the fleet's
    print(
        f"django_pgqueue fleet benchmark, {datetime.now():%Y-%m-%d %H:%M}, PostgreSQL "
        f"{version} (private cluster, port {cluster.port}, max_connections "
        f"{SERVER['max_connections']}), {os.cpu_count()} CPUs, code {code['commit']}"
        f"{' + uncommitted changes to the app' if code['uncommitted'] else ''}",
        flush=True,
    )
    rows = {
        "idle": Row(
            "idle",
            f"Fleet idle, {n} x {args.concurrency}: statements/s per process",
            "stmt/s",
            target="< 2",
            check=lambda v, r: v < 2,
        ),
        # The same window's statements as the server logged them: without the one-off
        # preparation of a statement a session runs for the first time, nor autovacuum.
        "idle_logged": Row("idle_logged", "Fleet idle: logged statements/s per process", "stmt/s"),
        "connections": Row(
            "connections", f"Fleet idle: server connections, {n} processes", "conns"
        ),
        "connections_per_process": Row(
            "connections_per_process", "Fleet idle: server connections per process", "conns"
        ),
        "start": Row("start", f"Fleet start: spawn to the last of {n} registrations", "s"),
        "fleet_drain": Row(
            "fleet_drain",
            f"Fleet drain {total:,}, {n} processes x {args.concurrency}",
            "tasks/s",
            ratio_to="pair_drain",
        ),
        "fleet_busy": Row("fleet_busy", "Fleet drain: machine CPU busy", "%"),
        "fleet_cpu": Row("fleet_cpu", "Fleet drain: CPU per task (workers + PostgreSQL)", "ms"),
        "pair_drain": Row(
            "pair_drain", f"Drain {total:,}, 2 processes x 10 (the defaults)", "tasks/s"
        ),
        "pair_busy": Row("pair_busy", "2-process drain: machine CPU busy", "%"),
        "pair_cpu": Row("pair_cpu", "2-process drain: CPU per task (workers + PostgreSQL)", "ms"),
    }
    raw: dict[str, Any] = {}
    failures: list[str] = []

    def record(key: str, value: float) -> None:
        rows[key].samples.append(value)
        print(f"  {rows[key].label}: {value:,.2f} {rows[key].unit}", flush=True)

    print(f"starting {n} worker processes", flush=True)
    fleet = start_workers(n, "--concurrency", str(args.concurrency), name="fleet")
    started.extend(fleet)
    record("start", wait_registered(fleet, 600))
    with cluster.connect() as stats:
        idle = idle_load(cluster, stats, fleet, args.warmup, args.idle_seconds)
    raw["idle"] = idle
    record("idle", idle["per_process_per_second"])
    record("idle_logged", idle["logged_statements_per_process_per_second"])
    record("connections", idle["connections"])
    record("connections_per_process", idle["connections"] / n)
    print(f"  connections by application_name: {idle['connections_by_application']}")
    print("  statements of the window by kind, per process per second:")
    for kind, rate in idle["statements_by_kind_per_process_per_second"].items():
        print(f"    {rate:7.3f}  {kind}")
    print(
        f"  CPU per idle process: worker {idle['worker_cpu_pct_per_process']:.2f}% of a core,"
        f" its PostgreSQL backends {idle['pg_cpu_pct_per_process']:.2f}%"
    )
    ensure_running(fleet)
    raw["fleet_rss_mb"] = sum(worker.rss_mb() for worker in fleet)

    print(f"draining {total:,} tasks with the fleet", flush=True)
    d = timed_drain(cluster, fleet, total)
    stop_workers(fleet)
    d["log_errors"], d["log_warnings"] = log_errors(fleet), log_warnings(fleet)
    raw["fleet_drain"] = d
    failures += [f"fleet drain: {f}" for f in check_drain(d, total, d["log_errors"])]
    report_drain(d, n)
    record("fleet_drain", d["rate"])
    record("fleet_busy", 100 * d["machine_busy_fraction"])
    record("fleet_cpu", d["cpu_ms_per_task"])

    print(f"draining {total:,} tasks with 2 processes", flush=True)
    reset_queue()
    pair = start_workers(2, name="fleet-pair")
    started.extend(pair)
    wait_registered(pair, 120)
    time.sleep(2)
    d = timed_drain(cluster, pair, total)
    stop_workers(pair)
    d["log_errors"], d["log_warnings"] = log_errors(pair), log_warnings(pair)
    raw["pair_drain"] = d
    failures += [f"2-process drain: {f}" for f in check_drain(d, total, d["log_errors"])]
    report_drain(d, 2)
    record("pair_drain", d["rate"])
    record("pair_busy", 100 * d["machine_busy_fraction"])
    record("pair_cpu", d["cpu_ms_per_task"])

    print()
    print_table(rows)
    for failure in failures:
        print(f"FAILED: {failure}")
    write_results(
        "fleet",
        args.json,
        {
            "server": {"postgresql": version, **SERVER},
            "code": code,
            "processes": n,
            "concurrency": args.concurrency,
            "tasks": total,
            "rows": rows_json(rows),
            "failures": failures,
            "raw": raw,
        },
    )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
