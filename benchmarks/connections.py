"""``python -m benchmarks.connections``: the PostgreSQL connections one worker process
holds (issue 13, "a connection budget").

One worker process (``runtaskworker``) at ``--concurrency`` 10, 50 and 200 drains tasks
that touch the database and then stay busy without it: one ``SELECT 1`` on Django's
connection, then 0.5 s asleep, enough of them for every slot to run 8 in turn. Once with
sync handlers (benchmarks.tasks.query_then_sleep, on the slot threads), once with async
ones (benchmarks.async_tasks.query_then_sleep_async, the query through
``sync_to_async``; that worker also runs ``--async-concurrency`` at the same number).
Then at concurrency 200, sync: with Django's connection pool (``OPTIONS["pool"]``,
max_size 20; needs psycopg_pool, skipped without it), with handlers that keep their
connection to the end of the task and with handlers that close it after their query;
and with persistent connections (``CONN_MAX_AGE = 60``).

Every 0.1 s, ``pg_stat_activity`` of the benchmark database is read (from another
database, so the reading adds no connection to what it counts) and its client
connections counted by who holds them:

- **component**: ``application_name = 'django_pgqueue worker'`` (claimer, settler,
  heartbeat, maintenance), less a backend running a ``VACUUM`` (the vacuumer's own
  connection, counted apart as **vacuum**);
- **handler**: any other application_name, i.e. the worker's Django connections (this
  benchmark's own are named apart and not counted; the watchdog's, ``'django_pgqueue
  watchdog'``, would be counted apart).

Reported per case: components while the worker is idle before the drain (after its
first heartbeat: the heartbeat connects at its first beat, the settler at the first
settlement), while all its slots are busy and after the drain; handler connections
while all slots are busy and a first task has settled (the median of those samples,
"steady"), at their peak and after the drain; the sessions the
server opened per task (``pg_stat_database.sessions``: with ``CONN_MAX_AGE = 0`` a
handler's connection is opened for its task and closed after it); and the drain's rate
(from the first claim to the last settlement, on the database's clock).

Runs on a private PostgreSQL cluster (initdb + pg_ctl, tests/pgcluster.py) with
max_connections = 500, stopped and deleted at the end, also on failure or Ctrl-C: at
concurrency 200 a worker holds more connections than a default server allows
(max_connections = 100). The benchmark database is prepared on it as
``python -m benchmarks`` prepares its own (benchmarks.harness.prepare_database). The
table is printed and the results written as JSON to benchmarks/results/. See
docs/worker.md, "Database connections".
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import signal
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    BENCH_DB,
    REPO,
    RESULTS,
    WorkerProcess,
    prepare_database,
    setup_django,
    wait_for,
    write_results,
)
from tests.pgcluster import PrivateCluster

MAX_CONNECTIONS = "500"
WORKER_APPLICATION = "django_pgqueue worker"
WATCHDOG_APPLICATION = "django_pgqueue watchdog"
# This benchmark's own connections to the benchmark database (enqueueing, progress).
OBSERVER_APPLICATION = "pgqueue connections benchmark"
SAMPLE_EVERY = 0.1
POOL_MAX_SIZE = 20


@dataclass
class Case:
    key: str
    label: str
    concurrency: int
    handler: str  # "sync" or "async"
    env: dict[str, str] = field(default_factory=dict)
    release: bool = False  # the sync handler closes its connection after its query
    needs_pool: bool = False


def cases(concurrencies: list[int], pool_concurrency: int) -> list[Case]:
    found = [
        Case(f"{handler}_{n}", f"{handler}, --concurrency {n}", n, handler)
        for handler in ("sync", "async")
        for n in concurrencies
    ]
    n = pool_concurrency
    pool = {"PGQUEUE_BENCH_POOL": str(POOL_MAX_SIZE)}
    return [
        *found,
        Case(
            f"sync_{n}_pool",
            f"sync, --concurrency {n}, pool max_size {POOL_MAX_SIZE}",
            n,
            "sync",
            env=pool,
            needs_pool=True,
        ),
        Case(
            f"sync_{n}_pool_release",
            f"sync, --concurrency {n}, pool max_size {POOL_MAX_SIZE}, closed after the query",
            n,
            "sync",
            env=pool,
            release=True,
            needs_pool=True,
        ),
        Case(
            f"sync_{n}_persistent",
            f"sync, --concurrency {n}, CONN_MAX_AGE = 60",
            n,
            "sync",
            env={"PGQUEUE_BENCH_CONN_MAX_AGE": "60"},
        ),
    ]


# -- what the server sees --------------------------------------------------------------
class Observer:
    """Reads the benchmark database's connections and progress: ``stats`` on the
    cluster's ``postgres`` database (not counted), ``bench`` on the benchmark database
    (named OBSERVER_APPLICATION, not counted)."""

    def __init__(self, cluster: PrivateCluster, dbname: str) -> None:
        import psycopg

        self.dbname = dbname
        self.stats = cluster.connect()
        self.bench = psycopg.connect(
            cluster.url(dbname),
            autocommit=True,
            connect_timeout=5,
            application_name=OBSERVER_APPLICATION,
        )

    def close(self) -> None:
        self.stats.close()
        self.bench.close()

    def connections(self) -> dict[str, Any]:
        """The benchmark database's client connections now, by kind and by
        application_name."""
        rows = self.stats.execute(
            "SELECT application_name, state, query FROM pg_stat_activity"
            " WHERE datname = %s AND backend_type = 'client backend'",
            [self.dbname],
        ).fetchall()
        kinds: Counter = Counter()
        names: Counter = Counter()
        for application, state, query in rows:
            if application == OBSERVER_APPLICATION:
                continue
            names[application or "(none)"] += 1
            if application == WORKER_APPLICATION:
                vacuum = state == "active" and re.match(r"\s*vacuum\b", query or "", re.I)
                kinds["vacuum" if vacuum else "component"] += 1
            elif application == WATCHDOG_APPLICATION:
                kinds["watchdog"] += 1
            else:
                kinds["handler"] += 1
        return {
            "component": kinds["component"],
            "handler": kinds["handler"],
            "vacuum": kinds["vacuum"],
            "watchdog": kinds["watchdog"],
            "by_application": dict(names),
        }

    def sessions(self) -> int:
        """Sessions the server has opened on the benchmark database so far."""
        self.stats.execute("SELECT pg_stat_clear_snapshot()")
        return self.stats.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = %s", [self.dbname]
        ).fetchone()[0]

    def progress(self) -> tuple[int, int, int]:
        """(succeeded, running, failed or retrying) tasks."""
        return self.bench.execute(
            "SELECT count(*) FILTER (WHERE state = 'succeeded'),"
            " count(*) FILTER (WHERE state = 'running'),"
            " count(*) FILTER (WHERE state NOT IN ('succeeded', 'running', 'pending'))"
            " FROM pgqueue_task"
        ).fetchone()

    def registered(self) -> int:
        return self.bench.execute("SELECT count(*) FROM pgqueue_worker").fetchone()[0]

    def sample_for(self, seconds: float) -> list[dict[str, Any]]:
        samples = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            samples.append(self.connections())
            time.sleep(SAMPLE_EVERY)
        return samples


# -- one case --------------------------------------------------------------------------
def start_worker(case: Case) -> WorkerProcess:
    args = ["--concurrency", str(case.concurrency)]
    env = dict(case.env)
    if case.handler == "async":
        args += ["--async-concurrency", str(case.concurrency)]
        env["PGQUEUE_BENCH_ASYNC_TASKS"] = "1"
    if os.environ.get("PYTHONPATH"):  # WorkerProcess sets it to the repository alone
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]])
    log_name = f"connections-{case.key}"
    (RESULTS / f"{log_name}.log").unlink(missing_ok=True)  # WorkerProcess appends
    return WorkerProcess(*args, log_name=log_name, env=env)


def enqueue(case: Case, tasks: int, seconds: float) -> None:
    """``tasks`` handlers into the paused default queue."""
    if case.handler == "async":
        from benchmarks.async_tasks import query_then_sleep_async

        query_then_sleep_async.enqueue_many([seconds] * tasks)
    else:
        from benchmarks.tasks import query_then_sleep

        query_then_sleep.enqueue_many([(seconds, case.release)] * tasks)


def run_case(observer: Observer, case: Case, rounds: int, seconds: float) -> dict[str, Any]:
    """Start the case's worker, watch it idle, drain ``rounds`` tasks per slot, watch
    it idle again; what the server saw."""
    from django.db import connections

    from django_pgqueue import pause, resume
    from django_pgqueue.core.conf import get_settings

    tasks = case.concurrency * rounds
    observer.bench.execute(
        "TRUNCATE pgqueue_task, pgqueue_dependency, pgqueue_worker, pgqueue_queue"
    )
    pause("default")
    connections.close_all()
    worker = start_worker(case)
    try:

        def registered() -> bool:
            if worker.proc.poll() is not None:
                raise RuntimeError(f"the worker exited; see {worker.log_path}")
            return observer.registered() > 0

        wait_for(registered, 60, 0.1)
        # The heartbeat connects at its first beat (the settler at the first settlement).
        time.sleep(get_settings().HEARTBEAT_SECONDS + 1.0)
        before = observer.sample_for(1.0)
        enqueue(case, tasks, seconds)
        sessions_start = observer.sessions()
        resume("default")
        busy, drain = [], []
        deadline = time.monotonic() + 600
        while True:
            held = observer.connections()
            succeeded, running, other = observer.progress()
            held["running"] = running
            drain.append(held)
            if running >= case.concurrency and succeeded > 0:
                busy.append(held)
            if succeeded + other >= tasks:
                break
            if worker.proc.poll() is not None:
                raise RuntimeError(f"the worker exited during the drain; see {worker.log_path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{case.label}: {succeeded:,} of {tasks:,} tasks settled")
            time.sleep(SAMPLE_EVERY)
        sessions = observer.sessions() - sessions_start
        after = observer.sample_for(1.5)
        first, last = observer.bench.execute(
            "SELECT min(started_at), max(finished_at) FROM pgqueue_task"
        ).fetchone()
    finally:
        worker.stop()
    log = worker.log_path.read_text(errors="replace")
    errors = [line for line in log.splitlines() if re.search(r"ERROR|CRITICAL|Traceback", line)]
    steady = busy or drain  # every slot busy; a drain that never filled them: all of it
    return {
        "label": case.label,
        "handler": case.handler,
        "concurrency": case.concurrency,
        "env": case.env,
        "tasks": tasks,
        "succeeded": succeeded,
        "not_succeeded": other,
        "rate": tasks / (last - first).total_seconds(),
        "samples_all_slots_busy": len(busy),
        "component_idle_before": max(s["component"] for s in before),
        "component_busy_min": min(s["component"] for s in steady),
        "component_busy_max": max(s["component"] for s in steady),
        "component_peak": max(s["component"] for s in drain),
        "component_after": max(s["component"] for s in after),
        "vacuum_peak": max(s["vacuum"] for s in drain),
        "watchdog_peak": max(s["watchdog"] for s in drain),
        "handler_idle_before": max(s["handler"] for s in before),
        "handler_steady": statistics.median(s["handler"] for s in steady),
        "handler_peak": max(s["handler"] for s in drain),
        "handler_after": max(s["handler"] for s in after),
        "total_peak": max(s["component"] + s["handler"] + s["vacuum"] for s in drain),
        "sessions_per_task": sessions / tasks,
        "by_application_peak": peak_by_application(drain),
        "log_errors": errors[:5],
        "timeline": [[s["component"], s["handler"], s["vacuum"], s["running"]] for s in drain],
    }


def peak_by_application(samples: list[dict[str, Any]]) -> dict[str, int]:
    peaks: dict[str, int] = {}
    for sample in samples:
        for name, n in sample["by_application"].items():
            peaks[name] = max(peaks.get(name, 0), n)
    return peaks


# -- the report ------------------------------------------------------------------------
def print_table(results: dict[str, dict[str, Any]]) -> None:
    print(
        f"{'case':<68} {'components':>18} {'handler connections':>22} {'peak':>5}"
        f" {'sessions':>9} {'tasks/s':>8}"
    )
    print(
        f"{'':<68} {'idle / busy / after':>18} {'steady / peak / after':>22} {'total':>5}"
        f" {'per task':>9}"
    )
    for r in results.values():
        if "skipped" in r:
            print(f"{r['label']:<68} skipped: {r['skipped']}")
            continue
        busy = (
            str(r["component_busy_max"])
            if r["component_busy_min"] == r["component_busy_max"]
            else f"{r['component_busy_min']}-{r['component_busy_max']}"
        )
        components = f"{r['component_idle_before']} / {busy} / {r['component_after']}"
        handlers = f"{r['handler_steady']:g} / {r['handler_peak']} / {r['handler_after']}"
        failed = f"  ({r['not_succeeded']} not succeeded)" if r["not_succeeded"] else ""
        vacuum = f"  (+{r['vacuum_peak']} vacuum)" if r["vacuum_peak"] else ""
        print(
            f"{r['label']:<68} {components:>18} {handlers:>22} {r['total_peak']:>5}"
            f" {r['sessions_per_task']:>9.2f} {r['rate']:>8.1f}{vacuum}{failed}"
        )


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.connections",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--concurrency",
        default="10,50,200",
        help="the worker's --concurrency of each case (comma-separated)",
    )
    parser.add_argument(
        "--pool-concurrency",
        type=int,
        default=200,
        help="the --concurrency of the pooled and persistent cases",
    )
    parser.add_argument(
        "--busy-seconds",
        type=float,
        default=4.0,
        help="how long every slot is kept busy (in handlers of --sleep each)",
    )
    parser.add_argument("--sleep", type=float, default=0.5, help="each handler's sleep, s")
    parser.add_argument("--json", type=Path, help="where to write the results")
    args = parser.parse_args(argv)
    concurrencies = [int(n) for n in args.concurrency.split(",")]
    rounds = max(1, math.ceil(args.busy_seconds / args.sleep))

    # A SIGTERM unwinds like Ctrl-C: the worker is stopped and the cluster deleted.
    signal.signal(signal.SIGTERM, _interrupted)
    cluster = PrivateCluster.create()
    try:
        cluster.configure(max_connections=MAX_CONNECTIONS)
        cluster.restart()
        return run(args, cluster, cases(concurrencies, args.pool_concurrency), rounds)
    finally:
        cluster.destroy()


def run(args: argparse.Namespace, cluster: PrivateCluster, todo: list[Case], rounds: int) -> int:
    from django.db import connections

    os.environ["DATABASE_URL"] = cluster.url()
    url = prepare_database()
    setup_django(url)
    # This process's own connections (the enqueue, pause and resume) are named apart.
    connections["default"].settings_dict.setdefault("OPTIONS", {})["application_name"] = (
        OBSERVER_APPLICATION
    )
    connections.close_all()
    pool = importlib.util.find_spec("psycopg_pool") is not None
    observer = Observer(cluster, BENCH_DB)
    version = observer.stats.execute("SHOW server_version").fetchone()[0]
    print(
        f"django_pgqueue connections benchmark, {datetime.now():%Y-%m-%d %H:%M}, PostgreSQL "
        f"{version} (private cluster, port {cluster.port}, max_connections "
        f"{MAX_CONNECTIONS}), {os.cpu_count()} CPUs; handlers: one SELECT 1, then "
        f"{args.sleep:g} s asleep, {rounds} per slot",
        flush=True,
    )
    results: dict[str, dict[str, Any]] = {}
    try:
        for case in todo:
            if case.needs_pool and not pool:
                results[case.key] = {
                    "label": case.label,
                    "skipped": "psycopg_pool is not installed (pip install 'psycopg[pool]')",
                }
                print(f"  {case.label}: skipped, psycopg_pool is not installed", flush=True)
                continue
            print(f"  {case.label}: ", end="", flush=True)
            r = run_case(observer, case, rounds, args.sleep)
            results[case.key] = r
            print(
                f"components {r['component_busy_max']}, handler connections "
                f"{r['handler_steady']:g} steady, {r['handler_peak']} peak, "
                f"{r['handler_after']} after; {r['rate']:.1f} tasks/s",
                flush=True,
            )
    finally:
        observer.close()
    print()
    print_table(results)
    write_results(
        "connections",
        args.json,
        {
            "server": {"postgresql": version, "max_connections": MAX_CONNECTIONS},
            "handler_sleep": args.sleep,
            "tasks_per_slot": rounds,
            "pool_max_size": POOL_MAX_SIZE,
            "cases": results,
        },
    )
    problems = [
        key
        for key, r in results.items()
        if "skipped" not in r and (r["not_succeeded"] or r["log_errors"])
    ]
    for key in problems:
        r = results[key]
        print(
            f"FAILED: {r['label']}: {r['not_succeeded']} tasks not succeeded; "
            f"{(r['log_errors'] or ['no errors logged'])[0]}"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
