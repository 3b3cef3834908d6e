"""What a type checker accepts and refuses in django_pgqueue's public API.

Never imported or run: tests/test_typing.py runs mypy and pyright over this file, and
each must report no error. A correct use carries ``assert_type`` of what it gives; an
incorrect one carries the error each checker must report, as an ignore comment: with
warn_unused_ignores (mypy) and reportUnnecessaryTypeIgnoreComment (pyright), a refusal
that stops happening fails the check as surely as an error that starts.
"""

from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any, Literal, assert_type

from django_pgqueue import (
    BatchCall,
    RetryPolicy,
    TaskContext,
    TaskDefinition,
    call,
    cancel,
    get_task,
    periodic,
    queue_overview,
    signal,
    task,
)
from django_pgqueue.models import Task
from django_pgqueue.registry import ContextTaskDefinition
from django_pgqueue.workflows import Step, chain


@task
def send_receipt(order_id: int) -> None: ...


@task(queue="emails", max_attempts=5, timeout=60, backoff={"base": 1, "cap": 60})
def send_email(to: str, subject: str = "", *, urgent: bool = False) -> str:
    return to


@task(takes_context=True, atomic=True)
def export(context: TaskContext, report_id: int) -> dict[str, int]:
    return {"report": report_id, "key": len(context.idempotency_key)}


@task
async def fetch(url: str) -> bytes:
    return b""


@task(unique_for=3600, unique_states=["scheduled", "pending", "running", "waiting"],
      on_conflict="replace")
def reindex(doc_id: int) -> None: ...


@periodic(every=60)
@task
def digest(day: str) -> int:
    return 0


def typed_definitions() -> None:
    # P carries the parameters' names, which a type expression cannot spell: these
    # assignments check the types, and wrong_arguments() below checks the names.
    receipt: TaskDefinition[[int], None] = send_receipt
    email: Callable[[str, str], int] = send_email.using(priority=1).enqueue
    context_task: ContextTaskDefinition[[int], dict[str, int]] = export
    # An async task's R is the coroutine: what a direct call returns.
    fetcher: TaskDefinition[[str], Coroutine[Any, Any, bytes]] = fetch
    # @periodic above @task keeps the task's type.
    digester: TaskDefinition[[str], int] = digest
    wrong: TaskDefinition[[str], None] = send_receipt  # type: ignore[assignment]  # pyright: ignore[reportAssignmentType]
    print(receipt, email, context_task, fetcher, digester, wrong)


def correct_enqueues() -> None:
    assert_type(send_receipt.enqueue(42), int)
    assert_type(send_receipt.enqueue(order_id=42), int)
    assert_type(send_receipt.enqueue_on_commit(42), int)
    assert_type(send_email.enqueue("a@example.com", "hi", urgent=True), int)
    assert_type(export.enqueue(7), int)  # the context is the worker's to pass
    assert_type(fetch.enqueue("https://example.com"), int)
    assert_type(send_receipt.enqueue_many([1, 2, (3,), {"order_id": 4}, call(5)]), list[int])
    assert_type(send_receipt.step(42), Step)
    assert_type(chain(send_receipt.step(1), export.step(2)), list[int])


async def correct_direct_calls(context: TaskContext) -> None:
    assert_type(send_receipt(42), None)
    assert_type(send_email("a@example.com"), str)
    assert_type(export(context, 7), dict[str, int])
    assert_type(await fetch("https://example.com"), bytes)


