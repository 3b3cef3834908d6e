"""``python -m benchmarks.tenants``: many tenants on one queue (docs/tenants.md).

Batch handlers (``--only batch``). 10,000 calls enqueued before one worker process (the
defaults) starts, through a batch handler (benchmarks/tenant_tasks.py: ``batch_call``,
100 calls a batch) and through a task of one call (``one_call``), each handler calling a
remote API whose round trip is ``--api-ms`` (a sleep), and without one: calls settled per
second, from the first start to the last settlement.

Fair share (``--only fair``). One worker process with the defaults (as W2a) serves a fair task
(benchmarks/tenant_tasks.py: ``fair_probe``, a no-op that returns when its handler
started). Each run measures, on the same database:

1. **Empty queue.** 50 keys each enqueue 10 tasks per second (one task per transaction,
   from one process, evenly spread) for ``--trickle-seconds``: their wait from due to
   start (the handler's start, less the row's run_at), p50 and p99, and the same from
   the moment the enqueue's commit returned (when the task could first be claimed: the
   wait less the enqueue's own commit).
2. **Beside a backlog.** Key A holds 200,000 due tasks (``enqueue_many``, before the
   worker starts); once the worker has started its first, the same 50 keys enqueue as
   in 1 (their tasks do not wait for the worker's start-up, which no fair share can
   shorten): their wait from due to start, over the tasks due while A still had due
   work; and the drain: every task settled per second from the first start to A's last
   settlement.
3. **The backlog alone.** As 2 without the other keys: the fair claim's own drain.
4. **Plain, alone and beside the same enqueues.** As 3 and 2 with a task that is not
   fair (``plain_probe``), backlog and trickle: the drain the same harness measures
   without fair share, alone, and while the machine also runs the other keys' 500
   enqueue transactions a second (the other keys then wait behind the backlog, so
   only the drain is reported).
5. **W2a.** The plain drain of as many no-op tasks (benchmarks/workloads.py: ``drain``).

Targets: the other keys' p99 beside the backlog at most 2x their p99 on the empty
queue; the drain beside them at least 0.9x W2a. ``--probe-ms`` gives the fair
workload's handlers (not W2a's) a sleep, as for an I/O call: with no-ops, the drain
takes every core, and the other keys' tasks then wait for the CPU as much as for the
queue. ``--scale`` shrinks the backlog (and
the trickle's duration with it) for a smoke run. The table is printed as
``python -m benchmarks`` prints its own, and the results written as JSON to
benchmarks/results/.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    Row,
    WorkerProcess,
    count,
    percentile,
    prepare_database,
    print_table,
    raw_connection,
    reset_queue,
    rows_json,
    setup_django,
    setup_django_child,
    wait_for,
    write_results,
)
from benchmarks.workloads import drain

BACKLOG = 200_000
KEYS = 50
PER_KEY_PER_SECOND = 10
TENANTS_ENV = {"PGQUEUE_BENCH_TENANTS": "1"}


def _trickle(
    url: str, seconds: float, ready: Any, go: Any, stop: Any, fair: bool = True
) -> None:
    """Enqueue one task per key per 1 / PER_KEY_PER_SECOND s, spread evenly, each in
    its own transaction, for ``seconds`` or until ``stop`` is set (of fair_probe, or
    of plain_probe if not ``fair``)."""
    os.environ.update(TENANTS_ENV)
    setup_django_child(url)
    from benchmarks.tenant_tasks import fair_probe, plain_probe

    probe = fair_probe if fair else plain_probe
    probe.enqueue("warm-up", -1)
    ready.put(1)
    go.wait()
    gap = 1.0 / (KEYS * PER_KEY_PER_SECOND)
    started = time.monotonic()
    n = 0
    committed: list[tuple[int, float]] = []
    while time.monotonic() - started < seconds and not stop.is_set():
        task_id = probe.enqueue(f"other:{n % KEYS}", n)
        committed.append((task_id, time.time()))  # the enqueue's commit has returned
        n += 1
        pause = started + n * gap - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    copy_in = "COPY bench_trickle (task_id, committed) FROM STDIN"
    with raw_connection() as conn, conn.cursor() as cursor, cursor.copy(copy_in) as copy:
        for row in committed:
            copy.write_row(row)


def start_trickle(
    seconds: float, before: Callable[[], None] | None = None, fair: bool = True
) -> tuple[multiprocessing.Process, Any]:
    """The trickle, in a process of its own, and the event that stops it early. It
    starts once its process is ready and ``before`` has returned."""
    ctx = multiprocessing.get_context("spawn")
    ready, go, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    process = ctx.Process(
        target=_trickle, args=(os.environ["DATABASE_URL"], seconds, ready, go, stop, fair)
    )
    process.start()
    ready.get(timeout=60)
    if before is not None:
        before()
    go.set()
    return process, stop


def waits(conn: Any, before: str = "true", since: str = "run") -> list[float]:
    """The other keys' waits to start (ms), of their tasks due ``before``: from their
    run_at (``since`` "run": the enqueue's INSERT, so its own commit is in the wait)
    or from the moment their enqueue's commit returned ("commit": when the task could
    first be claimed)."""
    start = (
        "EXTRACT(EPOCH FROM run_at)" if since == "run"
        else "(SELECT committed FROM bench_trickle WHERE task_id = id)"
    )
    rows = conn.execute(
        f"SELECT ((result #>> '{{}}')::float8 - {start}) * 1000 "
        "FROM pgqueue_task WHERE fair_key LIKE 'other:%%' AND state = 'succeeded' "
        f"AND {before}"
    ).fetchall()
    return [row[0] for row in rows]


def reset_tenants() -> None:
    reset_queue()
    with raw_connection() as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_trickle (task_id bigint, committed float8)"
        )
        conn.execute("TRUNCATE bench_trickle")


def start_worker(name: str) -> WorkerProcess:
    """A worker with the fair task, once it has registered (and so parked)."""
    worker = WorkerProcess(log_name=f"tenants-{name}", env=TENANTS_ENV)
    with raw_connection() as conn:
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM pgqueue_worker").fetchone()[0] > 0, 60
        )
    time.sleep(0.5)
    return worker


def empty_queue(seconds: float) -> dict[str, Any]:
    """1: the trickle alone."""
    reset_tenants()
    worker = start_worker("empty")
    try:
        trickle, _ = start_trickle(seconds)
        trickle.join()
        with raw_connection() as conn:
            wait_for(lambda: count(conn, "state IN ('pending', 'running')") == 0, 60)
            found = waits(conn)
            after_commit = waits(conn, since="commit")
    finally:
        worker.stop()
    return {
        "p50": percentile(found, 50), "p99": percentile(found, 99), "tasks": len(found),
        "commit_p50": percentile(after_commit, 50), "commit_p99": percentile(after_commit, 99),
    }


def beside_backlog(backlog: int, trickle_too: bool = True, fair: bool = True) -> dict[str, Any]:
    """2: the trickle beside key A's backlog, until A's last task started (without
    ``trickle_too``: A's backlog alone, the fair claim's own drain; without ``fair``:
    both of the plain task, whose waits are not reported)."""
    from benchmarks.tenant_tasks import fair_probe, plain_probe

    probe = fair_probe if fair else plain_probe
    reset_tenants()
    for start in range(0, backlog, 1000):
        probe.enqueue_many([("A", n) for n in range(start, min(backlog, start + 1000))])
    with raw_connection() as conn:
        conn.execute("VACUUM ANALYZE pgqueue_task")
        conn.execute("CHECKPOINT")
    worker = WorkerProcess(log_name="tenants-backlog", env=TENANTS_ENV)
    try:
        # The other keys start once the worker is draining A's backlog (not while it
        # starts up: their first tasks would wait for its start, which no fair share
        # can shorten).
        with raw_connection() as conn:

            def draining() -> None:
                wait_for(lambda: count(conn, "started_at IS NOT NULL") > 0, 60, 0.005)

            trickle, stop = (
                start_trickle(3600, draining, fair) if trickle_too else (None, None)
            )
            mine = "fair_key = 'A'" if fair else "args ->> 0 = 'A'"
            a_due = f"{mine} AND state IN ('pending', 'running')"
            wait_for(lambda: count(conn, a_due) == 0, 600, 0.05)
            if trickle is not None:
                stop.set()
                trickle.join()
            wait_for(lambda: count(conn, "state IN ('pending', 'running')") == 0, 60)
            first, last = conn.execute(
                f"SELECT min(started_at), max(finished_at) FILTER (WHERE {mine}) "
                "FROM pgqueue_task WHERE state = 'succeeded'"
            ).fetchone()
            (settled,) = conn.execute(
                "SELECT count(*) FROM pgqueue_task WHERE state = 'succeeded' "
                "AND finished_at <= %s",
                [last],
            ).fetchone()
            due = f"run_at < '{last.isoformat()}'"
            found = waits(conn, due) if fair else []
            after_commit = waits(conn, due, since="commit") if fair else []
            duplicates = count(conn, "attempt > 1 OR jsonb_array_length(errors) > 0")
    finally:
        worker.stop()
    span = (last - first).total_seconds()
    return {
        "p50": percentile(found, 50) if found else None,
        "p99": percentile(found, 99) if found else None,
        "commit_p50": percentile(after_commit, 50) if after_commit else None,
        "commit_p99": percentile(after_commit, 99) if after_commit else None,
        "others": len(found),
        "rate": settled / span,
        "seconds": span,
        "duplicates": duplicates,
    }


BATCH_CALLS = 10_000


def call_drain(kind: str, calls: int, api_ms: float) -> dict[str, Any]:
    """``calls`` calls enqueued before one worker starts: through the batch handler
    (``batch_call``, 100 a batch) or one call per task (``one_call``); from the first
    start to the last settlement."""
    from benchmarks.tenant_tasks import batch_call, one_call

    definition = batch_call if kind == "batch" else one_call
    reset_queue()
    for start in range(0, calls, 1000):
        definition.enqueue_many(range(start, min(calls, start + 1000)))
    with raw_connection() as conn:
        conn.execute("VACUUM ANALYZE pgqueue_task")
        worker = WorkerProcess(
            log_name=f"tenants-{kind}", env={**TENANTS_ENV, "PGQUEUE_BENCH_API_MS": str(api_ms)}
        )
        try:
            wait_for(lambda: count(conn, "state = 'succeeded'") >= calls, 600, 0.05)
            first, last = conn.execute(
                "SELECT min(started_at), max(finished_at) FROM pgqueue_task"
            ).fetchone()
        finally:
            worker.stop()
    seconds = (last - first).total_seconds()
    return {"rate": calls / seconds, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tenants", description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="runs (median)")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="fraction of the 200,000-task backlog"
    )
    parser.add_argument(
        "--trickle-seconds", type=float, default=20.0, help="the empty queue's trickle (s)"
    )
    parser.add_argument(
        "--only", default="fair,batch", help="comma-separated: fair (the fair share "
        "workload), batch (10,000 calls through a batch handler and a plain one)",
    )
    parser.add_argument(
        "--api-ms", type=float, default=5.0,
        help="the batch workload's remote API round trip per request (ms)",
    )
    parser.add_argument(
        "--probe-ms", type=float, default=0.0,
        help="the fair workload's handlers sleep this long (an I/O call; default 0: "
        "no-ops, whose drain takes every core of the machine)",
    )
    parser.add_argument("--json", type=str, default=None, help="write the results here")
    args = parser.parse_args(argv)

    os.environ["DATABASE_URL"] = prepare_database()
    setup_django(os.environ["DATABASE_URL"])
    if args.probe_ms:
        TENANTS_ENV["PGQUEUE_BENCH_PROBE_MS"] = str(args.probe_ms)  # the workers'
    os.environ.update(TENANTS_ENV)
    import benchmarks.tenant_tasks  # noqa: F401 - the enqueuer's registry

    backlog = int(BACKLOG * args.scale)
    rows = {
        "empty_p50": Row("empty_p50", f"{KEYS} keys x {PER_KEY_PER_SECOND}/s, empty queue, "
                         "due->start p50", "ms"),
        "empty_p99": Row("empty_p99", f"{KEYS} keys x {PER_KEY_PER_SECOND}/s, empty queue, "
                         "due->start p99", "ms"),
        "beside_p50": Row("beside_p50", f"the same beside a key's {backlog:,} due, p50", "ms"),
        "beside_p99": Row(
            "beside_p99", f"the same beside a key's {backlog:,} due, p99", "ms",
            ratio_to="empty_p99", target="<= 2x empty queue",
            check=lambda _, r: r is not None and r <= 2.0,
        ),
        "empty_commit_p99": Row("empty_commit_p99", "the same, empty queue, from the "
                                "enqueue's commit, p99", "ms"),
        "beside_commit_p99": Row(
            "beside_commit_p99", "the same beside the backlog, from the enqueue's commit, "
            "p99", "ms", ratio_to="empty_commit_p99",
        ),
        "w2a": Row("w2a", f"W2a drain {backlog:,}, 1 process", "tasks/s"),
        "fair_alone": Row(
            "fair_alone", f"drain of the key's {backlog:,} alone (no other keys)", "tasks/s",
            ratio_to="w2a",
        ),
        "fair_drain": Row(
            "fair_drain", f"drain of the {backlog:,} beside the {KEYS} keys", "tasks/s",
            ratio_to="w2a", target=">= 0.9x W2a", check=lambda _, r: r is not None and r >= 0.9,
        ),
        "plain_alone": Row(
            "plain_alone", "the backlog alone, plain task (no fair share)", "tasks/s",
            ratio_to="w2a",
        ),
        "plain_beside": Row(
            "plain_beside", "the same, plain task (no fair share), beside the same "
            "enqueues", "tasks/s", ratio_to="w2a",
        ),
    }  # fmt: skip
    calls = int(BATCH_CALLS * args.scale)
    rows |= {
        "plain_calls": Row("plain_calls", f"{calls:,} calls, one task each, {args.api_ms:g} ms "
                           "API", "calls/s"),
        "batch_calls": Row(
            "batch_calls", f"{calls:,} calls, a batch handler (100 a batch), {args.api_ms:g} "
            "ms API", "calls/s", ratio_to="plain_calls",
        ),
        "plain_noop": Row("plain_noop", f"{calls:,} calls, one task each, no API", "calls/s"),
        "batch_noop": Row("batch_noop", f"{calls:,} calls, a batch handler, no API", "calls/s",
                          ratio_to="plain_noop"),
    }  # fmt: skip
    only = set(args.only.split(","))
    details: list[dict[str, Any]] = []
    for run in range(args.runs):
        if "batch" in only:
            measured = {}
            for key, kind, api_ms in [("plain_calls", "plain", args.api_ms),
                                      ("batch_calls", "batch", args.api_ms),
                                      ("plain_noop", "plain", 0.0),
                                      ("batch_noop", "batch", 0.0)]:  # fmt: skip
                measured[key] = call_drain(kind, calls, api_ms)
                rows[key].samples.append(measured[key]["rate"])
            details.append({"batch": measured})
            print(f"run {run + 1}: {measured}")
        if "fair" not in only:
            continue
        empty = empty_queue(args.trickle_seconds)
        beside = beside_backlog(backlog)
        alone = beside_backlog(backlog, trickle_too=False)
        plain_alone = beside_backlog(backlog, trickle_too=False, fair=False)
        plain_beside = beside_backlog(backlog, fair=False)
        plain = drain(backlog, 1)
        details.append({"empty": empty, "beside": beside, "alone": alone,
                        "plain_alone": plain_alone, "plain_beside": plain_beside,
                        "w2a": plain})  # fmt: skip
        rows["plain_alone"].samples.append(plain_alone["rate"])
        rows["plain_beside"].samples.append(plain_beside["rate"])
        rows["empty_commit_p99"].samples.append(empty["commit_p99"])
        if beside["commit_p99"] is not None:
            rows["beside_commit_p99"].samples.append(beside["commit_p99"])
        rows["fair_alone"].samples.append(alone["rate"])
        rows["empty_p50"].samples.append(empty["p50"])
        rows["empty_p99"].samples.append(empty["p99"])
        if beside["p99"] is not None:
            rows["beside_p50"].samples.append(beside["p50"])
            rows["beside_p99"].samples.append(beside["p99"])
        rows["fair_drain"].samples.append(beside["rate"])
        rows["w2a"].samples.append(plain["rate"])
        print(f"run {run + 1}: empty {empty}, beside {beside}, alone {alone['rate']:,.0f}/s, "
              f"plain alone {plain_alone['rate']:,.0f}/s, "
              f"plain beside {plain_beside['rate']:,.0f}/s, W2a {plain['rate']:,.0f}/s")
    print()
    print_table(rows)
    write_results(
        "tenants",
        None if args.json is None else Path(args.json),
        {"rows": rows_json(rows), "runs": details},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
