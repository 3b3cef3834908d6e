"""Upgrades under load (docs/upgrading.md): migrations applied while a web-like process
enqueues and workers run, and the previous release's processes beside today's.

The previous release is built from its commit (tests/releases.py) into a venv of its own,
once per test session; its worker (``manage.py runtaskworker``) and its web-like process
(tests/upgrade_web.py, run by the release's interpreter in the release's project) use
only the release's code. Today's run from this checkout. Every handler records its runs
in the ledger (tests/ledger.py); at the end the ledger is held against the rows: every
committed task succeeded, each ran exactly once (no run overlapping another, none
repeated: no lease expires here), and nothing enqueued in a rolled-back transaction ran.

Every enqueue runs with a ``lock_timeout`` (``ENQUEUE_LOCK_TIMEOUT``, through
``PGOPTIONS``), so one that waited longer for a lock would fail, and the test with it;
every migration runs with the shorter ``lock_timeout`` the docs advise.

From an empty database: before the first migration there is no table to enqueue into.
The migrations up to the previous release's own (the release's schema) are applied under
plain INSERTs of ledger tasks, each in a short transaction: no release ever ran on those
intermediate schemas, so there is no release code to run on them; the rows they insert
are run after the upgrade. From the release's schema on, the load is real code: the
release's web process and worker run while each later migration is applied, and keep
enqueueing and running after each; then today's web process and worker join and the
release's stop, as in a rolling deploy (docs/decisions.md).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from django.db import connections
from django.db.migrations.loader import MigrationLoader

import django_pgqueue
from tests import ledger
from tests.conftest import REPO, WorkerProcess, database_url, wait_until
from tests.releases import InstalledRelease, install_release, rolling_upgrade_sources
from tests.test_migrations import Scratch, migration_names

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("upgrade")]

MIGRATION_LOCK_TIMEOUT = "1s"
ENQUEUE_LOCK_TIMEOUT = "3s"  # longer than the migration's: the migration gives up first
TASK_NAME = "tests.ledger_tasks.ledger_run"


@pytest.fixture(scope="session", params=rolling_upgrade_sources(django_pgqueue.__version__))
def previous_release(request, tmp_path_factory) -> InstalledRelease:
    """A release whose processes may run beside today's (tests/releases.py), installed in
    a venv of its own."""
    return install_release(request.param, tmp_path_factory.mktemp(f"release-{request.param}"))


@pytest.fixture
def scratch(django_db_modify_db_settings: None) -> Iterator[Scratch]:
    """An empty database on the test server, dropped afterwards."""
    settings_dict = connections["default"].settings_dict
    name = f"{settings_dict['NAME']}_upgrade"
    admin_url = database_url({**settings_dict, "NAME": "postgres"})
    scratch = Scratch(database_url({**settings_dict, "NAME": name}), admin_url, name)
    scratch.reset()
    yield scratch
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Deploy:
    """The code one side of a rolling deploy runs: an interpreter, a project directory,
    and what its processes need on their path."""

    name: str
    python: Path
    project: Path
    path: str

    @classmethod
    def today(cls) -> Deploy:
        return cls("today", Path(sys.executable), REPO, str(REPO))

    @classmethod
    def release(cls, release: InstalledRelease) -> Deploy:
        return cls(release.version, release.python, release.project, str(release.project))

    def env(self, url: str, ledger_path: Path, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PGOPTIONS")}
        return {**env, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url,
                "PYTHONPATH": self.path, "PYTHONUNBUFFERED": "1",
                ledger.LEDGER_ENV: str(ledger_path), **extra}


class Web:
    """A web-like process (tests/upgrade_web.py) of one deploy, enqueueing until stopped."""

    def __init__(self, deploy: Deploy, url: str, ledger_path: Path, workdir: Path) -> None:
        self.deploy = deploy
        self.out = workdir / f"web-{deploy.name}.jsonl"
        self._stop = workdir / f"web-{deploy.name}.stop"
        self._log = open(workdir / f"web-{deploy.name}.log", "wb")  # noqa: SIM115 - in stop()
        env = deploy.env(url, ledger_path, PGOPTIONS=f"-c lock_timeout={ENQUEUE_LOCK_TIMEOUT}")
        self.proc = subprocess.Popen(
            [str(deploy.python), "-P", str(REPO / "tests" / "upgrade_web.py"), str(self.out),
             str(self._stop)],
            cwd=deploy.project, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def events(self) -> list[dict]:
        return ledger.read(self.out)

    def committed(self) -> list[int]:
        return [i for e in self.events() for i in e.get("committed", [])]

    def rolled_back(self) -> list[int]:
        return [i for e in self.events() for i in e.get("rolled_back", [])]

    def errors(self) -> list[str]:
        return [e["error"] for e in self.events() if "error" in e]

    def lock_timeout(self) -> str | None:
        return next((e["lock_timeout"] for e in self.events() if "lock_timeout" in e), None)

    def longest(self) -> float:
        return max((e["seconds"] for e in self.events() if "seconds" in e), default=0.0)

    def stop(self) -> None:
        self._stop.touch()
        try:
            self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
            self._log.close()
        assert self.proc.returncode == 0, (
            f"the web process of {self.deploy.name} exited {self.proc.returncode}:\n"
            + (self.out.parent / f"web-{self.deploy.name}.log").read_text(errors="replace"))


@dataclass
class RawEnqueuer:
    """Before any release's schema: INSERTs of ledger tasks, one per short transaction
    (every tenth rolled back), with the enqueue lock_timeout, while a migration runs."""

    url: str
    committed: list[int] = field(default_factory=list)
    rolled_back: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    longest: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> RawEnqueuer:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with psycopg.connect(self.url) as conn:
            conn.execute(f"SET lock_timeout = '{ENQUEUE_LOCK_TIMEOUT}'")
            conn.commit()
            n = len(self.committed) + len(self.rolled_back)
            while not self._stop.wait(0.02):
                n += 1
                started = time.monotonic()
                try:
                    (task_id,) = conn.execute(
                        "INSERT INTO pgqueue_task (task_name, args, max_attempts) "
                        "VALUES (%s, %s::jsonb, 25) RETURNING id",
                        [TASK_NAME, json.dumps([n, 0.01])],
                    ).fetchone()
                    if n % 10 == 9:
                        conn.rollback()
                        self.rolled_back.append(task_id)
                    else:
                        conn.commit()
                        self.committed.append(task_id)
                except psycopg.Error as exc:
                    conn.rollback()
                    self.errors.append(str(exc))
                self.longest = max(self.longest, time.monotonic() - started)


@dataclass
class Upgrade:
    """The scratch database, the ledger, and the processes of a test."""

    scratch: Scratch
    workdir: Path
    webs: list[Web] = field(default_factory=list)
    workers: list[WorkerProcess] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)

    @property
    def ledger_path(self) -> Path:
        return self.workdir / "ledger.jsonl"

    def migrate(self, name: str) -> None:
        """Apply migration ``name`` with the docs' lock_timeout; an atomic migration that
        stopped on its lock timeout is rolled back whole and run again, as the docs say."""
        atomic = MigrationLoader(None, ignore_no_migrations=True).graph.nodes[
            ("django_pgqueue", name)].atomic
        for _ in range(3):
            done = self.scratch.migrate(name, lock_timeout=MIGRATION_LOCK_TIMEOUT)
            if done.returncode == 0:
                return
            if not (atomic and "lock timeout" in done.stderr):
                break
            self.retried.append(name)
        raise AssertionError(f"migration {name} failed:\n{done.stderr}")

    def start_web(self, deploy: Deploy) -> Web:
        web = Web(deploy, self.scratch.url, self.ledger_path, self.workdir)
        self.webs.append(web)
        return web

    def start_worker(self, deploy: Deploy) -> WorkerProcess:
        worker = WorkerProcess(
            ["--concurrency", "4"], deploy.env(self.scratch.url, self.ledger_path),
            self.workdir / f"worker-{deploy.name}-{len(self.workers)}.log",
            script=deploy.project / "manage.py", python=deploy.python, cwd=deploy.project,
        )  # fmt: skip
        self.workers.append(worker)
        return worker.wait_started(60)

    def stop_worker(self, worker: WorkerProcess) -> None:
        worker.stop()
        ledger.record_exit(self.ledger_path, worker.pid)

    def runs_by(self, worker: WorkerProcess, of: list[int] | None = None) -> int:
        """Finished runs of ``worker``'s process (of the tasks ``of`` only, if given)."""
        tasks = None if of is None else set(of)
        return sum(
            1
            for task, runs in ledger.runs_of(ledger.read(self.ledger_path)).items()
            for run in runs
            if run.finished and run.pid == worker.pid and (tasks is None or task in tasks)
        )

    def wait_runs(self, worker: WorkerProcess, more_than: int, of: list[int] | None = None,
                  message: str = "") -> None:
        wait_until(lambda: self.runs_by(worker, of) > more_than, timeout=60, interval=0.1,
                   message=message or f"worker {worker.pid} to run more than {more_than} tasks")

    def unfinished(self, ids: list[int]) -> int:
        with self.scratch.connect() as conn:
            return conn.execute(
                "SELECT count(*) FROM pgqueue_task WHERE id = ANY(%s) AND state <> 'succeeded'",
                [ids],
            ).fetchone()[0]

    def drain(self, ids: list[int]) -> None:
        wait_until(lambda: self.unfinished(ids) == 0, timeout=120, interval=0.2,
                   message=f"every one of {len(ids)} committed tasks to succeed")

    def check(self, committed: list[int], rolled_back: list[int]) -> ledger.LedgerReport:
        with self.scratch.connect() as conn:
            rows = ledger.task_rows(conn.cursor())
        return ledger.check(ledger.read(self.ledger_path), rows, committed, rolled_back)

    def close(self) -> None:
        for web in self.webs:
            if web.proc.poll() is None:
                web.proc.kill()
                web.proc.wait(5)
        for worker in self.workers:
            worker.stop()


