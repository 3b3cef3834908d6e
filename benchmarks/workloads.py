"""The workloads of ``python -m benchmarks``, W1 to W10: each function measures one and
returns what it saw (docs/performance.md says what each measures).

runner.py runs them and reports; tenants.py and client_cpu.py reuse the drain and W1's
ways of enqueueing.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from benchmarks.harness import (
    WorkerProcess,
    cost_per_task,
    count,
    cpu_seconds,
    enqueue_backlog,
    percentile,
    raw_connection,
    reset_queue,
    run_clients,
    setup_django_child,
    wait_for,
    wait_idle_worker,
    write_position,
)

# W8: what else the table holds while a clean backlog drains (one shape at a time).
# Each is %(rows)s rows that no claim of the drain may take, in one INSERT.
SHAPES = {
    "scheduled": (
        "same queue, scheduled an hour ahead, higher priority",
        "INSERT INTO pgqueue_task (queue, task_name, priority, state, run_at) "
        "SELECT 'default', 'benchmarks.tasks.noop', 10, 'scheduled', now() + interval '1 hour' "
        "FROM generate_series(1, %(rows)s)",
    ),
    "unroutable": (
        "due, of a task no worker runs, enqueued 10 minutes ago",
        "INSERT INTO pgqueue_task (queue, task_name, priority, run_at, enqueued_at) "
        "SELECT 'default', 'benchmarks.tasks.not_deployed', 10, now() - interval '10 minutes', "
        "now() - interval '10 minutes' FROM generate_series(1, %(rows)s)",
    ),
    "other_queue": (
        "another queue, due",
        "INSERT INTO pgqueue_task (queue, task_name, priority) "
        "SELECT 'other', 'benchmarks.tasks.noop', 10 FROM generate_series(1, %(rows)s)",
    ),
    "terminal": (
        "succeeded and failed rows",
        "INSERT INTO pgqueue_task (queue, task_name, state, attempt, finished_at) "
        "SELECT 'default', 'benchmarks.tasks.noop', "
        "(ARRAY['succeeded', 'failed'])[1 + n %% 2], 1, now() FROM generate_series(1, %(rows)s) n",
    ),
    # As an enqueue with after= leaves them: each waits for its parent through an edge
    # (one parent for all, scheduled an hour ahead in a queue the drain does not serve).
    "waiting": (
        "waiting for a parent, same queue, higher priority",
        "WITH parent AS ("
        " INSERT INTO pgqueue_task (queue, task_name, state, run_at, has_dependents)"
        " VALUES ('other', 'benchmarks.tasks.noop', 'scheduled', now() + interval '1 hour', true)"
        " RETURNING id),"
        " children AS ("
        " INSERT INTO pgqueue_task"
        " (queue, task_name, priority, state, wait_reason, parents_pending)"
        " SELECT 'default', 'benchmarks.tasks.noop', 10, 'waiting', 'parents', 1"
        " FROM generate_series(1, %(rows)s) RETURNING id)"
        " INSERT INTO pgqueue_dependency (parent_id, child_id)"
        " SELECT parent.id, children.id FROM parent, children",
    ),
}


def fill(shape: str, rows: int) -> None:
    with raw_connection() as conn:
        conn.execute(SHAPES[shape][1], {"rows": rows})


# W1's ways of enqueueing one task, one transaction each: kind -> what it does.
W1_KINDS = {
    "enqueue": "noop.enqueue(i)",
    "on_commit": "with atomic(): noop.enqueue_on_commit(i)",
    "many_one": "noop.enqueue_many([i])",
    "using_priority": "noop.using(priority=5).enqueue(i)",
    "framework": "Django Tasks framework: framework_tasks.noop.enqueue(i)",
    "tx": "with atomic(): INSERT an order; noop.enqueue(i) (a view's transaction)",
    "encrypted": "sealed_noop.enqueue(i) (@task(encrypt=True))",
}
# W1-tx's order: one row in the view's transaction, beside the task.
ORDER_TABLE = "CREATE TABLE IF NOT EXISTS bench_order (id bigserial PRIMARY KEY, total int)"
ORDER_INSERT = "INSERT INTO bench_order (total) VALUES (%s)"


def enqueue_call(kind: str) -> Callable[[int], Any]:
    from django.db import transaction

    from benchmarks.tasks import noop

    if kind == "on_commit":

        def on_commit(i: int) -> None:
            with transaction.atomic():
                noop.enqueue_on_commit(i)

        return on_commit
    if kind == "tx":
        from django.db import connection

        def in_a_view(i: int) -> None:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(ORDER_INSERT, [i])
                noop.enqueue(i)

        return in_a_view
    if kind == "many_one":
        return lambda i: noop.enqueue_many([i])
    if kind == "using_priority":
        return lambda i: noop.using(priority=5).enqueue(i)
    if kind == "framework":
        from benchmarks.framework_tasks import noop as framework_noop

        return framework_noop.enqueue
    if kind == "encrypted":
        from benchmarks.tasks import sealed_noop

        return sealed_noop.enqueue
    return noop.enqueue


def _enqueue_client(n: int, offset: int, url: str, ready, go, results, kind: str) -> None:
    setup_django_child(url)
    call = enqueue_call(kind)
    call(-1)  # connect and warm up before the clock starts
    ready.put(1)
    go.wait()
    started = time.perf_counter()
    for i in range(offset, offset + n):
        call(i)
    results.put(time.perf_counter() - started)


def w1_single(total: int, clients: int, kind: str = "enqueue") -> dict[str, Any]:
    """``noop.enqueue(i)`` (or another of W1_KINDS), one transaction each, from
    ``clients`` processes."""
    reset_queue()
    if kind == "tx":
        with raw_connection() as conn:
            conn.execute(ORDER_TABLE)
    per = total // clients
    wall, times = run_clients(_enqueue_client, clients, per, kind)
    # The clients' warm-up calls enqueue -1; an encrypted one's args are sealed.
    warm_ups = clients if kind == "encrypted" else 0
    with raw_connection() as conn:
        written = count(conn, "args <> '[-1]'") - warm_ups
    assert written == per * clients, f"W1 {kind}: {written} rows for {per * clients} calls"
    return {
        "rate": per * clients / wall,
        "wall": wall,
        "slowest_client": max(times),
        "written": written,
    }


def w1_many(total: int, batch: int) -> dict[str, Any]:
    from benchmarks.tasks import noop

    reset_queue()
    noop.enqueue_many(range(10))  # warm-up
    started = time.perf_counter()
    for start in range(0, total, batch):
        noop.enqueue_many(range(start, start + batch))
    wall = time.perf_counter() - started
    return {"rate": total / wall, "wall": wall}


def drain(
    total: int,
    processes: int,
    backlog: int | None = None,
    execution: str = "thread",
    shape: tuple[str, int] | None = None,
    async_claims: bool = False,
    limits: bool = False,
    enqueue: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Pre-enqueue, start worker process(es), time until ``total`` tasks settled.

    ``execution`` is the workers' --execution: "process" runs every handler in the
    worker's prefork pool of child processes, so each task also crosses two pipes.
    ``shape``: (name, rows) of SHAPES, filled in before the backlog (W8).
    ``async_claims``: the workers run with PGQUEUE["ASYNC_CLAIMS"] (the opt-in).
    ``limits``: the queue has a concurrency and a rate limit that never bind (W2a-limits).
    ``enqueue``: writes the ``total`` tasks instead of a backlog of no-ops (W9's chord and
    chain).
    ``env``: more environment for the workers (benchmarks/settings.py reads it).

    The rate is measured on the database's clock: from the first claim (the earliest
    started_at) to the settlement of the ``total``-th task (its finished_at), so the
    Python start-up of the worker process is not counted; ``wall`` includes it.
    """
    reset_queue()
    if shape is not None:
        fill(*shape)
    with raw_connection() as conn:
        (floor,) = conn.execute("SELECT COALESCE(max(id), 0) FROM pgqueue_task").fetchone()
    if enqueue is None:
        enqueue_backlog(backlog or total)
    else:
        enqueue()
    # The backlog's rows only, by primary key range: counting a W8 shape's million rows
    # every 100 ms would cost the drain what it measures.
    done = f"id > {floor} AND state = 'succeeded'"
    with raw_connection() as conn:
        conn.execute("VACUUM ANALYZE pgqueue_task")
        # Flush what the fill and the enqueue wrote: a checkpoint triggered by a
        # million-row fill would otherwise land in the middle of the drain.
        conn.execute("CHECKPOINT")
        workers = [
            WorkerProcess(
                "--execution",
                execution,
                log_name=f"drain-{processes}p-{execution}-{i}",
                env={
                    **({"PGQUEUE_BENCH_ASYNC_CLAIMS": "1"} if async_claims else {}),
                    # PGQUEUE_BENCH_LIMITS_SPEC: other limits (JSON) to measure.
                    **(
                        {"PGQUEUE_BENCH_LIMITS": os.environ.get("PGQUEUE_BENCH_LIMITS_SPEC", "1")}
                        if limits
                        else {}
                    ),
                    **(env or {}),
                }
                or None,
            )
            for i in range(processes)
        ]
        spawned = time.monotonic()
        pids = [worker.proc.pid for worker in workers]
        # The cost is counted from the first claim (the workers' start-up is not a
        # task's) to the total-th settlement, as the rate is.
        # (No shape holds running rows: the check walks the small running index.)
        wait_for(lambda: count(conn, f"state = 'running' AND id > {floor}") > 0, 120, 0.002)
        cost_start = (*cpu_seconds(pids), *write_position(conn))
        wait_for(lambda: count(conn, done) >= total, 600, 0.05)
        cost_end = (*cpu_seconds(pids), *write_position(conn))
        wall = time.monotonic() - spawned
        for worker in workers:
            worker.stop()
        first, nth = conn.execute(
            f"SELECT (SELECT min(started_at) FROM pgqueue_task WHERE id > {floor}),"
            f" (SELECT finished_at FROM pgqueue_task WHERE {done}"
            "   ORDER BY finished_at OFFSET %s LIMIT 1)",
            [total - 1],
        ).fetchone()
        duplicates = count(
            conn, f"id > {floor} AND (attempt > 1 OR jsonb_array_length(errors) > 0)"
        )
        succeeded = count(conn, done)
    seconds = (nth - first).total_seconds()
    return {
        "rate": total / seconds,
        "seconds": seconds,
        "wall": wall,
        "succeeded": succeeded,
        "duplicates": duplicates,
        **cost_per_task(cost_start, cost_end, total),
    }


