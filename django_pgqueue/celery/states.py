"""Celery's task states (``celery.states``), and how a row's state reads in them.

==============  ==========================================================
Celery state    the row
==============  ==========================================================
PENDING         scheduled, pending or waiting (or no row: an unknown id, or
                a row pruned by retention, reads PENDING, as in Celery)
RETRY           scheduled or pending again after a failed attempt
STARTED         running (always tracked: ``track_started`` is implied)
SUCCESS         succeeded
FAILURE         failed
REVOKED         cancelled (by revoke(), an expiry, or a failed parent)
==============  ==========================================================

A running task that called ``self.update_state(state="PROGRESS", meta=...)`` reads
that state until it ends.
"""

from __future__ import annotations

PENDING = "PENDING"
RECEIVED = "RECEIVED"
STARTED = "STARTED"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
REVOKED = "REVOKED"
REJECTED = "REJECTED"
RETRY = "RETRY"
IGNORED = "IGNORED"

READY_STATES = frozenset({SUCCESS, FAILURE, REVOKED})
UNREADY_STATES = frozenset({PENDING, RECEIVED, STARTED, REJECTED, RETRY})
EXCEPTION_STATES = frozenset({RETRY, FAILURE, REVOKED})
PROPAGATE_STATES = frozenset({FAILURE, REVOKED})
ALL_STATES = frozenset({PENDING, RECEIVED, STARTED, SUCCESS, FAILURE, RETRY, REVOKED})


def celery_state(state: str | None, attempt: int, errors: list | None) -> str:
    """The Celery state of a row in ``state`` (None: no row)."""
    if state in ("scheduled", "pending"):
        return RETRY if attempt > 0 and errors else PENDING
    return {
        "running": STARTED,
        "succeeded": SUCCESS,
        "failed": FAILURE,
        "cancelled": REVOKED,
    }.get(state or "", PENDING)
