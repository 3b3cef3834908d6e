"""The claim statement: what it takes, what it leaves, and what two claimers see."""

import re
import secrets
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from psycopg.rows import class_row, tuple_row

from django_pgqueue.core.limits import parse_limits, parse_rate
from django_pgqueue.db import sql
from django_pgqueue.db.sql import QUERIES, positional
from django_pgqueue.models import Task
from django_pgqueue.ops import operations
from django_pgqueue.worker.claimed import ClaimedTask, claimed_rows
from django_pgqueue.worker.claimer import claim_statement, route_params, stage_params
from django_pgqueue.worker.connection import connect
from tests import tasks
from tests.conftest import wait_until
from tests.factories import TaskFactory
from tests.ledger_tasks import ledger_key_rated, ledger_keyed
from tests.sqlhelpers import all_routes, claim, row

pytestmark = pytest.mark.django_db(transaction=True)


def test_claim_leases_exactly_the_rows_asked_for(pg):
    tasks.noop.enqueue_many(range(5))

    claimed = claim(pg, limit=2)

    assert len(claimed) == 2
    states = dict(pg.execute("SELECT state, count(*) FROM pgqueue_task GROUP BY state").fetchall())
    assert states == {"running": 2, "pending": 3}


def test_claim_increments_the_attempt_and_stamps_a_fresh_lease(pg):
    task_id = tasks.noop.enqueue(1)

    (task,) = claim(pg, limit=1, worker_id="w-a", lease=30)

    stored = row(pg, task_id)
    assert task.attempt == stored["attempt"] == 1
    assert str(stored["lease_token"]) == task.lease_token
    assert stored["worker_id"] == "w-a"
    lease = stored["lease_expires_at"] - task.claimed_at
    assert timedelta(seconds=29) < lease <= timedelta(seconds=30)
    assert stored["started_at"] == stored["last_attempted_at"] == task.claimed_at


def test_a_second_claimer_skips_rows_the_first_holds(pg):
    tasks.noop.enqueue_many(range(3))
    with connect("default") as other:
        other.autocommit = False
        held = claim(other, limit=2, worker_id="w-a")  # locked, not yet committed

        mine = claim(pg, limit=3, worker_id="w-b")

        other.rollback()
    assert len(held) == 2
    assert len(mine) == 1
    assert mine[0].id not in {t.id for t in held}


def test_future_tasks_are_not_claimed_before_run_at(pg):
    tasks.noop.using(delay=3600).enqueue()

    assert claim(pg, limit=5) == []


def test_claim_orders_by_priority_then_run_at_then_id(pg):
    now = timezone.now()
    low = TaskFactory(priority=-5, run_at=now - timedelta(seconds=30))
    high_late = TaskFactory(priority=10, run_at=now - timedelta(seconds=1))
    high_early = TaskFactory(priority=10, run_at=now - timedelta(seconds=2))
    mid_a = TaskFactory(priority=0, run_at=now - timedelta(seconds=5))
    mid_b = TaskFactory(priority=0, run_at=now - timedelta(seconds=5))

    order = [claim(pg, limit=1)[0].id for _ in range(5)]

    assert order == [high_early.id, high_late.id, mid_a.id, mid_b.id, low.id]


def test_a_starving_task_takes_one_slot_of_the_batch_regardless_of_priority(pg):
    now = timezone.now()
    starving = TaskFactory(priority=-100, run_at=now - timedelta(minutes=10))
    urgent = [TaskFactory(priority=100, run_at=now) for _ in range(5)]

    batch = claim(pg, limit=3, starvation=60)

    ids = {t.id for t in batch}
    assert starving.id in ids
    assert len(ids & {t.id for t in urgent}) == 2


def test_a_starving_task_wins_even_a_single_slot(pg):
    now = timezone.now()
    starving = TaskFactory(priority=-100, run_at=now - timedelta(minutes=10))
    TaskFactory(priority=100, run_at=now)

    assert [t.id for t in claim(pg, limit=1, starvation=60)] == [starving.id]


def test_without_starvation_priority_decides(pg):
    now = timezone.now()
    TaskFactory(priority=-100, run_at=now - timedelta(seconds=10))
    urgent = TaskFactory(priority=100, run_at=now)

    assert [t.id for t in claim(pg, limit=1, starvation=60)] == [urgent.id]


