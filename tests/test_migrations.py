"""Upgrading a live queue (docs/upgrading.md): every migration of django_pgqueue, one
at a time, in the order Django applies them (whatever migrations exist), against a
task table that takes enqueues meanwhile.

Each migration runs as ``manage.py migrate django_pgqueue NAME`` in a subprocess, on a
scratch database of its own on the test server, with the lock_timeout the docs advise
(``PGOPTIONS="-c lock_timeout=..."``). A thread enqueues meanwhile, each INSERT in its
own short transaction with a lock_timeout of its own: an enqueue that waited behind
the migration for longer than that fails, and the test with it.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import pytest
from django.db import connections
from django.db.migrations.loader import MigrationLoader

from tests.conftest import REPO, database_url

# Slow: each test runs manage.py migrate in a fresh process once or twice per migration.
pytestmark = pytest.mark.slow

MIGRATION_LOCK_TIMEOUT = "1s"
ENQUEUE_LOCK_TIMEOUT = "5s"  # longer than the migration's: it gives up first


def migration_names() -> list[str]:
    """django_pgqueue's migrations in the order migrate applies them."""
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    (leaf,) = graph.leaf_nodes("django_pgqueue")
    return [name for app, name in graph.forwards_plan(leaf) if app == "django_pgqueue"]


@dataclass
class Scratch:
    url: str
    admin_url: str
    name: str

    def reset(self) -> None:
        """Drop the database and create it empty."""
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{self.name}"')

    def connect(self, **kwargs) -> psycopg.Connection:
        return psycopg.connect(self.url, **kwargs)

    def migrate(self, name: str, lock_timeout: str | None = None) -> subprocess.CompletedProcess:
        env = {**os.environ, "DATABASE_URL": self.url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
        if lock_timeout is not None:
            env["PGOPTIONS"] = f"-c lock_timeout={lock_timeout}"
        return subprocess.run(
            [sys.executable, "manage.py", "migrate", "django_pgqueue", name, "-v", "0"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    def relfilenode(self) -> int:
        with self.connect() as conn:
            return conn.execute(
                "SELECT relfilenode FROM pg_class WHERE oid = 'pgqueue_task'::regclass"
            ).fetchone()[0]

    def invalid_indexes(self) -> list[str]:
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT indexrelid::regclass::text FROM pg_index WHERE NOT indisvalid"
            ).fetchall()
        return [name for (name,) in rows]


@pytest.fixture
def scratch(django_db_modify_db_settings: None) -> Iterator[Scratch]:
    """An empty database on the test server, dropped afterwards."""
    settings_dict = connections["default"].settings_dict
    name = f"{settings_dict['NAME']}_migrations"
    admin_url = database_url({**settings_dict, "NAME": "postgres"})
    scratch = Scratch(database_url({**settings_dict, "NAME": name}), admin_url, name)
    scratch.reset()
    yield scratch
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Enqueuer:
    """Enqueue-like INSERTs into pgqueue_task, one per short transaction, until stopped."""

    scratch: Scratch
    done: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Enqueuer:
        self._thread = threading.Thread(target=self._run)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with self.scratch.connect(autocommit=True) as conn:
            conn.execute(f"SET lock_timeout = '{ENQUEUE_LOCK_TIMEOUT}'")
            while not self._stop.wait(0.01):
                try:
                    conn.execute("INSERT INTO pgqueue_task (task_name) VALUES ('probe')")
                    self.done += 1
                except psycopg.Error as exc:
                    self.errors.append(str(exc))


def seed(scratch: Scratch, rows: int = 2000) -> None:
    with scratch.connect() as conn:
        conn.execute(
            "INSERT INTO pgqueue_task (task_name, run_at) "
            "SELECT 'seed', now() + (g %% 3 - 1) * interval '1 hour' "
            "FROM generate_series(1, %s) AS g",
            [rows],
        )


def test_each_migration_applies_under_lock_timeout_without_rewriting_the_task_table(scratch):
    # given: the task table as the first migration made it, with rows
    first, *rest = migration_names()
    assert scratch.migrate(first).returncode == 0
    seed(scratch)

    for name in rest:
        before = scratch.relfilenode()
        # when: the next migration runs under lock_timeout while tasks are enqueued
        with Enqueuer(scratch) as enqueuer:
            done = scratch.migrate(name, lock_timeout=MIGRATION_LOCK_TIMEOUT)

        # then: it applied; the table is the same file (not rewritten); every enqueue
        # made meanwhile went in
        assert done.returncode == 0, f"{name}: {done.stderr}"
        assert scratch.relfilenode() == before, f"{name} rewrote pgqueue_task"
        assert enqueuer.errors == [], f"enqueues failed during {name}"
        assert enqueuer.done > 0

    assert scratch.invalid_indexes() == []


def test_a_migration_behind_an_open_transaction_gives_up_at_lock_timeout_not_blocking_enqueues(
    scratch,
):
    names = migration_names()
    for previous, name in itertools.pairwise(names):
        # given: the table before the migration, and a transaction that enqueued a task
        # and stays open (a long request, a stuck shell)
        scratch.reset()
        assert scratch.migrate(previous).returncode == 0
        seed(scratch, rows=100)
        with scratch.connect() as open_transaction:
            open_transaction.execute("INSERT INTO pgqueue_task (task_name) VALUES ('open')")

            # when: the migration runs under lock_timeout, while tasks are enqueued
            with Enqueuer(scratch) as enqueuer:
                done = scratch.migrate(name, lock_timeout=MIGRATION_LOCK_TIMEOUT)
            open_transaction.rollback()

        # then: it applied, or it stopped on its lock timeout instead of waiting for
        # the open transaction; either way no enqueue waited on it past its own timeout
        assert done.returncode == 0 or "lock timeout" in done.stderr, f"{name}: {done.stderr}"
        assert enqueuer.errors == [], f"enqueues failed during {name}"
        assert enqueuer.done > 0
