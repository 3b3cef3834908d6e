"""What the benchmarks share: the benchmark database and Django set up on it, worker
processes, the CPU and write costs of a run, and the results table and its JSON.

The suite (``python -m benchmarks``: runner.py, workloads.py, report.py) and the other
benchmarks import from here; nothing here imports a benchmark.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


RESULTS = REPO / "benchmarks" / "results"


# Dropped and created again by every run: name another one to run beside someone else.
BENCH_DB = os.environ.get("PGQUEUE_BENCH_DB", "pgqueue_bench")


def prepare_database() -> str:
    """A fresh benchmark database on DATABASE_URL's server, or on an embedded one."""
    import psycopg

    base = os.environ.get("DATABASE_URL")
    if base:
        server_url = re.sub(r"/[^/?]*(\?|$)", r"/postgres\1", base, count=1)
        bench_url = re.sub(r"/[^/?]*(\?|$)", rf"/{BENCH_DB}\1", base, count=1)
    else:
        from django_pgqueue.core.embedded import embedded_database_url

        server_url = embedded_database_url(REPO / ".pgdata" / "bench", dbname="postgres")
        bench_url = server_url.replace("/postgres?", f"/{BENCH_DB}?", 1)
    with psycopg.connect(_libpq(server_url), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {BENCH_DB}")
    return bench_url


def _libpq(url: str) -> str:
    return url.replace("postgres://", "postgresql://", 1)


def psycopg_connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(_libpq(url), autocommit=True)


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def raw_connection():
    from django_pgqueue.worker.connection import connect

    return connect("default")


def server_info() -> dict[str, Any]:
    with raw_connection() as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('shared_buffers', 'synchronous_commit', 'fsync', 'max_connections')"
            ).fetchall()
        )
    return {"postgresql": version, **settings}


def reset_queue() -> None:
    with raw_connection() as conn:
        conn.execute(
            "TRUNCATE pgqueue_task, pgqueue_task_log, pgqueue_dependency, pgqueue_worker, "
            "pgqueue_queue, pgqueue_key_rate"
        )


_TICK = os.sysconf("SC_CLK_TCK")


def process_table() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command name, CPU seconds used so far), from /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        # fields[1] is the ppid; utime and stime are the 14th and 15th fields of stat.
        table[int(entry.name)] = (int(fields[1]), name, (int(fields[11]) + int(fields[12])) / _TICK)
    return table


class ServerCpu(float):
    """CPU seconds used so far by the PostgreSQL processes that serve the benchmark:
    its database's backends and the server's own processes (checkpointer, WAL
    writer, autovacuum...), not other databases' backends. Subtracting two readings
    sums each process's growth: a process that started in between counts whole, one
    that exited in between is left out (its last figures are gone), so a difference is
    never negative because a backend of another session ended."""

    by_pid: dict[int, float]

    def __new__(cls, by_pid: dict[int, float]) -> ServerCpu:
        value = super().__new__(cls, sum(by_pid.values()))
        value.by_pid = by_pid
        return value

    def __sub__(self, other: Any) -> float:
        if isinstance(other, ServerCpu):
            return sum(cpu - other.by_pid.get(pid, 0.0) for pid, cpu in self.by_pid.items())
        return float(self) - other


def _serves_the_benchmark(pid: int) -> bool:
    """A postgres process of this database or of no database (the server's own)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    if not title.startswith("postgres:"):
        return True  # the postmaster
    words = title.split()
    # A backend's title is "postgres: user database host state"; an autovacuum worker
    # names its database too; the server's own processes name none.
    if "autovacuum worker" in title:
        return BENCH_DB in words
    if len(words) >= 4 and ("(" in words[3] or words[3] == "[local]"):
        return words[2] == BENCH_DB
    return True


def descendants(table: dict[int, tuple[int, str, float]], pids: list[int]) -> set[int]:
    """``pids`` and every process below them in ``table`` (process_table())."""
    ours = set(pids)
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _name, _cpu) in table.items():
            if ppid in ours and pid not in ours:
                ours.add(pid)
                grew = True
    return ours


def cpu_seconds(worker_pids: list[int]) -> tuple[float, ServerCpu]:
    """CPU used so far by the worker processes (with their children: prefork) and by
    the PostgreSQL processes that serve the benchmark's database (ServerCpu)."""
    table = process_table()
    ours = descendants(table, worker_pids)
    worker = sum(table[pid][2] for pid in ours if pid in table)
    postgres = ServerCpu({
        pid: cpu for pid, (_ppid, name, cpu) in table.items()
        if name.startswith("postgres") and _serves_the_benchmark(pid)
    })  # fmt: skip
    return worker, postgres


def write_position(conn) -> tuple[int, int]:
    """(next transaction id, WAL position in bytes): their growth counts the write
    transactions (only a writing transaction takes an id) and the WAL written."""
    return conn.execute(
        "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,"
        " pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
    ).fetchone()