def starving_and_urgent():
    """A task due 10 minutes ago at priority -100 (starving, with a timeout of 60 s),
    and one due now at priority 100."""
    now = timezone.now()
    return (TaskFactory(priority=-100, run_at=now - timedelta(minutes=10)),
            TaskFactory(priority=100, run_at=now))


def escape_window(pg, queue: str = "default"):
    """When the queue's starvation window last opened (None: never, no row)."""
    found = pg.execute(
        "SELECT last_escape_at::text FROM pgqueue_queue WHERE name = %s", [queue]
    ).fetchone()
    return found and found[0]


@pytest.mark.parametrize(
    "name, version", [("tests.versioned", 1), ("billing.charge", 2)], ids=["version", "task"]
)
def test_a_starving_task_the_worker_does_not_run_is_not_escaped(pg, name, version):
    # Given a starving row of a version (or a task) this worker does not run (an old
    # release's row, left behind in a rolling deploy; another service's task), and a
    # fresh row of what it runs
    now = timezone.now()
    old = TaskFactory(task_name=name, handler_version=version, priority=-100,
                      run_at=now - timedelta(minutes=10))
    current = TaskFactory(task_name="tests.versioned", handler_version=2, run_at=now)
    # When a claim looks for starving tasks, then it takes only what it can run
    taken = claim(pg, limit=2, starvation=60, routes=[("tests.versioned", 2)])
    assert [t.id for t in taken] == [current.id]
    assert row(pg, old.id)["state"] == "pending"


def test_a_starving_task_escapes_only_through_its_own_queues_window(pg):
    # Given a starving task in a queue whose window an escape has just shut, and an
    # urgent task in another queue, whose window is open
    pg.execute("INSERT INTO pgqueue_queue (name, last_escape_at) VALUES ('other', now())")
    now = timezone.now()
    TaskFactory(queue="other", priority=-100, run_at=now - timedelta(minutes=10))
    urgent = TaskFactory(priority=100, run_at=now)
    # When a claim of both queues looks for starving tasks, then priority decides
    taken = claim(pg, limit=1, starvation=60, queue=["default", "other"])
    assert [t.id for t in taken] == [urgent.id]


KEYED = (ledger_keyed.name, ledger_keyed.version)
KEY_RATED = (ledger_key_rated.name, ledger_key_rated.version)


@pytest.mark.parametrize("limit", ["concurrency", "rate"])
def test_a_starving_task_of_a_key_at_its_limit_does_not_escape_the_limit(pg, limit):
    # Given two starving tasks of one key, one at a time per key (or one start an hour)
    route = KEYED if limit == "concurrency" else KEY_RATED
    extra = ({"key_limits": {route: 1}} if limit == "concurrency"
             else {"key_rates": {route: parse_rate("1/h")}})
    old = timezone.now() - timedelta(minutes=10)
    rows = [TaskFactory(task_name=route[0], handler_version=route[1], concurrency_key="k",
                        run_at=old) for _ in range(2)]
    # When one is claimed, then the other, starving, still waits for its key
    first = claim(pg, 1, routes=[route], look_for_starving=False, statement="claim", **extra)
    assert [t.id for t in first] == [rows[0].id]
    assert claim(pg, 1, routes=[route], starvation=60, **extra) == []
    assert row(pg, rows[1].id)["state"] == "pending"


