"""Direct calls of the named SQL, as a worker makes them (for tests of the contract)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg

from django_pgqueue.core.limits import QueueLimit
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.tasking.registry import registry
from django_pgqueue.worker.claimed import ClaimedTask
from django_pgqueue.worker.claimer import _fetch, claim_statement, route_params, stage_params


def all_routes() -> list[tuple[str, int]]:
    return [(d.name, d.version) for d in registry.all()]


def claim(
    conn: psycopg.Connection,
    limit: int = 1,
    worker_id: str = "w1",
    *,
    queue: str | list[str] = "default",
    routes: list[tuple[str, int]] | None = None,
    lease: float = 30,
    starvation: float = 3600,
    batch_bytes: int | None = None,
    fair: bool = False,
    look_for_starving: bool = True,
    statement: str | None = None,
    limits: dict[str, QueueLimit] | None = None,
    key_limits: dict[tuple[str, int], int] | None = None,
    key_rates: dict[tuple[str, int], Any] | None = None,
) -> list[ClaimedTask]:
    """One claim statement, as the worker's claimer runs it (after staging due rows).
    ``fair``: the routes of fair tasks are claimed as fair (as a worker does).
    ``look_for_starving``: as a claim in the starvation escape's window (the full
    ``claim``); False, as the worker's other claims (``claim_plain`` or ``claim_fair``
    where the routes have no limits: worker/claimer.py, claim_statement). ``statement``:
    the statement these parameters must choose (a test of one statement fails, rather
    than testing another, when they do not). ``limits`` and ``key_limits``: the
    worker's QUEUE_LIMITS (parsed) and its routes' per-key limits; ``key_rates``: their
    per-key rates (parsed)."""
    queues = [queue] if isinstance(queue, str) else queue
    conn.execute(QUERIES["stage"], stage_params(queues, 1000))
    fair_routes = {(d.name, d.version) for d in registry.all() if d.fair_key} if fair else None
    params = {
        **route_params(queues, all_routes() if routes is None else routes, starvation,
                       limits, key_limits, claim_batch_bytes=batch_bytes,
                       fair_routes=fair_routes, key_rates=key_rates),
        "look_for_starving": look_for_starving,
        "limit": limit,
        "token": str(uuid.uuid4()),
        "lease_seconds": lease,
        "worker_id": worker_id,
    }
    chosen = claim_statement(params)
    assert statement is None or chosen == statement, (chosen, statement)
    return _fetch(conn, chosen, params)


def settle(conn: psycopg.Connection, outcomes: list[dict[str, Any]]) -> dict[int, str]:
    params = {"outcomes": json.dumps(outcomes), "limit_queues": [], "limit_concurrency": []}
    rows = conn.execute(QUERIES["settle"], params).fetchall()
    return {r[0]: r[3] for r in rows}


def success(task: ClaimedTask, result: Any = None) -> dict[str, Any]:
    return {
        "id": task.id,
        "attempt": task.attempt,
        "token": task.lease_token,
        "label": "success",
        "state": "succeeded",
        "result": result,
    }


def expire_lease(conn: psycopg.Connection, task_id: int) -> None:
    conn.execute(
        "UPDATE pgqueue_task SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
        [task_id],
    )


def sweep(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute(QUERIES["recover_expired_leases"], {"limit": 100}).fetchall()


def row(conn: psycopg.Connection, task_id: int) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM pgqueue_task WHERE id = %s", [task_id])
    names = [c.name for c in cur.description]
    return dict(zip(names, cur.fetchone(), strict=True))
