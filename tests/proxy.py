"""A TCP proxy in front of PostgreSQL that a test can cut or stall, to simulate outages.

``cut()`` drops every proxied connection and refuses new ones (like a server that is
down); ``restore()`` accepts again.

``stall()`` simulates a failover whose old flows are black-holed (packets dropped, no
RST): every connection open at that moment, and every connection made until
``restore()``, stops forwarding in both directions for good, yet no socket is closed.
This proxy's kernel still acknowledges whatever the client sends, so TCP keepalives
and ``tcp_user_timeout`` cannot see it: only a client-side deadline can. After
``restore()`` new connections forward again (the "new primary"); the stalled ones stay
silent until the client closes them or the proxy is closed.

Works with a TCP server or the embedded server's Unix socket behind it.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading


class CuttableProxy:
    def __init__(self, target: tuple[str, int] | str) -> None:
        self.target = target
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._up = threading.Event()
        self._up.set()
        self._stalled = False
        self._closing = threading.Event()
        # Every open client or upstream socket, with the event that stalls its connection.
        self._open: dict[socket.socket, threading.Event] = {}
        self._lock = threading.Lock()
        self.connections_made = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.target, str):
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.connect(self.target)
        return upstream

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._up.is_set():
                client.close()  # the "server" is down: connection refused/reset
                continue
            stalled = threading.Event()
            with self._lock:
                self._open[client] = stalled
                if self._stalled:
                    stalled.set()  # a black hole from its first byte
                    continue
            try:
                upstream = self._connect_upstream()
            except OSError:
                self._close(client)
                continue
            with self._lock:
                self._open[upstream] = stalled
                self.connections_made += 1
            threading.Thread(
                target=self._pump, args=(client, upstream, stalled), daemon=True
            ).start()

    def _pump(self, a: socket.socket, b: socket.socket, stalled: threading.Event) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while not stalled.is_set():
                for key, _ in sel.select(timeout=0.1):
                    if stalled.is_set():
                        break
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    key.data.sendall(data)
            self._closing.wait()  # stalled: forward nothing, close nothing
        except OSError:
            return
        finally:
            sel.close()
            self._close(a)
            self._close(b)

    def _close(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.pop(sock, None)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()

    def cut(self) -> None:
        self._up.clear()
        with self._lock:
            sockets = list(self._open)
        for sock in sockets:
            self._close(sock)

    def stall(self) -> None:
        with self._lock:
            self._stalled = True
            for stalled in self._open.values():
                stalled.set()

    def restore(self) -> None:
        with self._lock:
            self._stalled = False
        self._up.set()

    def close(self) -> None:
        self._closing.set()
        self.cut()
        self._listener.close()
