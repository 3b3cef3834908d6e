"""Tasks for tests/test_encryption.py: encrypted ones, whose payloads the tests look
for in the raw rows."""

from __future__ import annotations

from typing import Any

from django_pgqueue import Continue, task
from django_pgqueue.tasking.context import TaskContext


@task(encrypt=True, queue="sealed")
def echo(secret: str, *, note: str | None = None) -> dict[str, Any]:
    return {"echo": secret, "note": note}


@task(encrypt=True, queue="sealed", takes_context=True)
def sliced(context: TaskContext, secret: str) -> dict[str, Any]:
    """Two slices: the first saves progress and a checkpoint holding the secret and
    continues; the second returns what it resumed from."""
    if context.checkpoint is None:
        context.report_progress({"progress": secret})
        raise Continue({"resume": secret})
    return {"resumed": context.checkpoint}


@task(encrypt=True, queue="sealed", takes_context=True)
def waits(context: TaskContext, secret: str) -> dict[str, Any]:
    """Suspends until the signal "go", then returns its payload as the handler saw it."""
    if "go" not in context.signals:
        context.suspend("go", checkpoint={"before": secret})
    return {"signal": context.signals["go"], "woken": context.wake, "kept": context.checkpoint}


@task(encrypt=True, queue="sealed", takes_context=True)
def reads_parents(context: TaskContext) -> dict[str, Any]:
    return {str(k): v["result"] for k, v in context.parent_results().items()}


@task(encrypt=True, queue="sealed", takes_context=True, atomic=True)
def atomic_echo(context: TaskContext, secret: str) -> str:
    """Its progress is held until its transaction commits with its result."""
    context.report_progress({"at": secret})
    return secret


@task(encrypt=True, queue="sealed")
async def echo_async(secret: str) -> str:
    return secret.upper()


@task(queue="sealed")
def plain_echo(secret: str) -> str:
    return secret
