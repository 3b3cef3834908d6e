"""A PgBouncer in transaction pooling mode in front of the test server, for the tests.

Debian's ``pgbouncer`` package; it refuses to run as root, so as root it drops to the
``postgres`` user, or to the embedded server's own (``-u``). The pool is small (3
server connections), so clients share server connections as they would in production:
a statement that relied on session state from an earlier one would find another
session.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

POOL_SIZE = 3


def available() -> bool:
    return shutil.which("pgbouncer") is not None or Path("/usr/sbin/pgbouncer").exists()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PgBouncer:
    """``with PgBouncer(server) as bouncer:`` listens on ``bouncer.port``; ``server``
    is the test server's (host, port) or Unix socket path (conftest.server_address)."""

    def __init__(self, server: tuple[str, int] | str, pool_size: int = POOL_SIZE) -> None:
        if isinstance(server, tuple):
            host, port = server
        else:  # .../.s.PGSQL.5432
            host, port = os.path.dirname(server), int(server.rsplit(".", 1)[1])
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        os.chmod(self.dir, 0o777)
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 500\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
        )
        for path in self.dir.iterdir():
            os.chmod(path, 0o666)
        self._binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        # As root it must drop to a user: the one that can reach the server's socket
        # (the embedded server's directory is its own user's), or postgres.
        owner = "postgres" if isinstance(server, tuple) else pwd.getpwuid(os.stat(host).st_uid)[0]
        self._user = ["-u", owner] if os.geteuid() == 0 else []
        self._spawn()

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(
            [self._binary, *self._user, str(self.dir / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start:\n{self.log()}") from None
                time.sleep(0.05)

    def _stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def restart(self) -> None:
        """Stop the pooler (every client connection drops) and start it again on the
        same port, as a deploy or a crash and its supervisor would."""
        self._stop()
        self._spawn()

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        self._stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
