"""Tasks of the many-tenants tests (tests/test_fair.py).

Imported by the tests that use them, and by worker subprocesses started with
PGQUEUE_TEST_TENANTS=1 (tests/settings.py): the other tests' workers do not have them,
so their claims stay the plain ones.
"""

import time

from django_pgqueue import TaskContext, task
from tests.ledger import record_run


@task(fair_key=lambda customer, n=0: None if customer is None else f"customer:{customer}")
def fair_job(customer: str | None, n: int = 0) -> int:
    """A fair task: the customer's calls share the slots with other customers'."""
    return n


@task(fair_key=lambda customer, n=0: f"customer:{customer}", priority=0)
def fair_other(customer: str, n: int = 0) -> int:
    """A second fair task: its keys are flows of their own, beside fair_job's."""
    return n


@task(takes_context=True, fair_key=lambda customer, n, seconds=0.005: customer)
def fair_run(context: TaskContext, customer: str, n: int, seconds: float = 0.005) -> int:
    """A fair ledger run (tests/ledger.py): its start and end recorded outside the
    database."""
    record_run("start", context.task_id, context.attempt, context.lease_token)
    time.sleep(seconds)
    record_run("end", context.task_id, context.attempt, context.lease_token)
    return n
