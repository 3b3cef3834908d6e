"""The command line of ``python -m benchmarks``: its flags, and the plan they make."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

# What --help says of the suite.
DESCRIPTION = """The benchmark: workloads W1-W10 against pgbench baselines on the same server.

Every figure is reported as the median of several runs with its spread, and as a ratio
to a pgbench baseline measured in the same invocation (one INSERT, one UPDATE by primary
key and one DELETE per transaction, 4 clients; and one INSERT per transaction, 1
client, for the single enqueue), so results survive a noisy machine. Every drain also
reports the machine CPU it cost per task (the worker's processes and PostgreSQL's, from
/proc) and the write transactions and WAL per task.
See docs/performance.md for what each workload measures and how to read the table.
"""


@dataclass(frozen=True)
class Plan:
    """What one invocation runs: which workloads, how many times, at what sizes."""

    only: frozenset[str]  # the workloads of --only, upper case
    runs: int
    tasks: int  # a drain's tasks, and W1's with 4 clients (a quarter of them with 1)
    soak_tasks: int
    shape_rows: int
    terminal_rows: int
    members: int  # W9's chord
    steps: int  # W9's chain
    lease: float | None  # W6's; None: the worker's default
    baseline_seconds: float
    quick: bool
    peer: str | None
    async_commit: bool
    json: Path | None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=DESCRIPTION)
    parser.add_argument("--runs", type=int, default=3, help="runs of each workload (median)")
    parser.add_argument(
        "--only",
        help="comma-separated workloads: W1,W2,W3,W4,W5,W6,W7,W8,W9,W10; also W2a (W2's "
        "1-process drain alone), W2a-process (the same drain with --execution process) and "
        "W2a-async (with ASYNC_CLAIMS), W2a-limits (with limits that do not bind), "
        "W2a-keys (10,000 keys with a per-key rate or concurrency that does not bind, and "
        "the claim alone), "
        "W2a-atomic (tasks that insert one row, plain against atomic=True), "
        "W2a-middleware (one no-op task middleware), W2a-encrypt (encrypted no-ops, "
        "@task(encrypt=True)), W2a-tasklogs (tasks logging two records, with TASK_LOGS "
        "against without), W2a-otel (OpenTelemetry's SDK against "
        "no opentelemetry); W3-latency is W3's idle latency without its idle workers "
        "of other queues; W9 is "
        "waiting work: a chord's fan-in against a plain drain, and a chain",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one run, smaller sizes, short lease in W6: a smoke test",
    )
    parser.add_argument("--soak-tasks", type=int, default=1_000_000)
    parser.add_argument(
        "--shape-rows", type=int, default=1_000_000, help="W8: rows of each backlog shape"
    )
    parser.add_argument(
        "--terminal-rows",
        type=int,
        default=10_000_000,
        help="W8: finished rows in the table for the claim-latency measurement",
    )
    parser.add_argument("--baseline-seconds", type=float, default=10)
    parser.add_argument(
        "--scale",
        type=float,
        help="the workloads' sizes as a fraction of the defaults (--quick: 0.25); W1's "
        "1-client runs enqueue 5,000 x scale tasks",
    )
    parser.add_argument(
        "--peer",
        choices=["pgqueuer", "celery"],
        help="also measure a peer in the same runs, interleaved with ours, and print ours / "
        "theirs. pgqueuer: PgQueuer (asyncpg), its single enqueue (W1, 1 and 4 clients), "
        "idle latency (W3) and 1-process drain (W2a); needs pip install "
        "'pgqueuer[asyncpg]'. celery: Celery with Redis and RabbitMQ (those that answer), "
        "its delay() (W1, and W1-tx in a view's transaction), its drain in its default and "
        "at-least-once configurations (W2a) and its idle latency with the prefork and "
        "threads pools (W3); needs pip install 'celery[redis]' amqp",
    )
    parser.add_argument(
        "--async-commit",
        action="store_true",
        help="synchronous_commit = off for every session of the benchmark database (ours, "
        "the peer's, pgbench's): the client and server CPU path without the wait for the "
        "WAL flush, the noisiest part on a shared machine's disk. For W1 only: it also "
        "gives up the worker's durable claims",
    )
    parser.add_argument("--json", type=Path, help="where to write the results")
    return parser


def parse_plan(argv: list[str] | None = None) -> Plan:
    args = build_parser().parse_args(argv)
    scale = args.scale or (0.25 if args.quick else 1.0)
    return Plan(
        only=frozenset((args.only or "W1,W2,W3,W4,W5,W6,W7,W8").upper().split(",")),
        runs=1 if args.quick else args.runs,
        tasks=int(20_000 * scale),
        soak_tasks=100_000 if args.quick else args.soak_tasks,
        shape_rows=int(args.shape_rows * scale),
        terminal_rows=int(args.terminal_rows * (0.1 if args.quick else 1)),
        members=int(10_000 * scale),
        steps=int(1_000 * scale),
        lease=5.0 if args.quick else None,
        baseline_seconds=args.baseline_seconds,
        quick=args.quick,
        peer=args.peer,
        async_commit=args.async_commit,
        json=args.json,
    )
