"""The connections a worker process holds: its components' four, whatever its
concurrency, and none of Django's for handlers that never touch the database
(docs/worker.md, "Database connections")."""

import time

import pytest
from django.db import connection

from django_pgqueue.models import Task
from tests import tasks
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

WORKER_APPLICATION = "django_pgqueue worker"


def component_connections(pg) -> int:
    """The test database's connections named as a worker's components, less ``pg``
    itself (the fixture connects as a worker would) and a backend running a VACUUM (the
    vacuumer's own connection, opened for it and closed after)."""
    return pg.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s"
        " AND pid <> pg_backend_pid()"
        " AND NOT (state = 'active' AND query ILIKE 'vacuum%%')",
        [WORKER_APPLICATION],
    ).fetchone()[0]


def other_connections(pg) -> int:
    """The test database's client connections of any other name (a worker's Django
    connections), less ``pg`` and this test's own Django connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (ours,) = cursor.fetchone()
    return pg.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND backend_type = 'client backend'"
        " AND application_name NOT IN (%s, 'django_pgqueue watchdog')"
        " AND pid NOT IN (pg_backend_pid(), %s)",
        [WORKER_APPLICATION, ours],
    ).fetchone()[0]


def drained_worker(start_worker, pg, concurrency: int):
    """A worker at ``concurrency`` (the only one on the database) that has drained
    five no-op tasks per slot, and whose heartbeat has beaten since: each component
    connects on first use (the settler at the first settlement, the heartbeat at its
    first beat)."""
    wait_until(lambda: component_connections(pg) == 0, message="no other worker's connections left")
    worker = start_worker("--concurrency", str(concurrency), "--heartbeat", "1")
    ids = tasks.noop.enqueue_many(range(5 * concurrency))
    wait_until(
        lambda: Task.objects.filter(pk__in=ids, state="succeeded").count() == len(ids),
        message=f"{len(ids)} no-ops drained",
    )
    time.sleep(1.5)
    return worker


def samples(count, pg, n: int = 5) -> list[int]:
    """``n`` readings of ``count``, 0.1 s apart: a steady number, not a passing one."""
    readings = []
    for _ in range(n):
        readings.append(count(pg))
        time.sleep(0.1)
    return readings


@pytest.mark.slow  # long: run by CI's slow step, not the README's command
def test_a_worker_holds_four_connections_of_its_own_whatever_its_concurrency(start_worker, pg):
    held = {}
    for concurrency in (1, 40):
        worker = drained_worker(start_worker, pg, concurrency)
        held[concurrency] = samples(component_connections, pg)
        worker.stop()

    assert held == {1: [4] * 5, 40: [4] * 5}


@pytest.mark.slow
def test_handlers_that_never_touch_the_database_open_no_django_connection(start_worker, pg):
    worker = drained_worker(start_worker, pg, 40)

    held = samples(other_connections, pg)

    worker.stop()
    assert held == [0] * 5


def test_a_handlers_django_connection_is_closed_after_each_task(start_worker, pg):
    """With Django's default CONN_MAX_AGE = 0 a handler's connection lives for its task,
    as a request's does: none is left open between tasks, however many ran."""
    wait_until(lambda: component_connections(pg) == 0, message="no other worker's connections left")
    worker = start_worker("--concurrency", "4")
    ids = tasks.record.enqueue_many([str(i) for i in range(40)])
    wait_until(
        lambda: Task.objects.filter(pk__in=ids, state="succeeded").count() == len(ids),
        message="40 tasks that write a row drained",
    )

    held = samples(other_connections, pg)

    worker.stop()
    assert held == [0] * 5
