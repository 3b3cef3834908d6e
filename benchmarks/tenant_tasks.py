"""The tasks of ``python -m benchmarks.tenants`` (docs/tenants.md): loaded by the
workers only when PGQUEUE_BENCH_TENANTS=1 (benchmarks/settings.py), so that the other
workloads' workers keep the plain claim."""

import time

from django_pgqueue import task


@task(fair_key=lambda key, n: key)
def fair_probe(key: str, n: int) -> float:
    """A fair no-op that returns the wall-clock time its handler started (same host as
    the benchmark): due -> start is that, less the row's run_at."""
    return time.time()
