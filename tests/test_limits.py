"""Fleet-wide limits and pausing, with real worker processes judged from the ledger.

tests/settings.py limits three queues that only these tests use: "limited" (3 running
at once), "rated" (10 starts per second) and "limited_rated" (2 at once, 20/s). What
the handlers did is read from the ledger (tests/ledger.py), outside the database.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from django.db import connection, transaction

from django_pgqueue import pause, resume
from django_pgqueue.core.limits import parse_limits, parse_rate
from django_pgqueue.models import Queue, Task
from django_pgqueue.worker.connection import connect
from tests import ledger
from tests.conftest import wait_until
from tests.ledger_tasks import ledger_keyed, ledger_run
from tests.sqlhelpers import claim
from tests.tasks import just_sleep, noop

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ledger_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    return path


def all_runs(path: Path) -> list[ledger.Run]:
    return [run for runs in ledger.runs_of(ledger.read(path)).values() for run in runs]


def states(ids: list[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in Task.objects.filter(id__in=ids).values_list("state", flat=True):
        counts[state] = counts.get(state, 0) + 1
    return counts


def queue_row(name: str) -> dict:
    # values(): last_escape_at defaults to -infinity, which Python's datetime cannot hold
    return Queue.objects.values("paused", "paused_tasks").get(name=name)


def wait_all_succeeded(ids: list[int], timeout: float = 60) -> None:
    wait_until(
        lambda: states(ids).get("succeeded") == len(ids),
        timeout,
        interval=0.1,
        message=f"{len(ids)} tasks to succeed (now {states(ids)})",
    )


# -- concurrency -----------------------------------------------------------------------
@pytest.mark.slow  # long: run by CI's slow step, not the README's command
def test_a_queue_concurrency_limit_holds_across_four_workers_of_eight_slots(
    start_worker, ledger_file
):
    # Given 4 workers x 8 slots serving "limited" (at most 3 running, fleet-wide)
    workers = [start_worker("--queues", "limited", "--concurrency", "8") for _ in range(4)]
    # When 48 tasks of 0.15 s arrive at once
    ids = ledger_run.using(queue="limited").enqueue_many(
        [(n, 0.15) for n in range(48)]
    )
    wait_all_succeeded(ids)
    runs = all_runs(ledger_file)
    # Then never more than 3 handlers ran at once, and the limit was used, not undercut
    assert len(runs) == 48
    assert ledger.most_at_once(runs) == 3
    # and the work was spread over the fleet, not left to the first worker
    assert len({run.pid for run in runs}) >= 2, [w.pid for w in workers]


@pytest.mark.slow
def test_a_per_key_limit_never_overlaps_two_runs_of_one_key(start_worker, ledger_file):
    # Given 3 workers x 4 slots and tasks limited to one running per key
    for _ in range(3):
        start_worker("--concurrency", "4")
    keys = ["account:1", "account:2", "account:3"]
    # When 30 tasks of three keys arrive, ten of each, in one batch
    ids = ledger_keyed.enqueue_many([(n, keys[n % 3], 0.05) for n in range(30)])
    wait_all_succeeded(ids)
    key_of = dict(Task.objects.filter(id__in=ids).values_list("id", "concurrency_key"))
    runs = all_runs(ledger_file)
    # Then no two runs of one key overlapped
    for key in keys:
        of_key = [run for run in runs if key_of[run.task] == key]
        assert len(of_key) == 10
        assert ledger.most_at_once(of_key) == 1, key
    # while different keys ran side by side
    assert ledger.most_at_once(runs) >= 2


@pytest.mark.slow
def test_a_saturated_key_does_not_block_the_keys_behind_it(start_worker, ledger_file):
    # Given one worker x 4 slots, and a key whose 20 tasks are ahead in the queue
    ids = ledger_keyed.enqueue_many([(n, "busy", 0.1) for n in range(20)])
    other = ledger_keyed.enqueue(99, "other", 0.01)
    start_worker("--concurrency", "4")
    # When the worker starts, the other key's task runs long before the busy key drains
    wait_all_succeeded([other], timeout=10)
    assert states(ids).get("succeeded", 0) < 10
    wait_all_succeeded(ids)


# -- rate ------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_rate_limit_spreads_starts_over_the_period_across_workers(start_worker, ledger_file):
    # Given two workers serving "rated" (10 starts per second, fleet-wide) that poll
    # only every 10 minutes
    for _ in range(2):
        start_worker("--queues", "rated", "--concurrency", "8", "--poll-interval", "600")
    # When 30 quick tasks arrive at once
    ids = ledger_run.using(queue="rated").enqueue_many([(n, 0.01) for n in range(30)])
    # Then they all run, long before a poll: each worker waits for its budget to come
    # back, not for its next poll
    wait_all_succeeded(ids)
    runs = all_runs(ledger_file)
    assert len(runs) == 30
    # and no window of one second holds more than 10 starts (a fixed-window limiter
    # would allow 20 across a boundary)
    assert ledger.most_starts_within(runs, 0.98) <= 10


@pytest.mark.slow
def test_a_queue_with_both_limits_obeys_both(start_worker, ledger_file):
    start_worker("--queues", "limited_rated", "--concurrency", "8")
    start_worker("--queues", "limited_rated", "--concurrency", "8")
    ids = ledger_run.using(queue="limited_rated").enqueue_many([(n, 0.2) for n in range(12)])
    wait_all_succeeded(ids)
    runs = all_runs(ledger_file)
    assert ledger.most_at_once(runs) <= 2
    assert ledger.most_starts_within(runs, 0.98) <= 20


def test_rates_are_parsed_with_their_burst_and_spacing():
    rate = parse_rate("100/m")
    assert (rate.count, rate.seconds, rate.burst) == (100, 60.0, 5)
    # 5 at once after an idle spell, then one every 60/96 s: never 101 in a minute
    assert rate.interval == pytest.approx(60 / 96)
    assert parse_rate("5/30s").seconds == 30.0
    assert parse_rate("1/h").burst == 1


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"emails": {"rate": "100 per minute"}}, "write N/period"),
        ({"emails": {"concurrency": 0}}, "an int >= 1"),
        ({"emails": {"concurency": 3}}, "must be a dict with 'concurrency'"),
        ({"bad name!": {"concurrency": 3}}, "not a valid queue name"),
    ],
)
def test_invalid_limits_are_refused_with_what_to_write(limits, message):
    with pytest.raises(ValueError, match=message):
        parse_limits(limits)


def test_a_claim_frozen_holding_a_limited_queue_lock_holds_up_only_that_queue(
    start_worker, db_url
):
    """A worker frozen inside its limited claim (SIGSTOP, a VM pause) holds that queue's
    claim lock until its transaction ends; the others go on claiming their other queues,
    and claim the limited one as soon as the lock is free."""
    # Given a worker of "default" and "limited", and the lock of "limited" held by a
    # transaction that stays open, as a frozen claimer's would
    start_worker("--queues", "default,limited")
    with psycopg.connect(db_url) as frozen:
        frozen.execute("SELECT pg_advisory_xact_lock(1885827330, hashtext('limited'))")
        # When tasks of both queues arrive
        limited = noop.using(queue="limited").enqueue_many(range(3))
        plain = noop.enqueue_many(range(3))
        # Then the other queue's run, while the limited ones wait for the lock
        wait_all_succeeded(plain, timeout=10)
        assert states(limited) == {"pending": 3}
        frozen.rollback()  # the frozen claim's transaction ends
    # and the limited ones run once it is free
    wait_all_succeeded(limited, timeout=10)


# -- pause -----------------------------------------------------------------------------
def test_a_paused_queue_is_not_claimed_and_its_resume_wakes_an_idle_worker(start_worker):
    # Given a running worker of two queues that polls every 10 minutes, one queue paused
    start_worker("--queues", "default,other", "--concurrency", "8", "--poll-interval", "600")
    pause("default")
    # When tasks of both are enqueued together (their notification wakes the worker)
    with transaction.atomic():
        ids = noop.enqueue_many(range(5))
        sentinel = noop.using(queue="other").enqueue(0)
    # Then the claim that took the other queue's task took none of the paused queue's
    wait_all_succeeded([sentinel], timeout=30)
    assert states(ids) == {"pending": 5}
    assert queue_row("default")["paused"]
    # And after resume they run long before a poll: the resume's notification woke it
    assert resume("default")
    wait_all_succeeded(ids, timeout=60)


def test_pausing_a_task_name_leaves_the_rest_of_the_queue_running(start_worker):
    start_worker()
    pause("default", task_name=noop.name)
    held = noop.enqueue_many(range(3))
    others = [just_sleep.enqueue(0.01), just_sleep.enqueue(0.01)]  # same queue, other name
    wait_all_succeeded(others, timeout=10)
    assert states(held) == {"pending": 3}
    assert queue_row("default")["paused_tasks"] == [noop.name]
    resume("default", task_name=noop.name)
    wait_all_succeeded(held, timeout=5)
    assert queue_row("default")["paused_tasks"] == []


@pytest.mark.slow
def test_a_task_running_when_its_queue_is_paused_finishes(start_worker, ledger_file):
    start_worker("--queues", "default,other")
    (running,) = ledger_run.enqueue_many([(1, 1.0)])
    wait_until(lambda: states([running]).get("running"), 10, message="the task to start")
    pause("default")
    queued = ledger_run.enqueue_many([(2, 0.01)])
    wait_all_succeeded([running], timeout=10)
    # A task of another queue, enqueued now, runs: the worker claimed after the one
    # running ended, and left the paused queue's task alone
    wait_all_succeeded([noop.using(queue="other").enqueue(0)], timeout=10)
    assert states(queued) == {"pending": 1}


def test_pause_and_resume_of_a_queue_no_worker_serves_yet():
    pause("nightly")
    assert queue_row("nightly")["paused"]
    assert resume("nightly")
    assert not queue_row("nightly")["paused"]
    assert resume("never-seen") is False


def test_the_worker_registers_its_queues_so_they_can_be_paused(start_worker):
    start_worker("--queues", "default,emails")
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pgqueue_queue ORDER BY name")
        assert [r[0] for r in cursor.fetchall()] == ["default", "emails"]


# -- the limited claim, at the SQL level ------------------------------------------------


def limited_claim(
    pg, queues: list[str], limits: dict, limit: int = 10, key_limits: dict | None = None
) -> list[int]:
    """One claim of ``queues`` with these QUEUE_LIMITS (and per-key limits of routes), as
    a worker's lane makes it outside the starvation window: the full claim where a
    queue or a route is limited, else claim_plain."""
    claimed = claim(
        pg, limit, queue=queues, routes=[(noop.name, noop.version), *(key_limits or {})],
        look_for_starving=False, statement="claim" if limits or key_limits else "claim_plain",
        limits=parse_limits(limits), key_limits=key_limits,
    )
    return [t.id for t in claimed]


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_a_limited_claim_leaves_unlocked_the_rows_its_queue_has_no_room_for(pg, fair):
    # Given 10 due tasks (of a fair task, or not) in a queue of concurrency 2
    from tests.tenant_tasks import fair_job

    definition = fair_job if fair else noop
    definition.enqueue_many([("c",)] * 10 if fair else range(10))
    limits = parse_limits({"default": {"concurrency": 2}})
    with connect("default") as other:
        other.autocommit = False
        # When a limited claim takes its 2, in a transaction still open
        taken = claim(other, 10, routes=[(definition.name, definition.version)],
                      look_for_starving=False, statement="claim", limits=limits, fair=fair)
        # Then the rows it had no room for are not locked: another claimer could take
        # them (the claim's walk stops at the queue's room)
        free = pg.execute(
            "SELECT count(*) FROM (SELECT id FROM pgqueue_task WHERE state = 'pending' "
            "FOR UPDATE SKIP LOCKED) AS f"
        ).fetchone()[0]
        other.rollback()
    assert (len(taken), free) == (2, 8)


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_a_queue_without_limits_claimed_beside_a_full_limited_one_takes_all_it_can(pg, fair):
    # Given a limited queue at its limit (1 of 1 running), and 3 due tasks in another
    # queue, without limits, claimed together with it
    from tests.tenant_tasks import fair_job

    definition = fair_job if fair else noop
    noop.enqueue(0)
    limits = parse_limits({"default": {"concurrency": 1}})
    routes = [(noop.name, noop.version), (definition.name, definition.version)]
    assert len(claim(pg, 5, routes=routes, look_for_starving=False, statement="claim",
                     limits=limits)) == 1
    free = definition.using(queue="other").enqueue_many([("c",)] * 3 if fair else range(3))
    # When both are claimed, then the other queue's room is its own: it takes all 3
    taken = claim(pg, 10, queue=["default", "other"], routes=routes, look_for_starving=False,
                  statement="claim", limits=limits, fair=fair)
    assert sorted(t.id for t in taken) == free


def keyed_rows(keys: str, fair: bool, queue: str = "default") -> list:
    """Due rows, one per letter of ``keys``, its concurrency key that letter: of the fair
    task (its fair key too, all at the head of the fair line) or of a keyed one."""
    from tests.factories import TaskFactory
    from tests.tenant_tasks import fair_job

    definition = fair_job if fair else ledger_keyed
    return [TaskFactory(task_name=definition.name, handler_version=definition.version,
                        queue=queue, concurrency_key=key,
                        **({"fair_key": key, "fair_tag": 0} if fair else {}))
            for key in keys]  # fmt: skip


def keyed_claim(pg, key_limit: int, fair: bool, queues: list[str] | None = None) -> list[int]:
    """One claim of one row, the task's route limited to ``key_limit`` per key."""
    from tests.tenant_tasks import fair_job

    definition = fair_job if fair else ledger_keyed
    route = (definition.name, definition.version)
    taken = claim(pg, 1, queue=queues or ["default"], routes=[route],
                  key_limits={route: key_limit}, fair=fair, look_for_starving=False,
                  statement="claim")
    return [t.id for t in taken]