def cost_per_task(start: tuple, end: tuple, tasks: int) -> dict[str, float]:
    (worker0, pg0, xid0, wal0), (worker1, pg1, xid1, wal1) = start, end
    return {
        "cpu_ms_per_task": ((worker1 - worker0) + (pg1 - pg0)) * 1000 / tasks,
        "worker_cpu_ms_per_task": (worker1 - worker0) * 1000 / tasks,
        "pg_cpu_ms_per_task": (pg1 - pg0) * 1000 / tasks,
        "write_txns_per_task": (xid1 - xid0) / tasks,
        "wal_bytes_per_task": (wal1 - wal0) / tasks,
    }


class WorkerProcess:
    def __init__(self, *args: str, log_name: str, env: dict[str, str] | None = None) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.log_path = RESULTS / f"{log_name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "manage.py"),
                "runtaskworker",
                "--log-level",
                "WARNING",
                *args,
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def rss_mb(self) -> float:
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return 0.0
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark step did not finish in time")
        time.sleep(interval)


def count(conn, where: str) -> int:
    return conn.execute(f"SELECT count(*) FROM pgqueue_task WHERE {where}").fetchone()[0]


def wait_idle_worker(conn) -> None:
    """Until a worker has registered (it claims before it registers... so also settle)."""
    wait_for(lambda: conn.execute("SELECT count(*) FROM pgqueue_worker").fetchone()[0] > 0, 30)
    time.sleep(0.5)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def enqueue_backlog(total: int, batch: int = 1000, encrypted: bool = False) -> None:
    from benchmarks.tasks import noop, sealed_noop

    task = sealed_noop if encrypted else noop
    for start in range(0, total, batch):
        task.enqueue_many(range(start, min(total, start + batch)))


def setup_django_child(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()


def run_clients(
    client: Callable[..., None], clients: int, per: int, *args: Any
) -> tuple[float, list[float]]:
    """``clients`` processes of ``client(per, offset, url, ready, go, results, *args)``, each
    making ``per`` calls from its own ``offset``: each puts on ``ready`` once connected and
    warmed up, waits for ``go``, and puts its own time on ``results``. Returns the wall time
    from the go to the last client's result, and the clients' own times."""
    # spawn, not fork: a forked client would inherit the parent's open database connections.
    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(
            target=client,
            args=(per, i * per, os.environ["DATABASE_URL"], ready, go, results, *args),
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    started = time.perf_counter()
    go.set()
    times = [results.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - started
    for p in procs:
        p.join()
    return wall, times


@dataclass
class Row:
    key: str
    label: str
    unit: str
    samples: list[float] = field(default_factory=list)
    ratio_to: str | None = None  # "baseline" or another row's key
    target: str = ""
    check: Callable[[float, float | None], bool] | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def write_results(kind: str, path: Path | None, document: dict[str, Any]) -> Path:
    """Write a run's JSON (with the date and the CPU count) to ``path``, or to
    benchmarks/results/<kind>-<date>.json, and say where."""
    out = path or RESULTS / f"{kind}-{datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    stamp = {"date": datetime.now().isoformat(timespec="seconds"), "cpus": os.cpu_count()}
    out.write_text(json.dumps({**stamp, **document}, indent=2, default=str))
    print(f"\nresults written to {out}")
    return out


def rows_json(rows: dict[str, Row]) -> dict[str, dict]:
    """The rows of a results table as the JSON files keep them."""
    return {
        k: {
            "label": r.label,
            "unit": r.unit,
            "samples": r.samples,
            "median": r.median if r.samples else None,
            "ratio": ratio(rows, r),
            "target": r.target,
            "met": met(rows, r),
        }
        for k, r in rows.items()
    }


def ratio(rows: dict[str, Row], row: Row) -> float | None:
    if not row.samples or row.ratio_to is None or not rows[row.ratio_to].samples:
        return None
    return row.median / rows[row.ratio_to].median


def met(rows: dict[str, Row], row: Row) -> bool | None:
    if row.check is None or not row.samples:
        return None
    return bool(row.check(row.median, ratio(rows, row)))


def print_table(rows: dict[str, Row]) -> None:
    print(
        f"{'workload':<52} {'median':>12} {'spread (min-max)':>22} {'ratio':>7}  {'target':<24} met"
    )
    for row in rows.values():
        if not row.samples:
            continue
        digits = 3 if row.median < 1 else 1  # CPU ms per task, transactions per task
        spread = f"{min(row.samples):,.{digits}f}-{max(row.samples):,.{digits}f}"
        r = ratio(rows, row)
        ok = met(rows, row)
        mark = "" if ok is None else ("yes" if ok else "NO")
        ratio_text = f"{r:.2f}x" if r is not None else ""
        print(
            f"{row.label:<52} {row.median:>12,.{digits}f} {spread:>22} {ratio_text:>7}  "
            f"{row.target:<24} {mark}  [{row.unit}]"
        )
