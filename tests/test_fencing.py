"""Fencing: every write about a claimed task carries (id, attempt, lease token)."""

import json
import logging
import threading

import pytest

from django_pgqueue.db.sql import QUERIES
from django_pgqueue.worker.heartbeat import Heartbeat
from django_pgqueue.worker.inflight import InFlight
from django_pgqueue.worker.outcomes import RELEASE_DELAY, SUCCESS, Outcome, released, succeeded
from django_pgqueue.worker.settler import Settler
from django_pgqueue.worker.stats import WorkerStats
from tests import tasks
from tests.conftest import wait_until
from tests.sqlhelpers import claim, expire_lease, row, settle, success, sweep

pytestmark = pytest.mark.django_db(transaction=True)


def lapse_and_reclaim(pg, task_id):
    """Worker A's lease lapses; the sweep recovers the task; worker B claims it."""
    expire_lease(pg, task_id)
    assert [(r[0], r[1]) for r in sweep(pg)] == [(task_id, "pending")]
    (taken_over,) = claim(pg, limit=1, worker_id="w-b")
    return taken_over


def forget_claim(pg, task_id):
    """What a PostgreSQL crash does to a claim committed asynchronously (ASYNC_CLAIMS):
    the row is as it was before the claim, pending with the attempt not yet counted,
    while the claimer's handler runs on."""
    pg.execute(
        "UPDATE pgqueue_task SET state = 'pending', attempt = attempt - 1, lease_token = NULL,"
        " lease_expires_at = NULL, started_at = NULL, worker_id = NULL WHERE id = %s",
        [task_id],
    )


def fence_params(lease):
    return {"id": lease.id, "attempt": lease.attempt, "token": lease.lease_token}


def leases_json(lease):
    return json.dumps([{"id": lease.id, "attempt": lease.attempt, "token": lease.lease_token}])


# Each fenced write or read of a claimed row by its lease: did the lease take effect?
FENCED = {
    "settle": lambda pg, lease: bool(settle(pg, [success(lease, result="stale")])),
    "heartbeat": lambda pg, lease: bool(
        pg.execute(
            QUERIES["heartbeat"], {"leases": leases_json(lease), "lease_seconds": 60}
        ).fetchall()
    ),
    "settle_check": lambda pg, lease: pg.execute(
        QUERIES["settle_check"], {"leases": leases_json(lease)}
    ).fetchone()[3] == "held",
    "hold_lease": lambda pg, lease: pg.execute(
        QUERIES["hold_lease"], {**fence_params(lease), "any_expiry": False}
    ).fetchone() is not None,
    "settle_atomic": lambda pg, lease: pg.execute(
        QUERIES["settle_atomic"],
        {**fence_params(lease), "any_expiry": False, "result": None,
         "save_checkpoint": False, "checkpoint": None, "save_progress": False,
         "progress": None, "limit_queue": None, "limit_concurrency": None},
    ).fetchone() is not None,
    "save_checkpoint": lambda pg, lease: pg.execute(
        QUERIES["save_checkpoint"], {**fence_params(lease), "checkpoint": '{"stale": 1}'}
    ).rowcount == 1,
    "save_progress": lambda pg, lease: pg.execute(
        QUERIES["save_progress"], {**fence_params(lease), "progress": '{"stale": 1}'}
    ).rowcount == 1,
    "read_cancel_requested": lambda pg, lease: pg.execute(
        QUERIES["read_cancel_requested"], fence_params(lease)
    ).fetchone() is not None,
    "wait_for_tasks": lambda pg, lease: bool(
        pg.execute(
            QUERIES["wait_for_tasks"], {**fence_params(lease), "ids": [tasks.noop.enqueue(2)]}
        ).fetchall()
    ),
}


@pytest.mark.parametrize("write", FENCED)
def test_each_fenced_statement_takes_the_current_lease(pg, write):
    tasks.noop.enqueue(1)
    (mine,) = claim(pg, limit=1, worker_id="w-a")

    assert FENCED[write](pg, mine)


