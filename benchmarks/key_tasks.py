"""W2a-keys: no-op tasks with a per-key limit that never binds (docs/limits.md).

Loaded by the workers only when PGQUEUE_BENCH_KEYS=1 (benchmarks/settings.py): a key on
any task of the default queue makes every claim of the queue a limited claim. The rows
are written by SQL with their key (workloads.enqueue_keyed), one of 10,000 keys each.
"""

from django_pgqueue import task


@task(key_rate="100/s")
def keyed_rate(n: int) -> None:
    """At most 100 starts per second of each key (a burst of 5): never binds when each
    key has two rows in the backlog."""
    return None


@task(key_concurrency=1000)
def keyed_concurrency(n: int) -> None:
    """At most 1,000 running per key: never binds."""
    return None
