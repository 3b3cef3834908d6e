"""Celery 5 as a peer baseline: ``python -m benchmarks --peer celery``.

Celery with Redis (``redis://127.0.0.1:6379/0``, or PGQUEUE_BENCH_REDIS_URL) and, when
one answers, RabbitMQ (``amqp://guest:guest@127.0.0.1:5672//``, or
PGQUEUE_BENCH_AMQP_URL); a broker that does not answer is skipped with a message, and
with none the run stops saying so. Celery is not a dependency of django_pgqueue: the
benchmark needs it beside it, ``pip install "celery[redis]" amqp`` (tox -e bench has
it). Measured in the same runs as ours, back to back (docs/performance.md, "Against
Celery"):

- **W1**: ``noop.delay(i)`` from 1 client, one message each; **W1-tx**: as a view
  writes an order and sends its task once the order is committed, ``with atomic():
  INSERT an order; transaction.on_commit(lambda: noop.delay(i))`` (ours: ``with
  atomic(): INSERT an order; noop.enqueue(i)``, the task in the order's transaction);
- **W2a**: ``total`` no-ops sent beforehand, then one ``celery worker`` (prefork pool
  of 4, Celery's default on 4 cores) drains them, in each configuration: Celery's
  defaults, and at-least-once (``task_acks_late``, ``worker_prefetch_multiplier=1``,
  ``task_reject_on_worker_lost``); the rate from the first task's end to the last's,
  and the machine CPU per task of the worker's processes and the broker's;
- **W3**: an idle worker (at-least-once settings) with the prefork pool and with the
  threads pool (4 each), whose probe records when it started; probes sent one at a
  time; p50 / p99 from just before ``delay()``.

Each task appends one line to a file (benchmarks/celery_app.py): about 5 us of a
write, the price of knowing when it ran without a result backend.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    REPO,
    RESULTS,
    Row,
    descendants,
    percentile,
    process_table,
    raw_connection,
    setup_django_child,
    wait_for,
)

INSTALL_HINT = 'pip install "celery[redis]" amqp'
CONFIGS = ("defaults", "at-least-once")
POOLS = ("prefork", "threads")
CONCURRENCY = 4
# The broker's processes, by their command name in /proc (their CPU is the broker's).
BROKER_PROCESSES = {"redis": ("redis-server",), "rabbitmq": ("beam.smp", "erl_child_setup")}
# W1-tx's order: one row in the view's transaction, beside the task.
ORDER_TABLE = "CREATE TABLE IF NOT EXISTS bench_order (id bigserial PRIMARY KEY, total int)"
ORDER_INSERT = "INSERT INTO bench_order (total) VALUES (%s)"
# The brokers install() found, by name -> URL.
BROKERS_IN_USE: dict[str, str] = {}


def available() -> str:
    """Celery's version, or SystemExit saying how to install it."""
    try:
        import celery
    except ImportError as exc:
        raise SystemExit(
            f"--peer celery needs Celery in the benchmark's environment ({exc}): "
            f"{INSTALL_HINT} (tox -e bench installs it)"
        ) from None
    return celery.__version__


def brokers() -> dict[str, str]:
    """The brokers that answer, by name ("redis", "rabbitmq"); each one that does not is
    reported. SystemExit when none does."""
    candidates = {
        "redis": os.environ.get("PGQUEUE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "rabbitmq": os.environ.get(
            "PGQUEUE_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"
        ),
    }
    found = {}
    for name, url in candidates.items():
        problem = _ping(url)
        if problem is None:
            found[name] = url
        else:
            print(f"  (--peer celery: no {name} at {url}, skipped: {problem})", flush=True)
    if not found:
        raise SystemExit(
            "--peer celery: no broker answers (Redis: apt install redis-server, or set "
            "PGQUEUE_BENCH_REDIS_URL; RabbitMQ: PGQUEUE_BENCH_AMQP_URL)"
        )
    return found


def _ping(url: str) -> str | None:
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def install() -> list[str]:
    """W1-tx's order table, and the brokers to measure (their names)."""
    with raw_connection() as conn:
        conn.execute(ORDER_TABLE)
    BROKERS_IN_USE.update(brokers())
    return list(BROKERS_IN_USE)


def _app(broker: str, config: str = "defaults", out: Path | None = None) -> Any:
    """benchmarks.celery_app, configured by the environment as its workers are."""
    os.environ["PGQUEUE_BENCH_CELERY_BROKER"] = broker
    os.environ["PGQUEUE_BENCH_CELERY_CONFIG"] = config
    if out is not None:
        os.environ["PGQUEUE_BENCH_CELERY_OUT"] = str(out)
    import importlib

    import benchmarks.celery_app as module

    return importlib.reload(module)