@pytest.mark.parametrize("statement", ["hold_lease", "settle_atomic"])
def test_an_atomic_commit_refuses_a_lapsed_lease_nobody_recovered_yet(pg, statement):
    """An atomic task's writes commit only while its lease holds: a lease past its
    expiry that no sweep has recovered yet (the row still running, with its token) is
    not the attempt's any more. The test helpers, where nothing renews a lease, pass
    any_expiry and commit anyway."""
    tasks.noop.enqueue(1)
    (mine,) = claim(pg, limit=1, worker_id="w-a")
    pg.execute(
        "UPDATE pgqueue_task SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
        [mine.id],
    )

    assert not FENCED[statement](pg, mine)
    assert row(pg, mine.id)["state"] == "running"
    params = {**fence_params(mine), "any_expiry": True}
    if statement == "settle_atomic":
        params.update(result=None, save_checkpoint=False, checkpoint=None,
                      save_progress=False, progress=None, limit_queue=None,
                      limit_concurrency=None)  # fmt: skip
    assert pg.execute(QUERIES[statement], params).fetchone() is not None


@pytest.mark.parametrize("write", ["save_checkpoint", "save_progress", "wait_for_tasks"])
def test_a_fenced_write_touches_its_own_task_not_the_others_of_its_claim(pg, write):
    """One claim statement leases its whole batch with one token: the task's id is part
    of the fence."""
    tasks.noop.enqueue_many(range(2))
    mine, other = claim(pg, limit=2, worker_id="w-a")
    assert mine.lease_token == other.lease_token

    assert FENCED[write](pg, mine)

    stored = row(pg, other.id)
    assert (stored["checkpoint"], stored["progress"]) == (None, None)
    children = pg.execute("SELECT child_id FROM pgqueue_dependency").fetchall()
    assert children in ([], [(mine.id,)])


def test_a_cancel_request_is_read_for_its_own_task_not_the_others_of_its_claim(pg):
    tasks.noop.enqueue_many(range(2))
    mine, other = claim(pg, limit=2, worker_id="w-a")
    pg.execute(QUERIES["cancel_task"], {"id": other.id, "hard": False})

    flags = [
        pg.execute(QUERIES["read_cancel_requested"], fence_params(lease)).fetchall()
        for lease in (mine, other)
    ]

    assert flags == [[(False,)], [(True,)]]


@pytest.mark.parametrize("write", FENCED)
def test_a_claim_made_again_with_the_same_attempt_fences_out_the_first_token(pg, write):
    """A claim forgotten by a crash is claimed again with the same attempt and a new
    token; the first claimer's handler may still run: the token alone tells them apart."""
    task_id = tasks.noop.enqueue(1)
    (first,) = claim(pg, limit=1, worker_id="w-a")
    forget_claim(pg, task_id)
    (second,) = claim(pg, limit=1, worker_id="w-b")
    assert (second.attempt, second.id) == (first.attempt, first.id)

    assert not FENCED[write](pg, first)

    stored = row(pg, task_id)
    assert (stored["state"], stored["worker_id"]) == ("running", "w-b")
    assert str(stored["lease_token"]) == second.lease_token
    assert stored["lease_expires_at"] == second.lease_expires_at
    assert (stored["result"], stored["checkpoint"], stored["progress"]) == (None, None, None)
    assert pg.execute("SELECT count(*) FROM pgqueue_dependency").fetchone()[0] == 0
    assert FENCED[write](pg, second)


@pytest.mark.parametrize("stale_first", [True, False], ids=["stale-first", "current-first"])
def test_one_batch_with_the_first_and_the_second_claims_outcomes_writes_the_second(
    pg, stale_first
):
    """A worker that claimed a task again after a crash forgot its first claim may settle
    both runs in one batch: the row takes the outcome of the lease it holds."""
    task_id = tasks.noop.enqueue(1)
    (first,) = claim(pg, limit=1, worker_id="w-a")
    forget_claim(pg, task_id)
    (second,) = claim(pg, limit=1, worker_id="w-a")
    outcomes = [success(first, result="first"), success(second, result="second")]

    written = settle(pg, outcomes if stale_first else outcomes[::-1])

    assert written == {task_id: "succeeded"}
    assert row(pg, task_id)["result"] == "second"


