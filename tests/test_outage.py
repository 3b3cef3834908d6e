"""Database outages: a worker survives a PostgreSQL restart or dropped connections,
reconnects with backoff, and loses no task."""

import os
import time

import pytest
from django.db import connections

from django_pgqueue.models import Task
from tests import tasks
from tests.conftest import database_url, wait_until
from tests.proxy import CuttableProxy

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def proxy(db_url):
    settings = connections["default"].settings_dict
    socket_dir = settings.get("OPTIONS", {}).get("host")
    if socket_dir:
        target = os.path.join(socket_dir, f".s.PGSQL.{settings.get('PORT') or 5432}")
    else:
        target = (settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    proxy = CuttableProxy(target)
    proxied = {
        **settings,
        "HOST": "127.0.0.1",
        "PORT": proxy.port,
        "OPTIONS": {k: v for k, v in settings.get("OPTIONS", {}).items() if k != "host"},
    }
    proxy.url = database_url(proxied)
    yield proxy
    proxy.close()


def test_worker_survives_a_database_restart_and_loses_no_task(start_worker, proxy):
    before = tasks.noop.enqueue_many(range(20))
    worker = start_worker("--poll-interval", "0.5", database_url=proxy.url)
    wait_until(lambda: Task.objects.filter(pk__in=before, state="succeeded").count() == 20)

    proxy.cut()  # the server goes away: every connection drops, new ones are refused
    during = tasks.noop.enqueue_many(range(20, 40))
    time.sleep(2)
    proxy.restore()

    wait_until(
        lambda: Task.objects.filter(pk__in=during, state="succeeded").count() == 20,
        timeout=30,
        message="tasks enqueued during the outage to run",
    )
    after = tasks.noop.enqueue_many(range(40, 60))
    wait_until(
        lambda: Task.objects.filter(pk__in=after, state="succeeded").count() == 20,
        timeout=30,
        message="tasks enqueued after the outage to run",
    )
    assert not Task.objects.exclude(state="succeeded").exists()
    log = worker.log()
    assert "database unavailable" in log or "connection lost" in log
    assert worker.proc.poll() is None


def test_a_task_running_through_an_outage_is_settled_afterwards(start_worker, proxy):
    task_id = tasks.just_sleep.enqueue(2)
    start_worker(database_url=proxy.url)
    wait_until(lambda: Task.objects.filter(pk=task_id, state="running").exists())

    proxy.cut()
    time.sleep(2.5)  # the handler finishes while the database is unreachable
    proxy.restore()

    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="succeeded").first(), timeout=30)
    assert row.attempt == 1


def test_worker_survives_its_connections_being_terminated(start_worker, pg):
    worker = start_worker("--poll-interval", "0.5")
    first = tasks.noop.enqueue(1)
    wait_until(lambda: Task.objects.filter(pk=first, state="succeeded").exists())

    killed = pg.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = 'django_pgqueue worker' AND pid <> pg_backend_pid()"
    ).fetchone()[0]
    second = tasks.noop.enqueue(2)

    assert killed >= 3
    wait_until(lambda: Task.objects.filter(pk=second, state="succeeded").exists(), timeout=30)
    assert worker.proc.poll() is None
