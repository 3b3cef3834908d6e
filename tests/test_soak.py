"""The long soak: every fault at once, for half an hour (``tox -e soak``).

Four workers on a private PostgreSQL cluster (tests/pgcluster.py), two of them through a
TCP proxy (tests/proxy.py) and two through PgBouncer in transaction pooling mode
(tests/pgbouncer.py, LISTEN direct). First the fleet's capacity is measured (30 s of a
backlog, no faults); then a web-like process (tests/soak_enqueuer.py) enqueues at half
that rate a mix of plain tasks, tasks that fail a few attempts and then succeed,
workflows (chains and groups), tasks of a concurrency-limited and of a rate-limited
queue, and enqueues that roll back; a periodic schedule ticks every 2 s. Meanwhile:

- every 2-5 s one worker is SIGKILLed (and replaced), SIGTERMed (replaced at once, the
  old one drains), or SIGSTOPped for less or more than its lease; the worker of slot 0
  is only ever paused, so that one process lives through the whole soak;
- every cycle (5 minutes, or half the run when shorter) the network to slots 0 and 1
  stalls for 20 s (a black hole: nothing forwarded, nothing closed; then the old flows
  are reset), PgBouncer is restarted, and PostgreSQL is restarted, crashed
  (``immediate``) and shut down cleanly (``fast``) by turns;
- retention is on (succeeded and failed rows kept SOAK_RETENTION seconds), so the rows
  are read before they are pruned: every 5 s, the rows that finished lately.

Judged at the end, from the ledger (tests/ledger.py) against the rows: every committed
task succeeded, nothing rolled back ran, no two runs of a task overlapped unless the
first one's lease expired; the limited queue never ran more than its limit at once and
the rated queue never started more than its rate in any window (the claims' own times);
no periodic tick was enqueued twice; and, after the warm-up (the first 5 minutes, or
40% of a shorter run), the RSS and the open sockets of the slot-0 worker, the task
table's size (medians) and the peak of the server's connections grew less than 10%.

Options (environment): SOAK_MINUTES (default 30), SOAK_RETENTION (seconds, default
60), SOAK_SEED (replays the sequence of faults; the timing still varies), SOAK_REPORT
(a JSON file for the figures; default test-artifacts/soak.json). The test runs only when
selected by its marker: ``pytest -m soak -n 0`` (tox -e soak).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import ledger, pgbouncer
from tests.conftest import ARTIFACTS, REPO, WorkerProcess, wait_until
from tests.pgcluster import ClusterUnavailable, PrivateCluster
from tests.proxy import CuttableProxy

pytestmark = [pytest.mark.soak]

MINUTES = float(os.environ.get("SOAK_MINUTES", "30"))
RETENTION = float(os.environ.get("SOAK_RETENTION", "60"))
SECONDS = MINUTES * 60
CYCLE = min(300.0, SECONDS / 2)  # a PostgreSQL restart, a PgBouncer restart, a stall
WARMUP = min(300.0, SECONDS * 0.4)
STALL_SECONDS = 20.0
MEASURE_SECONDS = 30.0
SLOTS = 4
LEASE = 4.0
WORKER_ARGS = ("--concurrency", "8", "--lease", str(LEASE), "--heartbeat", "1",
               "--sweep-interval", "0.5")
LIMITED_CONCURRENCY, RATE_COUNT, RATE_SECONDS = 2, 10, 1.0  # tests/soak_tasks.py
OPEN_STATES = ("pending", "running", "waiting", "scheduled")


@pytest.fixture
def selected(request: pytest.FixtureRequest) -> None:
    """Half an hour: only when asked for by name (-m soak), never by -m "" or -m slow."""
    if "soak" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the soak runs only when selected: pytest -m soak -n 0 (tox -e soak)")


@pytest.fixture
def cluster(selected: None) -> Any:
    if not pgbouncer.available():
        pytest.skip("Debian's pgbouncer is not installed")
    try:
        cluster = PrivateCluster.create(max_connections="300")
    except ClusterUnavailable as exc:
        pytest.skip(f"no private PostgreSQL cluster: {exc}")
    try:
        cluster.create_database("pgqueue")
        yield cluster
    finally:
        cluster.destroy()


@dataclass
class Seen:
    """What the rows said, read before retention deleted them (merged by id)."""

    rows: dict[int, ledger.TaskRow] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    queues: dict[int, str] = field(default_factory=dict)
    run_at: dict[int, float] = field(default_factory=dict)  # the periodic ticks'
    rated_claims: dict[str, float] = field(default_factory=dict)  # token -> claimed (DB)

    def add(self, records: list[tuple]) -> None:
        for id, name, queue, state, attempt, run_at, executions in records:
            executions = ledger._json(executions) or []
            # Only what the checker needs: lost leases, and the settled execution.
            kept = [
                {k: e.get(k) for k in ("attempt", "token", "outcome", "state")}
                for e in executions if e.get("outcome") == "lost"
            ] + [
                {k: e.get(k) for k in ("attempt", "token", "outcome", "state")}
                for e in executions[-1:] if e.get("state") == state
            ]
            self.rows[id] = ledger.TaskRow(id, state, attempt, [], kept)
            self.names[id] = name
            self.queues[id] = queue
            if name.endswith("soak_tick"):
                self.run_at[id] = run_at.timestamp()
            if queue == "soak_rated":
                for e in executions:
                    if e.get("started") and e.get("token"):
                        self.rated_claims[e["token"]] = datetime.fromisoformat(
                            e["started"]).timestamp()


ROW_COLUMNS = "id, task_name, queue, state, attempt, run_at, executions"


class Slot:
    """One of the fleet's four places: the worker in it now, and how it is reached."""

    def __init__(self, index: int, url: str, env: dict[str, str]) -> None:
        self.index = index
        self.url = url
        self.env = env
        self.worker: WorkerProcess | None = None
        self.started = 0


