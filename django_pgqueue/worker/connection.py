"""The worker's own PostgreSQL connections: one per component, reconnecting with backoff.

The worker's components do not use Django's per-thread connections: they need
autocommit, server-side parameter binding and prepared statements for the hot path, and
they must survive a PostgreSQL restart without disturbing handler threads.

No wait on the server is unbounded (DEAD_CONNECTION_TIMEOUT, docs/worker.md): a
connection attempt has ``connect_timeout``; an idle or sending socket whose packets are
lost is dropped by the kernel (TCP keepalives, ``tcp_user_timeout``); and a statement
that has had no answer for that long is checked by the watchdog, which drops its
connection unless the server is still working on it. The last covers what the kernel
cannot see: a peer that acknowledges packets but never answers (a proxy or load
balancer in front of a failed server).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import socket
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
from django.db import connections
from psycopg.types.json import set_json_loads

from django_pgqueue.core.conf import get_settings
from django_pgqueue.db.sql import QUERIES

logger = logging.getLogger("django_pgqueue.worker")

T = TypeVar("T")

# Errors that mean "the connection (or the server) went away": reconnect and retry.
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)

# A connection attempt gives up after DEAD_CONNECTION_TIMEOUT, but never waits longer
# than this: a server that takes longer to accept a connection is as good as down.
MAX_CONNECT_TIMEOUT = 5

# How often the watchdog looks for statements that have waited too long.
WATCH_INTERVAL = 0.25


def connection_params(alias: str) -> dict[str, Any]:
    """psycopg.connect() keyword arguments for a Django database alias."""
    params = dict(connections[alias].get_connection_params())
    # Django's adapters load jsonb as text (JSONField parses it later); the worker wants
    # plain psycopg loading (jsonb -> Python objects, timestamptz -> aware datetime).
    params.pop("context", None)
    params.pop("cursor_factory", None)
    params.pop("pool", None)
    # Behind a transaction pooler (PgBouncer) consecutive statements of one client
    # connection may run on different server connections: nothing of the session may
    # be relied on, so no prepared statements and no session settings (apply those to
    # the role instead, docs/scaling.md).
    pooled = is_pooled(alias)
    prepared = get_settings().PREPARED_STATEMENTS and not pooled
    params["prepare_threshold"] = 0 if prepared else None
    # Every statement of the worker is written to walk an index in order (the claim's
    # top-N, the sweep, next-due, the prune), whatever the table's statistics say. With
    # stale statistics (a bulk enqueue into a table last analyzed when it was empty) the
    # planner once chose a bitmap scan and a sort of the whole backlog for the claim:
    # 0.8 s per claim instead of 0.3 ms. Disabling those two plan shapes on the worker's
    # own connections keeps the plans index-ordered; the EXPLAIN tests pin them. A
    # disabled plan shape is priced enormous rather than forbidden, and that price would
    # make PostgreSQL JIT-compile a statement that runs in microseconds: no JIT either.
    options = ["-c enable_sort=off", "-c enable_bitmapscan=off", "-c jit=off"]
    if prepared:
        # PostgreSQL would otherwise re-plan the claim on every execution (its custom
        # plans look cheaper than the generic one), which costs more than the claim.
        options.append("-c plan_cache_mode=force_generic_plan")
    dead_after = get_settings().DEAD_CONNECTION_TIMEOUT
    # A worker session is idle inside a transaction only between the statements of a
    # limited claim, for microseconds; one idle there longer lost its worker (a host
    # gone without closing its socket) and would hold the queue's claim lock for every
    # other worker until the server's TCP keepalive: the server ends it instead.
    options.append(f"-c idle_in_transaction_session_timeout={math.ceil(dead_after * 1000)}")
    extra = " ".join(options)
    if not pooled:
        params["options"] = f"{params['options']} {extra}" if params.get("options") else extra
    # libpq waits at least 2 s whatever it is told.
    params.setdefault("connect_timeout", max(2, math.ceil(min(dead_after, MAX_CONNECT_TIMEOUT))))
    # A socket whose packets are lost (a failover without a RST, a NAT that forgot the
    # flow): the kernel probes an idle socket after a quarter of the timeout, then every
    # quarter, and drops a socket whose probes or sent data go unacknowledged for the
    # whole timeout. So even the claimer's LISTEN socket, parked in select(), wakes with
    # an error. Ignored on Unix-domain sockets; tcp_user_timeout needs Linux.
    probe_every = max(1, round(dead_after / 4))
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", probe_every)
    params.setdefault("keepalives_interval", probe_every)
    params.setdefault("keepalives_count", 3)
    params.setdefault("tcp_user_timeout", int(dead_after * 1000))
    params.setdefault("application_name", "django_pgqueue worker")
    return params


def is_pooled(alias: str) -> bool:
    """Is ``alias`` reached through a transaction pooler (TRANSACTION_POOLER)?
    LISTEN_DATABASE never is: it is the direct address."""
    conf = get_settings()
    return conf.TRANSACTION_POOLER and alias != conf.LISTEN_DATABASE


def connect(alias: str, durable: bool = True) -> psycopg.Connection:
    """An autocommit connection. ``durable=False`` commits asynchronously.

    Every worker statement commits durably by default. Asynchronous commit (the
    ASYNC_CLAIMS setting, for the claims) is faster, but a claim
    committed that way can be forgotten by a PostgreSQL crash while its handler already
    runs: the row goes back to pending with its old token and another worker starts the
    same attempt at once, overlapping the first run without any lease having expired.
    Settlements are always durable: a task is never reported done before its row is
    safely written.
    """
    params = connection_params(alias)
    if not durable and not is_pooled(alias):
        extra = "-c synchronous_commit=off"
        params["options"] = f"{params['options']} {extra}" if params.get("options") else extra
    conn = psycopg.connect(**params, autocommit=True)
    set_json_loads(_json_loads, conn)
    return conn


_JSON = json.JSONDecoder()


def _json_loads(data: bytes) -> Any:
    """jsonb from the server (a claimed task's arguments): UTF-8, which ``json.loads``
    would first sniff for its encoding, and one JSON value without surrounding
    whitespace, which ``decode`` would look for around it, value by value."""
    text = data.decode()
    value, end = _JSON.raw_decode(text)
    if end != len(text):  # not the server's output: decode() raises the error
        return _JSON.decode(text)
    return value


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
    """One component's connection. ``call`` runs a statement, reconnecting on loss.

    ``call`` retries until it succeeds or ``stop`` is set; callers pass ``retry=False``
    where a failed statement must be reported rather than repeated. A statement that has
    waited DEAD_CONNECTION_TIMEOUT seconds for its answer is checked by the watchdog,
    which drops the connection (the statement then fails like any lost connection) unless
    the server is still running it.
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
        self.timeout = get_settings().DEAD_CONNECTION_TIMEOUT
        self._conn: psycopg.Connection | None = None
        self._backoff = Backoff()
        # What the watchdog reads and acts on, under the lock: when the statement in
        # progress is overdue, and a duplicate of the connection's socket. Shutting the
        # duplicate down wakes the blocked statement; unlike libpq's own descriptor
        # (which libpq closes when the server hangs up), it cannot be reused by another
        # connection while this session holds it.
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._socket: socket.socket | None = None
        self._backend_pid = 0
        self._dropped: str | None = None  # why the watchdog dropped the connection
        # Components that share a session (the maintenance session: worker.py) take
        # turns: one call at a time.
        self._turn = threading.RLock()
        _watchdog.watch(self)

    @property
    def connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self.close()
            conn = connect(self.alias, self.durable)
            with self._lock:
                self._conn = conn
                self._socket = socket.socket(fileno=os.dup(conn.fileno()))
                self._backend_pid = conn.info.backend_pid
            if self.on_connect is not None:
                try:
                    with self._watched():
                        self.on_connect(conn)
                except BaseException:
                    self.close()
                    raise
        return self._conn

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            sock, self._socket = self._socket, None
            self._dropped = None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a broken socket may raise
                conn.close()
        if sock is not None:
            sock.close()

    def fetchall(self, query: str, params: dict[str, Any] | None = None) -> list[tuple]:
        return self.call(lambda conn: conn.execute(QUERIES[query], params).fetchall())

    def call(self, work: Callable[[psycopg.Connection], T], retry: bool = True) -> T:
        with self._turn:
            return self._call(work, retry)

    def _call(self, work: Callable[[psycopg.Connection], T], retry: bool) -> T:
        while True:
            try:
                conn = self.connection
                with self._watched():
                    result = work(conn)
                if self._backoff.failures:
                    logger.info("%s: database connection restored", self.name)
                self._backoff.reset()
                return result
            except CONNECTION_ERRORS as exc:
                reason = self._dropped or str(exc).strip().split("\n")[0] or type(exc).__name__
                self.close()
                delay = self._backoff.next_delay()
                logger.warning(
                    "%s: database unavailable (%s)%s",
                    self.name,
                    reason,
                    f"; retrying in {delay:.2f}s" if retry else "",
                )
                if not retry or self.stop.wait(delay):
                    raise

    @contextlib.contextmanager
    def _watched(self) -> Iterator[None]:
        """Put the statement(s) run inside under the watchdog's eye."""
        with self._lock:
            self._deadline = time.monotonic() + self.timeout
        try:
            yield
        finally:
            with self._lock:
                self._deadline = None

    def _overdue(self, now: float) -> tuple[float, int] | None:
        """(deadline, backend pid) of a statement past its deadline, for the watchdog."""
        with self._lock:
            if (
                self._deadline is None
                or now < self._deadline
                or self._socket is None
                or self._dropped is not None
            ):
                return None
            return self._deadline, self._backend_pid

    def _give_more_time(self, deadline: float, now: float) -> None:
        """The server is running the statement: look again one timeout from now."""
        with self._lock:
            if self._deadline == deadline:
                self._deadline = now + self.timeout

    def _drop(self, deadline: float, why: str) -> None:
        """Wake the blocked statement with a dead socket (it raises OperationalError)."""
        with self._lock:
            if self._deadline != deadline or self._socket is None:
                return  # that statement has finished meanwhile
            self._dropped = f"no answer in {self.timeout:g}s and {why}; connection dropped"
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """One thread per process that bounds how long any Session waits for an answer.

    Every WATCH_INTERVAL it collects the statements past their deadline and asks the
    server, on a fresh connection, whether their backends are still running them. It
    drops the connections whose backend is not, and all of them when the server does
    not answer that question either.
    """

    def __init__(self) -> None:
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, session: Session) -> None:
        with self._lock:
            self._sessions.add(session)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="pgqueue-watchdog", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(WATCH_INTERVAL)
            try:
                self.check()
            except Exception:
                logger.exception("watchdog: check failed; will retry")

    def check(self) -> None:
        now = time.monotonic()
        with self._lock:
            sessions = list(self._sessions)
        overdue: dict[str, list[tuple[Session, float, int]]] = defaultdict(list)
        for session in sessions:
            if (late := session._overdue(now)) is not None:
                overdue[session.alias].append((session, *late))
        for alias, waits in overdue.items():
            timeout = min(session.timeout for session, _, _ in waits)
            working = _working_backends(alias, [pid for _, _, pid in waits], timeout)
            for session, deadline, pid in waits:
                if working is None:
                    session._drop(deadline, "the server does not answer a new connection")
                elif pid not in working:
                    session._drop(deadline, "the server is not running the statement")
                else:
                    logger.debug("%s: slow statement, but the server is running it", session.name)
                    session._give_more_time(deadline, now)


def _working_backends(alias: str, pids: list[int], timeout: float) -> set[int] | None:
    """Which of ``pids`` are running a statement; None if the server does not answer."""
    params = connection_params(alias)
    params["application_name"] = "django_pgqueue watchdog"
    try:
        with psycopg.connect(**params, autocommit=True) as conn:
            # This connection may be stalled too: bound the question like the statements.
            sock = socket.socket(fileno=os.dup(conn.fileno()))
            timer = threading.Timer(timeout, _shutdown_socket, (sock,))
            timer.start()
            try:
                rows = conn.execute(QUERIES["working_backends"], {"pids": pids}).fetchall()
            finally:
                timer.cancel()
                sock.close()
    except psycopg.Error:
        return None
    return {pid for (pid,) in rows}


def _shutdown_socket(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


_watchdog = _Watchdog()
