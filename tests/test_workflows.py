"""Waiting work (docs/workflows.md): dependencies, chains, groups, chords, suspend and
signal. Real PostgreSQL throughout; real worker processes where a worker acts, and
the contract statements called directly where the race is the point."""

from __future__ import annotations

import json
import signal as os_signal
from pathlib import Path

import pytest
from django.db import connection, transaction

from django_pgqueue import InvalidTaskError, Suspend, cancel, signal
from django_pgqueue.models import Dependency, Task
from django_pgqueue.ops import operations
from django_pgqueue.tasking.workflows import chain, chord, group
from tests import ledger, sqlhelpers
from tests.conftest import wait_until
from tests.workflow_tasks import collect, fail_once, parent_of_child, step, wait_for_signal

pytestmark = pytest.mark.django_db(transaction=True)

FAST_LEASE = ("--lease", "2", "--heartbeat", "0.5", "--sweep-interval", "0.25")


@pytest.fixture
def ledger_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    return path


def runs(path: Path) -> list[dict]:
    return [e for e in ledger.read(path) if e["event"] == "run"] if path.exists() else []


def state(task_id: int) -> str:
    return Task.objects.values_list("state", flat=True).get(pk=task_id)


def row(task_id: int) -> Task:
    return Task.objects.get(pk=task_id)


def wait_state(task_id: int, wanted: str, timeout: float = 20) -> None:
    wait_until(lambda: state(task_id) == wanted, timeout, 0.05,
               message=f"task {task_id} to be {wanted} (is {state(task_id)})")  # fmt: skip


# -- dependencies ----------------------------------------------------------------------
def test_a_dependent_waits_and_is_pending_in_the_transaction_that_settles_its_last_parent(pg):
    # Given a task after two parents
    a, b = step.enqueue("a"), step.enqueue("b")
    child = step.using(after=[a, b]).enqueue("child")
    assert state(child) == "waiting"
    assert row(child).parents_pending == 2
    (claimed_a, claimed_b) = sorted(sqlhelpers.claim(pg, 2), key=lambda t: t.id)
    # When the first parent settles, the child still waits
    sqlhelpers.settle(pg, [sqlhelpers.success(claimed_a, "A")])
    assert state(child) == "waiting"
    # and the statement that settles the last one makes it pending, nothing else
    sqlhelpers.settle(pg, [sqlhelpers.success(claimed_b, "B")])
    assert state(child) == "pending"
    assert row(child).wake == {"reason": "parents", "task": b, "state": "succeeded"}
    (claimed,) = sqlhelpers.claim(pg, 1)
    assert claimed.id == child


def test_a_chain_runs_its_steps_one_after_the_other(start_worker, ledger_file):
    start_worker("--concurrency", "4")
    ids = chain(step.step("1", 0.1), step.step("2", 0.1), step.step("3", 0.1))
    wait_state(ids[-1], "succeeded")
    seen = runs(ledger_file)
    assert [e["label"] for e in seen] == ["1", "2", "3"]
    # each started after the one before had ended (its settlement released it)
    finished = dict(Task.objects.filter(pk__in=ids).values_list("pk", "finished_at"))
    started = dict(Task.objects.filter(pk__in=ids).values_list("pk", "started_at"))
    assert started[ids[1]] >= finished[ids[0]] and started[ids[2]] >= finished[ids[1]]


@pytest.mark.slow
def test_a_chord_runs_its_callback_once_after_every_member_with_their_results(
    start_worker, ledger_file
):
    for _ in range(2):
        start_worker("--concurrency", "8")
    members, callback = chord([step.step(str(n), 0.02) for n in range(60)], collect.step("cb"))
    wait_state(callback, "succeeded", timeout=30)
    assert [e["label"] for e in runs(ledger_file)].count("cb") == 1
    result = row(callback).result
    assert len(result) == 60
    assert all(v == ["succeeded", str(n)] for n, (_, v) in enumerate(sorted(
        result.items(), key=lambda kv: int(kv[0]))))  # fmt: skip
    last_member_end = max(Task.objects.filter(pk__in=members).values_list("finished_at", flat=True))
    assert row(callback).started_at >= last_member_end