WALKS = pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])


@WALKS
def test_a_walk_passes_over_a_key_at_its_limit_to_the_next_key(pg, fair):
    # Given key a at its limit (1 running), its next row first in line, then b's
    a_running, a_next, b_next = keyed_rows("aab", fair)
    assert keyed_claim(pg, 1, fair) == [a_running.id]
    # When one more row is claimed, then it is b's (a's rows do not fill the walk)
    assert keyed_claim(pg, 1, fair) == [b_next.id]
    assert Task.objects.get(id=a_next.id).state == "pending"


@WALKS
def test_a_walk_takes_a_key_below_its_limit(pg, fair):
    # Given key a with one running of two allowed
    a_running, a_next = keyed_rows("aa", fair)
    assert keyed_claim(pg, 2, fair) == [a_running.id]
    # When one more is claimed, then a still has room: its next row starts
    assert keyed_claim(pg, 2, fair) == [a_next.id]


@WALKS
def test_a_walk_counts_a_key_running_in_another_queue_apart(pg, fair):
    # Given key a running in another queue (at the limit there), and a's row here
    (elsewhere,) = keyed_rows("a", fair, queue="other")
    (here,) = keyed_rows("a", fair)
    assert keyed_claim(pg, 1, fair, ["other"]) == [elsewhere.id]
    # When both queues are claimed, then a's row here starts: each queue counts its own
    assert keyed_claim(pg, 1, fair, ["default", "other"]) == [here.id]