# W2a-atomic: what a handler with one insert costs, run plain and with atomic=True. The
# handlers keep their Django connection between tasks (CONN_MAX_AGE, as any deployment
# whose tasks use the database should): otherwise both drains would measure connecting.
ATOMIC_ENV = {"PGQUEUE_BENCH_CONN_MAX_AGE": "600"}


def enqueue_inserts(total: int, how: str) -> None:
    """``total`` tasks that each insert one row into bench_effect (emptied first):
    ``how`` "plain" (autocommit), "transaction" (in the handler's own atomic block) or
    "atomic" (atomic=True)."""
    from benchmarks.tasks import insert_row, insert_row_in_transaction

    with raw_connection() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_effect (id bigserial PRIMARY KEY, n int)")
        conn.execute("TRUNCATE bench_effect")
    call = {
        "plain": insert_row,
        "transaction": insert_row_in_transaction,
        "atomic": insert_row.using(atomic=True),
    }[how]
    for start in range(0, total, 1000):
        call.enqueue_many(range(start, min(total, start + 1000)))


def enqueue_chatty(total: int) -> None:
    """``total`` tasks that each log two INFO records (W2a-tasklogs)."""
    from benchmarks.tasks import chatty

    for start in range(0, total, 1000):
        chatty.enqueue_many(range(start, min(total, start + 1000)))


