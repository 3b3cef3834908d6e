"""Tasks of tests/test_sizes.py: values over the size limits, made in the handler.
Worker subprocesses import this module (TASK_MODULES)."""

from django_pgqueue import Continue, TaskContext, task

MB = 1_000_000


@task(max_attempts=2)
def return_megabytes(megabytes: int) -> str:
    return "x" * (megabytes * MB)


@task(takes_context=True, max_attempts=1)
def save_big_checkpoint(context: TaskContext, size: int) -> None:
    context.save_checkpoint({"seen": "x" * size})


@task(takes_context=True, max_attempts=3)
def continue_with_big_checkpoint(context: TaskContext, size: int) -> None:
    raise Continue({"seen": "x" * size})


@task(max_attempts=1)
def raise_long_message(size: int) -> None:
    raise ValueError("y" * size)


@task
def measure(blob: str) -> int:
    return len(blob)