class Soak:
    def __init__(self, cluster: PrivateCluster, tmp: Path, seed: int) -> None:
        self.cluster = cluster
        self.tmp = tmp
        self.rng = random.Random(seed)
        self.ledger = tmp / "ledger.jsonl"
        self.enqueued = tmp / "enqueued.jsonl"
        self.direct = cluster.url("pgqueue")
        self.bouncer = pgbouncer.PgBouncer(("127.0.0.1", cluster.port), pool_size=10)
        self.proxy = CuttableProxy(("127.0.0.1", cluster.port))
        through_proxy = f"postgres://postgres@127.0.0.1:{self.proxy.port}/pgqueue"
        through_bouncer = f"postgres://postgres@127.0.0.1:{self.bouncer.port}/pgqueue"
        pooled = {"PGQUEUE_TEST_TRANSACTION_POOLER": "1", "PGQUEUE_TEST_LISTEN_URL": self.direct}
        self.slots = [Slot(0, through_proxy, {}), Slot(1, through_proxy, {}),
                      Slot(2, through_bouncer, pooled), Slot(3, through_bouncer, pooled)]
        self.draining: list[WorkerProcess] = []  # SIGTERMed, finishing their tasks
        self.paused: dict[WorkerProcess, float] = {}
        self.workers: list[WorkerProcess] = []
        self.faults: dict[str, int] = dict.fromkeys(
            ["kill", "term", "pause_short", "pause_past_lease", "pg_restart_immediate",
             "pg_restart_fast", "pgbouncer_restart", "network_stall"], 0)
        self.seen = Seen()
        self.samples: list[dict[str, Any]] = []
        self.snapshot_gaps: list[float] = []
        self.began = time.monotonic()
        self._stop = threading.Event()
        self._last_snapshot: float | None = None
        self.sampling = False  # figures are sampled during the soak only, not the measurement

    # -- processes -------------------------------------------------------------------
    def env(self, url: str, extra: dict[str, str], schedule: bool = True) -> dict[str, str]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": url,
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            "PGQUEUE_TEST_SOAK": str(RETENTION),
            ledger.LEDGER_ENV: str(self.ledger),
            **extra,
        }
        if schedule:
            env["PGQUEUE_TEST_SOAK_SCHEDULE"] = "1"
        return env

    def start(self, slot: Slot) -> WorkerProcess:
        worker = WorkerProcess(list(WORKER_ARGS), self.env(slot.url, slot.env),
                               self.tmp / f"worker-{slot.index}-{slot.started}.log")
        slot.started += 1
        slot.worker = worker
        self.workers.append(worker)
        return worker

    def enqueuer(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.soak_enqueuer", str(self.enqueued), *args],
            cwd=REPO, env=self.env(self.direct, {}, schedule=False),
            stdout=open(self.tmp / "enqueuer.log", "ab"), stderr=subprocess.STDOUT,
        )

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.direct, autocommit=True, connect_timeout=3)

    def query(self, sql: str) -> list[tuple]:
        with self.connect() as conn:
            return conn.execute(sql).fetchall()

    # -- worker faults ---------------------------------------------------------------
    def live(self) -> list[Slot]:
        return [s for s in self.slots if s.worker and s.worker not in self.paused
                and s.worker.proc.poll() is None]

    def strike(self, now: float) -> None:
        """One random fault to one running worker."""
        kind = self.rng.choice(["kill", "term", "pause_short", "pause_past_lease"])
        candidates = [s for s in self.live() if kind.startswith("pause") or s.index != 0]
        if not candidates:
            return
        slot = self.rng.choice(candidates)
        worker = slot.worker
        assert worker is not None
        if kind == "kill":
            worker.kill()
            ledger.record_exit(self.ledger, worker.pid)
            worker._log.close()
            self.start(slot)
        elif kind == "term":
            worker.signal(signal.SIGTERM)
            self.draining.append(worker)
            self.start(slot)
        else:
            seconds = (self.rng.uniform(0.5, 2.0) if kind == "pause_short"
                       else self.rng.uniform(LEASE + 1, LEASE + 4))
            worker.signal(signal.SIGSTOP)
            self.paused[worker] = now + seconds
        self.faults[kind] += 1

    def resume_due(self, now: float) -> None:
        for worker, until in list(self.paused.items()):
            if until <= now:
                worker.signal(signal.SIGCONT)
                del self.paused[worker]

    def reap(self) -> None:
        for worker in list(self.draining):
            if worker.proc.poll() is not None:
                ledger.record_exit(self.ledger, worker.pid)
                worker._log.close()
                self.draining.remove(worker)
        for slot in self.slots:  # a worker that exited on its own is replaced too
            worker = slot.worker
            if worker and worker not in self.paused and worker.proc.poll() is not None:
                ledger.record_exit(self.ledger, worker.pid)
                self.faults.setdefault("exited_by_itself", 0)
                self.faults["exited_by_itself"] += 1
                self.start(slot)

    # -- sampling --------------------------------------------------------------------
    def sample_loop(self) -> None:
        while not self._stop.wait(5.0):
            with contextlib.suppress(Exception):
                self.sample()
            with contextlib.suppress(Exception):
                self.snapshot()

    def sample(self) -> None:
        if not self.sampling:
            return
        t = time.monotonic() - self.began
        rss = {}
        for slot in self.slots:
            if slot.worker is not None:
                with contextlib.suppress(OSError, ValueError):
                    rss[slot.index] = rss_kb(slot.worker.pid)
        sockets = None
        with contextlib.suppress(OSError):
            sockets = open_sockets(self.slots[0].worker.pid)
        with self.connect() as conn:
            by_application = dict(conn.execute(
                "SELECT application_name, count(*) FROM pg_stat_activity"
                " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
                " GROUP BY 1").fetchall())
            size = conn.execute("SELECT pg_total_relation_size('pgqueue_task')").fetchone()[0]
            states = dict(conn.execute(
                "SELECT state, count(*) FROM pgqueue_task GROUP BY state").fetchall())
        processes = sum(1 for w in self.workers if w.proc.poll() is None)
        self.samples.append({"t": round(t, 1), "rss_kb": rss, "slot0_sockets": sockets,
                             "slot0_pid": self.slots[0].worker.pid,
                             "connections": sum(by_application.values()),
                             "by_application": by_application, "worker_processes": processes,
                             "table_bytes": size, "states": states})

    def snapshot(self, everything: bool = False) -> None:
        """Read the rows that finished since the last snapshot (and 20 s before it), so
        that every row is seen in its final state before retention deletes it."""
        where = "" if everything else (
            "WHERE finished_at >= now() - make_interval(secs => %s)")
        now = time.monotonic()
        window = 20.0 + (now - self._last_snapshot if self._last_snapshot else RETENTION)
        with self.connect() as conn:
            records = conn.execute(f"SELECT {ROW_COLUMNS} FROM pgqueue_task {where}",
                                   () if everything else (window,)).fetchall()
            periodic = conn.execute(
                f"SELECT {ROW_COLUMNS} FROM pgqueue_task WHERE task_name LIKE '%%soak_tick'"
            ).fetchall()
        self.seen.add(records + periodic)
        if self._last_snapshot is not None:
            self.snapshot_gaps.append(now - self._last_snapshot)
        self._last_snapshot = now

    # -- the soak --------------------------------------------------------------------
    def measure_capacity(self) -> float:
        """Tasks a second the four workers settle from a backlog, without faults."""
        proc = self.enqueuer("--measure", "30000")
        assert proc.wait(300) == 0, (self.tmp / "enqueuer.log").read_text()

        def done() -> int:
            return self.query("SELECT count(*) FROM pgqueue_task WHERE task_name LIKE "
                              "'%soak_measure' AND state = 'succeeded'")[0][0]

        time.sleep(5)
        first, began = done(), time.monotonic()
        time.sleep(MEASURE_SECONDS)
        last, took = done(), time.monotonic() - began
        self.query("DELETE FROM pgqueue_task WHERE task_name LIKE '%soak_measure' "
                   "AND state = 'pending' RETURNING 1")
        assert last < 30000, "the backlog ran out: measure with a larger one"
        return (last - first) / took

    def run(self, rate: float) -> subprocess.Popen:
        enqueuer = self.enqueuer("--rate", f"{rate:.1f}", "--seconds", str(SECONDS))
        began = time.monotonic()
        next_strike = 2.0
        cycle = 0
        stall_until: float | None = None
        while (now := time.monotonic() - began) < SECONDS:
            self.resume_due(now)
            self.reap()
            if now >= next_strike:
                self.strike(now)
                next_strike = now + self.rng.uniform(2, 5)
            at = now - cycle * CYCLE
            if stall_until is None and self.faults["network_stall"] <= cycle and at >= 0.25 * CYCLE:
                self.proxy.stall()
                stall_until = now + STALL_SECONDS
                self.faults["network_stall"] += 1
            if stall_until is not None and now >= stall_until:
                self.proxy.cut()  # the black-holed flows are reset at last
                self.proxy.restore()
                stall_until = None
            if self.faults["pgbouncer_restart"] <= cycle and at >= 0.5 * CYCLE:
                self.bouncer.restart()
                self.faults["pgbouncer_restart"] += 1
            if at >= CYCLE:
                mode = "immediate" if cycle % 2 == 0 else "fast"
                self.cluster.restart(mode)
                self.faults[f"pg_restart_{mode}"] += 1
                cycle += 1
            time.sleep(0.05)
        for worker in list(self.paused):
            worker.signal(signal.SIGCONT)
        self.paused.clear()
        if stall_until is not None:
            self.proxy.cut()
            self.proxy.restore()
        return enqueuer

    def close(self) -> None:
        self._stop.set()
        for worker in self.workers:
            with contextlib.suppress(Exception):
                if worker.proc.poll() is None:
                    worker.signal(signal.SIGCONT)
                worker.stop()
        self.proxy.close()
        self.bouncer.close()