def task_log_rows() -> int:
    with raw_connection() as conn:
        return conn.execute("SELECT count(*) FROM pgqueue_task_log").fetchone()[0]


def inserted_rows() -> int:
    with raw_connection() as conn:
        return conn.execute("SELECT count(*) FROM bench_effect").fetchone()[0]


def w8_claim_latency(terminal_rows: int, samples: int = 500) -> dict[str, Any]:
    """The claim statement alone (limit 10, as a worker runs it), timed on a worker
    connection, with ``terminal_rows`` finished rows in the table."""
    from django_pgqueue.db.sql import QUERIES
    from django_pgqueue.tasking.registry import registry
    from django_pgqueue.worker.claimer import route_params
    from django_pgqueue.worker.connection import connect

    reset_queue()
    for start in range(0, terminal_rows, 1_000_000):
        fill("terminal", min(1_000_000, terminal_rows - start))
    enqueue_backlog(samples * 10 + 1000)
    with raw_connection() as conn:
        conn.execute("VACUUM ANALYZE pgqueue_task")
    routes = [(d.name, d.version) for d in registry.all()]
    params = {
        **route_params(["default"], routes, 60.0),
        "limit": 10,
        "lease_seconds": 30.0,
        "worker_id": "benchmark",
    }
    times = []
    conn = connect("default")
    try:
        for i in range(samples + 20):
            params["token"] = str(uuid.uuid4())
            started = time.perf_counter()
            claimed = conn.execute(QUERIES["claim"], params).fetchall()
            elapsed = (time.perf_counter() - started) * 1000
            if i >= 20:  # the first executions prepare the statement
                times.append(elapsed)
            assert len(claimed) == 10, "the backlog ran out"
    finally:
        conn.close()
    return {
        "p50_ms": percentile(times, 50),
        "p99_ms": percentile(times, 99),
        "terminal_rows": terminal_rows,
    }


