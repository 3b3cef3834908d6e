"""Per-key rate limits: the claim spends each key's budget, fleet-wide, and sets aside
the rows of a key out of budget so that they never hold back other keys.

The SQL tests call the statements as a worker does (tests/sqlhelpers.py); the ledger
test runs real worker processes and judges them by what the handlers recorded.
"""

from __future__ import annotations

import itertools
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from psycopg.rows import class_row

from django_pgqueue import task
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.limits import parse_limits
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Task
from django_pgqueue.tasking.registry import registry
from django_pgqueue.worker.claimed import ClaimedTask
from django_pgqueue.worker.claimer import SNOOZE_BATCH, route_params, stage_params
from tests import ledger
from tests.conftest import wait_until
from tests.ledger_tasks import ledger_key_rated, ledger_run

pytestmark = pytest.mark.django_db(transaction=True)

RATED = (ledger_key_rated.name, ledger_key_rated.version)
PLAIN = (ledger_run.name, ledger_run.version)


def params(limit: int) -> dict:
    """A claim's parameters for a worker running the key-rated and the plain task."""
    return {
        **route_params(
            ["default"], [RATED, PLAIN], 3600, key_rates={RATED: ledger_key_rated.key_rate}
        ),
        "limit": limit,
        "token": str(uuid.uuid4()),
        "lease_seconds": 30,
        "worker_id": "w1",
    }


def claim(conn: psycopg.Connection, limit: int = 10) -> tuple[list[ClaimedTask], int]:
    """A limited claim as the claimer runs it: lock, claim, and set aside when keys held
    rows back; the claimed rows and how many were set aside."""
    p = params(limit)
    with conn.transaction():
        conn.execute(
            QUERIES["lock_limited_queues"], {"queues": ["default"], "lock_timeout": "200"}
        )
        with conn.cursor(row_factory=class_row(ClaimedTask)) as cursor:
            tasks = cursor.execute(QUERIES["claim"], p).fetchall()
        snoozed = 0
        # as the claimer: after a short claim, or one whose keys held rows back
        if len(tasks) < limit or (tasks and tasks[0].key_held):
            (snoozed,) = conn.execute(
                QUERIES["snooze_throttled_keys"], {**p, "limit": SNOOZE_BATCH}
            ).fetchone()
    return tasks, snoozed


def key_of(tasks: list[ClaimedTask]) -> list[str | None]:
    keys = dict(Task.objects.values_list("id", "concurrency_key"))
    return sorted((keys[t.id] or "-") for t in tasks)


def test_a_key_starts_once_per_interval_across_claimers_and_other_keys_are_not_held(pg, db_url):
    # Given a busy key's 6 tasks ahead of another key's and an unkeyed task
    busy = ledger_key_rated.enqueue_many([(n, "busy") for n in range(6)])
    ledger_key_rated.enqueue(10, "other")
    ledger_key_rated.enqueue(11, None)
    ledger_run.enqueue(12, 0.01)
    # When a worker claims 10
    first, snoozed = claim(pg)
    # Then it takes one start of each key (a burst of 1 for 4/2s) and every unkeyed task
    assert key_of(first) == ["-", "-", "busy", "other"]
    # and sets the busy key's 5 other rows aside, spaced by its interval (0.5 s) from
    # its next start
    assert snoozed == 5
    rows = list(Task.objects.filter(id__in=busy, state="scheduled").order_by("run_at"))
    assert len(rows) == 5
    gaps = [(b.run_at - a.run_at).total_seconds() for a, b in itertools.pairwise(rows)]
    assert gaps == pytest.approx([0.5] * 4, abs=0.01)
    (tat,) = pg.execute("SELECT tat FROM pgqueue_key_rate WHERE key = 'busy'").fetchone()
    assert rows[0].run_at == tat
    assert (tat - first[0].claimed_at).total_seconds() == pytest.approx(0.5)
    # When a second worker claims at once, a task of the busy key enqueued meanwhile
    # waits too: the key's budget is the fleet's
    late = ledger_key_rated.enqueue(20, "busy")
    with psycopg.connect(db_url, autocommit=True) as other:
        second, snoozed = claim(other)
    assert second == [] and snoozed == 1
    assert Task.objects.get(id=late).state == "scheduled"
    # and the rows set aside come back one by one at the key's rate
    time.sleep(0.6)
    pg.execute(QUERIES["stage"], stage_params(["default"], 1000))
    third, _ = claim(pg)
    assert key_of(third) == ["busy"]
    assert third[0].id == rows[0].id


