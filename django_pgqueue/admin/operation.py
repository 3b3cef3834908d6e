"""What the admin does to chosen tasks: retry now, cancel, requeue, delete.

Each is one ``Operation``, used three ways: a list action on the selected tasks and a
button on a task's page (both ``run``, tasks.py), and "Select all" over every task a
filter matches, in batches (``batch``, writing ``history`` on each changed task:
bulk.py). tasks.py lists them, in ``OPERATIONS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest


@dataclass(frozen=True)
class Operation:
    name: str
    label: str
    permission: str  # "change" or "delete"
    applies_to: tuple[str, ...]  # the states it can change
    # The chosen tasks, with their messages and history: (the TaskAdmin, request, ids).
    run: Callable[[Any, HttpRequest, list[int]], None]
    # One batch of a bulk run, in its transaction: (database, ids) -> (changed ids,
    # ids whose cancellation was requested).
    batch: Callable[[str, list[int]], tuple[list[int], list[int]]]
    # The words a bulk run writes in each changed task's history.
    history: str

    @property
    def deletes(self) -> bool:
        """The rows go: a bulk run reads what their history names before."""
        return self.permission == "delete"