# W2a-keys: 10,000 distinct keys, each row one of them (n %% keys: two rows per key in a
# 20,000 backlog, far apart), written by one INSERT like enqueue_many's.
KEYED_TASKS = {
    "rate": "benchmarks.key_tasks.keyed_rate",
    "concurrency": "benchmarks.key_tasks.keyed_concurrency",
}


def enqueue_keyed(kind: str, total: int, keys: int = 10_000) -> None:
    with raw_connection() as conn:
        conn.execute(
            "INSERT INTO pgqueue_task (queue, task_name, args, concurrency_key) "
            "SELECT 'default', %(name)s, jsonb_build_array(n), 'key:' || (n %% %(keys)s) "
            "FROM generate_series(0, %(total)s - 1) AS n",
            {"name": KEYED_TASKS[kind], "keys": keys, "total": total},
        )


def key_claim_latency(keys: int = 10_000, samples: int = 500) -> dict[str, Any]:
    """The claim alone (limit 10, on a worker connection) with a backlog over ``keys``
    keys and their rate state in pgqueue_key_rate: the plain claim of unkeyed rows; the
    limited claim of the same rows (a queue concurrency limit that never binds: a
    transaction of the queue's lock and the claim); and the limited claim of keyed rows
    with a per-key rate that never binds; p50 and p99. Then a busy key: ``keys`` rows of one key
    out of budget ahead of other keys' rows, and the claims it takes to reach them
    (each claim, and the setting aside that follows it, in its transaction)."""
    from django_pgqueue.core.limits import QueueLimit, parse_rate
    from django_pgqueue.db.sql import QUERIES
    from django_pgqueue.worker.claimer import LOCK_WAIT_MS, SNOOZE_BATCH, route_params
    from django_pgqueue.worker.connection import connect

    rated = (KEYED_TASKS["rate"], 1)
    noop = ("benchmarks.tasks.noop", 1)
    rate = parse_rate("100/s")
    reset_queue()
    enqueue_backlog(samples * 20 + 1000)
    enqueue_keyed("rate", samples * 10 + 1000, keys)
    with raw_connection() as conn:
        # every key has run before (its state is in the table), its budget whole again
        conn.execute(
            "INSERT INTO pgqueue_key_rate (queue, key, tat) SELECT 'default', 'key:' || n, "
            "now() - interval '1 second' FROM generate_series(0, %s - 1) AS n",
            [keys],
        )
        conn.execute("VACUUM ANALYZE pgqueue_task")
        conn.execute("VACUUM ANALYZE pgqueue_key_rate")

    def params(routes: list[tuple[str, int]], limits: Any = None) -> dict[str, Any]:
        return {
            **route_params(["default"], routes, 60.0, limits, key_rates={rated: rate}),
            "limit": 10,
            "lease_seconds": 30.0,
            "worker_id": "benchmark",
        }

    def limited_claim(conn: Any, p: dict[str, Any], snooze: bool = False) -> tuple[int, int]:
        conn.execute("BEGIN")
        conn.execute(
            QUERIES["lock_limited_queues"], {"queues": ["default"], "lock_timeout": LOCK_WAIT_MS}
        )
        claimed = len(conn.execute(QUERIES["claim"], p).fetchall())
        snoozed = 0
        if snooze and claimed < p["limit"]:
            (snoozed,) = conn.execute(
                QUERIES["snooze_throttled_keys"], {**p, "limit": SNOOZE_BATCH}
            ).fetchone()
        conn.execute("COMMIT")
        return claimed, snoozed

    plain, keyed = params([noop]), params([rated])
    limited = params([noop], {"default": QueueLimit("default", concurrency=100_000)})
    times: dict[str, list[float]] = {"plain": [], "limited": [], "keyed": []}
    conn = connect("default")
    try:
        for i in range(samples + 20):
            for kind in ("plain", "limited", "keyed"):
                p = {"plain": plain, "limited": limited, "keyed": keyed}[kind]
                p["token"] = str(uuid.uuid4())
                started = time.perf_counter()
                if kind == "plain":
                    claimed = len(conn.execute(QUERIES["claim"], p).fetchall())
                else:
                    claimed, _ = limited_claim(conn, p)
                elapsed = (time.perf_counter() - started) * 1000
                if i >= 20:  # the first executions prepare the statement
                    times[kind].append(elapsed)
                assert claimed == 10, (kind, claimed)
                # Settled (untimed), so that each claim counts as many running rows.
                conn.execute(
                    "UPDATE pgqueue_task SET state = 'succeeded', finished_at = now(), "
                    "lease_token = NULL, lease_expires_at = NULL WHERE lease_token = %s",
                    [p["token"]],
                )
        (state_rows,) = conn.execute("SELECT count(*) FROM pgqueue_key_rate").fetchone()
        # A busy key: its budget spent, `keys` of its rows ahead of 100 of other keys.
        conn.execute("TRUNCATE pgqueue_task")
        conn.execute(
            "INSERT INTO pgqueue_task (queue, task_name, args, concurrency_key, priority) "
            "SELECT 'default', %(name)s, '[0]', 'busy', 1 FROM generate_series(1, %(n)s)",
            {"name": KEYED_TASKS["rate"], "n": keys},
        )
        enqueue_keyed("rate", 100, 100)
        conn.execute(
            "INSERT INTO pgqueue_key_rate (queue, key, tat) VALUES ('default', 'busy', "
            "now() + interval '1 hour') ON CONFLICT (queue, key) DO UPDATE SET tat = "
            "EXCLUDED.tat"
        )
        conn.execute("VACUUM ANALYZE pgqueue_task")
        rounds, claimed_total, busy_times = 0, 0, []
        started_all = time.perf_counter()
        while claimed_total == 0:
            keyed["token"] = str(uuid.uuid4())
            started = time.perf_counter()
            claimed, snoozed = limited_claim(conn, keyed, snooze=True)
            busy_times.append((time.perf_counter() - started) * 1000)
            rounds += 1
            claimed_total += claimed
            assert claimed or snoozed, "a claim neither took nor set aside anything"
        busy_ms = (time.perf_counter() - started_all) * 1000
        keyed["token"] = str(uuid.uuid4())
        started = time.perf_counter()
        claimed, snoozed = limited_claim(conn, keyed, snooze=True)
        after_ms = (time.perf_counter() - started) * 1000
    finally:
        conn.close()
    return {
        "plain_p50_ms": percentile(times["plain"], 50),
        "plain_p99_ms": percentile(times["plain"], 99),
        "limited_p50_ms": percentile(times["limited"], 50),
        "limited_p99_ms": percentile(times["limited"], 99),
        "keyed_p50_ms": percentile(times["keyed"], 50),
        "keyed_p99_ms": percentile(times["keyed"], 99),
        "keys": keys,
        "key_state_rows": state_rows,
        "busy_key_rows": keys,
        "busy_rounds": rounds,
        "busy_ms": busy_ms,
        "busy_round_p50_ms": percentile(busy_times, 50),
        "busy_round_max_ms": max(busy_times),
        "claim_after_busy_ms": after_ms,
    }