@pytest.mark.parametrize("write", FENCED)
def test_a_row_put_back_to_pending_by_hand_takes_nothing_from_the_lease_it_still_shows(
    pg, write
):
    """Only a running row is held by a lease: an operator's UPDATE that moves a running
    task back to pending, and leaves its lease columns as they were, takes it out of its
    worker's hands."""
    task_id = tasks.noop.enqueue(1)
    (mine,) = claim(pg, limit=1, worker_id="w-a")
    pg.execute("UPDATE pgqueue_task SET state = 'pending' WHERE id = %s", [task_id])

    assert not FENCED[write](pg, mine)

    stored = row(pg, task_id)
    assert stored["state"] == "pending"
    assert stored["lease_expires_at"] == mine.lease_expires_at
    assert (stored["result"], stored["checkpoint"], stored["progress"]) == (None, None, None)
    assert pg.execute("SELECT count(*) FROM pgqueue_dependency").fetchone()[0] == 0


def test_a_late_settlement_after_takeover_changes_nothing(pg):
    task_id = tasks.noop.enqueue(1)
    (mine,) = claim(pg, limit=1, worker_id="w-a")
    theirs = lapse_and_reclaim(pg, task_id)

    written = settle(pg, [success(mine, result="from A")])

    assert written == {}
    stored = row(pg, task_id)
    assert (stored["state"], stored["attempt"], stored["worker_id"]) == ("running", 2, "w-b")
    assert str(stored["lease_token"]) == theirs.lease_token
    assert stored["result"] is None


def test_the_current_holder_settles_normally_after_a_takeover(pg):
    task_id = tasks.noop.enqueue(1)
    claim(pg, limit=1, worker_id="w-a")
    theirs = lapse_and_reclaim(pg, task_id)

    assert settle(pg, [success(theirs, result="from B")]) == {task_id: "succeeded"}
    assert row(pg, task_id)["result"] == "from B"


def test_settler_counts_and_logs_a_lost_lease_and_never_reports_success(pg, caplog):
    task_id = tasks.noop.enqueue(1)
    (mine,) = claim(pg, limit=1, worker_id="w-a")
    lapse_and_reclaim(pg, task_id)
    stats, inflight = WorkerStats(), InFlight()
    inflight.add([mine])
    settler = Settler("default", inflight, stats)
    settler.start()

    with caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"):
        settler.put(Outcome(mine, SUCCESS, "succeeded", result=1))
        settler.stop(timeout=10)

    assert stats.get("lost") == 1
    assert stats.get(SUCCESS) == 0
    assert "lease lost before settlement" in caplog.text
    assert len(inflight) == 0


def test_one_settle_statement_writes_a_batch_and_reports_each_row(pg):
    ids = tasks.noop.enqueue_many(range(3))
    claimed = claim(pg, limit=3, worker_id="w-a")
    stale = claimed[0]
    lapse_and_reclaim(pg, stale.id)

    written = settle(pg, [success(t, result=t.id) for t in claimed])

    assert set(written) == set(ids) - {stale.id}
    assert row(pg, stale.id)["state"] == "running"


def test_heartbeat_renews_all_leases_in_one_fenced_update(pg):
    tasks.noop.enqueue_many(range(3))
    claimed = claim(pg, limit=3, worker_id="w-a", lease=5)
    lost = claimed[0]
    lapse_and_reclaim(pg, lost.id)
    leases = json.dumps(
        [{"id": t.id, "attempt": t.attempt, "token": t.lease_token} for t in claimed]
    )

    renewed = pg.execute(QUERIES["heartbeat"], {"leases": leases, "lease_seconds": 60}).fetchall()

    assert {r[0] for r in renewed} == {t.id for t in claimed[1:]}
    for task in claimed[1:]:
        assert row(pg, task.id)["lease_expires_at"] > task.lease_expires_at


def test_heartbeat_flags_the_context_of_a_task_whose_lease_was_lost(pg):
    task_id = tasks.noop.enqueue(1)
    (mine,) = claim(pg, limit=1, worker_id="w-a")
    from django_pgqueue.worker.execution import make_context

    mine.context = make_context(mine, "default")
    inflight, stats = InFlight(), WorkerStats()
    inflight.add([mine])
    lapse_and_reclaim(pg, task_id)
    heartbeat = Heartbeat("default", 10, 30, "w-a", inflight, stats, register=lambda: None)

    heartbeat.renew_leases()
    heartbeat.session.close()

    assert mine.context.lease_lost
    assert stats.get("lease_lost") == 1