def test_a_failed_step_cancels_the_rest_of_its_chain_naming_it(start_worker):
    start_worker()
    with transaction.atomic():  # else the head may fail before the rest is enqueued
        first, second, third = chain(fail_once.step("a"), step.step("b"), step.step("c"))
    wait_state(third, "cancelled")
    assert state(first) == "failed" and state(second) == "cancelled"
    error = row(second).errors[-1]
    assert error["type"] == "UpstreamFailed"
    assert f"task {first} " in error["message"] and "ended failed" in error["message"]
    assert "through other tasks" in row(third).errors[-1]["message"]


def test_a_dependent_enqueued_to_run_anyway_runs_after_a_failed_parent(start_worker):
    start_worker()
    parent = fail_once.enqueue("a")
    child = collect.using(after=[parent], after_failure="run").enqueue("child")
    wait_state(child, "succeeded")
    assert row(child).result == {str(parent): ["failed", None]}


@pytest.mark.slow
def test_a_chain_of_a_thousand_steps_cancelled_at_its_head_is_cancelled_in_one_go(pg):
    ids = chain(*[step.step(str(n)) for n in range(1000)])
    assert Task.objects.filter(pk__in=ids, state="waiting").count() == 999
    cancel(ids[0])
    assert Task.objects.filter(pk__in=ids, state="cancelled").count() == 1000


def test_waiting_for_a_task_that_does_not_exist_is_refused_and_writes_nothing():
    existing = step.enqueue("a")
    with pytest.raises(InvalidTaskError, match=r"no task with id\(s\) 999999"):
        step.using(after=[existing, 999999]).enqueue("b")
    assert Task.objects.count() == 1
    assert Dependency.objects.count() == 0


def test_waiting_for_tasks_that_already_ended(pg):
    done, dead = step.enqueue("done"), fail_once.enqueue("dead")
    claimed = {t.id: t for t in sqlhelpers.claim(pg, 2)}
    sqlhelpers.settle(pg, [sqlhelpers.success(claimed[done], "ok")])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgqueue_task SET state = 'failed', lease_token = NULL WHERE id = %s",
                       [dead])  # fmt: skip
    # after a succeeded task: pending at once; after a failed one: cancelled at once
    assert state(step.using(after=[done]).enqueue("x")) == "pending"
    refused = step.using(after=[done, dead]).enqueue("y")
    assert state(refused) == "cancelled"
    assert "had already ended failed" in row(refused).errors[-1]["message"]
    assert state(step.using(after=[dead], after_failure="run").enqueue("z")) == "pending"


def test_a_rolled_back_workflow_leaves_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        chord([step.step("a"), step.step("b")], collect.step("cb"))
        raise RuntimeError("roll back")
    assert Task.objects.count() == 0 and Dependency.objects.count() == 0


def test_a_parent_that_ends_by_the_lease_sweep_releases_its_dependents(pg):
    parent = fail_once.enqueue("a")  # max_attempts=1: the sweep dead-letters it
    child = step.using(after=[parent]).enqueue("b")
    (claimed,) = sqlhelpers.claim(pg, 1)
    sqlhelpers.expire_lease(pg, claimed.id)
    sqlhelpers.sweep(pg)
    assert state(parent) == "failed"
    assert state(child) == "cancelled"


def test_a_group_runs_side_by_side_after_its_parent(start_worker, ledger_file):
    start_worker("--concurrency", "4")
    head = step.enqueue("head", 0.05)
    ids = group([step.step(f"m{n}", 0.3) for n in range(4)], after=[head])
    for task_id in ids:
        wait_state(task_id, "succeeded")
    starts = sorted(e["t"] for e in runs(ledger_file) if e["label"].startswith("m"))
    assert starts[-1] - starts[0] < 0.25  # together, not one after the other