def w9_fan_in(members: int) -> dict[str, Any]:
    """A chord drained by one worker process: ``members`` no-op tasks enqueued with
    ``group()`` (one enqueue_many), and a callback enqueued ``after=`` all of them, in one
    transaction; the callback counts its parents' results (``context.parent_results()``).
    Timed as a drain, from the first claim to the callback's settlement; the rate is
    ``members`` over that time, to compare with a plain drain of as many no-ops."""
    from django.db import transaction

    from benchmarks.tasks import fan_in, noop
    from django_pgqueue.tasking.workflows import group

    enqueued: dict[str, Any] = {}

    def enqueue() -> None:
        started = time.perf_counter()
        with transaction.atomic():
            ids = group(noop.step(i) for i in range(members))
            grouped = time.perf_counter()
            enqueued["callback"] = fan_in.using(after=ids).enqueue(members)
            enqueued["group_s"] = grouped - started
            enqueued["callback_s"] = time.perf_counter() - grouped

    d = drain(members + 1, 1, enqueue=enqueue)
    with raw_connection() as conn:
        first, last_member, cb_started, cb_finished, cb_state, cb_result = conn.execute(
            "SELECT (SELECT min(started_at) FROM pgqueue_task),"
            " (SELECT max(finished_at) FROM pgqueue_task WHERE id <> %(cb)s),"
            " started_at, finished_at, state, result FROM pgqueue_task WHERE id = %(cb)s",
            {"cb": enqueued["callback"]},
        ).fetchone()
    seconds = (cb_finished - first).total_seconds()
    return {
        **d,
        "rate": members / seconds,
        "seconds": seconds,
        "members_seconds": (last_member - first).total_seconds(),
        "callback_start_lag_ms": (cb_started - last_member).total_seconds() * 1000,
        "callback_run_ms": (cb_finished - cb_started).total_seconds() * 1000,
        "callback_state": cb_state,
        "callback_saw_succeeded": cb_result,
        "enqueue_group_s": enqueued["group_s"],
        "enqueue_callback_s": enqueued["callback_s"],
    }


