"""Exactly-once effects under chaos: atomic tasks (``@task(atomic=True)``) whose runs
are cut short or repeated by a worker paused past its lease, a worker killed mid-handler,
and a PostgreSQL restart.

Each handler writes one Effect row in the task's database (tests/atomic_tasks.py) and
records its start and end in the ledger file (tests/ledger.py), which no rollback
reaches. The file shows what really ran: some tasks ran twice, to their end. The table
shows what the database kept: with ``atomic=True``, exactly one effect per task, the
one of the attempt whose success the row records; the same tasks without it keep the
effects of the runs that were repeated.

The first test runs on a private PostgreSQL cluster (tests/pgcluster.py) that it
restarts; the second is the long one: 20,000 atomic tasks while a worker is killed with
SIGKILL every 3 seconds (PGQUEUE_ATOMIC_SOAK_TASKS sets the number).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from django_pgqueue.models import Task
from tests import ledger
from tests.atomic_tasks import atomic_effect
from tests.conftest import REPO, wait_until
from tests.pgcluster import ClusterUnavailable, PrivateCluster, django_env, django_shell

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST_LEASE = ("--lease", "2", "--heartbeat", "0.5", "--sweep-interval", "0.25")


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    try:
        cluster = PrivateCluster.create()
    except ClusterUnavailable as exc:
        pytest.skip(f"no private PostgreSQL cluster: {exc}")
    try:
        url = cluster.create_database("pgqueue")
        # tests.testapp (the Effect table) has no migrations: create its tables.
        subprocess.run(
            [sys.executable, str(REPO / "manage.py"), "migrate", "--run-syncdb", "--noinput",
             "-v", "0"],
            env=django_env(url), cwd=REPO, check=True, capture_output=True, timeout=300,
        )
        yield cluster
    finally:
        cluster.destroy()


def ended(path: Path) -> int:
    return sum(1 for e in ledger.read(path) if e["event"] == "end")


def succeeded(cluster: PrivateCluster) -> int:
    """How many tasks succeeded; -1 while the server is unreachable."""
    try:
        with cluster.connect("pgqueue") as conn:
            return conn.execute(
                "SELECT count(*) FROM pgqueue_task WHERE state = 'succeeded'"
            ).fetchone()[0]
    except psycopg.OperationalError:
        return -1


def finished_runs(path: Path) -> Counter[int]:
    """How many runs of each task reached their end."""
    return Counter(e["task"] for e in ledger.read(path) if e["event"] == "end")


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "plain"])
def test_paused_killed_and_restarted_runs_leave_exactly_one_effect_per_atomic_task(
    cluster, start_worker, tmp_path, monkeypatch, atomic
):
    with cluster.connect("pgqueue") as conn:
        conn.execute("TRUNCATE pgqueue_task, pgqueue_worker, testapp_effect")
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    url = cluster.url("pgqueue")
    total = 400

    # Given 400 tasks that each write one effect and work 50-250 ms, atomic or not
    calls = [(n, 0.05 + (n * 7919 % 201) / 1000) for n in range(total)]
    out = django_shell(url, (
        "import json; from tests.atomic_tasks import atomic_effect; "
        f"print(json.dumps(atomic_effect.using(atomic={atomic}).enqueue_many({calls!r})))"
    ))
    ids = json.loads(out.splitlines()[-1])
    # ... and three workers with a 2 s lease draining them
    start = lambda: start_worker(*FAST_LEASE, "--concurrency", "4",  # noqa: E731
                                 database_url=url, wait=False)
    workers = [start() for _ in range(3)]
    for worker in workers:
        worker.wait_started()

    # When one worker is paused for 4 s (twice its lease) and resumed
    wait_until(lambda: ended(path) >= 0.1 * total, 60, 0.02, message="10% of the tasks")
    paused = workers[0]
    paused.signal(signal.SIGSTOP)
    time.sleep(4)
    paused.signal(signal.SIGCONT)
    # ... another is killed with SIGKILL while its handlers run, and replaced
    wait_until(lambda: ended(path) >= 0.4 * total, 60, 0.02, message="40% of the tasks")
    killed = workers[1]
    killed.kill()
    ledger.record_exit(path, killed.pid)
    workers.append(start())
    # ... and PostgreSQL crashes and starts again
    wait_until(lambda: ended(path) >= 0.6 * total, 60, 0.02, message="60% of the tasks")
    cluster.restart("immediate")

    # Then every task succeeds
    with contextlib.suppress(AssertionError):  # what is missing, the checks below say
        wait_until(lambda: succeeded(cluster) == total, 120, 0.2,
                   message="every task to succeed")
    for worker in workers:
        worker.stop()
    with cluster.connect("pgqueue") as conn:
        states = Counter(s for (s,) in conn.execute("SELECT state FROM pgqueue_task"))
        effects = Counter(t for (t,) in conn.execute("SELECT task_id FROM testapp_effect"))
        committed = {
            row[0]: (row[1], row[2])
            for row in conn.execute(
                "SELECT id, (e ->> 'attempt')::int, e ->> 'token' FROM pgqueue_task, "
                "jsonb_array_elements(executions) AS e WHERE e ->> 'state' = 'succeeded'"
            )
        }
        kept = {
            row[0]: (row[1], row[2])
            for row in conn.execute("SELECT task_id, attempt, token FROM testapp_effect")
        }
    assert states == {"succeeded": total}
    # ... the ledger file shows tasks that really ran twice, each run to its end
    twice = [task for task, runs in finished_runs(path).items() if runs > 1]
    assert twice, "no task ran twice: the pause did not outlive a lease while tasks ran"
    print(f"{len(twice)} tasks ran to their end twice or more; effects kept: "
          f"{sum(effects.values())} for {total} tasks")
    if atomic:
        # ... and the table holds exactly one effect per task: the committed attempt's
        assert effects == Counter(ids)
        assert kept == committed
    else:
        # ... while without atomic the repeated runs left their effects twice
        assert max(effects.values()) > 1
        assert sum(effects.values()) > total


def test_twenty_thousand_atomic_tasks_with_a_worker_killed_every_3_seconds_take_effect_once(
    start_worker
):
    total = int(os.environ.get("PGQUEUE_ATOMIC_SOAK_TASKS", "20000"))
    rng = random.Random(total)
    # Given 20,000 atomic tasks that each write one effect
    ids: list[int] = []
    for first in range(0, total, 5000):
        count = min(5000, total - first)
        ids += atomic_effect.enqueue_many([(n,) for n in range(first, first + count)])
    # ... and three workers with a 2 s lease
    start = lambda: start_worker(*FAST_LEASE, "--concurrency", "8", wait=False)  # noqa: E731
    workers = [start() for _ in range(3)]
    for worker in workers:
        worker.wait_started()

    # When, until they are all done, a random worker is killed with SIGKILL every 3 s
    # and replaced
    kills = 0
    deadline = time.monotonic() + max(600.0, total / 10)
    while time.monotonic() < deadline:
        if not Task.objects.exclude(state="succeeded").exists():
            break
        time.sleep(3)
        victim = rng.choice(workers)
        victim.kill()
        workers.remove(victim)
        workers.append(start())
        kills += 1
    for worker in workers:
        worker.stop()

    # Then every task succeeded, and took effect exactly once
    assert Counter(Task.objects.values_list("state", flat=True)) == {"succeeded": total}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT task_id, count(*) FROM testapp_effect GROUP BY task_id HAVING count(*) <> 1"
        )
        assert cursor.fetchall() == []
        cursor.execute("SELECT count(*) FROM testapp_effect")
        assert cursor.fetchone()[0] == total
        # ... though the kills did cut runs short (their leases were recovered)
        cursor.execute(
            "SELECT count(*) FROM pgqueue_task, jsonb_array_elements(executions) AS e "
            "WHERE e ->> 'outcome' = 'lost'"
        )
        lost = cursor.fetchone()[0]
    print(f"{total} tasks, {kills} workers killed, {lost} runs cut short")
    assert kills >= 3
    assert lost > 0
