"""The tasks of ``python -m benchmarks.tenants`` (docs/tenants.md): loaded by the
workers only when PGQUEUE_BENCH_TENANTS=1 (benchmarks/settings.py), so that the other
workloads' workers keep the plain claim. PGQUEUE_BENCH_API_MS: the round trip of the
remote API the batch workload's handlers call (0: none)."""

import os
import time

from django_pgqueue import BatchCall, task

# The fair workload's handler work (PGQUEUE_BENCH_PROBE_MS: a sleep, as for an I/O
# call; 0: none, a no-op).
PROBE_SECONDS = float(os.environ.get("PGQUEUE_BENCH_PROBE_MS", "0")) / 1000


@task(fair_key=lambda key, n: key)
def fair_probe(key: str, n: int) -> float:
    """A fair task that returns the wall-clock time its handler started (same host as
    the benchmark): due -> start is that, less the row's run_at."""
    started = time.time()
    if PROBE_SECONDS:
        time.sleep(PROBE_SECONDS)
    return started


@task
def plain_probe(key: str, n: int) -> float:
    """fair_probe without a fair key: the same work, claimed in plain order (the
    baseline of the fair workload's drain beside the other keys)."""
    started = time.time()
    if PROBE_SECONDS:
        time.sleep(PROBE_SECONDS)
    return started


# A remote API's round trip per request, for the batch workload (milliseconds).
API_SECONDS = float(os.environ.get("PGQUEUE_BENCH_API_MS", "0")) / 1000


@task(batch_size=100, batch_wait=0.05)
def batch_call(batch: list[BatchCall]) -> None:
    """One request for up to 100 calls."""
    if API_SECONDS:
        time.sleep(API_SECONDS)


@task
def one_call(n: int) -> None:
    """One request per call."""
    if API_SECONDS:
        time.sleep(API_SECONDS)
