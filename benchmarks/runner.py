"""The benchmark: workloads W1-W10 against pgbench baselines on the same server.

Every figure is reported as the median of several runs with its spread, and as a ratio
to a pgbench baseline measured in the same invocation (one INSERT, one UPDATE by primary
key and one DELETE per transaction, 4 clients; and one INSERT per transaction, 1
client, for the single enqueue), so results survive a noisy machine. Every drain also
reports the machine CPU it cost per task (the worker's processes and PostgreSQL's, from
/proc) and the write transactions and WAL per task.
See docs/performance.md for what each workload measures and how to read the table.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    BENCH_DB,
    Row,
    WorkerProcess,
    cost_per_task,
    count,
    cpu_seconds,
    enqueue_backlog,
    percentile,
    prepare_database,
    print_table,
    psycopg_connect,
    ratio,
    raw_connection,
    reset_queue,
    rows_json,
    server_info,
    setup_django,
    setup_django_child,
    wait_for,
    wait_idle_worker,
    write_position,
    write_results,
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


# -- pgbench baseline ------------------------------------------------------------------
BASELINE_SCRIPT = """\\set k random(1, 1000000000)
INSERT INTO bench_baseline (k, v) VALUES (:k, 1) ON CONFLICT DO NOTHING;
UPDATE bench_baseline SET v = v + 1 WHERE k = :k;
DELETE FROM bench_baseline WHERE k = :k;
"""


def pgbench_binary() -> str:
    found = shutil.which("pgbench")
    if found:
        return found
    import pgserver

    bundled = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pgbench"
    if bundled.exists():
        return str(bundled)
    raise RuntimeError("pgbench not found: install PostgreSQL's client tools")


def pgbench_env() -> dict[str, str]:
    from django.db import connections

    s = connections["default"].settings_dict
    env = dict(os.environ)
    env["PGHOST"] = s.get("OPTIONS", {}).get("host") or s.get("HOST") or "127.0.0.1"
    env["PGPORT"] = str(s.get("PORT") or 5432)
    env["PGUSER"] = s.get("USER") or "postgres"
    env["PGDATABASE"] = s["NAME"]
    if s.get("PASSWORD"):
        env["PGPASSWORD"] = s["PASSWORD"]
    return env


# The single enqueue's yardstick: one INSERT of a generated key per transaction.
INSERT_SCRIPT = "INSERT INTO bench_insert (v) VALUES (1);\n"


def pgbench_baseline(seconds: float) -> float:
    with raw_connection() as conn:
        conn.execute("DROP TABLE IF EXISTS bench_baseline")
        conn.execute("CREATE TABLE bench_baseline (k bigint PRIMARY KEY, v int)")
    return _pgbench(BASELINE_SCRIPT, 4, seconds)


def pgbench_insert(seconds: float, clients: int = 1) -> float:
    with raw_connection() as conn:
        conn.execute("DROP TABLE IF EXISTS bench_insert")
        conn.execute("CREATE TABLE bench_insert (k bigserial PRIMARY KEY, v int)")
    return _pgbench(INSERT_SCRIPT, clients, seconds)


def _pgbench(text: str, clients: int, seconds: float) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(text)
    jobs = str(clients)
    out = subprocess.run(
        [
            pgbench_binary(),
            "-n",
            "-f",
            script.name,
            "-c",
            jobs,
            "-j",
            jobs,
            "-T",
            str(int(seconds)),
        ],
        env=pgbench_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(script.name)
    return float(re.search(r"tps = ([\d.]+)", out).group(1))


# -- workloads -------------------------------------------------------------------------
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


def _enqueue_call(kind: str) -> Callable[[int], Any]:
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
    call = _enqueue_call(kind)
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
    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    per = total // clients
    procs = [
        ctx.Process(
            target=_enqueue_client,
            args=(per, i * per, os.environ["DATABASE_URL"], ready, go, results, kind),
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
    from django_pgqueue.worker.claimer import SNOOZE_BATCH, route_params
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
        conn.execute(QUERIES["lock_limited_queues"], {"queues": ["default"]})
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


# -- the run ---------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
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
    args = parser.parse_args(argv)
    only = set((args.only or "W1,W2,W3,W4,W5,W6,W7,W8").upper().split(","))
    runs = 1 if args.quick else args.runs
    scale = args.scale or (0.25 if args.quick else 1.0)
    soak = 100_000 if args.quick else args.soak_tasks
    n = int(20_000 * scale)
    shape_rows = int(args.shape_rows * scale)
    terminal_rows = int(args.terminal_rows * (0.1 if args.quick else 1))
    members = int(10_000 * scale)
    steps = int(1_000 * scale)

    peer = celery = None
    if args.peer == "pgqueuer":
        from benchmarks import peer_pgqueuer as peer

        peer_version = peer.available()
    if args.peer == "celery":
        from benchmarks import peer_celery as celery

        celery_version = celery.available()
    url = prepare_database()
    if args.async_commit:
        with psycopg_connect(url) as conn:
            conn.execute(f"ALTER DATABASE {BENCH_DB} SET synchronous_commit = off")
    setup_django(url)
    info = server_info()
    if peer is not None:
        peer.install()
        info["pgqueuer"] = peer_version
    brokers: list[str] = []
    if celery is not None:
        brokers = celery.install()
        info["celery"] = celery_version
    print(
        f"django_pgqueue benchmark, {datetime.now():%Y-%m-%d %H:%M}, PostgreSQL "
        f"{info['postgresql']}, {os.cpu_count()} CPUs, {runs} run(s)",
        flush=True,
    )

    rows = {
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
    if celery is not None:
        rows.update(celery.rows(brokers, n))
    raw: dict[str, list[Any]] = {key: [] for key in rows}
    lease = 5.0 if args.quick else None

    def record(key: str, value: float, detail: Any) -> None:
        rows[key].samples.append(value)
        raw[key].append(detail)
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

    from django.conf import settings as django_settings

    def side_by_side(
        run: int, ours: Callable[[], None], theirs: Callable[[], None] | None
    ) -> None:
        """Ours and the peer's measurement of one workload, in an order that alternates
        from run to run (so neither always runs first); ours alone without a peer."""
        steps = [ours] if theirs is None else ([ours, theirs] if run % 2 == 0 else [theirs, ours])
        for step in steps:
            step()

    def w1_ours(clients: int, key: str) -> None:
        d = w1_single(n if clients > 1 else n // 4, clients)
        record(key, d["rate"], d)

    def w1_peer(clients: int, key: str) -> None:
        d = peer.enqueue_single(n if clients > 1 else n // 4, clients)
        record(key, d["rate"], d)

    def w2a_ours() -> None:
        d = drain(n, 1)
        record("w2a", d["rate"], d)
        record("w2a_cpu", d["cpu_ms_per_task"], {})
        record("w2a_wtx", d["write_txns_per_task"], {})

    def w2a_peer() -> None:
        d = peer.drain(n)
        record("w2a_peer", d["rate"], d)
        record("w2a_peer_cpu", d["cpu_ms_per_task"], {})

    def w3_ours() -> None:
        d = w3_latency(200, 0.05)
        record("w3_p50", d["p50_ms"], d)
        record("w3_p95", d["p95_ms"], {})
        record("w3_p99", d["p99_ms"], {})
        record("w3_commit_p50", d["from_commit_p50_ms"], {})
        record("w3_commit_p99", d["from_commit_p99_ms"], {})
        record("w3_enqueue_p50", d["enqueue_call_p50_ms"], {})

    def w1_tx_ours() -> None:
        d = w1_single(n // 4, 1, "tx")
        record("w1_tx", d["rate"], d)

    def w1_celery() -> None:
        for broker in brokers:
            d = celery.enqueue_single(n // 4, broker)
            record(f"w1_celery_{broker}", d["rate"], d)

    def w1_tx_celery() -> None:
        for broker in brokers:
            d = celery.enqueue_single(n // 4, broker, tx=True)
            record(f"w1_tx_celery_{broker}", d["rate"], d)

    def w2a_celery() -> None:
        for broker in brokers:
            for config in celery.CONFIGS:
                d = celery.drain(n, broker, config)
                record(f"w2a_celery_{broker}_{config}", d["rate"], d)
                record(f"w2a_celery_{broker}_{config}_cpu", d["cpu_ms_per_task"], {})

    def w3_celery() -> None:
        for broker in brokers:
            for pool in celery.POOLS:
                d = celery.latency(200, 0.05, broker, pool)
                record(f"w3_celery_{broker}_{pool}_p50", d["p50_ms"], d)
                record(f"w3_celery_{broker}_{pool}_p99", d["p99_ms"], {})

    def theirs(pgqueuer_step: Callable[[], None], celery_step: Callable[[], None]) -> Any:
        """The peer's measurement of a workload, if a peer is measured."""
        return pgqueuer_step if peer is not None else celery_step if celery is not None else None

    def w3_peer() -> None:
        d = peer.latency(200, 0.05)
        record("w3_peer_p50", d["p50_ms"], d)
        record("w3_peer_p95", d["p95_ms"], {})
        record("w3_peer_p99", d["p99_ms"], {})
        record("w3_peer_commit_p50", d["from_commit_p50_ms"], {})
        record("w3_peer_enqueue_p50", d["enqueue_call_p50_ms"], {})

    for run in range(runs):
        print(f"run {run + 1}/{runs}", flush=True)
        base = pgbench_baseline(args.baseline_seconds)
        record("baseline", base, base)
        if "W1" in only:
            base = pgbench_insert(args.baseline_seconds)
            record("baseline_insert", base, base)
            base = pgbench_insert(args.baseline_seconds, clients=4)
            record("baseline_insert_4c", base, base)
            side_by_side(
                run,
                lambda: w1_ours(1, "w1_single_1c"),
                theirs(lambda: w1_peer(1, "w1_peer_1c"), w1_celery),
            )
            side_by_side(
                run,
                lambda: w1_ours(4, "w1_single"),
                theirs(lambda: w1_peer(4, "w1_peer_4c"), None),
            )
            side_by_side(run, w1_tx_ours, theirs(None, w1_tx_celery))
            for kind in W1_KINDS:
                if kind == "framework" and not hasattr(django_settings, "TASKS"):
                    print("  (W1 framework: no Tasks framework installed, skipped)")
                elif kind not in ("enqueue", "tx"):
                    d = w1_single(n // 4, 1, kind)
                    record(f"w1_{kind}", d["rate"], d)
            d = w1_many(n, 1000)
            record("w1_many", d["rate"], d)
        if only & {"W2", "W2A", "W4", "W8"}:
            side_by_side(run, w2a_ours, theirs(w2a_peer, w2a_celery))
        if "W2A-LIMITS" in only:
            d = drain(n, 1, limits=True)
            record("w2a_limits", d["rate"], d)
        if "W2A-KEYS" in only:
            for kind in ("concurrency", "rate"):
                d = drain(
                    n,
                    1,
                    enqueue=lambda kind=kind: enqueue_keyed(kind, n),
                    env={"PGQUEUE_BENCH_KEYS": "1"},
                )
                record(f"w2a_keys_{kind}", d["rate"], d)
            d = key_claim_latency()
            record("claim_plain_p50", d["plain_p50_ms"], d)
            record("claim_plain_p99", d["plain_p99_ms"], {})
            record("claim_limited_p50", d["limited_p50_ms"], {})
            record("claim_limited_p99", d["limited_p99_ms"], {})
            record("claim_keys_p50", d["keyed_p50_ms"], {})
            record("claim_keys_p99", d["keyed_p99_ms"], {})
            record("claim_busy_key_rounds", d["busy_rounds"], {})
            record("claim_busy_key_round_p50", d["busy_round_p50_ms"], {})
            record("claim_busy_key_round_max", d["busy_round_max_ms"], {})
        if "W2A-ASYNC" in only:
            d = drain(n, 1, async_claims=True)
            record("w2a_async", d["rate"], d)
        if "W2A-ATOMIC" in only:
            rates = {}
            for how, key in (("plain", "w2a_insert"), ("transaction", "w2a_insert_txn"),
                             ("atomic", "w2a_atomic")):  # fmt: skip
                d = drain(n, 1, enqueue=lambda how=how: enqueue_inserts(n, how), env=ATOMIC_ENV)
                d["rows"] = inserted_rows()
                assert d["rows"] == n, f"W2a-atomic ({how}): {d['rows']} rows for {n} tasks"
                rates[how] = d["rate"]
                record(key, d["rate"], d)
            record("w2a_atomic_ratio", rates["atomic"] / rates["plain"], {})
        if "W2A-TASKLOGS" in only:
            rates = {}
            for level, key in ((None, "w2a_chatty"), ("INFO", "w2a_tasklogs")):
                env = {"PGQUEUE_BENCH_TASK_LOGS": level} if level else {}
                d = drain(n, 1, enqueue=lambda: enqueue_chatty(n), env=env)
                d["task_log_rows"] = task_log_rows()
                expected = n if level else 0
                assert d["task_log_rows"] == expected, f"W2a-tasklogs: {d['task_log_rows']} rows"
                rates[key] = d["rate"]
                record(key, d["rate"], d)
            record("w2a_tasklogs_ratio", rates["w2a_tasklogs"] / rates["w2a_chatty"], {})
        if "W2A-MIDDLEWARE" in only:
            d = drain(n, 1, env={"PGQUEUE_BENCH_MIDDLEWARE": "1"})
            record("w2a_middleware", d["rate"], d)
        if "W2A-ENCRYPT" in only:
            d = drain(n, 1, enqueue=lambda: enqueue_backlog(n, encrypted=True))
            record("w2a_encrypt", d["rate"], d)
        if "W2A-OTEL" in only:
            d = drain(n, 1, env={"PGQUEUE_BENCH_OTEL": "off"})
            record("w2a_no_otel", d["rate"], d)
            d = drain(n, 1, env={"PGQUEUE_BENCH_OTEL": "sdk"})
            record("w2a_otel", d["rate"], d)
            d = drain(n, 1, env={"PGQUEUE_BENCH_OTEL": "export"})
            record("w2a_otel_export", d["rate"], d)
        if "W3" in only:  # W3-latency: the idle latency alone
            d = w3_idle_others(500)
            record("w3_idle_others", d["per_enqueue"], d)
        if "W2A-PROCESS" in only:
            d = drain(n, 1, execution="process")
            record("w2a_process", d["rate"], d)
        if "W2" in only:
            d = drain(n, 2)
            record("w2b", d["rate"], d)
        if only & {"W3", "W3-LATENCY"}:
            side_by_side(run, w3_ours, theirs(w3_peer, w3_celery))
        if "W10" in only:
            d = w10_async(1000, 1.0)
            record("w10", d["seconds"], d)
        if "W4" in only:
            d = drain(n, 1, backlog=10 * n)
            record("w4", d["rate"], d)
        if "W5" in only:
            d = w5_scheduled(200, 2.0, 0.01)
            record("w5_p50", d["p50_ms"], d)
            record("w5_p99", d["p99_ms"], d)
        if "W6" in only:
            d = w6_recovery(8, lease)
            record("w6", d["seconds"], d)
            rows["w6"].check = lambda v, r, limit=d["lease"] + 2: v <= limit
            rows["w6"].target = f"<= {d['lease'] + 2:g} s (lease + 2)"
        if "W8" in only:
            for shape in SHAPES:
                d = drain(n, 1, shape=(shape, shape_rows))
                record(f"w8_{shape}", d["rate"], d)
        if "W9" in only:
            plain = drain(members, 1)
            record("w9_plain", plain["rate"], plain)
            d = w9_fan_in(members)
            record("w9_fan_in", d["rate"], d)
            record("w9_fan_in_ratio", d["rate"] / plain["rate"], {})
            record("w9_fan_in_lag", d["callback_start_lag_ms"], {})
            record("w9_fan_in_enqueue", d["enqueue_callback_s"], {})
            d = w9_chain(steps)
            record("w9_chain", d["seconds"], d)
            record("w9_chain_handover", d["handover_p50_ms"], {})
        if "W8" in only and run == 0:
            d = w8_claim_latency(0)
            record("w8_claim_empty_p50", d["p50_ms"], d)
            record("w8_claim_empty_p99", d["p99_ms"], {})
            d = w8_claim_latency(terminal_rows)
            record("w8_claim_full_p50", d["p50_ms"], d)
            record("w8_claim_full_p99", d["p99_ms"], {})
        if "W7" in only and run == 0:
            d = w7_soak(soak)
            record("w7_ratio", d["last_over_first"], d)
            if d["rss_growth"] is not None:
                record("w7_rss", d["rss_growth"], {})

    # 4 clients against 1: 2.5x, or what pgbench's own one-INSERT scales by on this
    # machine (2 cores run 4 Python clients and 4 backends), whichever is lower.
    if rows["baseline_insert_4c"].samples:
        scale = min(2.5, ratio(rows, rows["baseline_insert_4c"]))
        rows["w1_single"].target = f">= {scale:.2f}x 1 client"
        rows["w1_single"].check = lambda v, r, limit=scale: r >= limit
    print()
    print_table(rows)
    if peer is not None:
        print()
        print_peer_table(rows)
    if celery is not None:
        print()
        print_peer_table(rows, celery.pairs(brokers), "against Celery")
    write_results(
        "results",
        args.json,
        {"server": info, "runs": runs, "quick": args.quick, "rows": rows_json(rows), "raw": raw},
    )
    return 0


# Ours against the peer's, row by row: (label, our row, their row).
# Ours against PgQueuer's, each with its target on ours / theirs (None: shown only).
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


def print_peer_table(
    rows: dict[str, Row], pairs: list[tuple] | None = None, title: str = "against PgQueuer"
) -> None:
    """Ours / theirs: the ratio of the medians, its target, and the spread of the
    per-run ratios (each run measured both back to back)."""
    print(
        f"{title:<42} {'ours':>10} {'theirs':>10} {'ours/theirs':>12} "
        f"{'per run':>14}  {'target':<9} met"
    )
    for label, ours, theirs, target, check in PEER_PAIRS if pairs is None else pairs:
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