def per_key(limit: str) -> tuple[tuple[str, int], dict]:
    """The route of a keyed task, and the claim's keyword for one start of each key at
    a time ("concurrency") or an hour ("rate")."""
    from tests.ledger_tasks import ledger_key_rated

    if limit == "concurrency":
        route = (ledger_keyed.name, ledger_keyed.version)
        return route, {"key_limits": {route: 1}}
    route = (ledger_key_rated.name, ledger_key_rated.version)
    return route, {"key_rates": {route: parse_rate("1/h")}}


@pytest.mark.parametrize("limit", ["concurrency", "rate"])
def test_rows_without_a_key_are_not_held_by_a_per_key_limit(pg, limit):
    # Given 3 due rows of a keyed task whose key function gave None (no key)
    from tests.factories import TaskFactory

    route, extra = per_key(limit)
    rows = [TaskFactory(task_name=route[0], handler_version=route[1]) for _ in range(3)]
    # When claimed, then all 3 start: a per-key limit holds back keys, not rows without
    taken = claim(pg, 3, routes=[route], look_for_starving=False, statement="claim", **extra)
    assert sorted(t.id for t in taken) == [r.id for r in rows]


def test_a_keys_rate_budget_is_its_queues_own(pg):
    # Given key k out of budget in another queue (its next start an hour away there)
    from tests.factories import TaskFactory

    route, extra = per_key("rate")
    pg.execute("INSERT INTO pgqueue_key_rate (queue, key, tat) "
               "VALUES ('other', 'k', now() + interval '1 hour')")
    here = TaskFactory(task_name=route[0], handler_version=route[1], concurrency_key="k")
    # When k's row here is claimed, then it starts: here, k's budget is whole
    taken = claim(pg, 1, routes=[route], look_for_starving=False, statement="claim", **extra)
    assert [t.id for t in taken] == [here.id]