def test_a_short_claim_sets_aside_at_most_a_batch_and_a_full_one_none(pg):
    # Given more rows of a key out of budget than one batch
    ledger_key_rated.enqueue(0, "busy")
    claim(pg)
    ledger_key_rated.enqueue_many([(n, "busy") for n in range(SNOOZE_BATCH + 20)])
    # When a worker claims, a batch of them is set aside, then the rest
    assert claim(pg) == ([], SNOOZE_BATCH)
    assert claim(pg) == ([], 20)
    assert claim(pg) == ([], 0)
    # When the claim comes back full, the busy key's row behind it stays as it is
    ledger_key_rated.enqueue_many([(n, f"k{n}") for n in range(3)])
    late = ledger_key_rated.enqueue(0, "busy")
    tasks, snoozed = claim(pg, limit=3)
    assert (len(tasks), snoozed) == (3, 0)
    assert Task.objects.get(id=late).state == "pending"


def test_a_busy_key_at_the_head_of_its_task_does_not_wait_for_another_task_to_drain(pg):
    # Given a key out of budget whose rows lead its task's walk, another key's row
    # behind them, and a backlog of an unkeyed task behind that row (same priority)
    ledger_key_rated.enqueue(0, "busy")
    claim(pg)
    ledger_key_rated.using(priority=5).enqueue_many([(n, "busy") for n in range(5)])
    other = ledger_key_rated.enqueue(0, "other")
    ledger_run.enqueue_many([(n, 0.01) for n in range(20)])
    # When a worker claims 3 at a time, its first claim is full of the unkeyed task
    first, snoozed = claim(pg, limit=3)
    assert key_of(first) == ["-", "-", "-"]
    # but its walk met the busy key, whose rows are set aside
    assert first[0].key_held == 3 and snoozed == 5
    # so the next claim takes the other key's row, before the unkeyed backlog drains
    second, _ = claim(pg, limit=3)
    assert other in [t.id for t in second]


def test_a_retry_is_a_start_of_its_key(pg):
    # Given a task of a key that started once and is due again (a retry, as settle
    # leaves it with no backoff, or a lease recovered)
    (task_id,) = ledger_key_rated.enqueue_many([(0, "shop:1")])
    (first,), _ = claim(pg)
    pg.execute(
        "UPDATE pgqueue_task SET state = 'pending', lease_token = NULL, "
        "lease_expires_at = NULL WHERE id = %s",
        [task_id],
    )
    # When a worker claims at once, the retry waits for its key's next start
    retried, snoozed = claim(pg)
    assert retried == [] and snoozed == 1
    row = Task.objects.get(id=task_id)
    assert (row.state, row.attempt) == ("scheduled", 1)
    assert (row.run_at - first.claimed_at).total_seconds() == pytest.approx(0.5)


def test_the_sweeper_deletes_the_state_of_keys_whose_budget_is_whole(pg):
    ledger_key_rated.enqueue_many([(0, "a"), (1, "b")])
    claim(pg)
    pg.execute("UPDATE pgqueue_key_rate SET tat = now() - interval '1 s' WHERE key = 'a'")
    (deleted,) = pg.execute(QUERIES["prune_key_rates"], {"limit": 1000}).fetchone()
    assert deleted == 1
    assert [k for (k,) in pg.execute("SELECT key FROM pgqueue_key_rate")] == ["b"]