@pytest.fixture
def upgrade(scratch: Scratch, tmp_path: Path) -> Iterator[Upgrade]:
    run = Upgrade(scratch, tmp_path)
    yield run
    run.close()


def assert_enqueues_within_lock_timeout(web: Web) -> None:
    """Every transaction of ``web`` went through, each under the lock_timeout."""
    assert web.lock_timeout() == ENQUEUE_LOCK_TIMEOUT, f"{web.deploy.name}: lock_timeout unset"
    assert web.errors() == [], f"enqueues of {web.deploy.name} failed"
    assert web.committed(), f"{web.deploy.name} enqueued nothing"


def assert_no_traceback(worker: WorkerProcess) -> None:
    assert "Traceback" not in worker.log(), worker.log()


def test_every_migration_from_an_empty_database_applies_while_tasks_are_enqueued_and_run(
    upgrade, previous_release
):
    release = previous_release.migrations
    names = migration_names()
    # The migrations of a release stay as they were: the same names, first, in order.
    assert names[: len(release)] == release, "a released migration was renamed or moved"
    first, *rest = names
    up_to_release = [name for name in rest if name in release]
    after_release = rest[len(up_to_release):]

    # Given an empty database, and the first migration applied (nothing can enqueue
    # before the table exists)
    upgrade.migrate(first)
    marks = [("first migration", time.monotonic())]

    # When every migration up to the previous release's schema is applied, one at a
    # time, while tasks are inserted
    raw = RawEnqueuer(upgrade.scratch.url)
    for name in up_to_release:
        inserted = len(raw.committed)
        with raw:
            upgrade.migrate(name)
        assert raw.errors == [], f"enqueues failed during {name}"
        assert len(raw.committed) > inserted, f"nothing was enqueued during {name}"

    # ... and every later migration while the release's web process and worker run,
    # enqueueing and running after each migration too
    marks.append(("migrations under INSERTs", time.monotonic()))
    old = Deploy.release(previous_release)
    old_web = upgrade.start_web(old)
    old_worker = upgrade.start_worker(old)
    upgrade.wait_runs(old_worker, 5)
    for name in after_release:
        upgrade.migrate(name)
        assert old_web.errors() == [], f"enqueues of {old.name} failed during {name}"
        enqueued, ran = len(old_web.committed()), upgrade.runs_by(old_worker)
        wait_until(lambda n=enqueued: len(old_web.committed()) > n + 5, timeout=60,
                   message=f"{old.name}'s web process to enqueue after {name}")
        upgrade.wait_runs(old_worker, ran + 5, message=f"{old.name}'s worker to run after {name}")

    # ... and then today's web process and worker start, and the release's stop
    marks.append((f"migrations under {old.name}", time.monotonic()))
    new = Deploy.today()
    new_web = upgrade.start_web(new)
    new_worker = upgrade.start_worker(new)
    wait_until(lambda: len(new_web.committed()) > 20, timeout=60,
               message="today's web process to enqueue")
    upgrade.wait_runs(new_worker, 20)
    old_web.stop()
    upgrade.stop_worker(old_worker)
    enqueued = len(new_web.committed())
    wait_until(lambda: len(new_web.committed()) > enqueued + 20, timeout=60,
               message="today's web process to go on enqueueing alone")
    new_web.stop()
    committed = raw.committed + old_web.committed() + new_web.committed()
    marks.append(("the rolling deploy", time.monotonic()))
    upgrade.drain(committed)
    upgrade.stop_worker(new_worker)
    marks.append(("the drain", time.monotonic()))

    # Then no enqueue waited longer than its lock_timeout (none failed), and every
    # committed task ran exactly once
    for web in (old_web, new_web):
        assert_enqueues_within_lock_timeout(web)
    report = upgrade.check(committed, raw.rolled_back + old_web.rolled_back()
                           + new_web.rolled_back())
    report.assert_clean()
    assert report.runs == len(committed), report.summary()
    for worker in (old_worker, new_worker):
        assert_no_traceback(worker)
    print(
        f"\nupgrade from {old.name} through {len(names)} migrations ({len(after_release)} "
        f"under {old.name}'s processes; retried on lock timeout: {upgrade.retried}): "
        f"{len(committed)} tasks, longest enqueue transaction: raw {raw.longest:.3f}s, "
        f"{old.name} {old_web.longest():.3f}s, today {new_web.longest():.3f}s; seconds: "
        + ", ".join(f"{label} {t - before:.1f}"
                    for (_, before), (label, t) in itertools.pairwise(marks))
    )


