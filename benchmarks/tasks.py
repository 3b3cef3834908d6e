"""The benchmark's tasks: a no-op taking one int, probes that report when they ran,
and a chord's callback (W9)."""

import time

from django_pgqueue import TaskContext, task


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


@task(takes_context=True)
def fan_in(context: TaskContext, members: int) -> int:
    """A chord's callback (W9): how many of its parents succeeded, from their results."""
    return sum(1 for p in context.parent_results().values() if p["state"] == "succeeded")
