"""``python -m benchmarks.history``: history at scale, DELETE-based retention at a
sustained rate (issue 13, item 6).

One worker process (the defaults, with a short RESULT_TTL and PRUNE_INTERVAL) drains
no-op tasks that a producer process enqueues at a sustained rate (``enqueue_many``
batches, paced to the target rate). Every 10 s the benchmark records:

- the table's size: ``pg_total_relation_size('pgqueue_task')``, its heap, its indexes
  (and each index);
- the live rows by state, counted through the partial indexes (pending through
  pgqueue_task_due, running through pgqueue_task_lease, the terminal rows through
  pgqueue_task_retention), and how old the oldest succeeded row is;
- the drain rate over the last 10 s: tasks the producer committed, less the pending and
  running ones, is what was settled;
- the backlog (pending), the pruner's deletes (``n_tup_del``: nothing else deletes from
  the table here), dead tuples and (auto)vacuum runs, and the CPU the worker and
  PostgreSQL used.

It runs twice, the same length, in one session: first a baseline whose worker does not
prune (``--no-prune``: the table only grows), then the run with the pruner. The verdict:
the table's size at the end within 20% of its size at TTL + 1 minute (pruning keeps up
with the inflow), and the drain rate with the pruner, over that window, at least 0.9x
the baseline's over the same window. The time series go to a JSON file in
benchmarks/results/. See docs/performance.md, "History at scale".
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import re
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    RESULTS,
    Row,
    WorkerProcess,
    cpu_seconds,
    prepare_database,
    print_table,
    raw_connection,
    reset_queue,
    rows_json,
    server_info,
    setup_django,
    setup_django_child,
    wait_for,
    write_results,
)

SAMPLE_SECONDS = 10.0
# After the first time to live, how long the pruner gets to catch up before the size
# it holds the table at is taken as the reference.
SETTLE_SECONDS = 60.0
SIZE_TARGET = 1.2
DRAIN_TARGET = 0.9
MB = 2**20
RUN_KINDS = ("baseline", "prune")


# -- the producer ----------------------------------------------------------------------
def produce(url: str, rate: float, batch: int, seconds: float, enqueued, ready, go) -> None:
    """Enqueue ``batch`` no-ops at a time, each batch when the target rate says it is
    due (a batch that is late goes at once: the producer catches up), for ``seconds``.
    ``enqueued`` counts the tasks committed so far."""
    setup_django_child(url)
    from django.db import connection

    from benchmarks.tasks import noop

    connection.ensure_connection()
    ready.set()
    go.wait()
    started = time.monotonic()
    sent = 0
    while True:
        due = started + sent / rate
        if due - started >= seconds:
            break
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        noop.enqueue_many(range(sent, sent + batch))
        sent += batch
        enqueued.value = sent


# -- what the table holds --------------------------------------------------------------
# Each state through its own partial index (the worker connection disables sorts and
# bitmap scans, so these stay index scans however stale the statistics are).
STATE_COUNTS = """
SELECT (SELECT count(*) FROM pgqueue_task WHERE state = 'pending'),
       (SELECT count(*) FROM pgqueue_task WHERE state = 'running'),
       (SELECT count(*) FROM pgqueue_task
         WHERE state IN ('succeeded', 'failed', 'cancelled')),
       (SELECT extract(epoch FROM now() - min(finished_at))::float FROM pgqueue_task
         WHERE state = 'succeeded')
"""
SIZES = """
SELECT pg_total_relation_size('pgqueue_task'), pg_relation_size('pgqueue_task'),
       pg_indexes_size('pgqueue_task')
"""
INDEX_SIZES = """
SELECT c.relname, pg_relation_size(c.oid)
  FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
 WHERE i.indrelid = 'pgqueue_task'::regclass
 ORDER BY c.relname
"""
TABLE_STATS = """
SELECT n_live_tup, n_dead_tup, n_tup_del, vacuum_count, autovacuum_count,
       (SELECT count(*) FROM pg_stat_progress_vacuum
         WHERE relid = 'pgqueue_task'::regclass)
  FROM pg_stat_user_tables WHERE relid = 'pgqueue_task'::regclass