# -- suspend and signal ----------------------------------------------------------------
def test_a_suspended_task_resumes_on_its_signal_without_burning_an_attempt(start_worker):
    start_worker()
    task_id = wait_for_signal.enqueue("approved")
    wait_state(task_id, "waiting")
    waiting = row(task_id)
    assert (waiting.wait_reason, waiting.wait_signal, waiting.attempt) == ("signal", "approved", 0)
    assert waiting.lease_token is None
    assert signal(task_id, "approved", {"by": "ops"}) == "resumed"
    wait_state(task_id, "succeeded")
    result = row(task_id).result
    assert result["wake"] == {"reason": "signal", "signal": "approved", "payload": {"by": "ops"}}
    assert result["signals"] == {"approved": {"by": "ops"}}
    assert result["checkpoint"] == {"suspended_on": 1}
    assert result["attempt"] == 1  # the suspended attempt was refunded


def test_a_signal_sent_before_the_task_suspends_is_not_lost(pg):
    task_id = wait_for_signal.enqueue("approved")
    (claimed,) = sqlhelpers.claim(pg, 1)
    # the signal arrives while the handler still runs
    assert signal(task_id, "approved", 42) == "stored"
    sqlhelpers.settle(pg, [suspension(claimed, "approved")])
    assert state(task_id) == "pending"
    assert row(task_id).wake["payload"] == 42


@pytest.mark.parametrize("when", ["scheduled", "pending"])
def test_a_signal_sent_before_the_task_starts_is_kept_for_it_alone(when):
    options = {"delay": 3600} if when == "scheduled" else {}
    task_id = wait_for_signal.using(**options).enqueue("approved")
    other = wait_for_signal.enqueue("approved")

    assert signal(task_id, "approved", 7) == "stored"

    assert (row(task_id).state, row(task_id).signals) == (when, {"approved": 7})
    assert row(other).signals == {}


def test_a_signal_for_another_name_does_not_resume(pg):
    task_id = wait_for_signal.enqueue("approved")
    (claimed,) = sqlhelpers.claim(pg, 1)
    sqlhelpers.settle(pg, [suspension(claimed, "approved")])
    assert signal(task_id, "rejected") == "stored"
    assert state(task_id) == "waiting"
    assert signal(999999, "approved") is None


def test_a_suspension_times_out_and_the_handler_sees_it(start_worker):
    start_worker()
    task_id = wait_for_signal.enqueue("approved", 0.5)
    wait_state(task_id, "succeeded", timeout=10)
    result = row(task_id).result
    assert result["timed_out"] is True
    assert result["wake"] == {"reason": "timeout", "waited_for": "signal", "signal": "approved"}


def test_a_stale_worker_cannot_suspend_a_task_it_lost(pg):
    task_id = wait_for_signal.enqueue("approved")
    (old,) = sqlhelpers.claim(pg, 1)
    sqlhelpers.expire_lease(pg, task_id)
    sqlhelpers.sweep(pg)
    (new,) = sqlhelpers.claim(pg, 1, worker_id="w2")
    # the old run's suspension matches nothing; the new run keeps its lease
    assert sqlhelpers.settle(pg, [suspension(old, "approved")]) == {}
    current = row(task_id)
    assert (current.state, str(current.lease_token)) == ("running", new.lease_token)


def test_a_stale_worker_cannot_wait_for_a_child(pg):
    parent = wait_for_signal.enqueue("x")
    child = step.enqueue("child")
    (old,) = [t for t in sqlhelpers.claim(pg, 2) if t.id == parent]
    sqlhelpers.expire_lease(pg, parent)
    sqlhelpers.sweep(pg)
    rows = pg.execute(
        "-- stale\n" + sqlhelpers.QUERIES["wait_for_tasks"],
        {"id": parent, "attempt": old.attempt, "token": old.lease_token, "ids": [child]},
    ).fetchall()
    assert rows == [] and Dependency.objects.count() == 0


def test_wait_for_links_the_tasks_named_and_never_the_waiting_task_itself(pg):
    parent = wait_for_signal.enqueue("x")
    child = step.enqueue("child")
    bystander = step.enqueue("bystander")
    (me,) = [t for t in sqlhelpers.claim(pg, 3) if t.id == parent]

    rows = pg.execute(
        sqlhelpers.QUERIES["wait_for_tasks"],
        {"id": parent, "attempt": me.attempt, "token": me.lease_token, "ids": [child, parent]},
    ).fetchall()

    assert rows == [(child,)]
    assert list(Dependency.objects.values_list("parent_id", "child_id")) == [(child, parent)]
    assert not row(bystander).has_dependents and not row(parent).has_dependents


