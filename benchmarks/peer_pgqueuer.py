"""PgQueuer (with asyncpg) as a peer baseline: ``python -m benchmarks --peer pgqueuer``.

Its single enqueue, its idle latency and its drain, at its defaults, measured in the same
run as ours and against the same server and database (its own tables, ``pgqueuer``,
``pgqueuer_log``...; installed with its own ``Queries.install()``). PgQueuer is not a
dependency of django_pgqueue: the benchmark needs it installed beside it,
``pip install "pgqueuer[asyncpg]"`` (tox -e bench has it). docs/performance.md, "Against
PgQueuer", says what each figure means.

- enqueue: ``Queries.enqueue("noop", payload)`` on one asyncpg connection per client
  (autocommit: one transaction per call), one job per call, as a web request enqueues;
- idle latency: a worker (``pgqueuer.run(worker)`` on uvloop, as ``pgq run`` runs it,
  every option at its default) whose ``probe`` entrypoint writes the time it started to a file; jobs
  enqueued one at a time on an idle queue;
- drain: jobs pre-enqueued in batches (``enqueue`` with lists), one worker process at its
  defaults (batch size 10), an ``async`` no-op entrypoint; timed on the database's clock
  from the first pick to the last success in ``pgqueuer_log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from benchmarks.harness import (
    REPO,
    RESULTS,
    cost_per_task,
    cpu_seconds,
    percentile,
    raw_connection,
    run_clients,
    setup_django_child,
    wait_for,
    write_position,
)

INSTALL_HINT = 'pip install "pgqueuer[asyncpg]"'


def available() -> str:
    """PgQueuer's version, or SystemExit saying how to install it."""
    try:
        import asyncpg  # noqa: F401
        import pgqueuer
    except ImportError as exc:
        raise SystemExit(
            f"--peer pgqueuer needs PgQueuer and asyncpg in the benchmark's environment "
            f"({exc}): {INSTALL_HINT} (tox -e bench installs them)"
        ) from None
    return pgqueuer.__version__


def dsn() -> str:
    """The benchmark database as a libpq URL, from Django's settings."""
    from django.db import connections

    s = connections["default"].settings_dict
    host = s.get("HOST") or "127.0.0.1"
    auth = s.get("USER") or "postgres"
    if s.get("PASSWORD"):
        auth += f":{s['PASSWORD']}"
    return f"postgresql://{auth}@{host}:{s.get('PORT') or 5432}/{s['NAME']}"


def install() -> None:
    """PgQueuer's schema in the benchmark database (its own install statement)."""

    async def run() -> None:
        import asyncpg
        from pgqueuer import Queries

        conn = await asyncpg.connect(dsn())
        try:
            queries = Queries.from_asyncpg_connection(conn)
            if not await queries.schema_is_installed():
                await queries.install()
        finally:
            await conn.close()

    asyncio.run(run())


def reset() -> None:
    with raw_connection() as conn:
        conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")


# -- the worker (pgq run benchmarks.peer_pgqueuer:worker) ------------------------------
@contextlib.asynccontextmanager
async def worker() -> AsyncIterator[Any]:
    """PgQueuer's factory: a QueueManager on one asyncpg connection, with a no-op and a
    probe that appends "<payload> <time.time()>" to PGQUEUER_BENCH_PROBES."""
    import asyncpg
    from pgqueuer import Job, Queries, QueueManager

    conn = await asyncpg.connect(os.environ["PGDSN"])
    manager = QueueManager(Queries.from_asyncpg_connection(conn))
    probes = open(os.environ["PGQUEUER_BENCH_PROBES"], "a", buffering=1)  # noqa: SIM115

    @manager.entrypoint("noop")
    async def noop(job: Job) -> None:
        return None

    @manager.entrypoint("probe")
    async def probe(job: Job) -> None:
        probes.write(f"{job.payload.decode()} {time.time()}\n")

    try:
        yield manager
    finally:
        probes.close()
        await conn.close()


