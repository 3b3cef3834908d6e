"""A TCP proxy in front of PostgreSQL that a test can cut, to simulate a server restart.

``cut()`` drops every proxied connection and refuses new ones (like a server that is
down); ``restore()`` accepts again. Works with a TCP server or the embedded server's
Unix socket behind it.
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
        self._closed = False
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
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
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._up.is_set():
                client.close()  # the "server" is down: connection refused/reset
                continue
            try:
                upstream = self._connect_upstream()
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
                self.connections_made += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while True:
                for key, _ in sel.select(timeout=0.5):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.close()

    def cut(self) -> None:
        self._up.clear()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def restore(self) -> None:
        self._up.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()
