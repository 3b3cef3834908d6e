"""A fleet of workers on one database: what its idle processes cost PostgreSQL, and the
duties the fleet shares (sweeps, vacuum checks, pruning) rather than each process."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from django_pgqueue.db.sql import QUERIES
from django_pgqueue.worker.periodic import Fleet
from django_pgqueue.worker.stats import WorkerStats
from django_pgqueue.worker.sweeper import Sweeper

pytestmark = pytest.mark.django_db(transaction=True)


def transactions() -> int:
    """Transactions of the test database so far (every worker statement is one)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        return cursor.fetchone()[0]


def test_a_fleet_wide_duty_ticks_n_times_less_often_in_each_of_n_processes():
    fleet = Fleet()
    sweeper = Sweeper("default", 1.0, 60.0, None, WorkerStats(), fleet=fleet)
    assert sweeper.period == 1.0
    fleet.size = 5
    assert sweeper.period == 5.0
    # capped, so the fleet's longest gap between sweeps stays bounded at any size
    fleet.size = 50
    assert sweeper.period == 10.0


def test_the_heartbeat_counts_the_live_workers(pg):
    for n, age in enumerate([0, 5, 30, 600]):
        pg.execute(
            "INSERT INTO pgqueue_worker (id, hostname, pid, queues, routes, concurrency, "
            "in_flight, started_at, last_heartbeat_at) VALUES (%s, 'h', %s, '[]', '[]', 1, "
            "0, now(), now() - make_interval(secs => %s))",
            [f"w{n}", n, age],
        )
    (live,) = pg.execute(
        QUERIES["touch_worker"], {"in_flight": 0, "id": "w0", "stale_seconds": 60}
    ).fetchone()
    assert live == 3  # the one silent for 10 minutes is gone


@pytest.mark.slow  # 34 s, and other tests' load slows its workers' statements down
def test_idle_workers_cost_under_two_statements_a_second_each(start_worker):
    # Given four idle worker processes with the default settings, past their first
    # heartbeat (which counts them)
    workers = [start_worker("--poll-interval", "2") for _ in range(4)]  # the default poll
    # (A backend reports its counts within 10 s of going idle: start-up is counted by then.)
    time.sleep(14)
    # When they idle for 20 s
    before, started = transactions(), time.monotonic()
    time.sleep(20)
    after, seconds = transactions(), time.monotonic() - started
    # Then each ran fewer than 2 transactions a second (every worker statement is one,
    # a limited claim's lock and claim one together): polls, heartbeats and its share of
    # the sweeps, vacuum checks and pruning (our own reads are not counted)
    per_process = (after - before - 2) / seconds / len(workers)
    assert per_process < 2.0, per_process