def correct_using() -> None:
    first = send_receipt.enqueue(1)
    later = send_receipt.using(
        queue="bulk",
        priority=10,
        delay=30,
        unique_key="receipt:1",
        max_attempts=3,
        timeout=None,
        backoff=RetryPolicy(base=1.0),
        metadata={"request_id": "abc"},
        commit_alias="default",
        after=[first],
        after_failure="run",
        atomic=True,
    )
    same: TaskDefinition[[int], None] = later
    assert_type(later.enqueue(2), int)
    assert_type(send_receipt.using(run_at=datetime(2030, 1, 1)).enqueue(3), int)
    assert_type(send_receipt.using(backoff=60).using(backoff={"base": 2}).enqueue(4), int)
    assert_type(export.using(priority=1).enqueue(5), int)
    unique = reindex.using(
        unique_key="doc:1",
        unique_for=timedelta(minutes=5),
        unique_states=("scheduled", "pending", "running", "waiting", "succeeded"),
        on_conflict="keep",
    )
    assert_type(unique.enqueue(1), int)
    print(same)


def results() -> None:
    assert_type(get_task(1), Task)
    assert_type(get_task(1, database="default"), Task)
    assert_type(cancel(1), Literal["cancelled", "cancel_requested"] | None)
    assert_type(signal(1, "approved", {"by": "ann"}), Literal["resumed", "stored"] | None)
    [row] = queue_overview()
    assert_type(row["pending_routable"], int)
    assert_type(row["oldest_due_seconds"], float | None)
    row["pending"]  # type: ignore[typeddict-item]  # pyright: ignore[reportGeneralTypeIssues]


def wrong_arguments(context: TaskContext) -> None:
    send_receipt.enqueue(order_id="x")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    send_receipt.enqueue("x")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    send_receipt.enqueue()  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    send_receipt.enqueue(order=1)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    send_receipt.enqueue(1, 2)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    send_receipt.enqueue_on_commit("x")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    send_receipt.step("x")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    send_receipt("x")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    send_email.enqueue("a@example.com", True)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    send_email.enqueue("a@example.com", "hi", True)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    # A takes_context task: enqueue takes no context, a direct call needs one.
    export.enqueue(context, 7)  # type: ignore[call-arg, arg-type]  # pyright: ignore[reportCallIssue]
    export(7)  # type: ignore[call-arg, arg-type]  # pyright: ignore[reportCallIssue]
    export.using(priority=1).enqueue("x")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]


def wrong_options() -> None:
    send_receipt.using(priorty=1)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
    send_receipt.using(priority="high")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    send_receipt.using(delay="soon")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    send_receipt.using(after_failure="ignore")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    send_receipt.using(run_at="tomorrow")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    send_receipt.using(on_conflict="latest")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    send_receipt.using(unique_states=["done"])  # type: ignore[list-item]  # pyright: ignore[reportArgumentType]


def wrong_results() -> None:
    ids: list[str] = send_receipt.enqueue_many([1])  # type: ignore[assignment]  # pyright: ignore[reportAssignmentType]
    task_id: str = send_receipt.enqueue(1)  # type: ignore[assignment]  # pyright: ignore[reportAssignmentType]
    print(ids, task_id)


@task(priorty=1)  # type: ignore[call-overload, untyped-decorator]  # pyright: ignore[reportCallIssue]
def misspelt_option() -> None: ...


@task(takes_context=True)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
def context_task_without_context(report_id: int) -> None: ...


@task(priority="high")  # type: ignore[call-overload, untyped-decorator]  # pyright: ignore[reportArgumentType]
def wrongly_typed_option() -> None: ...


def context_flag_not_literal(flag: bool) -> None:
    def handler(report_id: int) -> str:
        return ""

    # Which parameters enqueue takes depends on the flag: they are not checked.
    unchecked = task(takes_context=flag)(handler)
    assert_type(unchecked, TaskDefinition[..., str])
    assert_type(unchecked.enqueue("anything", at=all), int)


@task(batch_size=100, batch_wait=1.0, queue="emails")
def send_batch(batch: list[BatchCall]) -> None:
    for one in batch:
        one.result = one.kwargs["to"]


def batch_calls() -> None:
    # A batch handler takes a list of calls; each call is enqueued with its own arguments.
    assert_type(send_batch, TaskDefinition[..., None])
    assert_type(send_batch.enqueue(to="ada@example.com"), int)


@task(batch_size=100)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
def batch_handler_taking_one_call(to: str) -> None: ...
