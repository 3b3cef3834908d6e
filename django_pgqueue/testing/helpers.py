"""The helpers as one object: what the ``pgqueue`` pytest fixture returns."""

from __future__ import annotations

from django_pgqueue.testing.assertions import assert_enqueued, enqueued, refute_enqueued
from django_pgqueue.testing.runner import drain, run_tasks


class PgQueue:
    """``django_pgqueue.testing``'s functions as methods, for a fixture to hand out."""

    assert_enqueued = staticmethod(assert_enqueued)
    refute_enqueued = staticmethod(refute_enqueued)
    enqueued = staticmethod(enqueued)
    run_tasks = staticmethod(run_tasks)
    drain = staticmethod(drain)
