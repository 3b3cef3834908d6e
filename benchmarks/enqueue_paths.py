"""The single enqueue's client path, layer by layer: ``python -m benchmarks.enqueue_paths``.

``noop.enqueue(i)`` is measured against prototypes of faster paths that send the same
statement, with the same parameters, on the caller's Django connection and in the
caller's transaction, each stripping one layer: Django's cursor wrapper, client-side
parameter binding, the statement's parse and plan per call (prepared statements), and
the per-call Python that builds the row. Every variant runs ``--calls`` enqueues, one
transaction each, 1 client; the variants are interleaved (rotated) in ``--rounds``
rounds, the task table truncated before each, and reported as medians with their
spread and as the median of the per-round ratios to the current ``enqueue()``. Nothing
here is the package's code: these are prototypes to show what each change buys
(docs/performance.md, "The single enqueue's client path").

``--micro`` also times the Python steps of one enqueue without the database, and
``--profile cprofile`` / ``--profile py-spy`` profile ``enqueue()`` alone (autocommit
and in ``atomic()``), py-spy's samples bucketed by the layer they are in.

Uses the benchmark database (PGQUEUE_BENCH_DB, dropped and created again) on
DATABASE_URL's server.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.harness import REPO, prepare_database, reset_queue, setup_django, setup_django_child

Variant = Callable[[int, int], None]


def variants() -> dict[str, tuple[str, Variant]]:
    """name -> (what it does, run(start, count))."""
    import psycopg
    from django.db import connection, transaction

    from benchmarks.tasks import noop
    from django_pgqueue.core.conf import database_for
    from django_pgqueue.core.payload import check_json, dumps
    from django_pgqueue.db.sql import QUERIES
    from django_pgqueue.tasking.enqueue import build_row, check_transaction

    query = QUERIES["enqueue"]
    # The same statement with positional parameters, for the floor: what is left when
    # the row's constant part is computed once per task definition.
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", query)))
    positional = query
    for name in names:
        positional = positional.replace(f"%({name})s", "%s")
    order = sorted(names, key=lambda n: query.index(f"%({n})s"))
    # Each named parameter appears once in the statement.
    assert all(query.count(f"%({n})s") == 1 for n in names)

    def raw() -> psycopg.Connection:
        """The psycopg connection under Django's (opened if need be): same session,
        same transaction as the caller's Django cursor."""
        connection.ensure_connection()
        return connection.connection

    @contextlib.contextmanager
    def preparing() -> Iterator[None]:
        """Let ``prepare=True`` prepare. Django opens its connections with
        ``prepare_threshold=None`` (no prepared statements, for poolers' sake), and then
        psycopg ignores ``prepare=True``; a threshold no query reaches lets an explicit
        ``prepare=True`` through and prepares nothing else."""
        conn = raw()
        saved = conn.prepare_threshold
        conn.prepare_threshold = 2**31 - 1
        try:
            yield
        finally:
            conn.prepare_threshold = saved

    def enqueue_autocommit(start: int, n: int) -> None:
        for i in range(start, start + n):
            noop.enqueue(i)

    def enqueue_atomic(start: int, n: int) -> None:
        for i in range(start, start + n):
            with transaction.atomic():
                noop.enqueue(i)

    def row_of(i: int) -> dict[str, Any]:
        row = build_row(noop, (i,), {})
        alias = database_for(row["queue"])
        check_transaction(noop, row["queue"], alias, "enqueue()")
        return row

    def django_cursor(start: int, n: int) -> None:
        """enqueue() minus its own code around the cursor: build_row, then Django's cursor
        (what enqueue() does, inlined; the baseline for the layers below)."""
        for i in range(start, start + n):
            row = row_of(i)
            with connection.cursor() as cursor:
                cursor.execute(query, row)
                cursor.fetchone()

    def client_binding(start: int, n: int) -> None:
        """Django's binding (psycopg ClientCursor: the parameters quoted into the text,
        sent with the simple protocol), without Django's cursor wrapper."""
        for i in range(start, start + n):
            row = row_of(i)
            with psycopg.ClientCursor(raw()) as cursor:
                cursor.execute(query, row)
                cursor.fetchone()

    def server_binding(start: int, n: int) -> None:
        """Server-side binding (extended protocol: statement and parameters apart),
        unnamed statement: parsed and planned on every call, nothing kept in the session."""
        for i in range(start, start + n):
            row = row_of(i)
            with psycopg.Cursor(raw()) as cursor:
                cursor.execute(query, row, prepare=False)
                cursor.fetchone()

    def prepared(start: int, n: int) -> None:
        """Server-side binding and a named prepared statement (prepare=True): parsed
        once per connection. Not behind a transaction pooler (PgBouncer < 1.21, or
        without max_prepared_statements)."""
        with preparing():
            prepared_calls(start, n)

    def prepared_calls(start: int, n: int) -> None:
        for i in range(start, start + n):
            row = row_of(i)
            with psycopg.Cursor(raw()) as cursor:
                cursor.execute(query, row, prepare=True)
                cursor.fetchone()

    class PreparedCursor(psycopg.Cursor):
        """Server-side binding, every statement prepared: for Django's CursorWrapper,
        whose execute() passes no prepare= of its own."""

        def execute(self, query, params=None, **kwargs):  # type: ignore[override]
            return super().execute(query, params, prepare=True, **kwargs)

    def wrapped_prepared(start: int, n: int) -> None:
        """Prepared, through Django's CursorWrapper: keeps what the wrapper does (the
        execute_wrappers, the refusal to run in a broken atomic block, Django's error
        classes, the query log under DEBUG)."""
        with preparing():
            for i in range(start, start + n):
                row = row_of(i)
                with connection._prepare_cursor(PreparedCursor(raw())) as cursor:
                    cursor.execute(query, row)
                    cursor.fetchone()

    def prepared_atomic(start: int, n: int) -> None:
        with preparing():
            for i in range(start, start + n):
                with transaction.atomic():
                    row = row_of(i)
                    with psycopg.Cursor(raw()) as cursor:
                        cursor.execute(query, row, prepare=True)
                        cursor.fetchone()

    base = row_of(0)
    constant = {k: v for k, v in base.items() if k in names and k not in ("args",)}

    def floor(start: int, n: int) -> None:
        """The floor of Python work: the row's constant part computed once (as it could
        be per task definition and options), per call only args' check and JSON, the
        transaction check, one prepared statement on one cursor kept open."""
        with preparing(), psycopg.Cursor(raw()) as cursor:
            for i in range(start, start + n):
                args = dumps(check_json((i,), "args"))
                check_transaction(noop, "default", "default", "enqueue()")
                params = [args if name == "args" else constant[name] for name in order]
                cursor.execute(positional, params, prepare=True)
                cursor.fetchone()

    return {
        "enqueue": ("noop.enqueue(i), autocommit (today)", enqueue_autocommit),
        "enqueue_atomic": ("with atomic(): noop.enqueue(i) (today)", enqueue_atomic),
        "django_cursor": ("build_row + Django cursor, inlined", django_cursor),
        "client_binding": ("build_row + ClientCursor on the raw connection", client_binding),
        "server_binding": ("build_row + server-side binding, unprepared", server_binding),
        "prepared": ("build_row + server-side binding, prepared", prepared),
        "wrapped_prepared": ("prepared, in Django's CursorWrapper", wrapped_prepared),
        "prepared_atomic": ("with atomic(): build_row + prepared", prepared_atomic),
        "floor": ("constant row cached, args only, prepared, one cursor", floor),
    }  # fmt: skip


