"""The listener: how an idle claimer is woken.

It LISTENs on the claimer's own connection, so a wake-up costs no extra thread and no
extra backend: the notification arrives on the socket the claimer is about to claim on.
A pipe lets the rest of the process wake the claimer too (stop, a freed slot).

Notifications are best-effort (the claimer also polls), so after every (re)connect the
claimer is woken once in case one was missed. A notification that arrives while a
claim is running is kept (psycopg hands it to ``_on_notify``), so the wake-up that
raced with the claim is not lost.
"""

from __future__ import annotations

import contextlib
import os
import select

import psycopg

CHANNEL = "pgqueue"


class Listener:
    name = "listener"

    def __init__(self, queues: list[str]) -> None:
        self.queues = set(queues)
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._pending = False

    def attach(self, conn: psycopg.Connection) -> None:
        """On each new claimer connection: LISTEN, and count it as a wake-up."""
        conn.execute(f"LISTEN {CHANNEL}")
        conn.add_notify_handler(self._on_notify)
        self._pending = True

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
        """Block until a notification for one of our queues, a wake(), or ``timeout``."""
        if self._pending:
            return
        sockets = [self._read]
        if conn is not None and not conn.closed:
            sockets.append(conn.fileno())
        readable, _, _ = select.select(sockets, [], [], max(0.0, timeout))
        if conn is not None and not conn.closed and conn.fileno() in readable:
            self._drain(conn)

    def _drain(self, conn: psycopg.Connection) -> None:
        pgconn = conn.pgconn
        pgconn.consume_input()  # raises if the connection broke: the next claim reconnects
        while (notify := pgconn.notifies()) is not None:
            if notify.extra.decode() in self.queues:
                self._pending = True

    def _on_notify(self, notify: psycopg.Notify) -> None:
        if notify.payload in self.queues:
            self._pending = True

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)