def test_heartbeat_takes_a_lease_settled_by_its_own_commit_for_settled_not_lost(pg):
    # Given a claim an atomic attempt has just settled in its own transaction, whose
    # outcome has not reached the settler yet (so the worker still holds it in flight)
    task_id = tasks.noop.enqueue(1)
    (mine,) = claim(pg, limit=1, worker_id="w-a")
    from django_pgqueue.worker.execution import make_context

    mine.context = make_context(mine, "default")
    inflight, stats = InFlight(), WorkerStats()
    inflight.add([mine])
    assert settle(pg, [success(mine)]) == {task_id: "succeeded"}
    heartbeat = Heartbeat("default", 10, 30, "w-a", inflight, stats, register=lambda: None)

    # When the heartbeat cannot renew it
    heartbeat.renew_leases()
    heartbeat.session.close()

    # Then it is not taken for a lost lease
    assert not mine.context.lease_lost
    assert stats.get("lease_lost") == 0


def test_heartbeat_renews_a_lapsed_lease_nobody_recovered(pg):
    task_id = tasks.noop.enqueue(1)
    (mine,) = claim(pg, limit=1, worker_id="w-a")
    expire_lease(pg, task_id)
    leases = json.dumps([{"id": mine.id, "attempt": 1, "token": mine.lease_token}])

    renewed = pg.execute(QUERIES["heartbeat"], {"leases": leases, "lease_seconds": 30}).fetchall()

    assert [r[0] for r in renewed] == [task_id]
    assert sweep(pg) == []


def test_checkpoint_and_progress_writes_are_fenced(pg):
    task_id = tasks.noop.enqueue(1)
    (mine,) = claim(pg, limit=1, worker_id="w-a")
    lapse_and_reclaim(pg, task_id)
    params = {"id": mine.id, "attempt": mine.attempt, "token": mine.lease_token}

    saved = pg.execute(QUERIES["save_checkpoint"], {**params, "checkpoint": '{"x": 1}'})
    progressed = pg.execute(QUERIES["save_progress"], {**params, "progress": '{"x": 1}'})

    assert saved.rowcount == 0 and progressed.rowcount == 0
    assert row(pg, task_id)["checkpoint"] is None


def test_release_hands_the_task_back_after_the_release_delay_without_refunding_the_attempt(pg):
    task_id = tasks.noop.enqueue(1)
    (mine,) = claim(pg, limit=1)

    settle(pg, [released(mine).as_row()])

    stored = row(pg, task_id)
    assert (stored["state"], stored["attempt"], stored["lease_token"]) == ("scheduled", 1, None)
    # Not at once: the releasing process exits first (its handler thread dies with it).
    assert claim(pg, limit=1, worker_id="w-b") == []
    (due_in,) = pg.execute(
        "SELECT EXTRACT(EPOCH FROM run_at - now()) FROM pgqueue_task WHERE id = %s", [task_id]
    ).fetchone()
    assert 0 < due_in <= RELEASE_DELAY
    taken = wait_until(lambda: claim(pg, limit=1, worker_id="w-b"), timeout=RELEASE_DELAY + 10)
    assert [t.id for t in taken] == [task_id]


def test_release_on_the_final_attempt_dead_letters_with_an_explanation(pg):
    task_id = tasks.noop.using(max_attempts=1).enqueue(1)
    (mine,) = claim(pg, limit=1)

    settle(pg, [released(mine).as_row()])

    stored = row(pg, task_id)
    assert stored["state"] == "failed"
    assert stored["errors"][-1]["type"] == "WorkerShutdown"


def test_sweep_dead_letters_an_expired_lease_on_the_final_attempt(pg):
    task_id = tasks.noop.using(max_attempts=1).enqueue(1)
    claim(pg, limit=1)
    expire_lease(pg, task_id)

    assert [(r[0], r[1]) for r in sweep(pg)] == [(task_id, "failed")]
    stored = row(pg, task_id)
    assert stored["errors"][-1]["type"] == "LeaseExpired"
    assert stored["finished_at"] is not None


