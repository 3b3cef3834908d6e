"""What ``python -m benchmarks`` reports: its rows (what each figure is, its unit, the
row it is a ratio to, its target), a line as each sample is recorded, and at the end the
table of medians, the tables of ours against a peer's, and the results file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime
from typing import Any

from benchmarks.cli import Plan
from benchmarks.harness import Row, print_table, ratio, rows_json, write_results
from benchmarks.workloads import SHAPES, W1_KINDS


def print_header(info: dict[str, Any], runs: int) -> None:
    print(
        f"django_pgqueue benchmark, {datetime.now():%Y-%m-%d %H:%M}, PostgreSQL "
        f"{info['postgresql']}, {os.cpu_count()} CPUs, {runs} run(s)",
        flush=True,
    )


def suite_rows(plan: Plan) -> dict[str, Row]:
    """Every row the suite can report, labelled with the sizes the plan runs at (a row
    that none of the plan's workloads records stays empty, and out of the printed table)."""
    n, soak = plan.tasks, plan.soak_tasks
    shape_rows, terminal_rows = plan.shape_rows, plan.terminal_rows
    members, steps = plan.members, plan.steps
    return {
        "baseline": Row("baseline", "pgbench baseline (insert+update+delete, 4 clients)", "tps"),
        "baseline_insert": Row(
            "baseline_insert", "pgbench one INSERT per transaction, 1 client", "tps"
        ),
        "baseline_insert_4c": Row(
            "baseline_insert_4c",
            "pgbench one INSERT per transaction, 4 clients",
            "tps",
            ratio_to="baseline_insert",
        ),
        "w1_single_1c": Row(
            "w1_single_1c",
            f"W1 enqueue, {n // 4:,} x 1 txn, 1 client",
            "tasks/s",
            ratio_to="baseline_insert",  # its target is against PgQueuer's (PEER_PAIRS)
        ),
        "w1_single": Row(
            "w1_single",
            f"W1 enqueue, {n:,} x 1 txn, 4 clients",
            "tasks/s",
            ratio_to="w1_single_1c",
            target=">= 2.5x 1 client",  # or pgbench's own 1 -> 4 ratio: set after the runs
            check=lambda v, r: r >= 2.5,
        ),
        **{
            f"w1_{kind}": Row(
                f"w1_{kind}",
                f"W1 {what}, {n // 4:,} x 1 txn, 1 client",
                "tasks/s",
                ratio_to="w1_single_1c",
            )
            for kind, what in W1_KINDS.items()
            if kind != "enqueue"
        },
        "w1_peer_1c": Row(
            "w1_peer_1c",
            f"W1 PgQueuer Queries.enqueue, {n // 4:,} x 1 txn, 1 client",
            "tasks/s",
            ratio_to="baseline_insert",
        ),
        "w1_peer_4c": Row(
            "w1_peer_4c",
            f"W1 PgQueuer Queries.enqueue, {n:,} x 1 txn, 4 clients",
            "tasks/s",
            ratio_to="w1_peer_1c",
        ),
        "w1_many": Row(
            "w1_many",
            "W1 enqueue_many, batches of 1,000",
            "tasks/s",
            ratio_to="baseline",
            target=">= 100,000/s",
            check=lambda v, r: v >= 100_000,
        ),
        "w2a": Row(
            "w2a",
            f"W2a drain {n:,}, 1 process",
            "tasks/s",
            ratio_to="baseline",
            target=">= 2.5x baseline",
            check=lambda v, r: r >= 2.5,
        ),
        "w2a_cpu": Row(
            "w2a_cpu",
            "W2a machine CPU per task (worker + PostgreSQL)",
            "ms",
            target="<= 0.1 ms",
            check=lambda v, r: v <= 0.1,
        ),
        "w2a_wtx": Row("w2a_wtx", "W2a write transactions per task", "txns"),
        "w2a_peer": Row(
            "w2a_peer",
            f"W2a PgQueuer drain {n:,}, 1 process, its defaults",
            "tasks/s",
            ratio_to="baseline",
        ),
        "w2a_peer_cpu": Row(
            "w2a_peer_cpu", "W2a PgQueuer machine CPU per task (worker + PostgreSQL)", "ms"
        ),
        "w2a_process": Row(
            "w2a_process",
            f"W2a drain {n:,}, 1 process, --execution process",
            "tasks/s",
            ratio_to="w2a",
        ),
        "w2a_limits": Row(
            "w2a_limits",
            f"W2a drain {n:,}, 1 process, queue concurrency + rate limit (not binding)",
            "tasks/s",
            ratio_to="w2a",
            target=">= 0.8x W2a",
            check=lambda v, r: r >= 0.8,
        ),
        "w2a_keys_concurrency": Row(
            "w2a_keys_concurrency",
            f"W2a drain {n:,}, 1 process, 10,000 keys, a per-key concurrency (not binding)",
            "tasks/s",
            ratio_to="w2a",
        ),
        "w2a_keys_rate": Row(
            "w2a_keys_rate",
            f"W2a drain {n:,}, 1 process, 10,000 keys, a per-key rate (not binding)",
            "tasks/s",
            ratio_to="w2a",
            target=">= 0.8x W2a",
            check=lambda v, r: r >= 0.8,
        ),
        "claim_plain_p50": Row("claim_plain_p50", "W2a-keys claim alone p50, no key", "ms"),
        "claim_plain_p99": Row("claim_plain_p99", "W2a-keys claim alone p99, no key", "ms"),
        "claim_limited_p50": Row(
            "claim_limited_p50",
            "W2a-keys claim alone p50, no key, queue limit (lock + claim)",
            "ms",
            ratio_to="claim_plain_p50",
        ),
        "claim_limited_p99": Row(
            "claim_limited_p99",
            "W2a-keys claim alone p99, no key, queue limit (lock + claim)",
            "ms",
            ratio_to="claim_plain_p99",
        ),
        "claim_keys_p50": Row(
            "claim_keys_p50",
            "W2a-keys claim alone p50, 10,000 keys with a rate (lock + claim)",
            "ms",
            ratio_to="claim_limited_p50",
        ),
        "claim_keys_p99": Row(
            "claim_keys_p99",
            "W2a-keys claim alone p99, 10,000 keys with a rate (lock + claim)",
            "ms",
            ratio_to="claim_limited_p99",
        ),
        "claim_busy_key_rounds": Row(
            "claim_busy_key_rounds",
            "W2a-keys claims to pass a busy key's 10,000 rows out of budget",
            "claims",
        ),
        "claim_busy_key_round_p50": Row(
            "claim_busy_key_round_p50", "W2a-keys one of those claims (+ set aside), p50", "ms"
        ),
        "claim_busy_key_round_max": Row(
            "claim_busy_key_round_max", "W2a-keys one of those claims (+ set aside), max", "ms"
        ),
        "w2a_async": Row(
            "w2a_async",
            f"W2a drain {n:,}, 1 process, ASYNC_CLAIMS (opt-in)",
            "tasks/s",
            ratio_to="w2a",
        ),
        "w2a_insert": Row(
            "w2a_insert",
            f"W2a drain {n:,} tasks inserting one row each, 1 process",
            "tasks/s",
            ratio_to="w2a",
        ),
        "w2a_insert_txn": Row(
            "w2a_insert_txn",
            f"W2a drain {n:,} tasks inserting one row each in their own atomic(), 1 process",
            "tasks/s",
            ratio_to="w2a_insert",
        ),
        "w2a_atomic": Row(
            "w2a_atomic",
            f"W2a drain {n:,} tasks inserting one row each, 1 process, atomic=True",
            "tasks/s",
            ratio_to="w2a_insert",
        ),
        # The target, as one ratio per run (the two drains back to back).
        "w2a_atomic_ratio": Row(
            "w2a_atomic_ratio",
            "W2a-atomic rate / plain insert rate, same run",
            "x",
            target=">= 0.9",
            check=lambda v, r: v >= 0.9,
        ),
        "w2a_chatty": Row(
            "w2a_chatty",
            f"W2a drain {n:,} tasks logging two INFO records each, 1 process",
            "tasks/s",
        ),
        "w2a_tasklogs": Row(
            "w2a_tasklogs",
            f"W2a drain {n:,} tasks logging two INFO records each, 1 process, TASK_LOGS",
            "tasks/s",
            ratio_to="w2a_chatty",
        ),
        # One ratio per run (the two drains back to back).
        "w2a_tasklogs_ratio": Row(
            "w2a_tasklogs_ratio", "W2a-tasklogs rate / the same drain without, same run", "x"
        ),
        "w2a_middleware": Row(
            "w2a_middleware",
            f"W2a drain {n:,}, 1 process, one no-op task middleware",
            "tasks/s",
            ratio_to="w2a",
            target=">= 0.95x W2a",
            check=lambda v, r: r >= 0.95,
        ),
        "w2a_encrypt": Row(
            "w2a_encrypt",
            f"W2a drain {n:,} encrypted no-ops (@task(encrypt=True)), 1 process",
            "tasks/s",
            ratio_to="w2a",
        ),
        "w2a_no_otel": Row(
            "w2a_no_otel",
            f"W2a drain {n:,}, 1 process, opentelemetry not importable",
            "tasks/s",
        ),
        "w2a_otel": Row(
            "w2a_otel",
            f"W2a drain {n:,}, 1 process, OpenTelemetry SDK (no exporter)",
            "tasks/s",
            ratio_to="w2a_no_otel",
            target=">= 0.9x without",
            check=lambda v, r: r >= 0.9,
        ),
        "w2a_otel_export": Row(
            "w2a_otel_export",
            f"W2a drain {n:,}, 1 process, OpenTelemetry SDK, every span batched and exported",
            "tasks/s",
            ratio_to="w2a_no_otel",
        ),
        "w3_idle_others": Row(
            "w3_idle_others",
            "W3 claimer statements per enqueue, 10 idle workers of other queues",
            "statements",
            target="0",
            check=lambda v, r: v < 0.05,
        ),
        "w2b": Row(
            "w2b",
            f"W2b drain {n:,}, 2 processes",
            "tasks/s",
            ratio_to="baseline",
            target=">= 3x baseline",
            check=lambda v, r: r >= 3.0,
        ),
        "w3_p50": Row(
            "w3_p50", "W3 idle latency p50", "ms", target="< 2 ms", check=lambda v, r: v < 2
        ),
        "w3_p95": Row("w3_p95", "W3 idle latency p95", "ms"),
        "w3_p99": Row(
            "w3_p99", "W3 idle latency p99", "ms", target="< 4 ms", check=lambda v, r: v < 4
        ),
        "w3_peer_p50": Row("w3_peer_p50", "W3 PgQueuer idle latency p50", "ms"),
        "w3_peer_p95": Row("w3_peer_p95", "W3 PgQueuer idle latency p95", "ms"),
        "w3_peer_p99": Row("w3_peer_p99", "W3 PgQueuer idle latency p99", "ms"),
        "w3_peer_commit_p50": Row(
            "w3_peer_commit_p50", "W3 PgQueuer latency p50, from the enqueue's commit", "ms"
        ),
        "w3_peer_enqueue_p50": Row(
            "w3_peer_enqueue_p50", "W3 PgQueuer the enqueue call itself, p50", "ms"
        ),
        "w3_commit_p50": Row("w3_commit_p50", "W3 latency p50, from the enqueue's commit", "ms"),
        "w3_commit_p99": Row("w3_commit_p99", "W3 latency p99, from the enqueue's commit", "ms"),
        "w3_enqueue_p50": Row("w3_enqueue_p50", "W3 the enqueue() call itself, p50", "ms"),
        "w10": Row(
            "w10",
            "W10 1,000 async handlers awaiting 1 s, 1 process",
            "s",
            target="< 3 s",
            check=lambda v, r: v < 3,
        ),
        "w4": Row(
            "w4",
            f"W4 drain first {n:,} of {10 * n:,}",
            "tasks/s",
            ratio_to="w2a",
            target=">= 0.9x W2a",
            check=lambda v, r: r >= 0.9,
        ),
        "w5_p50": Row("w5_p50", "W5 scheduled lateness p50", "ms"),
        "w5_p99": Row(
            "w5_p99", "W5 scheduled lateness p99", "ms", target="< 20 ms", check=lambda v, r: v < 20
        ),
        "w6": Row("w6", "W6 crash recovery of 8 tasks", "s", target="<= lease + 2 s", check=None),
        "w7_ratio": Row(
            "w7_ratio",
            f"W7 soak {soak:,}: last 10% / first 10%",
            "x",
            target=">= 0.8",
            check=lambda v, r: v >= 0.8,
        ),
        **{
            f"w8_{shape}": Row(
                f"w8_{shape}",
                f"W8 drain {n:,} beside {shape_rows:,} rows: {description}",
                "tasks/s",
                ratio_to="w2a",
                target=">= 0.9x W2a",
                check=lambda v, r: r >= 0.9,
            )
            for shape, (description, _) in SHAPES.items()
        },
        "w9_plain": Row(
            "w9_plain", f"W9 plain drain {members:,}, 1 process (fan-in's yardstick)", "tasks/s"
        ),
        "w9_fan_in": Row(
            "w9_fan_in",
            f"W9 chord {members:,} + callback, to its settlement",
            "tasks/s",
            ratio_to="w9_plain",
        ),
        # The target, as one ratio per run (chord and plain drain back to back), so a
        # machine that slows down between runs moves both sides of each sample.
        "w9_fan_in_ratio": Row(
            "w9_fan_in_ratio",
            "W9 chord rate / plain drain rate, same run",
            "x",
            target=">= 0.83 (fan-in < +20%)",
            check=lambda v, r: v >= 0.83,
        ),
        "w9_fan_in_lag": Row(
            "w9_fan_in_lag", "W9 chord: last member's settlement to callback start", "ms"
        ),
        "w9_fan_in_enqueue": Row(
            "w9_fan_in_enqueue", f"W9 chord enqueue: the callback after= {members:,}", "s"
        ),
        "w9_chain": Row("w9_chain", f"W9 chain of {steps:,} steps, head's claim to the end", "s"),
        "w9_chain_handover": Row(
            "w9_chain_handover", "W9 chain: a step's settlement to the next claim, p50", "ms"
        ),
        "w8_claim_empty_p50": Row("w8_claim_empty_p50", "W8 claim latency p50, empty table", "ms"),
        "w8_claim_empty_p99": Row("w8_claim_empty_p99", "W8 claim latency p99, empty table", "ms"),
        "w8_claim_full_p50": Row(
            "w8_claim_full_p50",
            f"W8 claim latency p50, {terminal_rows:,} finished rows",
            "ms",
            ratio_to="w8_claim_empty_p50",
            target="<= 1.5x empty",
            check=lambda v, r: r <= 1.5,
        ),
        "w8_claim_full_p99": Row(
            "w8_claim_full_p99",
            f"W8 claim latency p99, {terminal_rows:,} finished rows",
            "ms",
            ratio_to="w8_claim_empty_p99",
            target="<= 1.5x empty",
            check=lambda v, r: r <= 1.5,
        ),
        "w7_rss": Row(
            "w7_rss",
            "W7 soak: worker RSS growth (2nd half / at 10%)",
            "x",
            target="flat (<= 1.15)",
            check=lambda v, r: v <= 1.15,
        ),
    }


class Report:
    """The rows and every sample recorded in them, with what the workload returned."""

    def __init__(self, rows: dict[str, Row]) -> None:
        self.rows = rows
        self.raw: dict[str, list[Any]] = {key: [] for key in rows}

    def record(self, key: str, value: float, detail: Any) -> None:
        """A sample of a row, with what the workload returned, and its line (a drain's
        with its CPU and write costs per task)."""
        rows = self.rows
        rows[key].samples.append(value)
        self.raw[key].append(detail)
        cost = ""
        if isinstance(detail, dict) and "broker_cpu_ms_per_task" in detail:  # a Celery drain
            cost = (
                f" (CPU {detail['cpu_ms_per_task']:.3f} ms/task: worker "
                f"{detail['worker_cpu_ms_per_task']:.3f} + broker "
                f"{detail['broker_cpu_ms_per_task']:.3f})"
            )
        elif isinstance(detail, dict) and "cpu_ms_per_task" in detail:
            cost = (
                f" (CPU {detail['cpu_ms_per_task']:.3f} ms/task: worker "
                f"{detail['worker_cpu_ms_per_task']:.3f} + PostgreSQL "
                f"{detail['pg_cpu_ms_per_task']:.3f}; {detail['write_txns_per_task']:.3f} "
                f"write txns/task; WAL {detail['wal_bytes_per_task']:,.0f} B/task)"
            )
        print(f"  {rows[key].label}: {value:,.2f} {rows[key].unit}{cost}", flush=True)

    def finish(
        self, plan: Plan, info: dict[str, Any], peer_tables: list[tuple[list[tuple], str]]
    ) -> None:
        """The tables (ours, then ours against each peer's pairs of rows, with its title),
        and the results file."""
        rows = self.rows
        # 4 clients against 1: 2.5x, or what pgbench's own one-INSERT scales by on this
        # machine (2 cores run 4 Python clients and 4 backends), whichever is lower.
        if rows["baseline_insert_4c"].samples:
            scale = min(2.5, ratio(rows, rows["baseline_insert_4c"]))
            rows["w1_single"].target = f">= {scale:.2f}x 1 client"
            rows["w1_single"].check = lambda v, r, limit=scale: r >= limit
        print()
        print_table(rows)
        for pairs, title in peer_tables:
            print()
            print_peer_table(rows, pairs, title)
        write_results(
            "results",
            plan.json,
            {
                "server": info,
                "runs": plan.runs,
                "quick": plan.quick,
                "rows": rows_json(rows),
                "raw": self.raw,
            },
        )


# Ours against PgQueuer's, row by row: (label, our row, their row, the target on
# ours / theirs and its check; None: shown only).
PEER_PAIRS: list[tuple[str, str, str, str | None, Callable[[float], bool] | None]] = [
    ("W1 enqueue, 1 client (tasks/s)", "w1_single_1c", "w1_peer_1c", ">= 1.0x", lambda r: r >= 1.0),
    ("W1 enqueue, 4 clients (tasks/s)", "w1_single", "w1_peer_4c", None, None),
    ("W3 idle latency p50 (ms)", "w3_p50", "w3_peer_p50", "<= 1.0x", lambda r: r <= 1.0),
    ("W3 idle latency p95 (ms)", "w3_p95", "w3_peer_p95", None, None),
    ("W3 idle latency p99 (ms)", "w3_p99", "w3_peer_p99", "<= 1.0x", lambda r: r <= 1.0),
    ("W3 from the enqueue's commit, p50 (ms)", "w3_commit_p50", "w3_peer_commit_p50", None, None),
    ("W3 the enqueue call itself, p50 (ms)", "w3_enqueue_p50", "w3_peer_enqueue_p50", None, None),
    ("W2a drain, 1 process (tasks/s)", "w2a", "w2a_peer", ">= 1.6x", lambda r: r >= 1.6),
    ("W2a machine CPU per task (ms)", "w2a_cpu", "w2a_peer_cpu", "<= 0.75x", lambda r: r <= 0.75),
]


def print_peer_table(rows: dict[str, Row], pairs: list[tuple], title: str) -> None:
    """Ours / theirs: the ratio of the medians, its target, and the spread of the
    per-run ratios (each run measured both back to back)."""
    print(
        f"{title:<42} {'ours':>10} {'theirs':>10} {'ours/theirs':>12} "
        f"{'per run':>14}  {'target':<9} met"
    )
    for label, ours, theirs, target, check in pairs:
        a, b = rows[ours].samples, rows[theirs].samples
        if not a or not b:
            continue
        per_run = [x / y for x, y in zip(a, b, strict=False)]
        r = rows[ours].median / rows[theirs].median
        mark = "" if check is None else ("yes" if check(r) else "NO")
        line = (
            f"{label:<42} {rows[ours].median:>10,.2f} {rows[theirs].median:>10,.2f} "
            f"{r:>11.2f}x {min(per_run):>6.2f}-{max(per_run):.2f}x  {target or '':<9} {mark}"
        )
        print(line.rstrip())
