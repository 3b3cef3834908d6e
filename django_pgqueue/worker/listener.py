"""The listener: how an idle claimer is woken, and only for its own queues.

It LISTENs on the claimer's own connection, so a wake-up costs no extra thread and no
extra backend: the notification arrives on the socket the claimer is about to claim on.
A pipe lets the rest of the process wake the claimer too (stop, a freed slot).

Every queue notifies on one of 64 channels, ``pgqueue_<hashtext(queue) & 63>`` (the
statements of db/sql/ compute it; ``listen_channels`` asks the database for ours, so the
hash is never re-implemented in Python), with the queue's name as payload. The claimer
LISTENs only on its queues' channels, so the server does not even deliver other
queues' notifications to it; one that shares a channel is read off the socket and
ignored without waking the claimer (no database statement is run for it).

A single enqueue notifies only while a claimer of its channel is parked (a NOTIFY
serialises commits on the server; contract.sql, "Wake-ups", has the protocol): the claimer
takes the parked mark and passes the in-flight check (``prepare_park``) before it parks,
and drops the mark once it is busy again (``release_park``). The mark is a session lock
on the claimer's connection, so a lost connection or a killed worker drops it.

Notifications are best-effort (the claimer also polls), so after every (re)connect the
claimer is woken once in case one was missed. A notification that arrives while a
claim is running is kept (psycopg hands it to ``_on_notify``), so the wake-up that
raced with the claim is not lost.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from django_pgqueue.db.sql import QUERIES

# The payload of schedules.sql's schedules_changed: no queue name has a space.
SCHEDULES_CHANGED = "schedules changed"


class Listener:
    name = "listener"

    def __init__(self, queues: list[str]) -> None:
        self.queues = set(queues)
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._pending = False
        self._channels: list[int] = []  # the channel numbers of our queues
        self._held: set[int] = set()  # channels whose parked mark this connection holds
        self.park_ready = False  # marked on every channel, and no enqueue left unsure
        # Called when a schedule changed (the scheduler's poke), and after each (re)connect,
        # in case a notification was missed meanwhile.
        self.on_schedules: list[Callable[[], None]] = []

    def attach(self, conn: psycopg.Connection) -> None:
        """On each new claimer connection: LISTEN, and count it as a wake-up."""
        queues = {"queues": sorted(self.queues)}
        rows = conn.execute(QUERIES["listen_channels"], queues).fetchall()
        for channel, _number in rows:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        conn.add_notify_handler(self._on_notify)
        self._channels = sorted(number for _channel, number in rows)
        self._held = set()  # a new session holds no lock
        self._schedules_changed()
        self.park_ready = False
        self._pending = True

    def prepare_park(self, conn: psycopg.Connection) -> bool:
        """Take the parked mark on our channels and check that no enqueue that could
        have missed it is in flight. True: claim once more, then park at will. False:
        retry shortly (an enqueue that did not notify may still commit)."""
        params = {"channels": self._channels, "held": sorted(self._held)}
        statuses = dict(conn.execute(QUERIES["park_prepare"], params).fetchall())
        self._held = {number for number, status in statuses.items() if status != "unmarked"}
        self.park_ready = all(status == "clear" for status in statuses.values())
        return self.park_ready

    @property
    def parked_mark(self) -> bool:
        return bool(self._held)

    def release_park(self, conn: psycopg.Connection) -> None:
        """Busy again: enqueues need not notify us."""
        self.park_ready = False
        if self._held:
            held, self._held = sorted(self._held), set()
            conn.execute(QUERIES["park_release"], {"channels": held}).fetchall()

    def wake(self) -> None:
        """Wake the claimer from another thread."""
        with contextlib.suppress(BlockingIOError):  # already has a byte waiting
            os.write(self._write, b"!")

    def clear(self) -> None:
        """Forget past wake-ups: called right before a claim, which will see their rows."""
        self._pending = False
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 512):
                pass

    def wait(self, conn: psycopg.Connection | None, timeout: float) -> None:
        """Block until a notification for one of our queues, a wake(), or ``timeout``.

        Traffic on the socket that is not for our queues (another queue sharing a
        channel) is consumed and the wait goes on: it never costs a claim.
        """
        deadline = time.monotonic() + max(0.0, timeout)
        while not self._pending:
            sockets = [self._read]
            if conn is not None and not conn.closed:
                sockets.append(conn.fileno())
            left = deadline - time.monotonic()
            if left <= 0:
                return
            readable, _, _ = select.select(sockets, [], [], left)
            if not readable:
                return
            if self._read in readable:
                return
            self._drain(conn)

    def _drain(self, conn: psycopg.Connection) -> None:
        pgconn = conn.pgconn
        pgconn.consume_input()  # raises if the connection broke: the next claim reconnects
        while (notify := pgconn.notifies()) is not None:
            payload = notify.extra.decode()
            if payload in self.queues:
                self._pending = True
            elif payload == SCHEDULES_CHANGED:
                self._schedules_changed()

    def _on_notify(self, notify: psycopg.Notify) -> None:
        if notify.payload in self.queues:
            self._pending = True
        elif notify.payload == SCHEDULES_CHANGED:
            self._schedules_changed()

    def _schedules_changed(self) -> None:
        for callback in self.on_schedules:
            callback()

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)