def purge(broker: str) -> int:
    """Empty the benchmark's queue; returns how many messages it held."""
    return _app(broker).app.control.purge()


class Worker:
    """``celery -A benchmarks.celery_app worker`` in a subprocess."""

    def __init__(self, broker: str, config: str, pool: str, name: str) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.out = RESULTS / f"celery-{name}.lines"
        self.out.write_text("")
        self._log = open(RESULTS / f"celery-{name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "benchmarks.celery_app", "worker",
             "--pool", pool, "--concurrency", str(CONCURRENCY), "--loglevel", "WARNING",
             "--queues", "pgqueue-bench-celery", "--hostname", f"bench-{name}@%h"],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "PGQUEUE_BENCH_CELERY_BROKER": broker,
                 "PGQUEUE_BENCH_CELERY_CONFIG": config,
                 "PGQUEUE_BENCH_CELERY_OUT": str(self.out)},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def lines(self) -> list[str]:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"the Celery worker exited ({self.proc.returncode}): see {self._log.name}"
            )
        return self.out.read_text().splitlines()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _cpu(worker_pid: int, broker: str) -> tuple[float, float]:
    """CPU seconds used so far by the worker (with its pool's children) and the broker."""
    table = process_table()
    ours = descendants(table, [worker_pid])
    names = BROKER_PROCESSES[broker]
    worker = sum(table[pid][2] for pid in ours if pid in table)
    server = sum(cpu for _ppid, name, cpu in table.values() if name in names)
    return worker, server


# -- W1 --------------------------------------------------------------------------------
def _enqueue_client(n: int, broker: str, url: str, tx: bool, ready, go, results) -> None:
    app = _app(broker)  # a broker's URL
    call = app.noop.delay
    if tx:
        setup_django_child(url)
        from django.db import connection, transaction

        def call(i: int) -> None:  # as a view sends it
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(ORDER_INSERT, [i])
                transaction.on_commit(lambda: app.noop.delay(i))

    call(-1)  # connect and warm up before the clock starts
    ready.put(1)
    go.wait()
    started = time.perf_counter()
    for i in range(n):
        call(i)
    results.put(time.perf_counter() - started)


def enqueue_single(total: int, broker: str, tx: bool = False) -> dict[str, Any]:
    """``noop.delay(i)`` (``tx``: in a view's transaction, on its commit), 1 client."""
    url = BROKERS_IN_USE[broker]
    purge(url)
    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    proc = ctx.Process(
        target=_enqueue_client,
        args=(total, url, os.environ["DATABASE_URL"], tx, ready, go, results),
    )
    proc.start()
    ready.get(timeout=60)
    started = time.perf_counter()
    go.set()
    elapsed = results.get(timeout=600)
    wall = time.perf_counter() - started
    proc.join()
    written = purge(url) - 1  # the warm-up's
    assert written == total, f"Celery W1 on {broker}: {written} messages for {total} calls"
    return {"rate": total / wall, "wall": wall, "client": elapsed, "written": written}


# -- W2a -------------------------------------------------------------------------------
def drain(total: int, broker: str, config: str) -> dict[str, Any]:
    """``total`` no-ops sent, then one worker (prefork, 4) drains them."""
    url = BROKERS_IN_USE[broker]
    purge(url)
    app = _app(url, config)
    with app.app.producer_or_acquire() as producer:
        for i in range(total):
            app.noop.apply_async((i,), producer=producer)
    worker = Worker(url, config, "prefork", f"drain-{broker}-{config}")
    try:
        wait_for(lambda: len(worker.lines()) > 0, 120, 0.002)
        cost_start = _cpu(worker.proc.pid, broker)
        wait_for(lambda: len(worker.lines()) >= total, 600, 0.05)
        cost_end = _cpu(worker.proc.pid, broker)
        ended = sorted(float(line) for line in worker.lines())
    finally:
        worker.stop()
    seconds = ended[-1] - ended[0]
    worker_cpu = cost_end[0] - cost_start[0]
    broker_cpu = cost_end[1] - cost_start[1]
    done = len(ended) - 1  # the rate and the costs from the first task's end on
    return {
        "rate": done / seconds,
        "seconds": seconds,
        "tasks": len(ended),
        "cpu_ms_per_task": (worker_cpu + broker_cpu) * 1000 / done,
        "worker_cpu_ms_per_task": worker_cpu * 1000 / done,
        "broker_cpu_ms_per_task": broker_cpu * 1000 / done,
    }