def test_one_settle_of_tasks_waiting_for_children_judges_each_by_its_own(pg):
    """One batch: a task with two children still to run, one with one, and one whose
    child has ended. Each waits for its own open children; the last is pending at once."""
    parents = [wait_for_signal.enqueue(name) for name in ("two", "one", "none")]
    claimed = sqlhelpers.claim(pg, 3)
    assert [t.id for t in claimed] == parents
    children = [[step.enqueue("a"), step.enqueue("b")], [step.enqueue("c")], [step.enqueue("d")]]
    Task.objects.filter(pk=children[2][0]).update(state="succeeded")
    for lease, ids in zip(claimed, children, strict=True):
        pg.execute(
            sqlhelpers.QUERIES["wait_for_tasks"],
            {"id": lease.id, "attempt": lease.attempt, "token": lease.lease_token, "ids": ids},
        )

    settled = sqlhelpers.settle(pg, [suspension(t, None, reason="child") for t in claimed])

    assert settled == dict(zip(parents, ["waiting", "waiting", "pending"], strict=True))
    assert [row(p).parents_pending for p in parents[:2]] == [2, 1]
    assert row(parents[2]).wake["reason"] == "child"


def test_a_handler_waits_for_its_child_and_resumes_with_its_result(start_worker):
    start_worker("--concurrency", "2")
    task_id = parent_of_child.enqueue(1)
    wait_state(task_id, "succeeded", timeout=20)
    result = row(task_id).result
    assert result["result"] == f"child of {task_id}"
    assert result["wake"]["reason"] == "child"
    assert row(task_id).attempt == 1


def test_a_suspension_on_a_child_that_ended_meanwhile_resumes_at_once(pg):
    parent = wait_for_signal.enqueue("x")
    child = step.enqueue("child")
    claimed = {t.id: t for t in sqlhelpers.claim(pg, 2)}
    pg.execute(sqlhelpers.QUERIES["wait_for_tasks"], {
        "id": parent, "attempt": claimed[parent].attempt,
        "token": claimed[parent].lease_token, "ids": [child]})  # fmt: skip
    sqlhelpers.settle(pg, [sqlhelpers.success(claimed[child], "done")])
    sqlhelpers.settle(pg, [suspension(claimed[parent], None, reason="child")])
    assert state(parent) == "pending"


def test_cancelling_a_waiting_task_cancels_what_waits_for_it():
    parent = wait_for_signal.enqueue("x")
    middle = step.using(after=[parent]).enqueue("m")
    last = step.using(after=[middle]).enqueue("l")
    assert cancel(middle) == "cancelled"
    assert state(last) == "cancelled" and state(parent) == "pending"


def test_suspend_refuses_a_bad_signal_name():
    with pytest.raises(ValueError, match="signal name"):
        Suspend("")


@pytest.mark.slow
def test_a_worker_killed_while_a_chords_members_run_still_runs_the_callback_once(
    start_worker, ledger_file
):
    # Given two workers with a short lease, and a chord of 40 members of 0.1 s
    victim = start_worker("--concurrency", "4", *FAST_LEASE)
    start_worker("--concurrency", "4", *FAST_LEASE)
    members, callback = chord([step.step(str(n), 0.1) for n in range(40)], collect.step("cb"))
    wait_until(lambda: Task.objects.filter(pk__in=members, state="succeeded").count() >= 10,
               20, message="members to start")  # fmt: skip
    # When one worker is killed with members in flight
    victim.signal(os_signal.SIGKILL)
    victim.proc.wait(10)
    # Then the survivors' leases are recovered, and the callback runs exactly once
    wait_state(callback, "succeeded", timeout=40)
    assert [e["label"] for e in runs(ledger_file)].count("cb") == 1
    assert len(row(callback).result) == 40
    assert Task.objects.filter(pk__in=members, state="succeeded").count() == 40


def suspension(task, signal_name: str | None, reason: str = "signal") -> dict:
    return {
        "id": task.id, "attempt": task.attempt, "token": task.lease_token,
        "label": "suspended", "state": "waiting", "attempt_refund": True,
        "wait_reason": reason, "wait_signal": signal_name,
    }  # fmt: skip