def measure(
    names: list[str], calls: int, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per variant, the calls per second of each round, and this process's CPU time per
    call (microseconds): the client's own cost, which the server's latency and the
    machine's other load move much less than the rate."""
    table = variants()
    for _what, run in table.values():
        run(-100, 20)  # connect, and prepare what is prepared, before any clock
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        print(f"  prepared statements in the session: {cursor.fetchone()[0]}", flush=True)
    rates: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        # Rotate the order: no variant always runs first after a truncate.
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            reset_queue()
            started, cpu_started = time.perf_counter(), time.process_time()
            table[name][1](r * calls, calls)
            rates[name].append(calls / (time.perf_counter() - started))
            cpu[name].append((time.process_time() - cpu_started) * 1e6 / calls)
            print(
                f"  round {r + 1} {name}: {rates[name][-1]:,.0f}/s, "
                f"client CPU {cpu[name][-1]:.0f} us/call",
                flush=True,
            )
    return rates, cpu


def micro(iterations: int = 20_000) -> dict[str, float]:
    """Microseconds per call of each Python step of enqueue(), no database involved
    except where named (the cursor's creation and close send nothing)."""
    from django.db import connection, connections

    from benchmarks.tasks import noop
    from django_pgqueue.core.conf import database_for
    from django_pgqueue.core.payload import check_json, dumps
    from django_pgqueue.db.sql import QUERIES
    from django_pgqueue.tasking.enqueue import build_row, check_transaction
    from django_pgqueue.tasking.tracing import trace_context

    connection.ensure_connection()
    row = build_row(noop, (1,), {})
    steps: dict[str, Callable[[], Any]] = {
        "build_row (the whole row)": lambda: build_row(noop, (1,), {}),
        "  check_json + dumps of args": lambda: dumps(check_json([1], "args")),
        "  trace_context (OpenTelemetry when installed)": trace_context,
        "database_for": lambda: database_for("default"),
        "check_transaction": lambda: check_transaction(noop, "default", "default", "e"),
        "connections[alias].cursor() + close": lambda: connections["default"].cursor().close(),
        "client-side binding (ClientCursor.mogrify)": lambda: (
            connection.connection.cursor().mogrify(QUERIES["enqueue"], row)
        ),
    }
    out = {}
    for name, step in steps.items():
        step()
        started = time.perf_counter()
        for _ in range(iterations):
            step()
        out[name] = (time.perf_counter() - started) * 1e6 / iterations
    return out


# -- profiles --------------------------------------------------------------------------
def loop(mode: str, calls: int) -> None:
    from django.db import transaction

    from benchmarks.tasks import noop

    noop.enqueue(-1)
    if mode == "atomic":
        for i in range(calls):
            with transaction.atomic():
                noop.enqueue(i)
    else:
        for i in range(calls):
            noop.enqueue(i)


def cprofile(mode: str, calls: int) -> str:
    reset_queue()
    profiler = cProfile.Profile()
    profiler.enable()
    loop(mode, calls)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(30)
    return out.getvalue()


# py-spy's frames, bucketed by the layer of the enqueue they belong to: the first rule
# whose text appears in a sample's stack (innermost first) names its bucket.
BUCKETS = [
    ("waiting on the server (round trips)", ("wait (psycopg", "wait_c", "_wait", "wait_conn")),
    ("atomic(): BEGIN / COMMIT / autocommit switches", (
        "__enter__ (django/db/transaction.py", "__exit__ (django/db/transaction.py",
    )),
    ("client-side binding (ClientCursor query build)", (
        "_client_query", "ClientQuery", "as_literal", "quote", "_convert_query",
        "client_cursor.py",
    )),
    ("psycopg execute (protocol, result)", ("psycopg/cursor.py", "psycopg/_cursor_base.py")),
    ("Django cursor wrapper", ("django/db/backends",)),
    ("build_row: JSON check and encoding", ("payload.py",)),
    ("build_row: trace context", ("trace_context",)),
    ("build_row: the rest", ("build_row",)),
    ("check_transaction / database_for", ("check_transaction", "database_for")),
    ("enqueue()'s own code", ("enqueue.py", "registry.py")),
]  # fmt: skip


def pyspy(mode: str, calls: int) -> dict[str, float]:
    binary = shutil.which("py-spy") or str(os.path.join(os.path.dirname(sys.executable), "py-spy"))
    reset_queue()
    with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as out:
        path = out.name
    subprocess.run(
        [
            binary, "record", "--idle", "--rate", "1000", "--format", "raw", "-o", path,
            "--", sys.executable, "-m", "benchmarks.enqueue_paths", "--loop", mode,
            "--calls", str(calls),
        ],
        check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
    )  # fmt: skip
    samples: Counter[str] = Counter()
    with open(path) as lines:
        stacks = [line.rstrip().rpartition(" ") for line in lines]
    for stack, _, n in stacks:
        if "loop (benchmarks/enqueue_paths.py" not in stack:
            continue  # start-up and set-up
        frames = stack.split(";")
        # The frames below the loop, innermost first.
        inner = frames[next(i for i, f in enumerate(frames) if f.startswith("loop (")) + 1 :]
        bucket = "other"
        for frame in reversed(inner):
            bucket = next((b for b, keys in BUCKETS if any(k in frame for k in keys)), None)
            if bucket:
                break
        samples[bucket or "other"] += int(n)
    os.unlink(path)
    total = sum(samples.values())
    return {bucket: 100 * n / total for bucket, n in samples.most_common()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.enqueue_paths", description=__doc__)
    parser.add_argument(
        "--calls", type=int, default=250, help="calls per variant per round (profiles: in all)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=30,
        help="rounds; many short ones interleave the variants finely, so the machine's "
        "other load moves them alike",
    )
    parser.add_argument("--only", help="comma-separated variants (default: all)")
    parser.add_argument("--micro", action="store_true", help="time the Python steps alone")
    parser.add_argument("--profile", choices=["cprofile", "py-spy"])
    parser.add_argument(
        "--async-commit",
        action="store_true",
        help="synchronous_commit = off on the session: the CPU path alone, without the wait "
        "for the WAL flush (the noisiest part on a shared machine's disk)",
    )
    parser.add_argument("--loop", choices=["autocommit", "atomic"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.loop:  # py-spy's target: DATABASE_URL is the benchmark database already
        setup_django_child(os.environ["DATABASE_URL"])
        loop(args.loop, args.calls)
        return 0

    setup_django(prepare_database())
    if args.async_commit:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SET synchronous_commit = off")
    if args.profile == "cprofile":
        for mode in ("autocommit", "atomic"):
            print(f"== cProfile, {args.calls:,} enqueue(), {mode}")
            print(cprofile(mode, args.calls))
        return 0
    if args.profile == "py-spy":
        for mode in ("autocommit", "atomic"):
            print(f"== py-spy (--idle), {args.calls:,} enqueue(), {mode}: share of samples")
            for bucket, share in pyspy(mode, args.calls).items():
                print(f"  {share:5.1f}%  {bucket}")
        return 0
    if args.micro:
        print("Python steps of one enqueue, microseconds per call:")
        for name, us in micro().items():
            print(f"  {us:8.1f}  {name}")

    table = variants()
    names = args.only.split(",") if args.only else list(table)
    rates, cpu = measure(names, args.calls, args.rounds)
    base = rates.get("enqueue")
    print(
        f"\n{args.calls:,} calls x {args.rounds} rounds, 1 client, one transaction each, "
        f"interleaved; medians{'; synchronous_commit = off' if args.async_commit else ''}"
    )
    print(
        f"{'variant':<16} {'calls/s':>9} {'spread':>15} {'us/call':>8} {'ratio':>6} "
        f"{'client CPU us':>13}  what"
    )
    for name in names:
        median = statistics.median(rates[name])
        spread = f"{min(rates[name]):,.0f}-{max(rates[name]):,.0f}"
        # The median of the per-round ratios: each round ran every variant back to back,
        # so a machine that slows down between rounds moves both sides of each ratio.
        ratio = (
            f"{statistics.median(a / b for a, b in zip(rates[name], base, strict=True)):.2f}x"
            if base
            else ""
        )
        print(
            f"{name:<16} {median:>9,.0f} {spread:>15} {1e6 / median:>8.0f} {ratio:>6} "
            f"{statistics.median(cpu[name]):>13.0f}  {table[name][0]}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
