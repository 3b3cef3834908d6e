"""Batch handlers: a task whose handler takes a list of calls (docs/tenants.md).

::

    @task(batch_size=100, batch_wait=1.0)
    def send_emails(batch: list[BatchCall]) -> None:
        replies = api.send_many([call.kwargs for call in batch])
        for call, reply in zip(batch, replies):
            if reply.failed:
                call.fail(RuntimeError(reply.error))   # retried by its own policy

    send_emails.enqueue(to="a@example.com", subject="Hi")   # one call, one task row

Each call is a task of its own (its row, attempts, lease and outcome); the worker hands
the handler up to ``batch_size`` of them at once. A call the handler marks failed
(``fail``) follows its own retry policy; the others succeed, with their ``result``. A
handler that raises fails every call of the batch (each by its own policy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class BatchCall:
    """One call of a batch: the task's id and attempt, and the arguments it was
    enqueued with. Set ``result`` to store a result for it; ``fail(exc)`` to fail it."""

    task_id: int
    attempt: int
    max_attempts: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    error: BaseException | None = None

    def fail(self, exc: BaseException) -> None:
        """This call failed with ``exc``: it is retried by its task's policy (or dead
        letters), whatever the other calls of the batch did."""
        if not isinstance(exc, BaseException):
            raise TypeError(f"fail() takes an exception, not {type(exc).__name__}")
        self.error = exc

    @property
    def failed(self) -> bool:
        return self.error is not None