def test_signal_payloads_must_be_json():
    task_id = wait_for_signal.enqueue("x")
    with pytest.raises(InvalidTaskError):
        signal(task_id, "x", object())
    assert json.dumps(row(task_id).signals) == "{}"


@pytest.mark.slow  # a second worker started within the slow member's 3 s: not under load
def test_a_worker_killed_running_a_chords_last_member_still_gets_the_callback_run_once(
    start_worker, ledger_file
):
    # Given a chord whose last member to finish is a slow one
    first = start_worker("--concurrency", "4", *FAST_LEASE)
    members, callback = chord(
        [step.step(str(n), 0.01) for n in range(20)] + [step.step("slow", 3.0)],
        collect.step("cb"),
    )
    slow = members[-1]
    wait_until(lambda: Task.objects.filter(pk__in=members[:-1], state="succeeded").count() == 20
               and state(slow) == "running", 20, message="only the slow member left")  # fmt: skip
    second = start_worker("--concurrency", "4", *FAST_LEASE)
    # When the worker running it is killed before the last member settles
    first.signal(os_signal.SIGKILL)
    first.proc.wait(10)
    ledger.record_exit(ledger_file, first.pid)
    # Then the member is recovered and run again elsewhere, and the callback runs once,
    # after it
    wait_state(callback, "succeeded", timeout=30)
    assert second.proc.poll() is None
    labels = [e["label"] for e in runs(ledger_file)]
    assert labels.count("slow") == 2 and labels.count("cb") == 1
    assert row(callback).result[str(slow)] == ["succeeded", "slow"]


@pytest.mark.slow  # ten thousand runs through one worker
def test_a_group_of_ten_thousand_runs_its_callback_once(start_worker, ledger_file):
    _members, callback = chord([step.step("m") for _ in range(10_000)], collect.step("cb"))
    assert row(callback).parents_pending == 10_000
    start_worker("--concurrency", "10")
    wait_state(callback, "succeeded", timeout=120)
    assert [e["label"] for e in runs(ledger_file)].count("cb") == 1
    assert len(row(callback).result) == 10_000


@pytest.mark.slow  # a thousand runs, one after the other
def test_a_chain_of_a_thousand_steps_completes(start_worker):
    ids = chain(*[step.step(str(n)) for n in range(1000)])
    start_worker()
    wait_state(ids[-1], "succeeded", timeout=120)
    assert Task.objects.filter(pk__in=ids, state="succeeded").count() == 1000


def test_retention_prunes_the_edges_of_the_tasks_it_prunes(pg):
    parent = step.enqueue("a")
    child = step.using(after=[parent]).enqueue("b")
    for _ in range(2):
        (claimed,) = sqlhelpers.claim(pg, 1)
        sqlhelpers.settle(pg, [sqlhelpers.success(claimed, "ok")])
    assert state(child) == "succeeded" and Dependency.objects.count() == 1
    pg.execute(sqlhelpers.QUERIES["prune"], {"result_ttl": 0, "dead_ttl": 0, "batch": 100})
    assert Task.objects.count() == 0 and Dependency.objects.count() == 0


def test_deleting_finished_tasks_deletes_their_edges_as_retention_does(pg):
    # given: a parent and its child, both finished, joined by their edge; and another
    # finished pair that is not deleted
    parent = step.enqueue("a")
    child = step.using(after=[parent]).enqueue("b")
    other_parent = step.enqueue("c")
    other_child = step.using(after=[other_parent]).enqueue("d")
    for _ in range(4):
        (claimed,) = sqlhelpers.claim(pg, 1)
        sqlhelpers.settle(pg, [sqlhelpers.success(claimed, "ok")])
    assert Dependency.objects.count() == 2

    # when: an operator deletes the first pair (the admin's delete, the bulk action)
    assert sorted(operations.delete_finished([parent, child])) == sorted([parent, child])

    # then: their edge goes with them; the other pair's stays
    assert list(Dependency.objects.values_list("parent_id", "child_id")) == [
        (other_parent, other_child)
    ]