def w9_chain(steps: int) -> dict[str, Any]:
    """A chain of ``steps`` no-ops (``chain()``, in one transaction), drained by one
    worker process: from the head's claim to the last step's settlement. Each step
    starts only after the one before settled, so this is per-step latency: the
    settlement, the trigger that makes the next step pending, its wake-up and claim."""
    from django.db import transaction

    from benchmarks.tasks import noop
    from django_pgqueue.tasking.workflows import chain

    enqueued: dict[str, Any] = {}

    def enqueue() -> None:
        started = time.perf_counter()
        with transaction.atomic():
            enqueued["ids"] = chain(*(noop.step(i) for i in range(steps)))
        enqueued["seconds"] = time.perf_counter() - started

    d = drain(steps, 1, enqueue=enqueue)
    with raw_connection() as conn:
        spans = conn.execute(
            "SELECT started_at, finished_at FROM pgqueue_task WHERE id = ANY (%s) ORDER BY id",
            [enqueued["ids"]],
        ).fetchall()
    # From a step's settlement to the next step's claim: what the chain adds per step.
    handovers = [
        (nxt[0] - prev[1]).total_seconds() * 1000 for prev, nxt in itertools.pairwise(spans)
    ]
    return {
        **d,
        "per_step_ms": d["seconds"] * 1000 / steps,
        "handover_p50_ms": percentile(handovers, 50),
        "handover_p99_ms": percentile(handovers, 99),
        "enqueue_s": enqueued["seconds"],
    }


def _claimer_statements(worker: WorkerProcess) -> int:
    """Claim, stage and next-due statements the worker ran (from the counters it logs at
    DEBUG as it stops)."""
    line = worker.log_path.read_text().rsplit("counters: ", 1)[1].splitlines()[0]
    stats = dict(item.split("=") for item in line.split() if "=" in item)
    return sum(
        int(stats.get(k, 0))
        for k in ("claim_statements", "stage_statements", "next_due_statements")
    )


