"""Tasks of the combined-fault soak (tests/test_soak.py). Worker subprocesses import this
module only when PGQUEUE_TEST_SOAK is set (tests/settings.py), and declare its periodic
schedule only when PGQUEUE_TEST_SOAK_SCHEDULE is set too: a schedule fires in every
worker that declares it.

Every handler records its runs in the ledger (tests/ledger.py) and touches no database:
the soak restarts the database under them. ``soak_measure`` records nothing: it is the
work of the capacity measurement, which counts rows.
"""

import os
import time

from django_pgqueue import TaskContext, periodic, task
from tests.ledger import record_run
from tests.ledger_tasks import work_seconds

LIMITED_QUEUE = "soak_limited"
RATED_QUEUE = "soak_rated"
# The queues' limits (tests/settings.py applies them to the soak's workers).
LIMITED_CONCURRENCY = 2
RATE_COUNT, RATE_SECONDS = 10, 1.0
TICK_EVERY = 2


def _run(context: TaskContext, seconds: float) -> None:
    record_run("start", context.task_id, context.attempt, context.lease_token)
    time.sleep(seconds)
    record_run("end", context.task_id, context.attempt, context.lease_token)


# max_attempts is high because the soak burns attempts on purpose: every kill, every
# pause past the lease, every lease lost in a database restart or a network stall costs
# the tasks in flight one.
@task(takes_context=True, max_attempts=50)
def soak_run(context: TaskContext, n: int) -> int:
    """The common task: works 20-300 ms (1 s for every 100th), like ledger_run."""
    _run(context, work_seconds(n))
    return n


@task(max_attempts=50)
def soak_measure(n: int) -> int:
    """soak_run's work without the ledger, for the capacity measurement."""
    time.sleep(work_seconds(n))
    return n


@task(takes_context=True, max_attempts=50)
def soak_flaky(context: TaskContext, n: int, failures: int) -> int:
    """Fails its first ``failures`` attempts (an error the retry policy retries), then
    succeeds. The failing runs end in the ledger before they raise."""
    _run(context, 0.02)
    if context.attempt <= failures:
        raise RuntimeError(f"soak_flaky {n}: attempt {context.attempt} fails on purpose")
    return n


@task(takes_context=True, max_attempts=50, queue=LIMITED_QUEUE)
def soak_limited(context: TaskContext, n: int) -> int:
    """A task of the queue limited to LIMITED_CONCURRENCY running at once."""
    _run(context, 0.1)
    return n


@task(takes_context=True, max_attempts=50, queue=RATED_QUEUE)
def soak_rated(context: TaskContext, n: int) -> int:
    """A task of the queue limited to RATE_COUNT starts per RATE_SECONDS."""
    _run(context, 0.02)
    return n


@task(takes_context=True, max_attempts=50)
def soak_tick(context: TaskContext) -> None:
    """The periodic task, every TICK_EVERY seconds."""
    _run(context, 0.02)


if os.environ.get("PGQUEUE_TEST_SOAK_SCHEDULE"):
    periodic(soak_tick, every=TICK_EVERY, name="soak_tick")