def test_queue_limits_give_a_key_rate_to_keyed_tasks_without_their_own():
    limits = parse_limits({"default": {"key_rate": "10/s"}})
    p = route_params(["default"], [RATED, PLAIN], 3600, limits, {PLAIN: 1},
                     key_rates={RATED: ledger_key_rated.key_rate})  # fmt: skip
    # the task's own rate wins; the keyed plain route gets the queue's
    assert p["route_key_rate_intervals"] == [0.5, pytest.approx(1 / 10)]
    # a key_rate alone does not make the queue a limited one (it keeps its escape)
    assert p["limit_queues"] == [] and p["keyed_queues"] == ["default"]
    with pytest.raises(ValueError, match=r"QUEUE_LIMITS\['default'\]: rate '9' .*N/period"):
        parse_limits({"default": {"key_rate": "9"}})


def test_a_bad_key_rate_or_key_is_refused_naming_the_task():
    with pytest.raises(ImproperlyConfigured, match=r"key_rate: rate '100 per minute'.*N/period"):
        task(name="tests.bad_key_rate", key_rate="100 per minute")(lambda: None)

    def key_of_shop(shop_id, **_):
        return {"shop": shop_id, "number": 7}[shop_id]

    shops = task(name="tests.key_rated_shops", concurrency_key=key_of_shop, key_rate="100/m")(
        lambda shop_id: None
    )
    try:
        # key_rate alone: no limit on how many of one key run at once
        assert shops.key_concurrency is None and shops.key_rate.label == "100/m"
        with pytest.raises(InvalidTaskError, match=r"tests\.key_rated_shops.*raised KeyError"):
            shops.enqueue(42)
        with pytest.raises(InvalidTaskError, match="at most 255 characters"):
            shops.using(concurrency_key="x" * 256).enqueue("shop")
        with pytest.raises(InvalidTaskError, match=r"key of task 'tests\.key_rated_shops'.*int"):
            shops.enqueue("number")
        assert Task.objects.count() == 0
        # a fixed key per call is accepted on a task with a key_rate only
        shops.using(concurrency_key="shop:1").enqueue("shop")
        assert Task.objects.get().concurrency_key == "shop:1"
    finally:
        registry.unregister(shops.name)


# -- with real workers -------------------------------------------------------------------
@pytest.fixture
def ledger_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    return path


@pytest.mark.slow
def test_three_workers_keep_every_key_to_its_rate_and_other_work_does_not_wait(
    start_worker, ledger_file
):
    # Given three workers x 4 slots
    for _ in range(3):
        start_worker("--concurrency", "4")
    # When a busy key's 16 tasks arrive first, then 8 of each of two other keys, then
    # 20 unkeyed tasks (4/2s per key: one start every 0.5 s per key)
    busy = ledger_key_rated.enqueue_many([(n, "shop:busy") for n in range(16)])
    keyed = {key: ledger_key_rated.enqueue_many([(n, key) for n in range(8)])
             for key in ("shop:a", "shop:b")}  # fmt: skip
    plain = ledger_run.enqueue_many([(n, 0.01) for n in range(20)])
    unkeyed = ledger_key_rated.enqueue_many([(n, None) for n in range(20)])
    everything = busy + plain + unkeyed + [i for ids in keyed.values() for i in ids]
    wait_until(
        lambda: Task.objects.filter(id__in=everything, state="succeeded").count()
        == len(everything),
        60,
        interval=0.2,
        message="every task to succeed",
    )
    runs = ledger.runs_of(ledger.read(ledger_file))
    start = {task_id: min(run.start for run in of_task) for task_id, of_task in runs.items()}
    # Then no window of 2 s holds more than 4 starts of one key, wherever it begins
    for key, ids in {"shop:busy": busy, **keyed}.items():
        of_key = [run for i in ids for run in runs[i]]
        assert ledger.most_starts_within(of_key, 1.98) <= 4, key
        # and the rate was used: 8 starts at one per 0.5 s span at least 3.5 s
        assert max(start[i] for i in ids) - min(start[i] for i in ids) >= 0.5 * (len(ids) - 1)
    # while the unkeyed tasks all started before the busy key's last third
    busy_starts = sorted(start[i] for i in busy)
    assert max(start[i] for i in plain + unkeyed) < busy_starts[10]
    # and the other keys ran beside the busy one, not after it
    for ids in keyed.values():
        assert max(start[i] for i in ids) < busy_starts[-1]
