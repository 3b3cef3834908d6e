"""Database outages: a worker survives a PostgreSQL restart, dropped connections or
connections that silently stop answering, reconnects with backoff, loses no task, and
stops promptly on a signal whatever the database is doing."""

import signal
import threading
import time

import pytest
from django.db import connections

from django_pgqueue.models import Task
from django_pgqueue.worker.connection import Session
from tests import tasks
from tests.conftest import server_address, url_through, wait_until
from tests.proxy import CuttableProxy

pytestmark = pytest.mark.django_db(transaction=True)

# DEAD_CONNECTION_TIMEOUT of the workers started by the tests below (tests/settings.py
# reads it from the environment); the production default is 15 s.
DEAD_AFTER = 2.0


@pytest.fixture
def quick_to_give_up(monkeypatch):
    monkeypatch.setenv("PGQUEUE_TEST_DEAD_CONNECTION_TIMEOUT", str(DEAD_AFTER))


@pytest.fixture
def proxy(db_url):
    settings = connections["default"].settings_dict
    proxy = CuttableProxy(server_address(settings))
    proxy.url = url_through(settings, proxy.port)
    yield proxy
    proxy.close()


@pytest.mark.slow
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


@pytest.mark.slow
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
        "WHERE application_name = 'django_pgqueue worker' AND pid <> pg_backend_pid() "
        # this test's database only: other tests (xdist's other processes) share the server
        "AND datname = current_database()"
    ).fetchone()[0]
    second = tasks.noop.enqueue(2)

    assert killed >= 3
    wait_until(lambda: Task.objects.filter(pk=second, state="succeeded").exists(), timeout=30)
    assert worker.proc.poll() is None


@pytest.mark.slow
@pytest.mark.parametrize("outage", ["cut", "stall"])
def test_sigterm_stops_a_worker_still_waiting_to_register(
    start_worker, proxy, quick_to_give_up, outage
):
    # Given a database that refuses connections (cut) or accepts them and never answers
    getattr(proxy, outage)()
    worker = start_worker(database_url=proxy.url, wait=False)
    wait_until(lambda: "database unavailable" in worker.log(), message="a failed registration")

    # When the worker is told to stop while it retries its registration
    worker.signal(signal.SIGTERM)

    # Then it stops at once, cleanly, and says why it never started
    assert worker.wait(timeout=DEAD_AFTER + 3) == 0
    assert "stopped before it could register: the database was unreachable" in worker.log()


@pytest.mark.slow  # long: run by CI's slow step, not the README's command
def test_worker_drops_connections_that_stopped_answering_and_finishes_its_tasks(
    start_worker, proxy, quick_to_give_up
):
    # Given a worker draining tasks through the proxy
    ids = tasks.just_sleep.enqueue_many([0.1] * 40)
    worker = start_worker("--concurrency", "2", database_url=proxy.url)
    wait_until(lambda: Task.objects.filter(pk__in=ids, state="succeeded").exists())

    # When every connection it holds goes silent for good (packets dropped, no RST),
    # while new connections reach the server (a failover to a new primary)
    proxy.stall()
    time.sleep(0.5)
    proxy.restore()

    # Then it notices within the timeout, reconnects and finishes every task
    wait_until(
        lambda: Task.objects.filter(pk__in=ids, state="succeeded").count() == len(ids),
        timeout=DEAD_AFTER + 20,
        message="the tasks to finish on new connections",
    )
    assert f"no answer in {DEAD_AFTER:g}s" in worker.log()
    assert worker.proc.poll() is None


@pytest.mark.slow  # long: run by CI's slow step, not the README's command
def test_sigterm_stops_a_worker_whose_database_stopped_answering(
    start_worker, proxy, quick_to_give_up
):
    # Given a running worker whose connections all go silent, new ones too
    worker = start_worker("--poll-interval", "0.2", database_url=proxy.url)
    proxy.stall()
    time.sleep(0.5)

    # When it is told to stop
    stopping_at = time.monotonic()
    worker.signal(signal.SIGTERM)

    # Then it gives up on the silent connections and exits cleanly, within a bound set
    # by the dead-connection and connect timeouts (the unregistration waits for both)
    assert worker.wait(timeout=4 * DEAD_AFTER + 6) == 0
    assert time.monotonic() - stopping_at < 4 * DEAD_AFTER + 6
    assert " stopped: " in worker.log()


@pytest.mark.slow
def test_a_slow_statement_the_server_is_running_is_not_dropped(db_url, settings):
    # Given a session that takes a connection for dead after 1 s without an answer
    settings.PGQUEUE = {**settings.PGQUEUE, "DEAD_CONNECTION_TIMEOUT": 1.0}
    session = Session("default", "slow", threading.Event())

    # When one of its statements runs for 3 s on a healthy server (a long VACUUM)
    started = time.monotonic()
    try:
        session.call(lambda conn: conn.execute("SELECT pg_sleep(3)"), retry=False)
    finally:
        session.close()

    # Then the watchdog, seeing the server at work, let it finish
    assert time.monotonic() - started >= 3