# -- W3 --------------------------------------------------------------------------------
def latency(n: int, gap: float, broker: str, pool: str) -> dict[str, Any]:
    """From just before ``probe.delay(i)`` to the probe's start, on an idle worker
    (at-least-once settings) of ``pool``."""
    url = BROKERS_IN_USE[broker]
    purge(url)
    worker = Worker(url, "at-least-once", pool, f"latency-{broker}-{pool}")
    app = _app(url, "at-least-once")
    sent: dict[str, tuple[float, float]] = {}
    try:
        app.probe.delay(-1)  # until the worker runs a task: it is up, and idle
        wait_for(lambda: len(worker.lines()) >= 1, 60)
        time.sleep(0.5)
        for i in range(n):
            before = time.time()
            app.probe.delay(i)
            sent[str(i)] = (before, time.time())
            time.sleep(gap)
        wait_for(lambda: len(worker.lines()) >= n + 1, 60)
        started = dict(line.split() for line in worker.lines()[1:])
    finally:
        worker.stop()
    lat = [(float(started[k]) - t0) * 1000 for k, (t0, _) in sent.items()]
    return {
        "p50_ms": percentile(lat, 50),
        "p95_ms": percentile(lat, 95),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat),
        "delay_call_p50_ms": percentile([(t1 - t0) * 1000 for t0, t1 in sent.values()], 50),
    }



# -- the rows and the table ------------------------------------------------------------
def rows(brokers: list[str], n: int) -> dict[str, Row]:
    """The runner's rows of Celery's measurements, per broker (and configuration, pool)."""
    found: dict[str, Row] = {}
    for broker in brokers:
        name = f"Celery+{'Redis' if broker == 'redis' else 'RabbitMQ'}"
        found[f"w1_celery_{broker}"] = Row(
            f"w1_celery_{broker}", f"W1 {name} delay(), {n // 4:,} x 1, 1 client", "tasks/s"
        )
        found[f"w1_tx_celery_{broker}"] = Row(
            f"w1_tx_celery_{broker}",
            f"W1-tx {name} on_commit(delay), {n // 4:,} x 1 txn, 1 client", "tasks/s",
        )  # fmt: skip
        for config in CONFIGS:
            key = f"w2a_celery_{broker}_{config}"
            found[key] = Row(key, f"W2a {name} drain, {config}, prefork 4", "tasks/s")
            found[f"{key}_cpu"] = Row(
                f"{key}_cpu", f"W2a {name} {config} machine CPU per task (worker + broker)", "ms"
            )
        for pool in POOLS:
            for q in ("p50", "p99"):
                key = f"w3_celery_{broker}_{pool}_{q}"
                found[key] = Row(key, f"W3 {name} idle latency {q}, {pool} pool", "ms")
    return found


def pairs(brokers: list[str]) -> list[tuple]:
    """Ours against Celery's, row by row: (label, our row, their row, target, check).
    The targets are against Celery with Redis (its at-least-once configuration for the
    drain, its best pool for the latency); RabbitMQ's rows are shown beside them."""
    table: list[tuple] = []
    for broker in brokers:
        redis = broker == "redis"
        name = "Redis" if redis else "RabbitMQ"
        table += [
            (f"W1 enqueue / delay(), {name} (tasks/s)", "w1_single_1c", f"w1_celery_{broker}",
             None, None),
            (f"W1-tx in a view's transaction, {name} (tasks/s)", "w1_tx",
             f"w1_tx_celery_{broker}", *_target(redis, ">= 1.5x", lambda r: r >= 1.5)),
            (f"W2a drain, {name} at-least-once (tasks/s)", "w2a",
             f"w2a_celery_{broker}_at-least-once",
             *_target(redis, ">= 5x", lambda r: r >= 5)),
            (f"W2a CPU/task, {name} at-least-once (ms)", "w2a_cpu",
             f"w2a_celery_{broker}_at-least-once_cpu",
             *_target(redis, "<= 0.25x", lambda r: r <= 0.25)),
            (f"W2a drain, {name} defaults (tasks/s)", "w2a", f"w2a_celery_{broker}_defaults",
             None, None),
            (f"W2a CPU/task, {name} defaults (ms)", "w2a_cpu",
             f"w2a_celery_{broker}_defaults_cpu", None, None),
        ]  # fmt: skip
        for pool in POOLS:
            best = redis and pool == "threads"
            for q in ("p50", "p99"):
                table.append(
                    (f"W3 latency {q}, {name} {pool} (ms)", f"w3_{q}",
                     f"w3_celery_{broker}_{pool}_{q}",
                     *_target(best, "<= 1.0x", lambda r: r <= 1.0))
                )  # fmt: skip
    return table


def _target(applies: bool, text: str, check: Any) -> tuple[Any, Any]:
    return (text, check) if applies else (None, None)
