"""The client CPU of one enqueue, this checkout against another:
``python -m benchmarks.client_cpu --against /path/to/other/checkout``.

Each W1 way of enqueueing one task (``--kinds``, default all) runs ``--calls`` times,
one transaction each, 1 client, in a fresh process of each checkout in turn, for
``--rounds`` interleaved rounds; the session has ``synchronous_commit = off`` (the
client's path without the wait for the WAL flush) and ``CONN_MAX_AGE`` 60, as a web
process with persistent connections. Prints the medians of the calls per second and of
the process's CPU time (user + system) per call, and their ratios. Uses the database
of DATABASE_URL as it is (migrated: ``manage.py migrate`` with the benchmark's
settings); the task table grows by the calls made.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from benchmarks.harness import REPO
from benchmarks.workloads import W1_KINDS

CHILD = r"""
import os, sys, time
root, kind, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, root)
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
os.environ["PGQUEUE_BENCH_CONN_MAX_AGE"] = "60"
import django
django.setup()
from django.db import connection
try:
    from benchmarks.workloads import enqueue_call
except ImportError:  # a checkout from before the workloads left runner.py
    from benchmarks.runner import _enqueue_call as enqueue_call
with connection.cursor() as cursor:
    cursor.execute("SET synchronous_commit = off")
call = enqueue_call(kind)
for i in range(200):
    call(-1)
o0, t0 = os.times(), time.perf_counter()
for i in range(calls):
    call(i)
o1, t1 = os.times(), time.perf_counter()
cpu = (o1.user - o0.user + o1.system - o0.system) * 1e6 / calls
print(calls / (t1 - t0), cpu)
"""


def run(root: str, kind: str, calls: int) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, root, kind, str(calls)],
        cwd=root, capture_output=True, text=True, check=True,
    )  # fmt: skip
    rate, cpu = out.stdout.split()
    return float(rate), float(cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.client_cpu", description=__doc__)
    parser.add_argument("--against", required=True, help="the other checkout's directory")
    parser.add_argument("--kinds", default=",".join(W1_KINDS))
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    roots = {"this": str(REPO), "other": os.path.abspath(args.against)}
    kinds = args.kinds.split(",")
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for kind in kinds:
            order = list(roots.items()) if r % 2 == 0 else list(roots.items())[::-1]
            for name, root in order:
                samples.setdefault((kind, name), []).append(run(root, kind, args.calls))
    print(f"{'kind':<16} {'other /s':>9} {'this /s':>9} {'other us':>9} {'this us':>8}  cpu")
    for kind in kinds:
        other, this = samples[(kind, "other")], samples[(kind, "this")]
        rate = [statistics.median(x[0] for x in s) for s in (other, this)]
        cpu = [statistics.median(x[1] for x in s) for s in (other, this)]
        print(
            f"{kind:<16} {rate[0]:>9,.0f} {rate[1]:>9,.0f} {cpu[0]:>9.0f} {cpu[1]:>8.0f}  "
            f"{cpu[1] / cpu[0]:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
