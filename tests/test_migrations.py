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


# -- migrating back ---------------------------------------------------------------------
# Every migration reverses, or refuses before it changes anything. The schema is read
# from the catalog: what a migration left behind shows here, whatever Django's
# django_migrations table says.

SCHEMA_QUERIES = {
    "columns": """
        SELECT table_name, column_name, data_type, character_maximum_length, is_nullable,
               column_default
          FROM information_schema.columns
         WHERE table_schema = 'public' AND table_name LIKE 'pgqueue%%'
         ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
         WHERE schemaname = 'public' AND tablename LIKE 'pgqueue%%' ORDER BY 1, 2""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid),
               convalidated
          FROM pg_constraint
         WHERE conrelid::regclass::text LIKE 'pgqueue%%' ORDER BY 1, 2""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger
         WHERE NOT tgisinternal AND tgrelid::regclass::text LIKE 'pgqueue%%' ORDER BY 1, 2""",
    "functions": """
        SELECT proname, pg_get_functiondef(oid) FROM pg_proc
         WHERE proname LIKE 'pgqueue%%' ORDER BY 1""",
    "table options": """
        SELECT relname, reloptions FROM pg_class
         WHERE relkind = 'r' AND relname LIKE 'pgqueue%%' ORDER BY 1""",
    "invalid indexes": "SELECT indexrelid::regclass::text FROM pg_index WHERE NOT indisvalid",
    "applied": """
        SELECT name FROM django_migrations WHERE app = 'django_pgqueue' ORDER BY name""",
}
# What a task is, whatever columns later migrations added: compared across a round trip.
TASK_COLUMNS = (
    "id, queue, task_name, handler_version, priority, state, args, kwargs, run_at, "
    "enqueued_at, started_at, finished_at, attempt, max_attempts, lease_token, worker_id, "
    "result, errors, unique_key, checkpoint, progress, cancel_requested, metadata"
)
# What a worker is, whatever columns later migrations added (the version the doctor reads).
WORKER_COLUMNS = (
    "id, hostname, pid, queues, routes, concurrency, in_flight, started_at, last_heartbeat_at"
)


def schema(scratch: Scratch) -> dict[str, list[tuple]]:
    """The django_pgqueue part of the catalog, and the migrations Django lists."""
    with scratch.connect() as conn:
        return {name: conn.execute(query).fetchall() for name, query in SCHEMA_QUERIES.items()}


def rows(scratch: Scratch, table: str, columns: str = "*") -> list[tuple]:
    with scratch.connect() as conn:
        return conn.execute(f"SELECT {columns} FROM {table} ORDER BY 1").fetchall()


def populate(scratch: Scratch) -> None:
    """A queue in use, at the latest migration: a task in every state but waiting (with
    unique keys, a lease, a result, errors), finished tasks joined by a dependency edge,
    a worker, a paused queue, a schedule from code, a key's rate state."""
    with scratch.connect() as conn:
        conn.execute("""
            INSERT INTO pgqueue_task (task_name, state, run_at, unique_key, args, kwargs,
                                      attempt, started_at, finished_at, lease_token,
                                      lease_expires_at, worker_id, result, errors, metadata,
                                      has_dependents, checkpoint, progress, priority)
            VALUES
              ('app.send', 'pending', now() - interval '1 minute', 'order:1', '[1]',
               '{"to": "a"}', 0, NULL, NULL, NULL, NULL, NULL, NULL, '[]', '{"t": 1}',
               false, NULL, NULL, 5),
              ('app.send', 'scheduled', now() + interval '1 hour', 'order:2', '[2]', '{}',
               1, NULL, NULL, NULL, NULL, NULL, NULL,
               '[{"attempt": 1, "type": "ValueError", "message": "m"}]', '{}',
               false, '{"page": 3}', NULL, 0),
              ('app.send', 'running', now(), NULL, '[3]', '{}', 1, now(), NULL,
               gen_random_uuid(), now() + interval '30 seconds', 'w-1', NULL, '[]', '{}',
               false, NULL, '{"done": 10}', -5),
              ('app.parent', 'succeeded', now(), NULL, '[]', '{}', 1, now(), now(), NULL,
               NULL, NULL, '{"ok": true}', '[]', '{}', true, NULL, NULL, 0),
              ('app.child', 'failed', now(), 'order:1', '[]', '{}', 3, now(), now(), NULL,
               NULL, NULL, NULL, '[{"attempt": 3, "type": "KeyError", "message": "k"}]',
               '{}', false, NULL, NULL, 0),
              ('app.send', 'cancelled', now(), NULL, '["x"]', '{}', 0, NULL, now(), NULL,
               NULL, NULL, NULL, '[]', '{}', false, NULL, NULL, 100)
        """)
        conn.execute("""
            INSERT INTO pgqueue_dependency (parent_id, child_id, resolved)
            SELECT p.id, c.id, true FROM pgqueue_task AS p, pgqueue_task AS c
             WHERE p.task_name = 'app.parent' AND c.task_name = 'app.child'
        """)
        conn.execute("""
            INSERT INTO pgqueue_worker (id, hostname, pid, queues, routes, concurrency)
            VALUES ('w-1', 'host', 4242, '["default"]', '[["app.send", 1]]', 4)
        """)
        conn.execute("INSERT INTO pgqueue_queue (name, paused) VALUES ('default', true)")
        conn.execute(
            "INSERT INTO pgqueue_schedule (name, task_name, spec, timezone) "
            "VALUES ('nightly', 'app.send', 'every 1h', 'UTC')"
        )
        conn.execute(
            "INSERT INTO pgqueue_key_rate (queue, key, tat) VALUES ('default', 'k', now())"
        )


