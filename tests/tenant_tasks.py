"""Tasks of the many-tenants tests (tests/test_fair.py).

Imported by the tests that use them, and by worker subprocesses started with
PGQUEUE_TEST_TENANTS=1 (tests/settings.py): the other tests' workers do not have them,
so their claims stay the plain ones.
"""

import os
import time

from django_pgqueue import BatchCall, TaskContext, task
from tests.ledger import append, ledger_path, record_run


@task(fair_key=lambda customer, n=0: None if customer is None else f"customer:{customer}")
def fair_job(customer: str | None, n: int = 0) -> int:
    """A fair task: the customer's calls share the slots with other customers'."""
    return n


@task(fair_key=lambda customer, n=0: f"customer:{customer}", priority=0)
def fair_other(customer: str, n: int = 0) -> int:
    """A second fair task: its keys are flows of their own, beside fair_job's."""
    return n


@task(name="tests.fair_versioned", version=1, fair_key=lambda customer: customer)
def fair_versioned_v1(customer: str) -> None:
    """Version 1 of a fair task whose version 2 runs beside it."""


@task(name="tests.fair_versioned", version=2, fair_key=lambda customer: customer)
def fair_versioned(customer: str) -> None:
    """Version 2 of tests.fair_versioned."""


@task(takes_context=True, fair_key=lambda customer, n, seconds=0.005: customer)
def fair_run(context: TaskContext, customer: str, n: int, seconds: float = 0.005) -> int:
    """A fair ledger run (tests/ledger.py): its start and end recorded outside the
    database."""
    record_run("start", context.task_id, context.attempt, context.lease_token)
    time.sleep(seconds)
    record_run("end", context.task_id, context.attempt, context.lease_token)
    return n


def _account(account: str | None, *_: object, **__: object) -> str | None:
    return None if account is None else f"account:{account}"


@task(sequence_key=_account, max_attempts=1)
def ordered_job(account: str | None, n: int = 0) -> int:
    """A sequenced task: the calls of one account run one at a time, in enqueue order;
    a failure holds the account's sequence (the default)."""
    return n


@task(sequence_key=_account, on_failure="continue", max_attempts=1)
def ordered_continue(account: str, n: int = 0) -> int:
    """A sequenced task whose failure lets the rest of the sequence go on."""
    return n


@task(takes_context=True, sequence_key=_account, max_attempts=25)
def ordered_run(
    context: TaskContext, account: str, n: int, seconds: float = 0.01, fail_times: int = 0
) -> int:
    """A sequenced ledger run (tests/ledger.py): fails its first ``fail_times`` attempts
    (after recording its end), so that its retries keep the sequence's head."""
    record_run("start", context.task_id, context.attempt, context.lease_token)
    time.sleep(seconds)
    record_run("end", context.task_id, context.attempt, context.lease_token)
    if context.attempt <= fail_times:
        raise RuntimeError(f"attempt {context.attempt} of {fail_times} failing")
    return n


@task(batch_size=5, batch_wait=0.3, max_attempts=3)
def batch_send(batch: list[BatchCall]) -> None:
    """A batch handler: records each batch it takes in the ledger (its task ids and
    attempts), fails the calls whose ``fail_until`` reaches their attempt, and gives the
    others their ``n`` doubled as a result; sleeps ``sleep`` (the largest of the batch)."""
    append(ledger_path(), {
        "event": "batch", "tasks": [c.task_id for c in batch],
        "attempts": [c.attempt for c in batch], "pid": os.getpid(), "t": time.time(),
    })  # fmt: skip
    time.sleep(max(c.kwargs.get("sleep", 0) for c in batch))
    for call in batch:
        if call.kwargs.get("fail_until", 0) >= call.attempt:
            call.fail(RuntimeError(f"call {call.task_id} failing on attempt {call.attempt}"))
        else:
            call.result = call.args[0] * 2


@task(batch_size=10, max_attempts=2, timeout=0.5)
def batch_boom(batch: list[BatchCall]) -> None:
    """A batch handler that raises (or, with ``sleep``, overruns its timeout) for the
    whole batch."""
    time.sleep(max(c.kwargs.get("sleep", 0) for c in batch))
    raise ValueError(f"a batch of {len(batch)} failed")