def test_a_claim_spends_the_rate_budget_of_the_keys_it_started_only(pg):
    # Given keys j and k due, one start an hour each, and k out of budget for 30 minutes
    from tests.factories import TaskFactory

    route, extra = per_key("rate")
    pg.execute("INSERT INTO pgqueue_key_rate (queue, key, tat) "
               "VALUES ('default', 'k', now() + interval '30 minutes')")
    (k_budget,) = pg.execute("SELECT tat FROM pgqueue_key_rate WHERE key = 'k'").fetchone()
    j, _k = (TaskFactory(task_name=route[0], handler_version=route[1], concurrency_key=key)
             for key in "jk")  # fmt: skip
    # When a claim meets both, then it starts j's only, and spends j's budget only
    taken = claim(pg, 2, routes=[route], look_for_starving=False, statement="claim", **extra)
    assert [t.id for t in taken] == [j.id]
    assert pg.execute("SELECT tat FROM pgqueue_key_rate WHERE key = 'k'").fetchone() == (
        k_budget,
    )


def rated_and_keyed(pg, first: str) -> tuple:
    """Key k's rows of two tasks that share it: one rated (one start an hour per key),
    one with one run at a time per key, the ``first`` ("rated" or "keyed") first in
    line; and the claim's keywords for both routes."""
    from tests.factories import TaskFactory
    from tests.ledger_tasks import ledger_key_rated

    rated_route = (ledger_key_rated.name, ledger_key_rated.version)
    keyed_route = (ledger_keyed.name, ledger_keyed.version)
    order = [rated_route, keyed_route] if first == "rated" else [keyed_route, rated_route]
    rows = {route: TaskFactory(task_name=route[0], handler_version=route[1],
                               concurrency_key="k") for route in order}  # fmt: skip
    extra = {"routes": order, "key_rates": {rated_route: parse_rate("1/h")},
             "key_limits": {keyed_route: 1}, "look_for_starving": False, "statement": "claim"}
    return rows[rated_route], rows[keyed_route], extra