class Worker:
    """The worker in a subprocess: ``pgqueuer.run(factory)`` on uvloop, as ``pgq run``
    does, every option at its default (``pgq run`` itself fails in this environment
    while setting up its logging: "'str' object has no attribute 'name'")."""

    def __init__(self, name: str) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.probes = RESULTS / f"pgqueuer-{name}.probes"
        self.probes.write_text("")
        self._log = open(RESULTS / f"pgqueuer-{name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "benchmarks.peer_pgqueuer",
            ],
            cwd=REPO,
            env={
                **os.environ, "PYTHONPATH": str(REPO), "PGDSN": dsn(),
                "PGQUEUER_BENCH_PROBES": str(self.probes),
            },
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def probe_lines(self) -> list[str]:
        self.alive()
        return self.probes.read_text().splitlines()

    def alive(self) -> bool:
        """True, or RuntimeError pointing at the worker's log if it has exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"the PgQueuer worker exited ({self.proc.returncode}): see {self._log.name}"
            )
        return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# -- enqueue ---------------------------------------------------------------------------
def _enqueue_client(n: int, offset: int, url: str, ready, go, results) -> None:
    setup_django_child(url)

    async def run() -> float:
        import asyncpg
        from pgqueuer import Queries

        conn = await asyncpg.connect(dsn())
        queries = Queries.from_asyncpg_connection(conn)
        await queries.enqueue("noop", b"-1")  # connect and warm up before the clock
        ready.put(1)
        while not go.is_set():
            await asyncio.sleep(0.001)
        started = time.perf_counter()
        for i in range(offset, offset + n):
            await queries.enqueue("noop", str(i).encode())
        elapsed = time.perf_counter() - started
        await conn.close()
        return elapsed

    results.put(asyncio.run(run()))


def enqueue_single(total: int, clients: int) -> dict[str, Any]:
    """``Queries.enqueue("noop", payload)``, one job and one transaction per call, from
    ``clients`` processes (as W1 measures ``noop.enqueue(i)``)."""
    reset()
    per = total // clients
    wall, times = run_clients(_enqueue_client, clients, per)
    with raw_connection() as conn:
        (written,) = conn.execute("SELECT count(*) FROM pgqueuer WHERE payload <> '-1'").fetchone()
    return {"rate": per * clients / wall, "wall": wall, "slowest_client": max(times),
            "written": written}  # fmt: skip


# -- idle latency ----------------------------------------------------------------------
def latency(n: int, gap: float) -> dict[str, Any]:
    """From just before ``Queries.enqueue`` to the probe's first line, and from the moment
    it returned (committed), on an idle worker; as W3 measures ours."""
    reset()
    peer = Worker("latency")
    sent: dict[str, tuple[float, float]] = {}

    async def run() -> None:
        import asyncpg
        from pgqueuer import Queries

        conn = await asyncpg.connect(dsn())
        queries = Queries.from_asyncpg_connection(conn)
        # Until the worker runs a job: it is listening and idle.
        await queries.enqueue("probe", b"warm-up")
        await asyncio.to_thread(wait_for, lambda: len(peer.probe_lines()) >= 1, 60)
        await asyncio.sleep(0.5)
        for i in range(n):
            before = time.time()
            await queries.enqueue("probe", str(i).encode())
            sent[str(i)] = (before, time.time())
            await asyncio.sleep(gap)
        await conn.close()

    try:
        asyncio.run(run())
        wait_for(lambda: len(peer.probe_lines()) >= n + 1, 60)
        started = dict(line.split() for line in peer.probe_lines()[1:])
    finally:
        peer.stop()
    lat = [(float(started[k]) - t0) * 1000 for k, (t0, _) in sent.items()]
    after_commit = [(float(started[k]) - t1) * 1000 for k, (_, t1) in sent.items()]
    return {
        "p50_ms": percentile(lat, 50),
        "p95_ms": percentile(lat, 95),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat),
        "from_commit_p50_ms": percentile(after_commit, 50),
        "from_commit_p99_ms": percentile(after_commit, 99),
        "enqueue_call_p50_ms": percentile([t1 - t0 for t0, t1 in sent.values()], 50) * 1000,
    }


# -- drain -----------------------------------------------------------------------------
def drain(total: int, batch: int = 1000) -> dict[str, Any]:
    """``total`` no-op jobs pre-enqueued, one worker at its defaults; the rate from the
    first pick to the last success (``pgqueuer_log``, the database's clock), and the
    machine CPU per job over the same span, as W2a measures ours."""
    reset()

    async def fill() -> None:
        import asyncpg
        from pgqueuer import Queries

        conn = await asyncpg.connect(dsn())
        queries = Queries.from_asyncpg_connection(conn)
        for start in range(0, total, batch):
            size = min(batch, total - start)
            payloads = [str(i).encode() for i in range(start, start + size)]
            await queries.enqueue(["noop"] * size, payloads, [0] * size)
        await conn.close()

    asyncio.run(fill())

    def remaining(conn) -> int:
        return conn.execute("SELECT count(*) FROM pgqueuer").fetchone()[0]

    with raw_connection() as conn:
        conn.execute("VACUUM ANALYZE pgqueuer")
        conn.execute("CHECKPOINT")
        peer = Worker("drain")
        spawned = time.monotonic()
        try:
            wait_for(
                lambda: peer.alive() and (remaining(conn) < total or _picked(conn) > 0), 120, 0.002
            )
            cost_start = (*cpu_seconds([peer.proc.pid]), *write_position(conn))
            wait_for(lambda: peer.alive() and remaining(conn) == 0, 600, 0.05)
            cost_end = (*cpu_seconds([peer.proc.pid]), *write_position(conn))
            wall = time.monotonic() - spawned
        finally:
            peer.stop()
        first, last, succeeded = conn.execute(
            "SELECT min(created) FILTER (WHERE status = 'picked'),"
            " max(created) FILTER (WHERE status = 'successful'),"
            " count(*) FILTER (WHERE status = 'successful') FROM pgqueuer_log"
        ).fetchone()
    seconds = (last - first).total_seconds()
    return {
        "rate": total / seconds,
        "seconds": seconds,
        "wall": wall,
        "succeeded": succeeded,
        **cost_per_task(cost_start, cost_end, total),
    }


def _picked(conn) -> int:
    return conn.execute("SELECT count(*) FROM pgqueuer WHERE status = 'picked'").fetchone()[0]


if __name__ == "__main__":  # the worker's process (Worker above)
    import uvloop
    from pgqueuer import run

    uvloop.run(run(worker))
