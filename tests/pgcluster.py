"""A private PostgreSQL cluster that a test may crash: initdb + pg_ctl in a temporary directory.

The outage tests in test_outage.py cut a TCP proxy; this is the real thing: the server
the workers talk to is stopped (``immediate`` = a crash: shared memory, and with it any
WAL not yet written, is gone; ``fast`` = a clean shutdown that disconnects every client)
and started again, with crash recovery, on the same port.

The tools come from ``pg_config --bindir``. initdb and the server refuse to run as root:
as root, every PostgreSQL command runs as the ``postgres`` OS user (``runuser``), which
owns the temporary directory. Without the tools (or, as root, without that user) the
tests that need a cluster are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "on",
    "synchronous_commit": "on",
    "shared_buffers": "'16MB'",
    "max_connections": "100",
    "log_min_messages": "warning",
}


class ClusterUnavailable(Exception):
    """The PostgreSQL server binaries (or, as root, a ``postgres`` user) are missing."""


def find_bindir() -> Path:
    """The directory of initdb and pg_ctl, from ``pg_config --bindir``."""
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        raise ClusterUnavailable(
            "pg_config is not on PATH: install the PostgreSQL server package "
            "(e.g. apt-get install postgresql) to run the database-restart tests"
        )
    bindir = Path(subprocess.run(
        [pg_config, "--bindir"], check=True, capture_output=True, text=True
    ).stdout.strip())
    missing = [tool for tool in ("initdb", "pg_ctl") if not (bindir / tool).exists()]
    if missing:
        raise ClusterUnavailable(
            f"{', '.join(missing)} not found in {bindir} (pg_config --bindir): "
            "install the PostgreSQL server package, not only the client"
        )
    return bindir


def _as_postgres_user() -> list[str]:
    """The command prefix that runs a PostgreSQL tool as a user the server accepts."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ClusterUnavailable(
            "running as root, and initdb refuses root: create a 'postgres' OS user "
            "or run the tests as a normal user"
        ) from None
    if shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--"]
    return ["su", "postgres", "-s", "/bin/sh", "-c"]  # the command follows as one string


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrivateCluster:
    """One PostgreSQL server in its own temporary directory, superuser ``postgres``, trust
    auth, on 127.0.0.1 and a Unix socket in that directory. Use ``create()``."""

    def __init__(self, bindir: Path, root: Path, prefix: list[str]) -> None:
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.logfile = root / "server.log"
        self.port = _free_port()
        self._prefix = prefix

    @classmethod
    def create(cls, **overrides: str) -> PrivateCluster:
        """initdb into a new temporary directory and start the server. ``overrides``
        (postgresql.conf syntax, e.g. ``max_connections="1000"``) override
        SERVER_SETTINGS."""
        bindir = find_bindir()
        prefix = _as_postgres_user()
        # Not pytest's tmp_path: its parent is private to the current user, and the
        # server may run as another one.
        root = Path(tempfile.mkdtemp(prefix="pgqueue-cluster-"))
        if prefix:
            account = pwd.getpwnam("postgres")
            os.chown(root, account.pw_uid, account.pw_gid)
        cluster = cls(bindir, root, prefix)
        try:
            cluster._pg("initdb", "--pgdata", str(cluster.data), "--username", "postgres",
                        "--auth", "trust", "--encoding", "UTF8", "--locale", "C", "--no-sync")
            settings = {
                **SERVER_SETTINGS,
                **overrides,
                "port": str(cluster.port),
                "unix_socket_directories": f"'{root}'",
            }
            with open(cluster.data / "postgresql.conf", "a") as conf:
                conf.write("\n# tests/pgcluster.py\n")
                conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
            cluster.start()
        except BaseException:
            cluster.destroy()
            raise
        return cluster

    def _pg(self, tool: str, *args: str, timeout: float = 120) -> str:
        command = [str(self.bindir / tool), *args]
        if self._prefix and self._prefix[0] == "su":
            command = [*self._prefix, shlex.join(command)]
        else:
            command = [*self._prefix, *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                cwd=self.root)
        if result.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}\n--- server log ---\n{self.log_tail()}"
            )
        return result.stdout

    def start(self) -> None:
        """Start the server and wait until it accepts connections (after crash recovery)."""
        self._pg("pg_ctl", "start", "--pgdata", str(self.data), "--log", str(self.logfile),
                 "--wait", "--timeout", "60")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``immediate`` crashes it, ``fast`` shuts it down cleanly."""
        if mode not in ("immediate", "fast", "smart"):
            raise ValueError(f"pg_ctl stop mode must be immediate, fast or smart, not {mode!r}")
        self._pg("pg_ctl", "stop", "--pgdata", str(self.data), "--mode", mode,
                 "--wait", "--timeout", "60")

    def restart(self, mode: str = "fast") -> None:
        """Stop (``immediate`` or ``fast``) and start again on the same port."""
        self.stop(mode)
        self.start()

    def is_running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5)

    def configure(self, **settings: str) -> None:
        """ALTER SYSTEM SET each setting, then reload (for settings a reload applies)."""
        with self.connect() as conn:
            for name, value in settings.items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            conn.execute("SELECT pg_reload_conf()")

    def reset_configuration(self) -> None:
        """Undo every ``configure()``."""
        with self.connect() as conn:
            conn.execute("ALTER SYSTEM RESET ALL")
            conn.execute("SELECT pg_reload_conf()")

    def create_database(self, dbname: str) -> str:
        """CREATE DATABASE and run ``manage.py migrate`` in it; returns its URL."""
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')
        url = self.url(dbname)
        result = subprocess.run(
            [sys.executable, str(REPO / "manage.py"), "migrate", "--noinput", "-v", "0"],
            env=django_env(url), cwd=REPO, capture_output=True, text=True, timeout=300,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"manage.py migrate into {url} failed:\n{result.stdout}{result.stderr}"
            )
        return url

    def create_standby(self) -> PrivateCluster:
        """A streaming replica of this server, started on a port of its own: a hot
        standby that replays this server's WAL, answers reads and refuses writes.
        ``pg_basebackup --write-recovery-conf`` copies the data directory and points the
        copy at this server. This server needs ``wal_level = replica`` and some
        ``max_wal_senders``: PostgreSQL's defaults, checked here. initdb's pg_hba.conf
        already trusts replication connections from 127.0.0.1."""
        if not (self.bindir / "pg_basebackup").exists():
            raise ClusterUnavailable(
                f"pg_basebackup not found in {self.bindir} (pg_config --bindir): install "
                "the PostgreSQL server package to run the replica tests"
            )
        with self.connect() as conn:
            wal_level = conn.execute("SHOW wal_level").fetchone()[0]
            senders = int(conn.execute("SHOW max_wal_senders").fetchone()[0])
        if wal_level == "minimal" or senders < 1:
            raise RuntimeError(
                f"a standby needs wal_level = replica and max_wal_senders >= 1 on its "
                f"primary, which has wal_level = {wal_level}, max_wal_senders = {senders}"
            )
        root = Path(tempfile.mkdtemp(prefix="pgqueue-standby-"))
        if self._prefix:
            account = pwd.getpwnam("postgres")
            os.chown(root, account.pw_uid, account.pw_gid)
        standby = PrivateCluster(self.bindir, root, self._prefix)
        try:
            self._pg("pg_basebackup", "--pgdata", str(standby.data), "--host", "127.0.0.1",
                     "--port", str(self.port), "--username", "postgres",
                     "--write-recovery-conf", "--checkpoint", "fast", "--wal-method", "stream",
                     "--no-sync")
            # The copy's postgresql.conf is this server's: the lines below win.
            with open(standby.data / "postgresql.conf", "a") as conf:
                conf.write(f"\n# tests/pgcluster.py: a standby of port {self.port}\n"
                           f"port = {standby.port}\nunix_socket_directories = '{root}'\n"
                           "hot_standby = on\n")
            standby.start()
        except BaseException:
            standby.destroy()
            raise
        return standby

    def log_tail(self, lines: int = 30) -> str:
        if not self.logfile.exists():
            return "(no server log)"
        return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])

    def destroy(self) -> None:
        """Crash-stop the server if it runs and delete its directory."""
        if self.is_running():
            try:
                self.stop("immediate")
            except (RuntimeError, subprocess.TimeoutExpired):
                self._kill_postmaster()
        shutil.rmtree(self.root, ignore_errors=True)

    def _kill_postmaster(self) -> None:
        """SIGKILL the postmaster named in its pid file (its backends exit with it)."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
            os.kill(pid, signal.SIGKILL)


def django_env(database_url: str) -> dict[str, str]:
    """The environment of a Django process (tests.settings) on ``database_url``."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url,
        "PYTHONPATH": str(REPO),
    }


def django_shell(database_url: str, code: str, timeout: float = 120) -> str:
    """Run ``code`` in ``manage.py shell`` on ``database_url``; returns what it printed."""
    result = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "shell", "--no-imports", "-c", code],
        env=django_env(database_url), cwd=REPO, capture_output=True, text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"manage.py shell on {database_url} failed:\n{result.stderr}")
    return result.stdout