"""


HORIZON = """
SELECT (SELECT max(age(backend_xmin)) FROM pg_stat_activity
         WHERE datname = current_database()),
       (SELECT max(age(xmin)) FROM pg_replication_slots)
"""


# -- where PostgreSQL's CPU goes -------------------------------------------------------
# This database's backends (and the server's own processes: WAL writer, checkpointer,
# background writer) with the statement each runs or ran last.
ACTIVITY = """
SELECT pid, backend_type, state, query FROM pg_stat_activity
 WHERE (datname = current_database() OR datname IS NULL) AND pid <> pg_backend_pid()
"""
VACUUM_PROGRESS = """
SELECT phase FROM pg_stat_progress_vacuum WHERE relid = 'pgqueue_task'::regclass
"""


def _normalized(sql: str) -> str:
    return re.sub(r"\s+", " ", sql).strip()


# A worker's connections, each named for what it does, by a statement only it runs
# (docs/worker.md: claimer, settler, heartbeat, maintenance; a VACUUM opens its own).
ROLE_OF = {
    "claim": "claimer",
    "settle": "settler",
    "heartbeat": "heartbeat",
    "recover_expired_leases": "maintenance",
    "prune": "maintenance",
    "vacuum_due": "maintenance",
    "vacuum_task_table": "vacuum",
    "enqueue_many": "producer",
}


class BackendProfile(threading.Thread):
    """Every ``interval`` seconds, the CPU each PostgreSQL process of this database used
    since the last look (/proc/<pid>/stat), put down to what the backend is (ROLE_OF,
    from the statements it has been seen running; a server process by its type), and
    which statements (of django_pgqueue/db/sql/) were running at that moment,
    as a sampling profile; also the phase of a VACUUM of the task table in progress.
    ``take()`` returns and resets the totals since the last call."""

    def __init__(self, interval: float = 0.2) -> None:
        super().__init__(name="backend-profile", daemon=True)
        from django_pgqueue.db.sql import QUERIES

        self.interval = interval
        self._names = {name: _normalized(text)[:200] for name, text in QUERIES.items()}
        self._named: dict[str, str] = {}
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._cpu: Counter[str] = Counter()
        self._active: Counter[str] = Counter()
        self._vacuum: Counter[str] = Counter()
        self._polls = 0
        self._seen: dict[int, float] = {}
        self._roles: dict[int, str] = {}
        self.ignore: set[int] = set()

    def statement(self, backend_type: str, query: str | None) -> str:
        """The name of the statement of db/sql/ that ``query`` starts like (up to
        its first parameter), or its first 40 characters."""
        if backend_type != "client backend":
            return backend_type
        text = _normalized(query or "")[:200]
        if text not in self._named:
            best, length = text[:40], 30
            for name, known in self._names.items():
                common = next(
                    (i for i, (a, b) in enumerate(zip(text, known, strict=False)) if a != b),
                    min(len(text), len(known)),
                )
                if common > length:
                    best, length = name, common
            self._named[text] = best
        return self._named[text]

    def run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        with raw_connection() as conn:
            first = True
            while not self._done.wait(self.interval):
                rows = conn.execute(ACTIVITY).fetchall()
                phases = [phase for (phase,) in conn.execute(VACUUM_PROGRESS).fetchall()]
                used: Counter[str] = Counter()
                active: Counter[str] = Counter()
                alive = {}
                for pid, backend_type, state, query in rows:
                    if pid in self.ignore:
                        continue
                    try:
                        with open(f"/proc/{pid}/stat") as f:
                            fields = f.read().rsplit(")", 1)[1].split()
                    except OSError:
                        continue
                    cpu = (int(fields[11]) + int(fields[12])) / tick
                    alive[pid] = cpu
                    statement = self.statement(backend_type, query)
                    if state == "active":
                        active[statement] += 1
                    if pid not in self._roles or statement in ROLE_OF:
                        self._roles[pid] = ROLE_OF.get(statement, self._roles.get(pid, statement))
                    if not first:
                        # A backend not seen before started since the last look.
                        used[self._roles[pid]] += cpu - self._seen.get(pid, 0)
                self._seen = alive
                self._roles = {pid: role for pid, role in self._roles.items() if pid in alive}
                first = False
                with self._lock:
                    self._cpu.update(used)
                    self._active.update(active)
                    self._vacuum.update(phases or ["none"])
                    self._polls += 1

    def take(self) -> dict[str, Any]:
        with self._lock:
            cpu, active, vacuum, polls = self._cpu, self._active, self._vacuum, self._polls
            self._cpu, self._active, self._vacuum = Counter(), Counter(), Counter()
            self._polls = 0
        polls = max(1, polls)
        return {
            "pg_cpu_s_by_backend": {k: round(v, 2) for k, v in cpu.most_common() if v > 0},
            "active_share": {k: round(v / polls, 2) for k, v in active.most_common()},
            "vacuum_phases": {k: round(v / polls, 2) for k, v in vacuum.most_common()},
        }

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join(5)


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - idle) / tick, sum(fields) / tick


def sample(conn, t: float, enqueued: int, worker_pid: int, producer_pid: int) -> dict[str, Any]:
    started = time.perf_counter()
    conn.execute("SELECT pg_stat_clear_snapshot()")
    pending, running, terminal, oldest = conn.execute(STATE_COUNTS).fetchone()
    counted_ms = (time.perf_counter() - started) * 1000
    total, heap, indexes = conn.execute(SIZES).fetchone()
    live, dead, deleted, vacuums, autovacuums, vacuuming = conn.execute(TABLE_STATS).fetchone()
    xmin_age, slot_xmin_age = conn.execute(HORIZON).fetchone()
    worker_cpu, pg_cpu = cpu_seconds([worker_pid])
    producer_cpu = cpu_seconds([producer_pid])[0]
    busy, cpu_total = machine_busy()
    load = os.getloadavg()[0]
    return {
        "t": round(t, 1),
        "enqueued": enqueued,
        "pending": pending,
        "running": running,
        "terminal": terminal,
        "settled": enqueued - pending - running,
        "oldest_succeeded_s": oldest,
        "total_bytes": total,
        "heap_bytes": heap,
        "indexes_bytes": indexes,
        "index_bytes": dict(conn.execute(INDEX_SIZES).fetchall()),
        "n_live_tup": live,
        "n_dead_tup": dead,
        "deleted": deleted,
        "vacuums": vacuums,
        "autovacuums": autovacuums,
        "vacuum_running": vacuuming > 0,
        "oldest_xmin_age": xmin_age,
        "slot_xmin_age": slot_xmin_age,
        "worker_cpu_s": worker_cpu,
        "pg_cpu_s": pg_cpu,
        "producer_cpu_s": producer_cpu,
        "machine_busy_s": busy,
        "machine_cpu_s": cpu_total,
        "load_1m": load,
        "count_ms": round(counted_ms, 1),
    }


def per_interval(samples: list[dict[str, Any]]) -> None:
    """Rates over each sample's last interval, and counters made relative to the start."""
    for key in ("deleted", "vacuums", "autovacuums"):
        start = samples[0][key]
        for s in samples:
            s[key] -= start
    for prev, s in itertools.pairwise(samples):
        dt = s["t"] - prev["t"]
        s["enqueue_rate"] = (s["enqueued"] - prev["enqueued"]) / dt
        s["drain_rate"] = (s["settled"] - prev["settled"]) / dt
        s["delete_rate"] = (s["deleted"] - prev["deleted"]) / dt
        s["worker_cores"] = (s["worker_cpu_s"] - prev["worker_cpu_s"]) / dt
        s["pg_cores"] = (s["pg_cpu_s"] - prev["pg_cpu_s"]) / dt
        s["producer_cores"] = (s["producer_cpu_s"] - prev["producer_cpu_s"]) / dt
        s["machine_busy"] = (s["machine_busy_s"] - prev["machine_busy_s"]) / (
            s["machine_cpu_s"] - prev["machine_cpu_s"]
        )


