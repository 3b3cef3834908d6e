"""The benchmark's tasks: a no-op taking one int, probes that report when they ran,
a chord's callback (W9), handlers that touch the database (connections, and
W2a-atomic's one insert per task), and one that logs (W2a-tasklogs)."""

import logging
import time

from django.db import connection, transaction

from django_pgqueue import TaskContext, task


@task
def noop(n: int) -> None:
    return None


@task(encrypt=True, name="benchmarks.tasks.sealed_noop")
def sealed_noop(n: int) -> None:
    """noop, encrypted (W1 encrypted, W2a-encrypt): its args and result are sealed."""
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


@task
def query_then_sleep(seconds: float, release: bool = False) -> None:
    """One query on the slot thread's Django connection, then ``seconds`` away from the
    database (python -m benchmarks.connections). ``release``: close the connection after
    the query, so a pooled one goes back to the pool before the sleep rather than when
    the worker closes it after the task."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    if release:
        connection.close()
    time.sleep(seconds)


@task
def insert_row(n: int) -> None:
    """Inserts one row into bench_effect, on the slot thread's Django connection
    (W2a-atomic: enqueued as is, and with using(atomic=True))."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO bench_effect (n) VALUES (%s)", [n])


@task
def insert_row_in_transaction(n: int) -> None:
    """insert_row inside the handler's own transaction.atomic() (W2a-atomic's yardstick:
    what a transaction costs, without the settle in it)."""
    with transaction.atomic():
        insert_row.func(n)


log = logging.getLogger(__name__)


@task
def chatty(n: int) -> None:
    """Logs two INFO records (W2a-tasklogs: drained with TASK_LOGS and without)."""
    log.info("handling %s", n)
    log.info("handled %s", n)