def key_budget(pg, key: str = "k"):
    return pg.execute("SELECT tat FROM pgqueue_key_rate WHERE key = %s", [key]).fetchone()


def test_a_keys_row_held_by_its_rate_leaves_the_keys_run_to_another_tasks_row(pg):
    # Given key k out of its rate budget for 30 minutes, and k's rows of a rated task
    # (first in line) and of a task of one run at a time per key
    pg.execute("INSERT INTO pgqueue_key_rate (queue, key, tat) "
               "VALUES ('default', 'k', now() + interval '30 minutes')")
    spent = key_budget(pg)
    rated, keyed, extra = rated_and_keyed(pg, first="rated")
    # When claimed, then the other task's row starts: nothing of k runs, and the rated
    # row held by its budget takes no place of k's concurrency
    assert [t.id for t in claim(pg, 2, **extra)] == [keyed.id]
    assert Task.objects.get(id=rated.id).state == "pending"
    # And k's budget is as it was: a start of a task without a rate spends none of it
    assert key_budget(pg) == spent


def test_a_row_of_a_task_without_a_rate_takes_no_place_of_a_keys_rate_budget(pg):
    # Given key k with its whole budget (one start), its row of a task without a rate
    # first in line, then its row of the rated task
    rated, keyed, extra = rated_and_keyed(pg, first="keyed")
    extra["key_limits"] = {}
    # When claimed, then both start: the budget's one start is the rated row's
    assert sorted(t.id for t in claim(pg, 2, **extra)) == sorted([rated.id, keyed.id])
    # And it is spent once: an hour from the claim
    (ahead,) = pg.execute(
        "SELECT extract(epoch FROM tat - now()) FROM pgqueue_key_rate WHERE key = 'k'"
    ).fetchone()
    assert 3500 < ahead <= 3600


