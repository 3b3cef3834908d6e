"""The worker's own PostgreSQL connections: one per component, reconnecting with backoff.

The worker's components do not use Django's per-thread connections: they need
autocommit, server-side parameter binding and prepared statements for the hot path, and
they must survive a PostgreSQL restart without disturbing handler threads.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from django.db import connections

from django_pgqueue.conf import get_settings
from django_pgqueue.sql import QUERIES

logger = logging.getLogger("django_pgqueue.worker")

T = TypeVar("T")

# Errors that mean "the connection (or the server) went away": reconnect and retry.
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)


def connection_params(alias: str) -> dict[str, Any]:
    """psycopg.connect() keyword arguments for a Django database alias."""
    params = dict(connections[alias].get_connection_params())
    # Django's adapters load jsonb as text (JSONField parses it later); the worker wants
    # plain psycopg loading (jsonb -> Python objects, timestamptz -> aware datetime).
    params.pop("context", None)
    params.pop("cursor_factory", None)
    params.pop("pool", None)
    prepared = get_settings().PREPARED_STATEMENTS
    params["prepare_threshold"] = 0 if prepared else None
    # Every statement of the worker is written to walk an index in order (the claim's
    # top-N, the sweep, next-due, the prune), whatever the table's statistics say. With
    # stale statistics (a bulk enqueue into a table last analyzed when it was empty) the
    # planner once chose a bitmap scan and a sort of the whole backlog for the claim:
    # 0.8 s per claim instead of 0.3 ms. Disabling those two plan shapes on the worker's
    # own connections keeps the plans index-ordered; the EXPLAIN tests pin them.
    options = ["-c enable_sort=off", "-c enable_bitmapscan=off"]
    if prepared:
        # PostgreSQL would otherwise re-plan the claim on every execution (its custom
        # plans look cheaper than the generic one), which costs more than the claim.
        options.append("-c plan_cache_mode=force_generic_plan")
    extra = " ".join(options)
    params["options"] = f"{params['options']} {extra}" if params.get("options") else extra
    params.setdefault("connect_timeout", 5)
    params.setdefault("application_name", "django_pgqueue worker")
    return params


def connect(alias: str, durable: bool = True) -> psycopg.Connection:
    """An autocommit connection. ``durable=False`` commits asynchronously.

    Asynchronous commit is used only where losing the last few hundred milliseconds of
    commits in a PostgreSQL crash cannot break a guarantee: the claim and the lease
    renewals. A claim lost that way puts its rows back to pending with their old
    token, so the worker's fenced settlement matches nothing (counted as lost) and the
    task runs again: a duplicate run, which at-least-once delivery already admits.
    WAL is written in order, so a (synchronously committed) settlement can never be
    durable while the claim before it is not. Settlements stay durable: a task is never
    reported done before its row is safely written.
    """
    params = connection_params(alias)
    if not durable:
        extra = "-c synchronous_commit=off"
        params["options"] = f"{params['options']} {extra}" if params.get("options") else extra
    return psycopg.connect(**params, autocommit=True)


class Backoff:
    """Exponential backoff with full jitter, for reconnect loops."""

    def __init__(self, initial: float = 0.1, cap: float = 5.0) -> None:
        self.initial = initial
        self.cap = cap
        self.failures = 0

    def next_delay(self) -> float:
        self.failures += 1
        ceiling = min(self.cap, self.initial * 2 ** (self.failures - 1))
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


class Session:
    """One component's connection. ``run`` executes a named query, reconnecting on loss.

    ``run`` retries until it succeeds or ``stop`` is set; callers pass ``retry=False``
    where a failed statement must be reported rather than repeated.
    """

    def __init__(
        self,
        alias: str,
        name: str,
        stop: threading.Event,
        durable: bool = True,
        on_connect: Callable[[psycopg.Connection], None] | None = None,
    ) -> None:
        self.alias = alias
        self.durable = durable
        self.name = name
        self.stop = stop
        self.on_connect = on_connect
        self._conn: psycopg.Connection | None = None
        self._backoff = Backoff()

    @property
    def connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            conn = connect(self.alias, self.durable)
            if self.on_connect is not None:
                self.on_connect(conn)
            self._conn = conn
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a broken socket may raise
                self._conn.close()
            self._conn = None

    def fetchall(self, query: str, params: dict[str, Any] | None = None) -> list[tuple]:
        return self.call(lambda conn: conn.execute(QUERIES[query], params).fetchall())

    def call(self, work: Callable[[psycopg.Connection], T], retry: bool = True) -> T:
        while True:
            try:
                result = work(self.connection)
                if self._backoff.failures:
                    logger.info("%s: database connection restored", self.name)
                self._backoff.reset()
                return result
            except CONNECTION_ERRORS as exc:
                self.close()
                delay = self._backoff.next_delay()
                logger.warning(
                    "%s: database unavailable (%s); retrying in %.2fs",
                    self.name,
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                    delay,
                )
                if not retry or self.stop.wait(delay):
                    raise