def w3_idle_others(n: int, idle_workers: int = 10) -> dict[str, Any]:
    """Database statements the claimers of ``idle_workers`` idle workers of other queues
    run per enqueue into "default" (one transaction each), net of what the same workers
    run in the same time without those enqueues."""
    from benchmarks.tasks import noop

    def phase(enqueue: bool) -> int:
        reset_queue()
        workers = [
            WorkerProcess(
                "--queues",
                f"idle-{i}",
                "--log-level",
                "DEBUG",
                "--poll-interval",
                "30",
                log_name=f"idle-{i}-{enqueue}",
            )
            for i in range(idle_workers)
        ]
        with raw_connection() as conn:
            wait_for(
                lambda: (
                    conn.execute("SELECT count(*) FROM pgqueue_worker").fetchone()[0]
                    == idle_workers
                ),
                60,
            )
        time.sleep(1.0)
        started = time.monotonic()
        if enqueue:
            for i in range(n):
                noop.enqueue(i)
        time.sleep(max(0.0, 3.0 - (time.monotonic() - started)))
        for worker in workers:
            worker.stop()
        return sum(_claimer_statements(w) for w in workers)

    quiet = phase(False)
    busy = phase(True)
    return {"per_enqueue": max(0, busy - quiet) / n, "quiet": quiet, "busy": busy}


def w3_latency(n: int, gap: float) -> dict[str, Any]:
    """From just before ``enqueue()`` to the handler's first line; also from the moment
    ``enqueue()`` returned (the task committed), to separate the enqueuing
    transaction's own cost from the queue's reaction."""
    from benchmarks.tasks import probe
    from django_pgqueue.models import Task

    reset_queue()
    worker = WorkerProcess(log_name="latency")
    sent: dict[int, tuple[float, float]] = {}
    try:
        with raw_connection() as conn:
            wait_idle_worker(conn)
            # Until the worker runs a task: it is started, listening and idle (as the
            # peer's measurement waits for its worker's first job). A worker that has
            # registered may still be starting its threads on a loaded machine.
            probe.enqueue(-1)
            wait_for(lambda: count(conn, "state = 'succeeded'") >= 1, 60)
            time.sleep(0.5)
            for i in range(n):
                before = time.time()
                task_id = probe.enqueue(i)
                sent[task_id] = (before, time.time())
                time.sleep(gap)
            wait_for(lambda: count(conn, "state = 'succeeded'") >= n + 1, 60)
    finally:  # a failed step must not leave the worker draining the next workload
        worker.stop()
    started = dict(Task.objects.filter(pk__in=sent).values_list("pk", "result"))
    lat = [(started[pk] - t0) * 1000 for pk, (t0, _) in sent.items()]
    after_commit = [(started[pk] - t1) * 1000 for pk, (_, t1) in sent.items()]
    enqueue_call = [(t1 - t0) * 1000 for t0, t1 in sent.values()]
    return {
        "p50_ms": percentile(lat, 50),
        "p95_ms": percentile(lat, 95),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat),
        "from_commit_p50_ms": percentile(after_commit, 50),
        "from_commit_p99_ms": percentile(after_commit, 99),
        "enqueue_call_p50_ms": percentile(enqueue_call, 50),
        # In enqueue order: whether the slow ones come together (a stall) or spread.
        "latencies_ms": [round(v, 3) for v in lat],
    }


def w10_async(n: int, seconds: float) -> dict[str, Any]:
    """``n`` async handlers that each await ``seconds``, on one worker process with as
    many async slots: from the enqueue to the last settlement."""
    import benchmarks.async_tasks  # noqa: F401 - registers sleep_async here too

    reset_queue()
    worker = WorkerProcess(
        "--async-concurrency",
        str(n),
        log_name="async",
        env={"PGQUEUE_BENCH_ASYNC_TASKS": "1"},
    )
    with raw_connection() as conn:
        wait_idle_worker(conn)
        from benchmarks.async_tasks import sleep_async

        sleep_async.enqueue_many([seconds] * n)
        wait_for(lambda: count(conn, "state = 'succeeded'") >= n, 120, 0.02)
        enqueued, first, last = conn.execute(
            "SELECT min(enqueued_at), min(started_at), max(finished_at) FROM pgqueue_task"
        ).fetchone()
        failed = count(conn, "state <> 'succeeded'")
    worker.stop()
    return {
        "seconds": (last - enqueued).total_seconds(),
        "first_start_s": (first - enqueued).total_seconds(),
        "not_succeeded": failed,
    }