def test_a_key_with_budget_for_more_starts_only_as_many_as_its_concurrency(pg):
    # Given key k's 3 due rows of a task of one run at a time per key and a key rate
    # whose budget allows 5 starts at once
    from tests.factories import TaskFactory
    from tests.ledger_tasks import ledger_key_rated

    route = (ledger_key_rated.name, ledger_key_rated.version)
    for _ in range(3):
        TaskFactory(task_name=route[0], handler_version=route[1], concurrency_key="k")
    # When claimed, then one starts: the budget lets them start, the concurrency holds
    taken = claim(pg, 3, routes=[route], key_rates={route: parse_rate("100/m")},
                  key_limits={route: 1}, look_for_starving=False, statement="claim")
    assert len(taken) == 1


def test_one_key_due_in_two_queues_starts_once_in_each(pg):
    # Given key k due in two queues, one start an hour per key, in each queue
    from tests.factories import TaskFactory

    route, extra = per_key("rate")
    rows = [TaskFactory(task_name=route[0], handler_version=route[1], concurrency_key="k",
                        queue=queue) for queue in ("default", "other")]  # fmt: skip
    # When both queues are claimed together, then k starts once in each
    taken = claim(pg, 4, queue=["default", "other"], routes=[route], look_for_starving=False,
                  statement="claim", **extra)
    assert sorted(t.id for t in taken) == [r.id for r in rows]


def test_a_queue_concurrency_limit_counts_its_own_running_tasks_only(pg):
    # Given 3 tasks running in a queue without a limit, and 5 due in a queue of 2
    noop.using(queue="other").enqueue_many(range(3))
    assert len(limited_claim(pg, ["other"], {})) == 3
    noop.enqueue_many(range(5))
    limits = {"default": {"concurrency": 2}}

    # When the limited queue is claimed, then it takes its 2, and no more while they run
    assert len(limited_claim(pg, ["default"], limits)) == 2
    assert limited_claim(pg, ["default"], limits) == []


def test_a_queue_rate_budget_is_its_own_not_another_limited_queues(pg):
    # Given two queues of one start an hour each, and one of them has spent its start
    limits = {"default": {"rate": "1/h"}, "other": {"rate": "1/h"}}
    Queue.objects.bulk_create([Queue(name="default"), Queue(name="other")],
                              ignore_conflicts=True)
    noop.using(queue="other").enqueue_many(range(3))
    noop.enqueue_many(range(3))
    assert len(limited_claim(pg, ["other"], limits)) == 1
    assert limited_claim(pg, ["other"], limits) == []

    # When both are claimed, then the other queue still has its start
    taken = limited_claim(pg, ["default", "other"], limits)
    assert Task.objects.filter(id__in=taken, queue="default").count() == 1
    assert len(taken) == 1


def test_a_claim_of_two_rated_queues_spends_only_the_budget_of_the_queue_it_started(pg):
    # Given two queues of one start an hour each, and work in one of them only
    limits = {"default": {"rate": "1/h"}, "other": {"rate": "1/h"}}
    noop.using(queue="other").enqueue(0)
    # When both are claimed, and the other queue's task starts
    assert len(limited_claim(pg, ["default", "other"], limits)) == 1
    # Then this queue still has its start for the task that comes next
    mine = noop.enqueue(1)
    assert limited_claim(pg, ["default", "other"], limits) == [mine]


def test_a_key_limit_counts_the_keys_running_tasks_not_its_waiting_ones(pg):
    # Given 3 due tasks of key a and 2 of key b, one running at a time per key
    for n, key in enumerate("aaabb"):
        ledger_keyed.enqueue(n, key)
    key_limits = {(ledger_keyed.name, ledger_keyed.version): 1}

    # When claimed twice, then each key starts one, and none more while it runs
    taken = limited_claim(pg, ["default"], {}, key_limits=key_limits)
    assert sorted(Task.objects.filter(id__in=taken).values_list("concurrency_key", flat=True)) == [
        "a", "b"]
    assert limited_claim(pg, ["default"], {}, key_limits=key_limits) == []
