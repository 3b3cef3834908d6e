"""Tasks of tests/test_workflows.py: steps that record their runs in the ledger."""

from __future__ import annotations

import os
import time

from django_pgqueue import Suspend, TaskContext, task
from tests.ledger import LEDGER_ENV, append, ledger_path


def _note(context: TaskContext, **extra) -> None:
    if not os.environ.get(LEDGER_ENV):  # only the tests that read the ledger keep one
        return
    append(ledger_path(), {"event": "run", "task": context.task_id, "attempt": context.attempt,
                           "t": time.time(), **extra})  # fmt: skip


@task(takes_context=True)
def step(context: TaskContext, label: str, seconds: float = 0.0, fail: bool = False) -> str:
    _note(context, label=label)
    time.sleep(seconds)
    if fail:
        raise RuntimeError(f"step {label} failed (on purpose)")
    return label


@task(takes_context=True, max_attempts=1)
def fail_once(context: TaskContext, label: str) -> str:
    """Fails for good: max_attempts=1."""
    _note(context, label=label)
    raise RuntimeError(f"{label} failed for good")


@task(takes_context=True)
def collect(context: TaskContext, label: str) -> dict:
    """Returns what its parents returned (and how they ended)."""
    _note(context, label=label)
    results = context.parent_results()
    return {str(k): [v["state"], v["result"]] for k, v in sorted(results.items())}


@task(takes_context=True)
def wait_for_signal(context: TaskContext, name: str, timeout: float | None = None) -> dict:
    """Suspends until ``name`` arrives (once); then reports what woke it."""
    _note(context, label="wait_for_signal", wake=context.wake)
    if context.wake is None:
        raise Suspend(name, timeout=timeout, checkpoint={"suspended_on": context.attempt})
    return {"wake": context.wake, "signals": context.signals, "checkpoint": context.checkpoint,
            "attempt": context.attempt, "timed_out": context.timed_out}  # fmt: skip


@task(takes_context=True)
def parent_of_child(context: TaskContext, n: int) -> dict:
    """Enqueues a child, suspends until it ends, then returns the child's result."""
    _note(context, label="parent_of_child", wake=context.wake)
    if context.checkpoint is None:
        child = step.enqueue(f"child of {context.task_id}", 0.3)
        context.wait_for(child, checkpoint={"child": child})
    child = context.checkpoint["child"]
    return {"child": child, "result": context.parent_results()[child]["result"],
            "wake": context.wake}  # fmt: skip