def w5_scheduled(n: int, ahead: float, gap: float) -> dict[str, Any]:
    from django.utils import timezone

    from benchmarks.tasks import probe
    from django_pgqueue.models import Task

    reset_queue()
    worker = WorkerProcess(log_name="scheduled")
    due: dict[int, float] = {}
    with raw_connection() as conn:
        wait_idle_worker(conn)
        for i in range(n):
            run_at = timezone.now() + timedelta(seconds=ahead)
            due[probe.using(run_at=run_at).enqueue(i)] = run_at.timestamp()
            time.sleep(gap)
        wait_for(lambda: count(conn, "state = 'succeeded'") >= n, 60)
    worker.stop()
    started = dict(Task.objects.filter(pk__in=due).values_list("pk", "result"))
    late = [(started[pk] - at) * 1000 for pk, at in due.items()]
    return {
        "p50_ms": percentile(late, 50),
        "p99_ms": percentile(late, 99),
        "min_ms": min(late),
        "max_ms": max(late),
    }


def w6_recovery(tasks: int, lease: float | None) -> dict[str, Any]:
    from benchmarks.tasks import hold

    reset_queue()
    lease_args = ["--lease", str(lease), "--heartbeat", str(lease / 3)] if lease else []
    doomed = WorkerProcess("--concurrency", str(tasks), *lease_args, log_name="recovery-a")
    hold.enqueue_many([(600,)] * tasks)
    with raw_connection() as conn:
        wait_for(lambda: count(conn, "state = 'running'") == tasks, 60)
        survivor = WorkerProcess(*lease_args, log_name="recovery-b")
        wait_for(lambda: conn.execute("SELECT count(*) FROM pgqueue_worker").fetchone()[0] == 2, 30)
        time.sleep(0.5)
        doomed.stop(signal.SIGKILL)
        killed_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        wait_for(lambda: count(conn, "state = 'running' AND attempt = 2") == tasks, 120, 0.1)
        last = conn.execute(
            "SELECT max(last_attempted_at) FROM pgqueue_task WHERE attempt = 2"
        ).fetchone()[0]
    survivor.stop(signal.SIGKILL)
    reset_queue()
    return {"seconds": (last - killed_at).total_seconds(), "lease": lease or 30.0}


def w7_soak(total: int) -> dict[str, Any]:
    reset_queue()
    enqueue_backlog(total)
    workers = [WorkerProcess(log_name=f"soak-{i}") for i in range(2)]
    rss: list[dict[str, float]] = []
    began = time.monotonic()
    with raw_connection() as conn:
        while True:
            remaining = count(conn, "state IN ('pending', 'running')")
            rss.append(
                {
                    "t": round(time.monotonic() - began, 1),
                    "done": total - remaining,
                    "rss_mb": [round(w.rss_mb(), 1) for w in workers],
                }
            )
            if remaining == 0:
                break
            time.sleep(2)
        for worker in workers:
            worker.stop()
        tenth = total // 10

        def at(offset: int) -> datetime:
            return conn.execute(
                "SELECT finished_at FROM pgqueue_task WHERE state = 'succeeded'"
                " ORDER BY finished_at OFFSET %s LIMIT 1",
                [offset],
            ).fetchone()[0]

        start = conn.execute("SELECT min(started_at) FROM pgqueue_task").fetchone()[0]
        first = tenth / (at(tenth - 1) - start).total_seconds()
        last = tenth / (at(total - 1) - at(total - tenth - 1)).total_seconds()
        sizes = conn.execute(
            "SELECT pg_relation_size('pgqueue_task'), pg_indexes_size('pgqueue_task'),"
            " pg_total_relation_size('pgqueue_task')"
        ).fetchone()
        duplicates = count(conn, "attempt > 1 OR jsonb_array_length(errors) > 0")
        succeeded = count(conn, "state = 'succeeded'")
    early = [max(s["rss_mb"]) for s in rss if s["done"] >= tenth][:1] or [0.0]
    late = [max(s["rss_mb"]) for s in rss if s["done"] >= total // 2] or [0.0]
    return {
        "first_10pct_rate": first,
        "last_10pct_rate": last,
        "last_over_first": last / first,
        "table_mb": sizes[0] / 2**20,
        "indexes_mb": sizes[1] / 2**20,
        "total_mb": sizes[2] / 2**20,
        "rss_at_10pct_mb": early[0],
        "rss_max_second_half_mb": max(late),
        "rss_growth": max(late) / early[0] if early[0] else None,
        "succeeded": succeeded,
        "duplicates": duplicates,
        "seconds": rss[-1]["t"],
        "rss_series": rss,
    }