def test_two_sweepers_recover_each_expired_lease_once(pg):
    ids = tasks.noop.enqueue_many(range(50))
    claim(pg, limit=50)
    pg.execute("UPDATE pgqueue_task SET lease_expires_at = now() - interval '1 second'")
    results: list[list[tuple]] = []

    def run_sweep() -> None:
        from django_pgqueue.worker.connection import connect

        with connect("default") as conn:
            results.append(sweep(conn))

    threads = [threading.Thread(target=run_sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    recovered = [r[0] for result in results for r in result]
    assert sorted(recovered) == sorted(ids)
    assert {len(row(pg, i)["errors"]) for i in ids} == {1}


def test_heartbeat_skips_a_row_its_handler_has_locked_without_calling_it_lost(pg):
    from django_pgqueue.worker.connection import connect

    tasks.noop.enqueue_many(range(2))
    locked, free = claim(pg, limit=2, worker_id="w-a", lease=5)
    inflight, stats = InFlight(), WorkerStats()
    inflight.add([locked, free])
    heartbeat = Heartbeat("default", 10, 60, "w-a", inflight, stats, register=lambda: None)
    with connect("default") as handler_conn:  # the handler's own open transaction
        handler_conn.autocommit = False
        handler_conn.execute("SELECT 1 FROM pgqueue_task WHERE id = %s FOR UPDATE", [locked.id])

        heartbeat.renew_leases()

        handler_conn.rollback()
    heartbeat.session.close()
    assert stats.get("lease_lost") == 0
    assert stats.get("lease_renewals") == 1
    assert row(pg, free.id)["lease_expires_at"] > free.lease_expires_at
    assert row(pg, locked.id)["lease_expires_at"] == locked.lease_expires_at


def test_tasks_nobody_can_run_are_failed_with_an_explanation_after_the_ttl(pg):
    from datetime import timedelta

    from django.utils import timezone

    from django_pgqueue.worker.sweeper import Sweeper
    from tests.factories import TaskFactory

    long_ago = timezone.now() - timedelta(hours=2)
    pg.execute(
        "INSERT INTO pgqueue_worker (id, hostname, pid, queues, routes, concurrency)"
        " VALUES ('w-live', 'h', 1, %s, %s, 4)",
        ['["default"]', '[["tests.tasks.noop", 1]]'],
    )
    served = TaskFactory(task_name="tests.tasks.noop", run_at=long_ago)
    unknown = TaskFactory(task_name="os.system", run_at=long_ago)
    recent_unknown = TaskFactory(task_name="os.system", run_at=timezone.now())
    sweeper = Sweeper("default", 1, 60, 3600, WorkerStats())

    failed = sweeper.fail_unroutable()
    sweeper.session.close()

    assert failed == 1
    stored = row(pg, unknown.id)
    assert stored["state"] == "failed" and stored["attempt"] == 0
    assert "has registered task 'os.system' version 1" in stored["errors"][0]["message"]
    assert row(pg, served.id)["state"] == "pending"
    assert row(pg, recent_unknown.id)["state"] == "pending"


def test_the_vacuumer_vacuums_the_task_table_once_dead_tuples_pile_up(pg):
    from django_pgqueue.worker.vacuumer import Vacuumer

    pg.execute("INSERT INTO pgqueue_task (task_name) SELECT 'x' FROM generate_series(1, 3000)")
    pg.execute("UPDATE pgqueue_task SET priority = 1")  # 3,000 dead tuples

    def stats():
        return pg.execute(
            "SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables"
            " WHERE relname = 'pgqueue_task'"
        ).fetchone()

    wait_until(lambda: stats()[0] >= 3000, message="the statistics to count the dead tuples")
    before = stats()[1]
    quiet, busy = (
        Vacuumer("default", 5, 10_000, WorkerStats()),
        Vacuumer("default", 5, 1000, WorkerStats()),
    )

    quiet.tick()
    busy.tick()
    quiet.session.close()
    busy.session.close()

    assert quiet.stats.get("vacuums") == 0
    assert busy.stats.get("vacuums") == 1
    wait_until(lambda: stats()[1] == before + 1, message="the vacuum to be recorded")


@pytest.mark.parametrize("result", [None, False, 0, "", [], {}, True])
def test_a_success_stores_the_value_the_handler_returned_none_as_null(pg, result):
    """The settle row leaves out what is None or a false flag (outcomes.as_row): a
    handler's own False, 0 or empty value is still its result."""
    task_id = tasks.noop.enqueue(1)
    (mine,) = claim(pg, limit=1)

    assert settle(pg, [succeeded(mine, result, 0.001).as_row()]) == {task_id: "succeeded"}

    (stored, is_null) = pg.execute(
        "SELECT result, result IS NULL FROM pgqueue_task WHERE id = %s", [task_id]
    ).fetchone()
    assert is_null is (result is None)
    assert stored == result
