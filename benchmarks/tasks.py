"""The benchmark's tasks: a no-op taking one int, and probes that report when they ran."""

import time

from django_pgqueue import task


@task
def noop(n: int) -> None:
    return None


@task
def probe(n: int) -> float:
    """Returns the wall-clock time at which the handler started (same host as the
    benchmark, so it is comparable with the enqueuer's time.time())."""
    return time.time()


@task
def hold(seconds: float) -> float:
    """Occupies a slot (crash-recovery workload); returns when it started."""
    started = time.time()
    time.sleep(seconds)
    return started
