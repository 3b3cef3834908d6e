"""How the task list counts its rows.

Django's list runs a ``count(*)`` of what it shows, for its paginator: on a table of
10,000,000 tasks that reads every row (about 4 s on a 2-core machine), on each view of
the unfiltered list, the page operators open first. The task list's paginator asks
the planner's estimate instead (``task_count_estimate``) when nothing filters the list
and the estimate is above ``ADMIN_COUNT_ESTIMATE_ABOVE``, and the page says *about*.
A filtered or searched list is counted exactly (its filters bound the count: an
indexed state, a window of ids), as is a table below the setting or never analyzed.
"""

from __future__ import annotations

from functools import cached_property

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet

from django_pgqueue.core.conf import get_settings
from django_pgqueue.db.sql import QUERIES


def estimated_tasks(alias: str) -> int | None:
    """The planner's estimate of the task table's rows on ``alias`` (None before its
    first ANALYZE)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(QUERIES["task_count_estimate"])
        (estimate,) = cursor.fetchone()
    return estimate


class TaskPaginator(Paginator):
    """The task list's pages: ``count`` is an estimate (and ``estimated`` True) for an
    unfiltered list of a table larger than ADMIN_COUNT_ESTIMATE_ABOVE.

    A page past the estimate's end is empty, and the last rows may lie past the last
    page link when the estimate is low: the list is ordered newest first, so those are
    the oldest tasks, which a filter or the date drill-down reaches."""

    estimated = False

    @cached_property
    def count(self) -> int:
        above = get_settings().ADMIN_COUNT_ESTIMATE_ABOVE
        rows = self.object_list
        if above is not None and isinstance(rows, QuerySet) and not rows.query.where:
            estimate = estimated_tasks(rows.db)
            if estimate is not None and estimate > above:
                self.estimated = True
                return estimate
        return super().count
