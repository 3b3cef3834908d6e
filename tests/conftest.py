"""Test fixtures: the database server, worker subprocesses, raw connections.

Without DATABASE_URL, one embedded PostgreSQL (pgserver) is started for the whole
run, in .pgdata/tests. Worker subprocesses get DATABASE_URL pointing at the test
database that pytest-django created, so they see exactly what the test wrote.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from django.db import connections

REPO = Path(__file__).resolve().parent.parent
# The environment of a worker whose claims are claim_plain (tests/settings.py leaves
# out the tasks limited by key, whose routes take the full claim).
PLAIN_CLAIM_ENV = {"PGQUEUE_TEST_PLAIN_CLAIM": "1"}
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """Name queue2's test database after the default's, and start the embedded server
    (once, shared by every xdist worker: pgserver counts its users) when no DATABASE_URL
    is given."""
    # A worker subprocess given the test database's URL names queue2 after it
    # (tests/settings.py); under xdist pytest-django suffixes each test database with the
    # worker id (test_pgqueue_gw0, test_pgqueue_queue2_gw0), so queue2's is set to match.
    default = connections["default"].settings_dict
    default_test_name = default.get("TEST", {}).get("NAME") or f"test_{default['NAME']}"
    queue2 = connections["queue2"].settings_dict
    queue2["TEST"] = {**queue2.get("TEST", {}), "NAME": f"{default_test_name}_queue2"}
    if os.environ.get("DATABASE_URL"):
        return
    from django_pgqueue.core.embedded import embedded_database_url

    url = embedded_database_url(REPO / ".pgdata" / "tests")
    host = url.split("?host=", 1)[1]
    for alias in ("default", "queue2"):  # tests/settings.py: the same server
        settings_dict = connections[alias].settings_dict
        settings_dict["OPTIONS"] = {**settings_dict.get("OPTIONS", {}), "host": host}
        settings_dict["HOST"] = ""


def database_url(settings_dict: dict) -> str:
    """A postgres:// URL for a Django settings dict (TCP host or Unix socket)."""
    user = quote(settings_dict.get("USER") or "postgres")
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{quote(password)}@" if password else f"{user}@"
    host = settings_dict.get("HOST") or ""
    port = settings_dict.get("PORT") or ""
    netloc = f"{auth}{host}{':' + str(port) if port else ''}"
    url = f"postgres://{netloc}/{settings_dict['NAME']}"
    socket_dir = settings_dict.get("OPTIONS", {}).get("host")
    if socket_dir:
        url += f"?host={quote(socket_dir, safe='/')}"
    return url


def server_address(settings_dict: dict) -> tuple[str, int] | str:
    """Where a Django database alias's server listens: (host, port) or a Unix socket path."""
    port = int(settings_dict.get("PORT") or 5432)
    socket_dir = settings_dict.get("OPTIONS", {}).get("host")
    if socket_dir:
        return os.path.join(socket_dir, f".s.PGSQL.{port}")
    return (settings_dict.get("HOST") or "127.0.0.1", port)


def url_through(settings_dict: dict, port: int) -> str:
    """The database URL of ``settings_dict``, reached through a proxy on a local port."""
    options = {k: v for k, v in settings_dict.get("OPTIONS", {}).items() if k != "host"}
    return database_url({**settings_dict, "HOST": "127.0.0.1", "PORT": port, "OPTIONS": options})


@pytest.fixture
def db_url(transactional_db: None) -> str:
    """The URL of the test database (committed data only: transactional tests)."""
    return database_url(connections["default"].settings_dict)


@pytest.fixture
def pg(db_url: str) -> Iterator[psycopg.Connection]:
    """A raw autocommit connection to the test database, like a second worker's."""
    from django_pgqueue.worker.connection import connect

    conn = connect("default")
    try:
        yield conn
    finally:
        conn.close()


# Claimers parked on the test database: a parked claimer holds the PARKED advisory lock
# (class 1885827329) of each channel it LISTENs on (contract.sql, "Wake-ups"). Advisory
# locks are per database; pg_locks shows every database's (other test runs').
PARKED_MARKS = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1885827329 "
    "AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def wait_until(
    predicate: Callable[[], object],
    timeout: float = 20.0,
    interval: float = 0.02,
    message: str = "condition",
) -> object:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


class WorkerProcess:
    """``<script> runtaskworker`` in a subprocess (the repository's manage.py and this
    interpreter unless told), with its log in a file."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        log_path: Path,
        new_session: bool = False,
        script: Path = REPO / "manage.py",
        python: str | Path = sys.executable,
        cwd: Path = REPO,
    ) -> None:
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(python), str(script), "runtaskworker", *args],
            cwd=cwd,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_started(self, timeout: float = 90) -> WorkerProcess:
        wait_until(
            lambda: " started: " in self.log() or self.proc.poll() is not None,
            timeout,
            message=f"worker {self.pid} to start",
        )
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited early ({self.proc.returncode}):\n{self.log()}")
        return self

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.pid} did not exit within {timeout}s:\n{self.log()}"
            ) from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGINT)  # a second signal exits at once
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
        self._log.close()


@pytest.fixture
def start_worker(db_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker subprocesses; every one still running is stopped after the test."""
    started: list[WorkerProcess] = []

    def start(
        *args: str,
        database_url: str | None = None,
        wait: bool = True,
        new_session: bool = False,
        script: Path = REPO / "manage.py",
        env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": database_url or db_url,
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        worker = WorkerProcess(
            list(args),
            env,
            tmp_path / f"worker-{len(started)}.log",
            new_session=new_session,
            script=script,
        )
        started.append(worker)
        if wait:
            worker.wait_started()
        return worker

    yield start
    for worker in started:
        worker.stop()
