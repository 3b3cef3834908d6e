"""A proxy in front of PostgreSQL that loses the reply to one statement after it committed.

``ReplyLosingProxy.lose_reply_to(marker)`` arms a one-shot fault: the first statement
whose text contains ``marker`` is forwarded to the server and executed (in autocommit
the server commits it at the Sync that follows the Execute), but everything the server
sends back from the Execute on is swallowed, and once the server's ReadyForQuery ('Z')
has gone by, both sides of that connection are closed. The client sees a connection
lost mid-statement; the database has the statement's effects: the lost reply of a
committed statement, as after a network failure or a server crash at the wrong moment.

The statement text travels in the Parse message the first time a connection runs a
prepared statement (or in every Parse, or in a simple Query), so after the client
reconnects its retry carries the marker again: the fault fires once per arming.

The proxy reads the frontend/backend protocol message by message. It answers an
SSLRequest or GSSENCRequest with "N" itself, so the conversation stays plain text.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

# Untyped startup-phase request codes (the int32 after the length).
_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_PROTOCOL_3 = 196608


class _Messages:
    """Splits one direction of a protocol stream into whole messages."""

    def __init__(self, typed: bool) -> None:
        self.typed = typed
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        messages = []
        while True:
            header = 5 if self.typed else 4
            if len(self._buffer) < header:
                return messages
            length = int.from_bytes(self._buffer[header - 4 : header], "big")
            size = length + (1 if self.typed else 0)
            if len(self._buffer) < size:
                return messages
            messages.append(bytes(self._buffer[:size]))
            del self._buffer[:size]


class ReplyLosingProxy:
    """A TCP proxy to ``target``, (host, port) or a Unix socket path, on 127.0.0.1:port."""

    def __init__(self, target: tuple[str, int] | str) -> None:
        self.target = target
        self._marker: bytes | None = None
        self._arm_lock = threading.Lock()
        self.fired = threading.Event()
        self._closing = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stop accepting; open connections end at their next poll."""
        self._closing.set()
        self._listener.close()

    def lose_reply_to(self, marker: str) -> None:
        """Lose the reply of the next statement whose text contains ``marker`` (once)."""
        with self._arm_lock:
            self._marker = marker.encode()
        self.fired.clear()

    def _take_fault(self, message: bytes) -> bool:
        with self._arm_lock:
            if self._marker is None or self._marker not in message:
                return False
            self._marker = None
            return True

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            family = socket.AF_UNIX if isinstance(self.target, str) else socket.AF_INET
            upstream = socket.socket(family, socket.SOCK_STREAM)
            try:
                upstream.connect(self.target)
            except OSError:
                client.close()
                upstream.close()
                continue
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        from_client = _Messages(typed=False)
        from_server = _Messages(typed=True)
        # ReadyForQuery messages asked for (one for the startup, one per Sync or Query)
        # and received: the one that answers the Sync after the marked Execute is the
        # commit point.
        asked, answered = 1, 0
        triggered = False
        commit_at: int | None = None
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ)
        sel.register(upstream, selectors.EVENT_READ)
        try:
            while not self._closing.is_set():
                for key, _ in sel.select(timeout=0.1):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    if key.fileobj is client:
                        for message in from_client.feed(data):
                            if not from_client.typed:
                                code = int.from_bytes(message[4:8], "big")
                                if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                                    client.sendall(b"N")  # no encryption: stay readable
                                    continue
                                from_client.typed = code == _PROTOCOL_3
                            else:
                                kind = message[:1]
                                if kind in (b"S", b"Q"):
                                    asked += 1
                                if not triggered and self._take_fault(message):
                                    triggered = True
                                if triggered and commit_at is None and kind in (b"E", b"Q"):
                                    commit_at = asked + 1 if kind == b"E" else asked
                            upstream.sendall(message)
                        continue
                    for message in from_server.feed(data):
                        if message[:1] == b"Z":
                            answered += 1
                        if commit_at is None:
                            client.sendall(message)
                        elif answered >= commit_at:
                            self.fired.set()
                            return  # the statement committed; its reply never arrives
        except OSError:
            return
        finally:
            sel.close()
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
