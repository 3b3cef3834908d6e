"""Behind PgBouncer in transaction pooling mode (docs/scaling.md): enqueue (single,
on commit, many), the Tasks backend, the admin and the worker all work through it, with
a pool of 3 server connections shared by every client, so nothing may rely on session
state. LISTEN needs a session: the worker listens on a direct address
(LISTEN_DATABASE), or without one it polls and says so."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.db import connections, transaction

from django_pgqueue.models import Task
from tests import ledger, pgbouncer
from tests.conftest import (
    PARKED_MARKS,
    database_url,
    server_address,
    url_through,
    wait_until,
)
from tests.ledger_tasks import ledger_keyed
from tests.tasks import noop

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not pgbouncer.available(), reason="Debian's pgbouncer is not installed"),
]


@pytest.fixture
def bouncer(db_url: str) -> Iterator[pgbouncer.PgBouncer]:
    with pgbouncer.PgBouncer(server_address(connections["default"].settings_dict)) as running:
        yield running


@contextlib.contextmanager
def django_through(bouncer: pgbouncer.PgBouncer) -> Iterator[None]:
    """This test process's Django connection goes through the pooler meanwhile."""
    settings = connections["default"].settings_dict
    saved = {key: settings.get(key) for key in ("HOST", "PORT", "OPTIONS")}
    connections["default"].close()
    settings.update(
        HOST="127.0.0.1",
        PORT=bouncer.port,
        OPTIONS={k: v for k, v in (saved["OPTIONS"] or {}).items() if k != "host"},
    )
    try:
        yield
    finally:
        connections["default"].close()
        settings.update(saved)


def pooled_env(direct: bool) -> dict[str, str]:
    env = {"PGQUEUE_TEST_TRANSACTION_POOLER": "1"}
    if direct:
        env["PGQUEUE_TEST_LISTEN_URL"] = database_url(connections["default"].settings_dict)
    return env


def parked(pg) -> int:
    return pg.execute(PARKED_MARKS).fetchone()[0]


def states(ids: list[int]) -> dict[str, int]:
    found: dict[str, int] = {}
    for state in Task.objects.filter(pk__in=ids).values_list("state", flat=True):
        found[state] = found.get(state, 0) + 1
    return found


@pytest.mark.slow
def test_the_whole_round_trip_works_through_pgbouncer_in_transaction_mode(
    bouncer, start_worker, client, tmp_path, monkeypatch, pg
):
    monkeypatch.setenv(ledger.LEDGER_ENV, str(tmp_path / "ledger.jsonl"))  # ledger_keyed
    url = url_through(connections["default"].settings_dict, bouncer.port)
    # Given two workers whose connections go through the pooler (LISTEN direct), that
    # poll every 10 minutes, so that a task that starts was woken by a notification
    workers = [
        start_worker("--poll-interval", "600", database_url=url, env=pooled_env(direct=True))
        for _ in range(2)
    ]
    wait_until(lambda: parked(pg) == 2, message="both workers parked")
    with django_through(bouncer):
        # When tasks are enqueued through the pooler, every way there is
        ids = [noop.enqueue(1)]
        with transaction.atomic():
            ids.append(noop.enqueue_on_commit(2))
            ids.append(noop.enqueue(3))
        ids += noop.enqueue_many(range(4, 40))
        ids += [ledger_keyed.enqueue(n, f"k{n % 3}", 0.01) for n in range(9)]  # limited claims
        from tests.framework_tasks import add

        result = add.enqueue(2, 3)
        # Then they all run (woken, not polled)
        wait_until(lambda: states(ids).get("succeeded") == len(ids), 30, 0.05,
                   message=f"the tasks to succeed ({states(ids)})")  # fmt: skip
        result.refresh()
        assert result.return_value == 5
        # And the admin reads through the pooler too
        User.objects.create_superuser("admin", "a@example.com", "pw")
        client.force_login(User.objects.get(username="admin"))
        assert client.get("/admin/django_pgqueue/task/").status_code == 200
        assert client.get("/admin/django_pgqueue/queueoverview/").status_code == 200
    for worker in workers:
        assert " ERROR " not in worker.log(), worker.log()
        assert "polls every" not in worker.log()
    assert "ERROR" not in bouncer.log().replace("ERROR_", ""), bouncer.log()


def test_a_woken_worker_behind_the_pooler_starts_a_task(bouncer, start_worker, pg):
    url = url_through(connections["default"].settings_dict, bouncer.port)
    start_worker("--poll-interval", "600", database_url=url, env=pooled_env(direct=True))
    wait_until(lambda: parked(pg) == 1, message="the worker parked")
    with django_through(bouncer):
        task_id = noop.enqueue(1)
        # a 10-minute poll: it was woken
        wait_until(lambda: states([task_id]).get("succeeded"), 30, 0.01, message="the task")


def test_without_a_direct_address_a_pooled_worker_polls_and_says_so(bouncer, start_worker):
    url = url_through(connections["default"].settings_dict, bouncer.port)
    worker = start_worker("--poll-interval", "0.5", database_url=url, env=pooled_env(direct=False))
    assert "polls every 0.5s" in worker.log()
    with django_through(bouncer):
        ids = noop.enqueue_many(range(5))
        wait_until(lambda: states(ids).get("succeeded") == 5, 10, 0.05, message="the tasks")
    assert " ERROR " not in worker.log()


def test_atomic_tasks_commit_and_roll_back_through_the_pooler(bouncer, start_worker):
    from tests.atomic_tasks import atomic_effect
    from tests.testapp.models import Effect

    # Given a worker whose connections (its handlers' too) go through the pooler
    url = url_through(connections["default"].settings_dict, bouncer.port)
    start_worker("--concurrency", "4", database_url=url, env=pooled_env(direct=True))
    # When atomic tasks run there: each handler's transaction holds one of the pooler's
    # three server connections from its first write to its commit
    good = [atomic_effect.enqueue(n, seconds=0.05, progress=True) for n in range(20)]
    bad = [atomic_effect.using(max_attempts=1).enqueue(n, fail="raise") for n in range(5)]
    wait_until(lambda: states(good + bad) == {"succeeded": 20, "failed": 5}, 60, 0.05,
               message=f"the tasks to end ({states(good + bad)})")

    # Then the successes kept their writes and progress, the failures none
    assert sorted(Effect.objects.values_list("task_id", flat=True)) == good
    assert all(t.progress == {"n": t.args[0], "done": 1}
               for t in Task.objects.filter(pk__in=good))
    assert "ERROR" not in bouncer.log().replace("ERROR_", ""), bouncer.log()


def test_pooled_worker_connections_send_no_session_settings(settings):
    from django_pgqueue.worker.connection import connection_params

    settings.PGQUEUE = {**settings.PGQUEUE, "TRANSACTION_POOLER": True}
    params = connection_params("default")
    assert "options" not in params or "-c " not in (params["options"] or "")
    assert params["prepare_threshold"] is None
    assert os.environ.get("PGQUEUE_TEST_TRANSACTION_POOLER") is None  # only in workers
