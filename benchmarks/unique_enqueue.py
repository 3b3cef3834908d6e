"""Enqueues with a unique key, by option: ``python -m benchmarks.unique_enqueue``.

One client, one transaction per enqueue (autocommit), ``noop.enqueue(i)`` on the
caller's Django connection. Variants, interleaved (rotated) in ``--rounds`` rounds,
the task table truncated before each, reported as calls per second (median and
spread), as the median of the per-round ratios to a plain enqueue, and as the
benchmark process's CPU time per call (what the machine's other load moves least):

- ``plain``: no unique key (the web path);
- ``key``: a new unique key per call, no options (one INSERT ... ON CONFLICT);
- ``unique_for new``: a new key per call with ``unique_for``: the key's lock, the
  lookup, the insert (three statements in one transaction);
- ``unique_for duplicate``: the same key each call, held by a finished task within
  the period: the lock and the lookup, nothing written;
- ``replace``: the same key each call, ``on_conflict="replace"`` on a queued task:
  the lock, the lookup, the UPDATE.

``--history`` rows of finished tasks with other keys are in the table first, so the
lookup runs beside history (the index pgqueue_task_unique_key holds every row with a
key). Uses the benchmark database (PGQUEUE_BENCH_DB, dropped and created again) on
DATABASE_URL's server.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from benchmarks.harness import prepare_database, raw_connection, reset_queue, setup_django


def variants() -> dict[str, Callable[[int], None]]:
    from benchmarks.tasks import noop

    fresh_for = noop.using(unique_for=3600)
    same_for = noop.using(unique_key="held", unique_for=3600)
    replace = noop.using(unique_key="queued", on_conflict="replace")
    return {
        "plain": noop.enqueue,
        "key": lambda i: noop.using(unique_key=f"k{i}").enqueue(i),
        "unique_for new": lambda i: fresh_for.using(unique_key=f"f{i}").enqueue(i),
        "unique_for duplicate": same_for.enqueue,
        "replace": replace.enqueue,
    }


def setup_round(history: int) -> None:
    from benchmarks.tasks import noop

    reset_queue()
    with raw_connection() as conn:
        conn.execute(
            "INSERT INTO pgqueue_task (queue, task_name, state, unique_key, finished_at) "
            "SELECT 'default', 'benchmarks.tasks.noop', 'succeeded', 'h' || n, now() "
            "FROM generate_series(1, %(rows)s) AS n",
            {"rows": history},
        )
        conn.execute("VACUUM ANALYZE pgqueue_task")
    held = noop.using(unique_key="held", unique_for=3600).enqueue(0)
    with raw_connection() as conn:
        conn.execute(
            "UPDATE pgqueue_task SET state = 'succeeded', finished_at = now() WHERE id = %s",
            [held],
        )
    noop.using(unique_key="queued").enqueue(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--history", type=int, default=100_000)
    options = parser.parse_args()
    setup_django(prepare_database())
    runs = variants()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    ratios: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for round_ in range(options.rounds):
        order = names[round_ % len(names):] + names[: round_ % len(names)]
        this_round = {}
        for name in order:
            setup_round(options.history)
            run = runs[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            for i in range(1, options.calls + 1):
                run(i)
            this_round[name] = options.calls / (time.perf_counter() - start)
            cpu[name].append((time.process_time() - start_cpu) / options.calls * 1e6)
            rates[name].append(this_round[name])
        for name in names:
            ratios[name].append(this_round[name] / this_round["plain"])
    print(f"{options.calls} calls x {options.rounds} rounds, {options.history:,} finished "
          "rows with other keys in the table")
    print(f"{'variant':<22} {'calls/s (median)':>17} {'spread':>15} {'vs plain':>9} "
          f"{'client CPU us/call':>19}")
    for name in names:
        low, high = min(rates[name]), max(rates[name])
        print(f"{name:<22} {statistics.median(rates[name]):>17.0f} "
              f"{low:>7.0f}-{high:<7.0f} {statistics.median(ratios[name]):>9.2f} "
              f"{statistics.median(cpu[name]):>19.0f}")


if __name__ == "__main__":
    main()