def test_every_migration_reverses_to_the_schema_it_was_applied_on_and_keeps_the_rows(scratch):
    # given: the schema after each migration, applied one at a time from an empty
    # database; then the latest schema in use
    *earlier, latest = names = migration_names()
    applied = {}
    for name in names:
        assert scratch.migrate(name).returncode == 0, name
        applied[name] = schema(scratch)
    populate(scratch)
    tasks = rows(scratch, "pgqueue_task", TASK_COLUMNS)
    workers = rows(scratch, "pgqueue_worker", WORKER_COLUMNS)

    # when: each migration is reversed, one at a time, down to the first
    for name in reversed(earlier):
        done = scratch.migrate(name)
        # then: each reverses, to the schema it was applied on (indexes, constraints,
        # columns, triggers, functions, and the migrations Django lists)
        assert done.returncode == 0, f"back to {name}: {done.stderr}"
        assert schema(scratch) == applied[name], f"back to {name}"

    # then: at the first migration, the tasks and workers are all there; a scheduled
    # task is pending with its run_at ahead, as that schema had it
    as_first = [
        (*task[:5], "pending" if task[5] == "scheduled" else task[5], *task[6:])
        for task in tasks
    ]
    assert rows(scratch, "pgqueue_task", TASK_COLUMNS) == as_first
    assert rows(scratch, "pgqueue_worker", WORKER_COLUMNS) == workers

    # when: migrated forward again
    done = scratch.migrate(latest)

    # then: the same schema, the same tasks in the same states, the same workers
    assert done.returncode == 0, done.stderr
    assert schema(scratch) == applied[latest]
    assert rows(scratch, "pgqueue_task", TASK_COLUMNS) == tasks
    assert rows(scratch, "pgqueue_worker", WORKER_COLUMNS) == workers


def test_migrating_to_zero_drops_every_table_and_forward_again_builds_the_same_schema(scratch):
    # given: the latest schema, in use
    latest = migration_names()[-1]
    assert scratch.migrate(latest).returncode == 0
    populate(scratch)
    before = schema(scratch)

    # when: every migration is reversed at once
    done = scratch.migrate("zero")

    # then: no table, index, trigger or function of the app is left (the tables are
    # the app's: at zero there is nowhere to keep their rows)
    assert done.returncode == 0, done.stderr
    assert {name: found for name, found in schema(scratch).items() if found} == {}

    # when: migrated forward again, then: the same schema, empty
    assert scratch.migrate(latest).returncode == 0
    assert schema(scratch) == before
    assert rows(scratch, "pgqueue_task") == []


@pytest.mark.parametrize(
    ("before", "rows_sql", "words"),
    [
        ("0008_workflows",
         "INSERT INTO pgqueue_task (task_name, state, wait_reason, wait_signal) "
         "VALUES ('app.approve', 'waiting', 'signal', 'approved')",
         "1 task is waiting"),
        ("0012_runtime_schedules",
         "INSERT INTO pgqueue_schedule (name, task_name, spec, timezone, definition) "
         "VALUES ('hourly', 'app.send', 'every 1h', 'UTC', '{\"every\": 3600}')",
         "1 runtime schedule"),
    ],
)  # fmt: skip
def test_a_reverse_that_would_lose_what_rows_mean_refuses_before_it_changes_anything(
    scratch, before, rows_sql, words
):
    # given: a queue in use, migrated back to ``before``, with rows that the schema
    # before it cannot hold
    names = migration_names()
    target = names[names.index(before) - 1]
    assert scratch.migrate(names[-1]).returncode == 0
    populate(scratch)
    assert scratch.migrate(before).returncode == 0
    with scratch.connect() as conn:
        conn.execute(rows_sql)
    catalog, tasks = schema(scratch), rows(scratch, "pgqueue_task")

    # when: migrating back past it
    done = scratch.migrate(target)

    # then: refused, saying why and what to do; the schema, the applied migrations and
    # the rows are as they were
    assert done.returncode != 0
    assert words in done.stderr and before in done.stderr
    assert schema(scratch) == catalog
    assert rows(scratch, "pgqueue_task") == tasks
