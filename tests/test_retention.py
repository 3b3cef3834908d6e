"""Retention: finished rows are pruned after their time to live, in small batches, and
nothing live (or still leased) is ever pruned."""

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Task
from django_pgqueue.ops.operations import prune_expired
from django_pgqueue.worker.pruner import Pruner
from django_pgqueue.worker.stats import WorkerStats
from tests.conftest import wait_until
from tests.factories import TaskFactory

HOUR = 3600.0


def finished(state: str, hours_ago: float, **kwargs) -> Task:
    return TaskFactory(
        state=state, finished_at=timezone.now() - timedelta(hours=hours_ago), **kwargs
    )


def remaining() -> set[int]:
    return set(Task.objects.values_list("pk", flat=True))


@pytest.mark.django_db
def test_succeeded_and_cancelled_rows_are_pruned_after_result_ttl():
    old = [finished("succeeded", 3), finished("cancelled", 3)]
    young = [finished("succeeded", 1), finished("cancelled", 1)]

    deleted = prune_expired(result_ttl=2 * HOUR, dead_ttl=100 * HOUR, batch=100)

    assert deleted == 2
    assert remaining() == {t.pk for t in young}
    assert not remaining() & {t.pk for t in old}


@pytest.mark.django_db
def test_dead_letters_are_kept_until_dead_ttl_not_result_ttl():
    kept = finished("failed", 3)
    expired = finished("failed", 30)

    prune_expired(result_ttl=1 * HOUR, dead_ttl=24 * HOUR, batch=100)

    assert remaining() == {kept.pk}
    assert expired.pk not in remaining()


@pytest.mark.django_db
def test_live_tasks_are_never_pruned_however_old():
    live = [
        TaskFactory(state="pending", finished_at=timezone.now() - timedelta(days=30)),
        TaskFactory(
            state="running",
            attempt=1,
            lease_token=uuid.uuid4(),
            lease_expires_at=timezone.now(),
            finished_at=timezone.now() - timedelta(days=30),
        ),
        TaskFactory(state="waiting", finished_at=timezone.now() - timedelta(days=30)),
    ]

    deleted = prune_expired(result_ttl=0, dead_ttl=0, batch=100)

    assert deleted == 0
    assert remaining() == {t.pk for t in live}


@pytest.mark.django_db
def test_a_finished_row_still_holding_a_lease_token_is_not_pruned():
    leased = finished("succeeded", 48, lease_token=uuid.uuid4())

    prune_expired(result_ttl=HOUR, dead_ttl=HOUR, batch=100)

    assert remaining() == {leased.pk}


@pytest.mark.django_db
def test_one_prune_statement_deletes_at_most_one_batch_of_each_state_oldest_first():
    succeeded = [finished("succeeded", 10 + n) for n in range(5)]
    failed = [finished("failed", 10 + n) for n in range(5)]

    with connection.cursor() as cursor:
        cursor.execute(QUERIES["prune"], {"result_ttl": HOUR, "dead_ttl": HOUR, "batch": 2})
        states = sorted(row[0] for row in cursor.fetchall())

    assert states == ["failed", "failed", "succeeded", "succeeded"]
    oldest = {t.pk for t in succeeded[-2:] + failed[-2:]}
    assert not remaining() & oldest


@pytest.mark.django_db
def test_prune_repeats_small_batches_until_every_expired_row_is_gone():
    for n in range(7):
        finished("succeeded", 5 + n)
    young = finished("succeeded", 0.5)

    deleted = prune_expired(result_ttl=HOUR, dead_ttl=HOUR, batch=3)

    assert deleted == 7
    assert remaining() == {young.pk}


@pytest.mark.django_db
def test_retention_defaults_come_from_the_settings(settings):
    settings.PGQUEUE = {**settings.PGQUEUE, "RESULT_TTL": 2 * HOUR, "DEAD_TTL": 2 * HOUR}
    gone = [finished("succeeded", 3), finished("failed", 3)]
    kept = finished("succeeded", 1)

    prune_expired()

    assert remaining() == {kept.pk}
    assert not remaining() & {t.pk for t in gone}


@pytest.mark.django_db(transaction=True)
def test_the_worker_pruner_applies_retention_on_its_interval():
    expired = [finished("succeeded", 3) for _ in range(5)]
    kept = finished("succeeded", 1)
    stats = WorkerStats()
    pruner = Pruner(
        "default", interval=0.05, result_ttl=2 * HOUR, dead_ttl=HOUR, batch=2, stats=stats
    )

    pruner.start()
    try:
        wait_until(lambda: stats.get("pruned") == len(expired), timeout=10, message="the prune")
    finally:
        pruner.stop()

    assert remaining() == {kept.pk}


@pytest.mark.django_db(transaction=True)
def test_a_dead_letter_retried_while_a_prune_deletes_it_is_not_deleted(pg):
    """The prune picks its rows without a lock; a dead letter retry_now makes pending
    after the pick (its UPDATE holds the row when the prune's DELETE reaches it) is
    left alone once that commits: the DELETE re-checks that the row is still expired."""
    dead = finished("failed", 30)
    pg.execute("BEGIN")
    pg.execute(QUERIES["retry_now"], {"ids": [dead.pk]})
    done = threading.Event()
    deleted: list[int] = []

    def prune_now() -> None:
        try:
            deleted.append(prune_expired(result_ttl=HOUR, dead_ttl=HOUR, batch=100))
        finally:
            connection.close()
            done.set()

    threading.Thread(target=prune_now).start()
    wait_until(
        lambda: lock_waits("WITH doomed AS"),
        message="the prune to wait for the retried row's lock",
    )
    pg.execute("COMMIT")
    done.wait(10)

    assert deleted == [0]
    assert Task.objects.get(pk=dead.pk).state == "pending"


def lock_waits(statement_start: str) -> int:
    """Statements starting so that wait for a lock now (read outside any transaction:
    pg_stat_activity is a snapshot per transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND starts_with(query, %s)",
            [statement_start],
        )
        return cursor.fetchone()[0]