def test_the_previous_releases_worker_and_enqueue_run_beside_todays_on_the_migrated_database(
    upgrade, previous_release
):
    # Given the database migrated by today's code
    upgrade.migrate(migration_names()[-1])

    # When the release's web process and worker run beside today's
    old, new = Deploy.release(previous_release), Deploy.today()
    old_web, new_web = upgrade.start_web(old), upgrade.start_web(new)
    old_worker, new_worker = upgrade.start_worker(old), upgrade.start_worker(new)

    # Then each worker runs tasks that the other side enqueued
    upgrade.wait_runs(old_worker, 10, of=None, message="the release's worker to run tasks")
    wait_until(lambda: upgrade.runs_by(old_worker, new_web.committed()) > 5, timeout=60,
               interval=0.1, message="the release's worker to run tasks that today's enqueued")
    wait_until(lambda: upgrade.runs_by(new_worker, old_web.committed()) > 5, timeout=60,
               interval=0.1, message="today's worker to run tasks that the release enqueued")

    # When the release's processes stop (the rolling deploy ends), today's go on
    old_web.stop()
    upgrade.stop_worker(old_worker)
    ran = upgrade.runs_by(new_worker)
    upgrade.wait_runs(new_worker, ran + 20)
    new_web.stop()
    committed = old_web.committed() + new_web.committed()
    upgrade.drain(committed)
    upgrade.stop_worker(new_worker)

    # Then every enqueue went through within its lock_timeout, every committed task
    # ran exactly once, by one worker or the other, and nothing rolled back ran
    for web in (old_web, new_web):
        assert_enqueues_within_lock_timeout(web)
    report = upgrade.check(committed, old_web.rolled_back() + new_web.rolled_back())
    report.assert_clean()
    assert report.runs == len(committed), report.summary()
    for worker in (old_worker, new_worker):
        assert_no_traceback(worker)
    print(
        f"\n{old.name} beside today: {len(committed)} tasks; runs by {old.name}'s worker "
        f"{upgrade.runs_by(old_worker)}, by today's {upgrade.runs_by(new_worker)}"
    )