def open_sockets(pid: int) -> int:
    """How many sockets process ``pid`` holds open (its connections)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


def peak_growth(samples: list[dict[str, Any]], value: Any) -> tuple[float, float, float]:
    """(warm-up peak, later peak, growth): the highest ``value`` during the warm-up
    against the highest after it. The server's connection count swings with what the
    workers do at the moment (PgBouncer opens server connections on demand and keeps
    them until its restart), so medians of it are noise; a leak raises the peak."""
    before = [value(s) for s in samples if s["t"] < WARMUP]
    after = [value(s) for s in samples if WARMUP <= s["t"] <= SECONDS]
    return max(before), max(after), max(after) / max(before) - 1


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise ValueError(f"no VmRSS for {pid}")


def growth(samples: list[dict[str, Any]], value: Any) -> tuple[float, float, float]:
    """(baseline, end, growth): the median of ``value`` over the two minutes after the
    warm-up's end against its median over the last two minutes (or the last fifth of a
    shorter run), as a fraction. Growth "after the first 5 minutes" is measured from
    then: during the warm-up the table still refills after the capacity measurement's
    backlog is deleted, so a baseline taken before its end can be a low point."""
    width = min(120.0, SECONDS / 5)
    before = [v for s in samples if WARMUP <= s["t"] < WARMUP + width
              and (v := value(s)) is not None]
    last = [v for s in samples if SECONDS - width <= s["t"]
            and (v := value(s)) is not None]
    base, end = statistics.median(before), statistics.median(last)
    return base, end, end / base - 1


def test_a_long_soak_with_combined_faults_loses_nothing_and_stays_flat(cluster, tmp_path):
    seed = int(os.environ.get("SOAK_SEED", time.time_ns() % 1_000_000))
    print(f"soak seed {seed} (SOAK_SEED={seed} replays it); {MINUTES:g} minutes")
    soak = Soak(cluster, tmp_path, seed)
    sampler = threading.Thread(target=soak.sample_loop, daemon=True)
    sampler.start()  # its snapshots of the rows begin at once: the ticks run already
    try:
        # Given four workers, and their capacity measured from a backlog
        for slot in soak.slots:
            soak.start(slot)
        for slot in soak.slots:
            slot.worker.wait_started()
        capacity = soak.measure_capacity()
        wait_until(lambda: not soak.query("SELECT 1 FROM pgqueue_task WHERE task_name LIKE "
                                          "'%soak_measure' AND state = 'running'"),
                   timeout=60, message="the measurement's last tasks to end")
        rate = capacity / 2
        print(f"capacity {capacity:.0f} tasks/s; enqueuing at {rate:.0f}/s")
        soak.began = time.monotonic()
        soak.sampling = True

        # When tasks arrive at half that rate under every fault for SOAK_MINUTES
        enqueuer = soak.run(rate)
        soak.sampling = False
        assert enqueuer.wait(120) == 0, (tmp_path / "enqueuer.log").read_text()[-3000:]

        # Then, once the fleet has drained what the enqueuer committed
        soak.reap()
        drained = time.monotonic()
        with contextlib.suppress(AssertionError):  # what is missing, the check reports
            wait_until(lambda: not soak.query(
                "SELECT 1 FROM pgqueue_task WHERE state IN ('pending', 'running', 'waiting', "
                "'scheduled') AND task_name NOT LIKE '%soak_tick' LIMIT 1"),
                timeout=180, interval=1, message="the queue to drain")
        drained = time.monotonic() - drained
        for worker in soak.workers:
            worker.stop()
            ledger.record_exit(soak.ledger, worker.pid)
        # ... and a last worker without the schedule has run its last ticks
        last = WorkerProcess(["--burst"], soak.env(soak.direct, {}, schedule=False),
                             tmp_path / "worker-last.log")
        last.wait(120)
        soak._stop.set()
        sampler.join(30)
        soak.snapshot(everything=True)
    finally:
        soak.close()

    figures = judge(soak, capacity, rate, drained)
    path = Path(os.environ.get("SOAK_REPORT", ARTIFACTS / "soak.json"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**figures, "samples": soak.samples}, indent=1))
    print(json.dumps(figures, indent=2))
    assert figures["violations"] == {k: 0 for k in figures["violations"]}, figures
    # ... and the faults did happen
    assert soak.faults["kill"] and soak.faults["term"] and soak.faults["pause_past_lease"]
    assert soak.faults["network_stall"] and soak.faults["pgbouncer_restart"]
    assert soak.faults["pg_restart_immediate"]


def judge(soak: Soak, capacity: float, rate: float, drained: float) -> dict[str, Any]:
    committed: set[int] = set()
    rolled_back: set[int] = set()
    ambiguous: list[int] = []
    enqueue_errors = 0
    for line in ledger.read(soak.enqueued):
        committed.update(line.get("committed", []))
        rolled_back.update(line.get("rolled_back", []))
        ambiguous += line.get("ambiguous", [])
        enqueue_errors += "error" in line
    seen = soak.seen
    for task in ambiguous:  # the rows say whether the commit went through
        (committed if task in seen.rows else rolled_back).add(task)
    ticks = [task for task, name in seen.names.items() if name.endswith("soak_tick")]
    committed.update(ticks)
    events = ledger.read(soak.ledger)
    report = ledger.check(events, seen.rows.values(), committed, rolled_back)
    print(report.describe())

    runs = ledger.runs_of(events)
    limited = [
        run for task, task_runs in runs.items() if seen.queues.get(task) == "soak_limited"
        for run in task_runs
        if not (task in seen.rows and ledger.lease_recovered(seen.rows[task], run))
    ]
    claims = [ledger.Run(0, 0, token, 0, t) for token, t in seen.rated_claims.items()]
    most_limited = ledger.most_at_once(limited)
    most_rated = ledger.most_starts_within(claims, RATE_SECONDS * 0.98)
    tick_times = sorted(seen.run_at.values())
    duplicate_ticks = len(tick_times) - len(set(tick_times))
    # Ticks no worker enqueued in time (a restart, a stall) collapse into one
    # (missed="once"): fewer ticks than the span holds, never more.
    tick_slots = (tick_times[-1] - tick_times[0]) / 2 + 1 if tick_times else 0

    rss = growth(soak.samples, lambda s: s["rss_kb"].get(0))
    connections = peak_growth(soak.samples, lambda s: s["connections"])
    sockets = growth(soak.samples, lambda s: s["slot0_sockets"])
    table = growth(soak.samples, lambda s: s["table_bytes"])
    slot0_pids = {s["slot0_pid"] for s in soak.samples}
    return {
        "minutes": MINUTES,
        "load_average": os.getloadavg(),
        "capacity_per_s": round(capacity, 1),
        "enqueue_rate_per_s": round(rate, 1),
        "committed": len(committed),
        "rolled_back": len(rolled_back),
        "ambiguous_commits": len(ambiguous),
        "enqueue_errors": enqueue_errors,
        "runs": report.runs,
        "justified_overlaps": report.justified_overlaps,
        "periodic_ticks": len(ticks),
        "periodic_tick_slots": round(tick_slots),
        "faults": soak.faults,
        "workers_started": sum(slot.started for slot in soak.slots),
        "drain_seconds": round(drained, 1),
        "limited_most_at_once": most_limited,
        "rated_claims": len(claims),
        "rated_most_in_a_window": most_rated,
        "slot0_worker_processes": len(slot0_pids),
        "slot0_rss_mb": [round(rss[0] / 1024, 1), round(rss[1] / 1024, 1)],
        "slot0_rss_growth": round(rss[2], 3),
        "rss_mb_max_any_worker": round(max(
            (v for s in soak.samples for v in s["rss_kb"].values()), default=0) / 1024, 1),
        "connections_peak": [connections[0], connections[1]],
        "connections_peak_growth": round(connections[2], 3),
        "connections_median": list(growth(soak.samples, lambda s: s["connections"])[:2]),
        "slot0_sockets": [sockets[0], sockets[1]],
        "slot0_sockets_growth": round(sockets[2], 3),
        "table_mb": [round(table[0] / 2**20, 1), round(table[1] / 2**20, 1)],
        "table_growth": round(table[2], 3),
        "table_mb_max": round(max(s["table_bytes"] for s in soak.samples) / 2**20, 1),
        "snapshot_gap_max_s": round(max(soak.snapshot_gaps, default=0), 1),
        "violations": {
            "ledger": report.violations,
            "limited_over_limit": max(0, most_limited - LIMITED_CONCURRENCY),
            "rated_over_limit": max(0, most_rated - RATE_COUNT),
            "duplicate_ticks": duplicate_ticks,
            "slot0_not_one_process": len(slot0_pids) - 1,
            "slot0_rss_grew_10pct": int(rss[2] >= 0.10),
            "connections_peak_grew_10pct": int(connections[2] >= 0.10),
            "slot0_sockets_grew_10pct": int(sockets[2] >= 0.10),
            "table_grew_10pct": int(table[2] >= 0.10),
            "rows_unseen_too_long": int(max(soak.snapshot_gaps, default=0)
                                        >= RETENTION - 20),
        },
    }