def test_two_claims_in_one_window_escape_one_starving_task_between_them(pg):
    # Given a starving task of each of two tasks, urgent ones of each, and a claim (of
    # a worker that runs the first task) that has escaped its starving task, its
    # transaction not yet committed
    now = timezone.now()
    old = now - timedelta(minutes=10)
    routes = [("tests.tasks.noop", 1), ("tests.versioned", 2)]
    starving = [TaskFactory(task_name=name, handler_version=version, priority=-100, run_at=old)
                for name, version in routes]  # fmt: skip
    urgent = [TaskFactory(task_name=name, handler_version=version, priority=100, run_at=now)
              for name, version in routes]  # fmt: skip
    with connect("default") as first, connect("default") as second:
        first.autocommit = False
        taken = claim(first, limit=1, starvation=60, routes=routes[:1])
        assert [t.id for t in taken] == [starving[0].id]
        # When a worker that runs the second task claims meanwhile (it waits for the
        # first's window), and the first commits
        result: list = []
        waiting = threading.Thread(target=lambda: result.append(
            claim(second, limit=1, starvation=60, routes=routes[1:])
        ))
        waiting.start()
        pid = second.info.backend_pid
        wait_until(lambda: pg.execute(  # it waits on the window's row, as documented
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()[0])
        first.commit()
        waiting.join(10)
    # Then the second escaped nothing (one escape per window, fleet-wide): priority
    # decided its claim
    assert [t.id for t in result[0]] == [urgent[1].id]
    assert row(pg, starving[1].id)["state"] == "pending"


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_a_starving_task_at_the_head_of_the_line_fills_one_place_of_the_batch(pg, fair):
    # Given a starving task first in line (its priority is everyone's), and two more
    from tests.tenant_tasks import fair_job

    now = timezone.now()
    fields = ({"task_name": fair_job.name, "fair_key": "c", "fair_tag": 0} if fair
              else {})  # fmt: skip
    rows = [TaskFactory(run_at=now - timedelta(minutes=10), **fields),
            TaskFactory(run_at=now, **fields), TaskFactory(run_at=now, **fields)]
    # When a claim of 3 looks for starving tasks, then it takes all 3: the escaped task
    # takes one place, not two
    taken = claim(pg, limit=3, starvation=60, fair=fair)
    assert sorted(t.id for t in taken) == [r.id for r in rows]


def test_starving_tasks_of_two_queues_escape_one_each(pg):
    # Given a starving task in each of two queues, both windows open, and urgent tasks
    now = timezone.now()
    starving = [TaskFactory(queue=q, priority=-100, run_at=now - timedelta(minutes=10))
                for q in ("default", "other")]  # fmt: skip
    for _ in range(3):
        TaskFactory(priority=100, run_at=now)
    # When a claim of 4 over both queues looks for starving tasks, then each queue's
    # starving task takes one place, and two urgent ones the rest
    taken = {t.id for t in claim(pg, limit=4, starvation=60, queue=["default", "other"])}
    assert len(taken) == 4
    assert {s.id for s in starving} <= taken


@pytest.mark.parametrize("state", ["running", "succeeded"])
def test_an_older_task_no_longer_pending_does_not_hide_a_starving_one(pg, state):
    # Given a row of the same task due even longer ago that has left the line (it runs,
    # or it ended), a starving task, and an urgent one
    now = timezone.now()
    TaskFactory(state=state, run_at=now - timedelta(minutes=20))
    starving = TaskFactory(priority=-100, run_at=now - timedelta(minutes=10))
    TaskFactory(priority=100, run_at=now)
    # When a claim looks for starving tasks, then the starving one escapes
    assert [t.id for t in claim(pg, limit=1, starvation=60)] == [starving.id]


def test_a_starving_task_claimed_by_another_worker_meanwhile_is_not_escaped_again(pg):
    # Given a starving task, and a claim looking for starving tasks held up (by a lock
    # on its queue's row: an operation on the queue) after its snapshot saw the task
    now = timezone.now()
    starving = TaskFactory(priority=-100, run_at=now - timedelta(minutes=10))
    pg.execute("INSERT INTO pgqueue_queue (name) VALUES ('default')")
    with connect("default") as holder, connect("default") as late, connect("default") as other:
        holder.autocommit = False
        holder.execute("SELECT 1 FROM pgqueue_queue WHERE name = 'default' FOR UPDATE")
        result: list = []
        waiting = threading.Thread(
            target=lambda: result.append(claim(late, limit=1, starvation=60))
        )
        waiting.start()
        pid = late.info.backend_pid
        wait_until(lambda: pg.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()[0])
        # When another worker claims the task and commits, and the queue's row is freed
        (mine,) = claim(other, limit=1, look_for_starving=False, statement="claim_plain")
        holder.commit()
        waiting.join(10)
    # Then the held-up claim does not claim it a second time
    assert mine.id == starving.id
    assert result == [[]]
    assert (row(pg, starving.id)["attempt"], str(row(pg, starving.id)["lease_token"])) == (
        1, mine.lease_token,
    )


def test_a_queue_registered_by_its_workers_still_takes_its_starvation_escape(pg):
    # Given the queue's row (its workers register it), its window last open long ago
    pg.execute("INSERT INTO pgqueue_queue (name) VALUES ('default') ON CONFLICT DO NOTHING")
    pg.execute("UPDATE pgqueue_queue SET last_escape_at = now() - interval '1 hour'")
    starving, _ = starving_and_urgent()
    # When a claim looks for starving tasks, then the window is open: it escapes
    assert [t.id for t in claim(pg, limit=1, starvation=60)] == [starving.id]
    assert escape_window(pg) > "2000"


def test_another_queues_shut_window_leaves_this_queues_open(pg):
    # Given a window just shut by an escape in another queue
    pg.execute("INSERT INTO pgqueue_queue (name, last_escape_at) VALUES ('other', now())")
    starving, _ = starving_and_urgent()
    # When this queue is claimed, then its own window is open: its starving task escapes
    assert [t.id for t in claim(pg, limit=1, starvation=60)] == [starving.id]


def test_a_claim_outside_the_window_takes_no_starving_task_and_leaves_the_window(pg):
    # Given a starving task behind an urgent one
    _, urgent = starving_and_urgent()
    # When the full claim runs between the claimer's looks for starving tasks (as a
    # limited lane's every claim does), then priority decides, and the window stays shut
    params = {
        **route_params(["default"], all_routes(), 60),
        "look_for_starving": False, "limit": 1, "token": str(uuid.uuid4()),
        "lease_seconds": 30, "worker_id": "w1",
    }
    taken = sql.execute(pg, "claim", params, row_factory=claimed_rows)
    assert [t.id for t in taken] == [urgent.id]
    assert escape_window(pg) in (None, "-infinity")


def test_a_limited_queue_takes_no_starvation_escape(pg):
    # Given a starving task behind an urgent one, in a queue with a concurrency limit
    _, urgent = starving_and_urgent()
    # When a claim looks for starving tasks, then the limit's order (priority) decides
    taken = claim(pg, limit=1, starvation=60, statement="claim",
                  limits=parse_limits({"default": {"concurrency": 5}}))
    assert [t.id for t in taken] == [urgent.id]
    assert escape_window(pg) in (None, "-infinity")


def test_a_claim_never_waits_on_a_starvation_window_another_claim_has_shut(pg):
    # Given a starving task, urgent ones, and a window that an escape has just shut
    now = timezone.now()
    starving = TaskFactory(priority=-100, run_at=now - timedelta(minutes=10))
    urgent = [TaskFactory(priority=100, run_at=now) for _ in range(2)]
    assert [t.id for t in claim(pg, limit=1, starvation=60)] == [starving.id]
    shut_at = escape_window(pg)
    TaskFactory(priority=-100, run_at=now - timedelta(minutes=10))
    with connect("default") as other:
        # When one claim looks for starving tasks in a transaction still open, and
        # another claim does the same meanwhile
        other.autocommit = False
        first = claim(other, limit=1, starvation=60)
        pg.execute("SET lock_timeout = '2s'")
        try:
            second = claim(pg, limit=1, starvation=60)
        finally:
            pg.execute("RESET lock_timeout")
        other.commit()
    # Then the second neither waited on the window's row (a shut window is only read)
    # nor escaped: each took an urgent task, and the window was not moved
    assert sorted(t.id for t in first + second) == sorted(t.id for t in urgent)
    assert escape_window(pg) == shut_at


def test_unregistered_names_and_versions_stay_pending_and_burn_no_attempt(pg):
    unknown = TaskFactory(task_name="billing.charge")
    old_version = TaskFactory(task_name="tests.versioned", handler_version=3)
    current = TaskFactory(task_name="tests.versioned", handler_version=2)

    claimed = claim(pg, limit=10)

    assert [t.id for t in claimed] == [current.id]
    for task in (unknown, old_version):
        stored = row(pg, task.id)
        assert (stored["state"], stored["attempt"]) == ("pending", 0)


def test_claim_only_takes_its_own_queue(pg):
    tasks.other_queue.enqueue(1)
    tasks.noop.enqueue(1)

    claimed = claim(pg, limit=10, queue="other")

    assert [t.task_name for t in claimed] == ["tests.tasks.other_queue"]


def test_many_concurrent_claimers_never_take_the_same_row(db_url):
    total = 2000
    tasks.noop.enqueue_many(range(total))
    seen: list[list[int]] = []
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        mine: list[int] = []
        try:
            with connect("default") as conn:
                while batch := claim(conn, limit=7, worker_id=f"w{n}"):
                    mine.extend(t.id for t in batch)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        seen.append(mine)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not errors
    everything = [task_id for mine in seen for task_id in mine]
    assert len(everything) == total
    assert len(set(everything)) == total


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_a_statement_converted_once_has_one_numbered_parameter_per_name(name):
    """The worker's hot statements run with $n placeholders converted once
    (sql.positional): each name is one parameter, numbered in order of first use."""
    statement = positional(name)

    assert "%(" not in statement.text
    numbers = {int(n) for n in re.findall(r"\$(\d+)", statement.text)}
    assert numbers == set(range(1, len(statement.names) + 1))
    assert sorted(statement.names) == sorted(set(re.findall(r"%\((\w+)\)s", QUERIES[name])))


def test_claimed_rows_make_the_task_class_row_would(pg):
    """The worker's row factory (claimed_rows) builds each ClaimedTask field by field as
    psycopg's class_row would, and refuses columns that are not its fields."""
    task_id = tasks.noop.using(priority=7).enqueue(3)
    pg.execute(QUERIES["stage"], stage_params(["default"], 1000))
    params = {
        **route_params(["default"], all_routes(), 3600),
        "limit": 1,
        "token": str(uuid.uuid4()),
        "lease_seconds": 30,
        "worker_id": "w1",
    }
    with sql.execute(pg, "claim", params, row_factory=tuple_row) as cursor:
        (values,) = cursor.fetchall()
        fast = claimed_rows(cursor)(values)
        slow = class_row(ClaimedTask)(cursor)(values)

    assert (fast.id, fast.priority, fast.args, fast.kwargs) == (task_id, 7, [3], {})
    assert {k: v for k, v in vars(fast).items() if k != "received_monotonic"} == {
        k: v for k, v in vars(slow).items() if k != "received_monotonic"
    }
    assert abs(fast.received_monotonic - time.monotonic()) < 5
    assert fast.lease == slow.lease
    with pg.cursor() as cursor:
        cursor.execute("SELECT 1::bigint AS id")
        with pytest.raises(TypeError, match="missing"):
            claimed_rows(cursor)((1,))
        cursor.execute("SELECT 1 AS nope")
        with pytest.raises(TypeError, match=r"unknown \['nope'\]"):
            claimed_rows(cursor)((1,))


def claim_with(pg, statement: str, limit: int = 10) -> list[int]:
    """One claim by ``statement`` (claim or claim_plain) of the queue "default", with the
    parameters of a lane without limits, for which both apply."""
    params = {
        **route_params(["default"], all_routes(), 3600),
        "look_for_starving": False,
        "limit": limit,
        "token": str(uuid.uuid4()),
        "lease_seconds": 30,
        "worker_id": "w1",
    }
    return [t.id for t in sql.execute(pg, statement, params, row_factory=claimed_rows)]


@pytest.mark.parametrize("statement", ["claim", "claim_plain"])
def test_a_paused_queue_is_claimed_by_neither_claim_until_resumed(pg, statement):
    ids = tasks.noop.enqueue_many(range(3))
    operations.pause("default")

    assert claim_with(pg, statement) == []

    operations.resume("default")
    assert sorted(claim_with(pg, statement)) == ids


@pytest.mark.parametrize("statement", ["claim", "claim_plain"])
def test_neither_claim_takes_a_task_of_the_same_name_in_a_queue_it_does_not_serve(
    pg, statement
):
    elsewhere = tasks.noop.using(queue="other").enqueue_many(range(3))
    ids = tasks.noop.enqueue_many(range(3))

    assert sorted(claim_with(pg, statement)) == ids
    assert Task.objects.filter(id__in=elsewhere, state="pending").count() == 3


@pytest.mark.parametrize("statement", ["claim", "claim_plain"])
def test_neither_claim_takes_a_version_of_a_task_the_worker_does_not_run(pg, statement):
    # Given rows of a task's version 1 and 2, and a worker that runs only version 1 (an
    # old release beside a new one in a rolling deploy)
    old = tasks.versioned_v1.enqueue_many([()] * 3)
    tasks.versioned.enqueue_many([()] * 3)
    # When it claims, then it takes only the rows of its version
    claimed = claim(pg, 10, routes=[(tasks.versioned_v1.name, 1)],
                    look_for_starving=statement == "claim", statement=statement)
    assert sorted(t.id for t in claimed) == old


@pytest.mark.parametrize("statement", ["claim", "claim_plain"])
def test_a_pause_of_another_queue_holds_back_nothing_here(pg, statement):
    ids = tasks.noop.enqueue_many(range(3))
    operations.pause("other")
    operations.pause("other", tasks.noop.name)

    assert sorted(claim_with(pg, statement)) == ids


@pytest.mark.parametrize("statement", ["claim", "claim_plain"])
def test_a_paused_task_name_is_claimed_by_neither_claim_the_rest_of_its_queue_is(
    pg, statement
):
    held = tasks.noop.enqueue_many(range(2))
    other = tasks.record.enqueue("runs")
    operations.pause("default", tasks.noop.name)

    assert claim_with(pg, statement) == [other]

    operations.resume("default", tasks.noop.name)
    assert sorted(claim_with(pg, statement)) == held


def test_the_stager_makes_due_only_the_rows_of_the_queues_it_is_given(pg):
    past = timezone.now() - timedelta(seconds=5)
    mine = TaskFactory(state="scheduled", run_at=past)
    theirs = TaskFactory(state="scheduled", run_at=past, queue="other")
    waiting = [
        TaskFactory(state="waiting", queue=queue, wait_reason="signal", wait_signal="go",
                    wait_until=past)
        for queue in ("default", "other")
    ]  # fmt: skip

    staged = pg.execute(QUERIES["stage"], stage_params(["default"], 100)).fetchall()

    assert [(q, n) for q, n, _notified, _expired in staged] == [("default", 2)]
    states = {t.pk: t.state for t in Task.objects.all()}
    assert (states[mine.pk], states[waiting[0].pk]) == ("pending", "pending")
    assert (states[theirs.pk], states[waiting[1].pk]) == ("scheduled", "waiting")


def test_the_plain_claim_takes_what_the_full_claim_takes_for_a_lane_without_limits(pg):
    """claim_plain is claim reduced for a lane without limits, per-key limits or rates,
    and without a starvation escape: on the same table, in the same state, both take
    the same rows, in the same order, with the same flags (expired, left_out)."""
    for i in range(30):
        tasks.noop.using(priority=i % 4).enqueue(i)
        tasks.record.using(priority=(i + 1) % 4).enqueue(str(i))
    expired = tasks.noop.using(priority=9, expires=0.01).enqueue(-1)
    large = tasks.noop.using(priority=9).enqueue(secrets.token_hex(3000))  # over 4,000 bytes
    paused = tasks.report.using(priority=9).enqueue()
    operations.pause("default", tasks.report.name)
    time.sleep(0.05)
    other = connect("default")
    try:
        other.execute("BEGIN")
        (locked,) = other.execute(
            "SELECT id FROM pgqueue_task WHERE state = 'pending' AND priority = 2"
            " ORDER BY id LIMIT 1 FOR UPDATE"
        ).fetchone()

        def take(statement: str, limit: int, batch_bytes: int | None) -> list[tuple]:
            params = {
                **route_params(["default"], all_routes(), 3600, claim_batch_bytes=batch_bytes),
                "look_for_starving": False,
                "limit": limit,
                "token": str(uuid.uuid4()),
                "lease_seconds": 30,
                "worker_id": "w1",
            }
            assert claim_statement(params) == "claim_plain"
            with pg.transaction(force_rollback=True):
                claimed = sql.execute(pg, statement, params, row_factory=claimed_rows).fetchall()
            return [(t.id, t.attempt, t.expired, t.left_out, t.key_held) for t in claimed]

        seen = []
        for limit in (1, 3, 10, 100):
            for batch_bytes in (None, 4000):
                plain = take("claim_plain", limit, batch_bytes)
                assert plain == take("claim", limit, batch_bytes), (limit, batch_bytes)
                seen += plain
    finally:
        other.close()

    ids = {row[0] for row in seen}
    assert expired in ids and large in ids
    assert paused not in ids and locked not in ids
    assert len(ids) == 61  # every row but the paused and the locked one, at limit 100
    assert any(row[2] for row in seen)  # an expired row, flagged
    assert any(row[3] > 0 for row in seen)  # a batch cut by its bytes


def test_the_plain_claims_update_and_columns_are_the_full_claims():
    """claim_plain's UPDATE and RETURNING are claim's, less the escaped rows and the
    key_held count (always 0 without per-key limits): the two cannot drift apart."""
    full = QUERIES["claim"][QUERIES["claim"].index("UPDATE pgqueue_task AS t"):]
    plain = QUERIES["claim_plain"][QUERIES["claim_plain"].index("UPDATE pgqueue_task AS t"):]

    assert plain == full.replace(
        "ARRAY(SELECT id FROM escaped UNION ALL SELECT id FROM picked WHERE fits)",
        "ARRAY(SELECT id FROM picked WHERE fits)",
    ).replace("(SELECT count(*) FROM keyed) - (SELECT count(*) FROM allowed) AS key_held",
              "0 AS key_held")