def heap_and_index_health(conn) -> dict[str, Any]:
    """At the end of a run: the heap's free and dead space (pgstattuple_approx) and each
    B-tree's leaf density (pgstatindex), when the pgstattuple extension can be created."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    except Exception as error:  # not installed on this server: the figures are optional
        return {"unavailable": str(error).strip()}
    heap = conn.execute(
        "SELECT approx_tuple_percent, dead_tuple_percent, approx_free_percent"
        " FROM pgstattuple_approx('pgqueue_task')"
    ).fetchone()
    indexes = conn.execute(
        "SELECT c.relname, s.avg_leaf_density, s.leaf_fragmentation, s.leaf_pages,"
        "       s.empty_pages, s.deleted_pages"
        "  FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
        "  JOIN pg_am AS am ON am.oid = c.relam,"
        "       LATERAL pgstatindex(c.oid::regclass) AS s"
        " WHERE i.indrelid = 'pgqueue_task'::regclass AND am.amname = 'btree'"
        " ORDER BY c.relname"
    ).fetchall()
    return {
        "heap": dict(
            zip(("tuple_percent", "dead_tuple_percent", "free_percent"), heap, strict=True)
        ),
        "indexes": {
            name: {
                "avg_leaf_density": density,
                "leaf_fragmentation": fragmentation,
                "leaf_pages": leaves,
                "empty_pages": empty,
                "deleted_pages": deleted,
            }
            for name, density, fragmentation, leaves, empty, deleted in indexes
        },
    }


# -- one run ---------------------------------------------------------------------------
def run(
    url: str,
    kind: str,
    *,
    seconds: float,
    rate: float,
    batch: int,
    result_ttl: float,
    prune_interval: float,
    prune_batch: int | None,
) -> dict[str, Any]:
    """``kind``: "baseline" (the worker does not prune) or "prune" (the worker's pruner)."""
    prune = kind != "baseline"
    name = f"history-{kind}"
    print(f"{name}: {seconds / 60:g} min at {rate:,.0f} tasks/s", flush=True)
    reset_queue()
    (RESULTS / f"{name}.log").unlink(missing_ok=True)  # WorkerProcess appends
    worker = WorkerProcess(
        *([] if prune else ["--no-prune"]),
        log_name=name,
        env={
            "PGQUEUE_BENCH_RESULT_TTL": str(result_ttl),
            "PGQUEUE_BENCH_PRUNE_INTERVAL": str(prune_interval),
            **({"PGQUEUE_BENCH_PRUNE_BATCH": str(prune_batch)} if prune_batch else {}),
        },
    )
    ctx = multiprocessing.get_context("spawn")
    enqueued, ready, go = ctx.Value("q", 0), ctx.Event(), ctx.Event()
    producer = ctx.Process(
        target=produce, args=(url, rate, batch, seconds, enqueued, ready, go), daemon=True
    )
    samples: list[dict[str, Any]] = []
    profile = BackendProfile()
    try:
        with raw_connection() as conn:
            wait_for(
                lambda: conn.execute("SELECT count(*) FROM pgqueue_worker").fetchone()[0] > 0,
                60,
                0.2,
            )
            producer.start()
            if not ready.wait(60):
                raise TimeoutError("the producer did not connect within 60 s")
            profile.ignore.add(conn.info.backend_pid)
            profile.start()
            began = time.monotonic()
            go.set()
            samples.append(sample(conn, 0.0, 0, worker.proc.pid, producer.pid))
            profile.take()
            for i in range(1, int(seconds / SAMPLE_SECONDS) + 1):
                time.sleep(max(0.0, began + i * SAMPLE_SECONDS - time.monotonic()))
                if worker.proc.poll() is not None:
                    raise RuntimeError(f"the worker exited; see {worker.log_path}")
                s = sample(
                    conn, time.monotonic() - began, enqueued.value, worker.proc.pid, producer.pid
                )
                others = conn.execute(
                    "SELECT count(*) FROM pgqueue_worker WHERE pid <> %s", [worker.proc.pid]
                ).fetchone()[0]
                if others:
                    raise RuntimeError(
                        f"{others} other worker(s) registered in {conn.info.dbname}: the run "
                        "needs the database to itself (a worker left over from an earlier "
                        "run? see pgqueue_worker.pid)"
                    )
                s.update(profile.take())
                samples.append(s)
                print(
                    f"  {s['t']:>5.0f} s  table {s['total_bytes'] / MB:>7.1f} MB"
                    f" (indexes {s['indexes_bytes'] / MB:.1f})  backlog {s['pending']:>7,}"
                    f"  terminal {s['terminal']:>9,}"
                    f"  deleted {s['deleted'] - samples[0]['deleted']:>9,}"
                    f"  dead {s['n_dead_tup']:>8,}",
                    flush=True,
                )
            producer.join(60)
            health = heap_and_index_health(conn)
    finally:
        try:
            profile.stop()
            if producer.is_alive():
                producer.terminate()
        finally:
            worker.stop()
    per_interval(samples)
    return {"prune": prune, "samples": samples, "health": health}


# -- the verdict -----------------------------------------------------------------------
def at(samples: list[dict[str, Any]], t: float) -> dict[str, Any]:
    """The first sample at or after ``t`` seconds (the last one if the run was shorter)."""
    return next((s for s in samples if s["t"] >= t - 1), samples[-1])


def window_rate(
    samples: list[dict[str, Any]], start: float, end: float | None = None, key: str = "settled"
) -> float:
    """``key``'s growth per second from the sample at ``start`` to the one at ``end``
    (the last one by default)."""
    a, b = at(samples, start), samples[-1] if end is None else at(samples, end)
    return (b[key] - a[key]) / (b["t"] - a["t"]) if b["t"] > a["t"] else 0.0


def reference_time(seconds: float, result_ttl: float) -> float:
    """When the pruner has had its time to catch up: TTL + 1 minute, or halfway from the
    TTL to the end in a run too short for that (a smoke check)."""
    if seconds - (result_ttl + SETTLE_SECONDS) >= SETTLE_SECONDS:
        return result_ttl + SETTLE_SECONDS
    return result_ttl + max(0.0, seconds - result_ttl) / 2


def summarize(runs: dict[str, dict[str, Any]], seconds: float, result_ttl: float) -> dict[str, Row]:
    mark = reference_time(seconds, result_ttl)
    # From the first sample on (the worker's start-up is behind it), to the TTL.
    early = SAMPLE_SECONDS if result_ttl >= 2 * SAMPLE_SECONDS else 0.0
    rows: dict[str, Row] = {}
    base = runs.get("baseline")
    if base:
        s = base["samples"]
        rows["baseline_drain"] = Row(
            "baseline_drain",
            f"baseline (no pruning): drain, {mark:.0f} s to the end",
            "tasks/s",
            samples=[window_rate(s, mark)],
        )
        rows["baseline_size"] = Row(
            "baseline_size",
            f"baseline (no pruning): table size, end / at {mark:.0f} s",
            "x",
            samples=[s[-1]["total_bytes"] / at(s, mark)["total_bytes"]],
        )
    for name, run_ in runs.items():
        if not run_["prune"]:
            continue
        s = run_["samples"]
        rows[f"{name}_first_ttl_drain"] = Row(
            f"{name}_first_ttl_drain",
            f"{name}: drain, {early:.0f}-{result_ttl:.0f} s (nothing prunable yet)",
            "tasks/s",
            samples=[window_rate(s, early, result_ttl)],
        )
        rows[f"{name}_drain"] = Row(
            f"{name}_drain",
            f"{name}: drain, {mark:.0f} s to the end",
            "tasks/s",
            samples=[window_rate(s, mark)],
            ratio_to="baseline_drain" if base else f"{name}_first_ttl_drain",
            target=f">= {DRAIN_TARGET}x " + ("baseline" if base else "its first TTL"),
            check=lambda v, r: r is not None and r >= DRAIN_TARGET,
        )
        if base:
            rows[f"{name}_drain_vs_first_ttl"] = Row(
                f"{name}_drain_vs_first_ttl",
                f"{name}: drain, the same, against its first TTL",
                "tasks/s",
                samples=[window_rate(s, mark)],
                ratio_to=f"{name}_first_ttl_drain",
                target=f">= {DRAIN_TARGET}x",
                check=lambda v, r: r is not None and r >= DRAIN_TARGET,
            )
        rows[f"{name}_deletes"] = Row(
            f"{name}_deletes",
            f"{name}: rows deleted, {mark:.0f} s to the end",
            "rows/s",
            samples=[window_rate(s, mark, key="deleted")],
        )
        rows[f"{name}_size"] = Row(
            f"{name}_size",
            f"{name}: table size, end / at {mark:.0f} s",
            "x",
            samples=[s[-1]["total_bytes"] / at(s, mark)["total_bytes"]],
            target=f"<= {SIZE_TARGET} (flat)",
            check=lambda v, r: v <= SIZE_TARGET,
        )
        rows[f"{name}_end_mb"] = Row(
            f"{name}_end_mb",
            f"{name}: table size at the end (at {mark:.0f} s: "
            f"{at(s, mark)['total_bytes'] / MB:,.0f} MB)",
            "MB",
            samples=[s[-1]["total_bytes"] / MB],
        )
        rows[f"{name}_backlog"] = Row(
            f"{name}_backlog",
            f"{name}: backlog (pending) at the end",
            "tasks",
            samples=[s[-1]["pending"]],
        )
        rows[f"{name}_oldest"] = Row(
            f"{name}_oldest",
            f"{name}: oldest succeeded row at the end (TTL {result_ttl:.0f} s)",
            "s",
            samples=[s[-1]["oldest_succeeded_s"] or 0.0],
        )
    return rows


def print_checkpoints(name: str, samples: list[dict[str, Any]]) -> None:
    print(f"\n{name}, every minute:")
    print(
        f"{'t (s)':>6} {'total MB':>9} {'heap MB':>8} {'idx MB':>7} {'enq/s':>7} {'drain/s':>8}"
        f" {'backlog':>8} {'terminal':>10} {'del/s':>7} {'dead':>8} {'vac':>4} {'avac':>4}"
        f" {'busy':>5} {'load':>5}"
    )
    for s in samples[1:]:
        if round(s["t"]) % 60 > SAMPLE_SECONDS / 2 and s is not samples[-1]:
            continue
        print(
            f"{s['t']:>6.0f} {s['total_bytes'] / MB:>9.1f} {s['heap_bytes'] / MB:>8.1f}"
            f" {s['indexes_bytes'] / MB:>7.1f} {s['enqueue_rate']:>7,.0f} {s['drain_rate']:>8,.0f}"
            f" {s['pending']:>8,} {s['terminal']:>10,} {s['delete_rate']:>7,.0f}"
            f" {s['n_dead_tup']:>8,} {s['vacuums']:>4} {s['autovacuums']:>4}"
            f" {s['machine_busy']:>5.0%} {s['load_1m']:>5.1f}"
        )


def profile_window(
    samples: list[dict[str, Any]], start: float, end: float
) -> dict[str, dict[str, float]]:
    """From ``start`` to ``end`` seconds, from the backend profile: the PostgreSQL cores
    each kind of backend used, and the share of the time each statement was running
    (with ``VACUUM``: a VACUUM of the task table in progress, whoever started it)."""
    window = [s for s in samples[1:] if start < s["t"] <= end + 1]
    if not window:
        return {"cores": {}, "running": {}}
    seconds = window[-1]["t"] - window[0]["t"] + SAMPLE_SECONDS
    used: Counter[str] = Counter()
    running: Counter[str] = Counter()
    for s in window:
        used.update(s.get("pg_cpu_s_by_backend", {}))
        running.update(s.get("active_share", {}))
        running["VACUUM"] += 1 - s.get("vacuum_phases", {}).get("none", 1)
    return {
        "cores": {name: round(cpu / seconds, 3) for name, cpu in used.most_common()},
        "running": {name: round(n / len(window), 3) for name, n in running.most_common()},
    }


def print_profile(name: str, samples: list[dict[str, Any]], result_ttl: float) -> None:
    end = samples[-1]["t"]
    mark = reference_time(end, result_ttl)
    before, after = profile_window(samples, 0, result_ttl), profile_window(samples, mark, end)
    parts = (("cores", "PostgreSQL cores by backend"), ("running", "backends running it, mean"))
    for part, title in parts:
        print(f"\n{name}: {title}, 0-{result_ttl:.0f} s and {mark:.0f}-{end:.0f} s")
        b, a = before[part], after[part]
        for key in sorted(set(b) | set(a), key=lambda k: -a.get(k, b.get(k, 0))):
            if max(b.get(key, 0), a.get(key, 0)) >= 0.01:
                print(f"  {key:<40} {b.get(key, 0):>6.2f} {a.get(key, 0):>6.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.history", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10, help="length of each run")
    parser.add_argument("--rate", type=float, default=6000, help="tasks enqueued per second")
    parser.add_argument("--batch", type=int, default=500, help="tasks per enqueue_many")
    parser.add_argument("--result-ttl", type=float, default=60.0, help="RESULT_TTL, seconds")
    parser.add_argument("--prune-interval", type=float, default=5.0, help="PRUNE_INTERVAL, seconds")
    parser.add_argument("--prune-batch", type=int, help="PRUNE_BATCH (default: the setting's)")
    parser.add_argument(
        "--runs",
        default="baseline,prune",
        help="comma-separated, run in this order: baseline (the worker does not prune), "
        "prune (the worker's pruner)",
    )
    parser.add_argument("--json", type=Path, help="where to write the time series")
    args = parser.parse_args(argv)
    kinds = args.runs.split(",")
    unknown = set(kinds) - set(RUN_KINDS)
    if unknown:
        parser.error(f"unknown run(s) {', '.join(sorted(unknown))}: choose from {RUN_KINDS}")
    if "PGQUEUE_BENCH_DB" not in os.environ:
        parser.error(
            "set PGQUEUE_BENCH_DB to a database of your own (it is dropped and created "
            "again), for example PGQUEUE_BENCH_DB=pgqueue_history"
        )

    url = prepare_database()
    setup_django(url)
    info = server_info()
    print(
        f"django_pgqueue history at scale, {datetime.now():%Y-%m-%d %H:%M}, PostgreSQL "
        f"{info['postgresql']}, {os.cpu_count()} CPUs; RESULT_TTL {args.result_ttl:g} s, "
        f"PRUNE_INTERVAL {args.prune_interval:g} s",
        flush=True,
    )
    options = {
        "seconds": args.minutes * 60,
        "rate": args.rate,
        "batch": args.batch,
        "result_ttl": args.result_ttl,
        "prune_interval": args.prune_interval,
        "prune_batch": args.prune_batch,
    }
    runs = {}
    for name in kinds:
        runs[name] = run(url, name, **options)
        print_checkpoints(name, runs[name]["samples"])
        print_profile(name, runs[name]["samples"], args.result_ttl)

    rows = summarize(runs, options["seconds"], args.result_ttl)
    print()
    print_table(rows)
    write_results(
        "history",
        args.json,
        {
            "server": info,
            "options": {**options, "runs": kinds},
            "rows": rows_json(rows),
            "runs": runs,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
