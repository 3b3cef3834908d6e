"""Unique jobs: ``unique_key`` with ``unique_for``, ``unique_states`` and ``on_conflict``.

What a caller relies on: which id comes back, how many rows exist, which arguments a
run gets. Concurrent enqueuers are separate connections in separate transactions
(threads here, processes in the slow tests); claims are the worker's own statement
(tests/sqlhelpers.py) or a worker subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_pgqueue import InvalidTaskError, task
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Task
from django_pgqueue.tasking.enqueue import build_row
from django_pgqueue.tasking.registry import registry
from tests import tasks, unique_tasks
from tests.conftest import REPO, wait_until
from tests.ledger import LEDGER_ENV
from tests.pgcluster import django_env
from tests.sqlhelpers import claim, settle
from tests.test_explain import analyze, buffers, node_types, rows_read

pytestmark = pytest.mark.django_db
committed = pytest.mark.django_db(transaction=True)  # other connections see the rows

LIVE = ["scheduled", "pending", "running", "waiting"]


def end(task_id: int, state: str = "succeeded") -> None:
    now = timezone.now()
    Task.objects.filter(pk=task_id).update(state=state, started_at=now, finished_at=now)


def enqueued_ago(task_id: int, seconds: float) -> None:
    Task.objects.filter(pk=task_id).update(
        enqueued_at=timezone.now() - timedelta(seconds=seconds)
    )


def rows(key: str) -> list[Task]:
    return list(Task.objects.filter(unique_key=key).order_by("id"))


def lock_waiters(pg: psycopg.Connection) -> int:
    """Backends of this test database waiting for a lock (a row, an index entry, an
    advisory lock). ``pg`` must be outside a transaction: a transaction sees one
    snapshot of pg_stat_activity."""
    return pg.execute(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()[0]


class InThread:
    """Run ``fn`` in a thread (its own Django connection, so its own transaction)."""

    def __init__(self, fn) -> None:
        self.result = self.error = None

        def run() -> None:
            try:
                self.result = fn()
            except BaseException as exc:  # handed to the test by join()
                self.error = exc
            finally:
                connection.close()

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def join(self):
        self.thread.join(30)
        assert not self.thread.is_alive(), "the enqueue did not return"
        if self.error is not None:
            raise self.error
        return self.result


# --- validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unique_for": 0}, "unique_for must be a number of seconds"),
        ({"unique_for": -5}, "unique_for must be a number of seconds"),
        ({"unique_for": "1h"}, "unique_for must be a number of seconds"),
        ({"unique_for": True}, "unique_for must be a number of seconds"),
        ({"unique_for": float("nan")}, "unique_for must be a number of seconds"),
        ({"unique_states": "succeeded"}, "unique_states must be a list of task states"),
        ({"unique_states": 3}, "unique_states must be a list of task states"),
        ({"unique_states": [*LIVE, "done"]}, "unique_states: 'done' is not a task state"),
        ({"unique_states": ["pending", "succeeded"]}, "must include every live state"),
        ({"on_conflict": "ignore"}, "on_conflict must be one of 'keep', 'replace'"),
    ],
)
def test_bad_unique_options_are_refused_naming_the_option(options, message):
    with pytest.raises(InvalidTaskError, match=message):
        tasks.noop.using(unique_key="k", **options)


@pytest.mark.parametrize(
    "options",
    [{"unique_for": 60}, {"unique_states": [*LIVE, "succeeded"]}, {"on_conflict": "keep"}],
)
def test_a_unique_option_without_a_unique_key_is_refused_and_writes_nothing(options):
    call = tasks.noop.using(**options)
    for enqueue in (call.enqueue, call.enqueue_on_commit):
        with pytest.raises(InvalidTaskError, match="without a unique_key"):
            enqueue(1)
    with pytest.raises(InvalidTaskError, match="without a unique_key"):
        call.enqueue_many([1, 2])
    assert Task.objects.count() == 0


def test_bad_unique_options_on_the_decorator_are_refused():
    with pytest.raises(InvalidTaskError, match="on_conflict must be one of"):
        task(name="tests.test_unique.bad", on_conflict="latest")(lambda: None)
    with pytest.raises(InvalidTaskError, match="unique_for must be a number"):
        task(name="tests.test_unique.bad", unique_for=0)(lambda: None)
    assert "tests.test_unique.bad" not in registry


# --- unique_for and unique_states -----------------------------------------------------


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled"])
def test_unique_for_refuses_a_duplicate_of_a_finished_task_within_the_period(state):
    first = tasks.noop.using(unique_key="digest:1", unique_for=3600).enqueue(1)
    end(first, state)

    second = tasks.noop.using(unique_key="digest:1", unique_for=3600).enqueue(2)

    assert second == first
    assert [r.args for r in rows("digest:1")] == [[1]]


def test_unique_for_lets_a_new_task_in_once_the_period_is_over():
    first = tasks.noop.using(unique_key="digest:2", unique_for=60).enqueue(1)
    end(first)
    enqueued_ago(first, 61)

    second = tasks.noop.using(unique_key="digest:2", unique_for=60).enqueue(2)

    assert second != first
    assert [(r.id, r.state) for r in rows("digest:2")] == [
        (first, "succeeded"),
        (second, "pending"),
    ]


def test_a_live_task_holds_its_key_even_when_enqueued_before_the_period():
    first = tasks.noop.using(unique_key="digest:3", delay=7200).enqueue(1)
    enqueued_ago(first, 3600)

    assert tasks.noop.using(unique_key="digest:3", unique_for=60).enqueue(2) == first
    assert len(rows("digest:3")) == 1


def into_state(pg, task_id: int, state: str) -> None:
    """Bring the only task of queue "default" that is due, ``task_id``, to ``state`` the
    way a worker does: its claim, and a suspension's settlement."""
    if state in ("running", "waiting"):
        (claimed,) = claim(pg)
        assert claimed.id == task_id
    if state == "waiting":
        suspended = {
            "id": task_id, "attempt": claimed.attempt, "token": claimed.lease_token,
            "label": "suspended", "state": "waiting", "wait_reason": "signal",
            "wait_signal": "go", "attempt_refund": True,
        }
        assert settle(pg, [suspended]) == {task_id: "waiting"}
    assert Task.objects.get(pk=task_id).state == state


@committed
@pytest.mark.parametrize("options", [{}, {"unique_for": 60}], ids=["default", "unique_for"])
@pytest.mark.parametrize("state", LIVE)
def test_a_live_task_holds_its_key_in_every_live_state(pg, state, options):
    # Given the key's earlier task, finished; the key's live task; and tasks of another
    # queue, without the key and with another key, before and after it
    old = tasks.noop.using(unique_key="sync:1").enqueue(0)
    end(old)
    tasks.noop.using(queue="other").enqueue(1)
    delay = {"delay": 3600} if state == "scheduled" else {}
    first = tasks.noop.using(unique_key="sync:1", **delay).enqueue(2)
    into_state(pg, first, state)
    tasks.noop.using(queue="other", unique_key="sync:2").enqueue(1)
    enqueued_ago(first, 3600)  # before unique_for: only its live state holds the key
    enqueued_ago(old, 7200)

    # When the key is enqueued again, Then the live task comes back
    assert tasks.noop.using(unique_key="sync:1", **options).enqueue(3) == first
    assert [(t.id, t.state) for t in rows("sync:1")] == [(old, "succeeded"), (first, state)]


def test_unique_states_counts_only_the_states_named():
    states = [*LIVE, "succeeded"]
    succeeded = tasks.noop.using(unique_key="once:1", unique_states=states).enqueue(1)
    end(succeeded)
    failed = tasks.noop.using(unique_key="once:2", unique_states=states).enqueue(1)
    end(failed, "failed")

    # A succeeded twin counts, however old: the welcome email is sent once.
    enqueued_ago(succeeded, 10 * 86400)
    assert tasks.noop.using(unique_key="once:1", unique_states=states).enqueue(2) == succeeded
    # A failed one does not: the key is free.
    again = tasks.noop.using(unique_key="once:2", unique_states=states).enqueue(2)
    assert again != failed
    assert Task.objects.get(pk=again).state == "pending"


def test_unique_for_with_unique_states_counts_those_states_within_the_period():
    options = {"unique_for": 3600, "unique_states": [*LIVE, "succeeded"]}
    cancelled = tasks.noop.using(unique_key="report:1", **options).enqueue(1)
    end(cancelled, "cancelled")

    retried = tasks.noop.using(unique_key="report:1", **options).enqueue(2)
    end(retried)
    assert retried != cancelled  # a cancelled task does not count

    assert tasks.noop.using(unique_key="report:1", **options).enqueue(3) == retried


def test_without_options_a_finished_task_frees_its_key_as_before():
    first = tasks.noop.using(unique_key="plain").enqueue(1)
    end(first)
    assert tasks.noop.using(unique_key="plain").enqueue(2) != first


def test_the_default_call_sees_a_live_task_enqueued_with_options_and_back():
    first = tasks.noop.using(unique_key="mixed", unique_for=60).enqueue(1)
    assert tasks.noop.using(unique_key="mixed").enqueue(2) == first
    end(first)
    second = tasks.noop.using(unique_key="mixed").enqueue(3)
    assert second != first  # the default counts live tasks only
    assert tasks.noop.using(unique_key="mixed", unique_for=60).enqueue(4) == second


# --- on_conflict="replace" ----------------------------------------------------------


def test_replace_gives_the_queued_duplicate_the_new_call_and_keeps_its_id():
    first = tasks.noop.using(unique_key="index:1", on_conflict="replace", priority=1).enqueue(1)
    before = Task.objects.get(pk=first)

    second = tasks.noop.using(
        unique_key="index:1", on_conflict="replace", priority=9, delay=5
    ).enqueue(n=2)

    assert second == first
    row = Task.objects.get(pk=first)
    assert (row.args, row.kwargs, row.priority, row.state) == ([], {"n": 2}, 9, "scheduled")
    assert row.run_at >= before.enqueued_at + timedelta(seconds=5)
    assert row.enqueued_at == before.enqueued_at
    assert len(rows("index:1")) == 1


def test_replace_changes_the_duplicate_only_and_no_other_queued_task():
    others = [
        tasks.noop.enqueue(0),
        tasks.noop.using(unique_key="index:other", on_conflict="replace").enqueue(0),
    ]
    first = tasks.noop.using(unique_key="index:5", on_conflict="replace").enqueue(1)

    assert tasks.noop.using(unique_key="index:5", on_conflict="replace").enqueue(2) == first

    assert Task.objects.get(pk=first).args == [2]
    assert [Task.objects.get(pk=pk).args for pk in others] == [[0], [0]]


@pytest.mark.parametrize("state", ["cancelled", "succeeded", "failed"])
def test_the_replace_statement_leaves_a_duplicate_that_ended_before_it_started(state):
    """find_unique judged the duplicate queued; if it ends before replace_unique takes
    its row (a cancel, an expiry), the replace writes nothing and the caller keeps it."""
    first = tasks.noop.using(unique_key="index:6", on_conflict="replace").enqueue(1)
    Task.objects.filter(pk=first).update(state=state, finished_at=timezone.now())
    row = build_row(tasks.noop.using(unique_key="index:6"), (2,), {})  # the new call's

    with connection.cursor() as cursor:
        cursor.execute(QUERIES["replace_unique"], {**row, "target": first})
        assert cursor.fetchall() == []
    assert (Task.objects.get(pk=first).state, Task.objects.get(pk=first).args) == (state, [1])


def test_replace_of_a_scheduled_duplicate_without_a_delay_makes_it_due_now():
    first = tasks.noop.using(unique_key="index:2", on_conflict="replace", delay=600).enqueue(1)

    assert tasks.noop.using(unique_key="index:2", on_conflict="replace").enqueue(2) == first

    row = Task.objects.get(pk=first)
    assert (row.args, row.state) == ([2], "pending")
    assert row.run_at <= timezone.now()


def test_keep_leaves_the_queued_duplicate_as_it_was():
    first = tasks.noop.using(unique_key="index:3", unique_for=60).enqueue(1)
    assert tasks.noop.using(unique_key="index:3", unique_for=60, priority=50).enqueue(2) == first
    row = Task.objects.get(pk=first)
    assert (row.args, row.priority) == ([1], 0)


@committed
def test_replace_never_changes_a_started_task(pg):
    first = unique_tasks.debounced.using(unique_key="index:4", on_conflict="replace").enqueue(1)
    [claimed] = claim(pg)
    assert claimed.id == first

    again = unique_tasks.debounced.using(unique_key="index:4", on_conflict="replace").enqueue(2)

    assert again == first  # running: kept as it is, like on_conflict="keep"
    assert Task.objects.get(pk=first).args == [1]
    # Once it has finished (and is counted by no option), the key is free again.
    end(first)
    third = unique_tasks.debounced.using(unique_key="index:4", on_conflict="replace").enqueue(3)
    assert third != first and Task.objects.get(pk=third).args == [3]


def test_replace_does_not_replace_a_finished_task_counted_by_unique_for():
    options = {"unique_key": "index:5", "on_conflict": "replace", "unique_for": 60}
    first = tasks.noop.using(**options).enqueue(1)
    end(first)

    assert tasks.noop.using(**options).enqueue(2) == first
    assert Task.objects.get(pk=first).args == [1]
    assert len(rows("index:5")) == 1


def test_replace_does_not_hand_one_task_s_arguments_to_another_task():
    first = tasks.noop.using(unique_key="shared-key").enqueue(1)

    other = unique_tasks.debounced.using(unique_key="shared-key", on_conflict="replace")
    assert other.enqueue(2) == first
    row = Task.objects.get(pk=first)
    assert (row.task_name, row.args) == ("tests.tasks.noop", [1])


def test_task_defaults_apply_to_calls_with_a_unique_key():
    first = unique_tasks.digest.using(unique_key="digest:user:7").enqueue(7, note="a")
    second = unique_tasks.digest.using(unique_key="digest:user:7").enqueue(7, note="b")
    assert second == first
    assert Task.objects.get(pk=first).kwargs == {"note": "b"}  # replaced
    end(first)
    assert unique_tasks.digest.using(unique_key="digest:user:7").enqueue(7) == first  # an hour
    # A call without a key is a plain enqueue.
    assert unique_tasks.digest.enqueue(7) != first
    # A call may override the task's default.
    kept = unique_tasks.digest.using(unique_key="digest:user:8").enqueue(8, note="a")
    unique_tasks.digest.using(unique_key="digest:user:8", on_conflict="keep").enqueue(8, note="b")
    assert Task.objects.get(pk=kept).kwargs == {"note": "a"}


def test_enqueue_many_with_replace_leaves_the_last_call():
    first = tasks.noop.using(unique_key="batch", on_conflict="replace").enqueue(0)

    ids = tasks.noop.using(unique_key="batch", on_conflict="replace").enqueue_many([1, 2, 3])

    assert ids == [first] * 3
    assert [r.args for r in rows("batch")] == [[3]]


def test_enqueue_many_with_unique_for_returns_the_finished_task_for_every_call():
    first = tasks.noop.using(unique_key="batch:2", unique_for=60).enqueue(0)
    end(first)

    assert tasks.noop.using(unique_key="batch:2", unique_for=60).enqueue_many([1, 2]) == [first] * 2
    assert len(rows("batch:2")) == 1


@committed
def test_enqueue_on_commit_applies_the_options_when_the_block_commits():
    first = tasks.noop.using(unique_key="commit", on_conflict="replace").enqueue(1)
    with transaction.atomic():
        reserved = tasks.noop.using(unique_key="commit", on_conflict="replace").enqueue_on_commit(2)
        assert Task.objects.get(pk=first).args == [1]  # nothing yet

    assert reserved != first  # the reserved id stays unused, as with every duplicate
    assert [(r.id, r.args) for r in rows("commit")] == [(first, [2])]


@committed
def test_enqueue_on_commit_outside_a_transaction_checks_and_inserts_at_once():
    first = tasks.noop.using(unique_key="commit:2", unique_for=60).enqueue(1)
    end(first)
    tasks.noop.using(unique_key="commit:2", unique_for=60).enqueue_on_commit(2)
    assert len(rows("commit:2")) == 1


# --- concurrency -------------------------------------------------------------------


@committed
@pytest.mark.parametrize(
    "options",
    [{"unique_for": 60}, {"on_conflict": "replace"}, {"unique_states": [*LIVE, "failed"]}],
)
def test_concurrent_enqueuers_of_one_key_get_one_row_and_its_id(options):
    start = threading.Barrier(6)

    def enqueue(n: int):
        start.wait(10)
        with transaction.atomic():
            task_id = tasks.noop.using(unique_key="race", **options).enqueue(n)
            time.sleep(0.05)  # the transactions overlap
        return task_id

    calls = [InThread(lambda n=n: enqueue(n)) for n in range(6)]
    ids = [c.join() for c in calls]

    [row] = rows("race")
    assert ids == [row.id] * 6


@committed
def test_a_rolled_back_first_enqueue_lets_the_waiting_one_insert_its_own(pg):
    release = threading.Event()

    def first():
        with transaction.atomic():
            task_id = tasks.noop.using(unique_key="rb", unique_for=60).enqueue(1)
            release.wait(10)
            transaction.set_rollback(True)
        return task_id

    a = InThread(first)
    wait_until(lambda: Task.objects.filter(unique_key="rb").count() == 0 and a.thread.is_alive())
    time.sleep(0.1)
    b = InThread(lambda: tasks.noop.using(unique_key="rb", unique_for=60).enqueue(2))
    wait_until(lambda: lock_waiters(pg) == 1, message="the second enqueue to wait")
    release.set()

    rolled_back, second = a.join(), b.join()
    assert [(r.id, r.args) for r in rows("rb")] == [(second, [2])]
    assert second != rolled_back


@committed
def test_a_duplicate_waits_for_the_first_transaction_and_counts_its_task_once_ended(pg):
    """The key's lock, not only the live index: the first task ends within its own
    transaction (as a task that ran before the duplicate looked would have); the
    duplicate, which waited, still finds it within unique_for."""
    release = threading.Event()

    def first():
        with transaction.atomic():
            task_id = tasks.noop.using(unique_key="ended", unique_for=60).enqueue(1)
            release.wait(10)
            end(task_id)
        return task_id

    a = InThread(first)
    wait_until(lambda: lock_waiters(pg) == 0 and a.thread.is_alive())
    time.sleep(0.1)
    b = InThread(lambda: tasks.noop.using(unique_key="ended", unique_for=60).enqueue(2))
    wait_until(lambda: lock_waiters(pg) == 1, message="the duplicate to wait")
    release.set()

    first_id, second = a.join(), b.join()
    assert second == first_id
    assert [(r.id, r.state) for r in rows("ended")] == [(first_id, "succeeded")]


@committed
def test_an_option_call_waits_for_an_uncommitted_default_call_and_gets_its_id(pg):
    release = threading.Event()

    def first():
        with transaction.atomic():
            task_id = tasks.noop.using(unique_key="mix").enqueue(1)
            release.wait(10)
        return task_id

    a = InThread(first)
    wait_until(lambda: lock_waiters(pg) == 0 and a.thread.is_alive())
    time.sleep(0.1)
    b = InThread(lambda: tasks.noop.using(unique_key="mix", on_conflict="replace").enqueue(2))
    wait_until(lambda: lock_waiters(pg) == 1, message="the option call to wait")
    release.set()

    first_id, second = a.join(), b.join()
    assert second == first_id
    assert [r.args for r in rows("mix")] == [[2]]  # then replaced it, once committed


@committed
def test_a_claim_holding_the_row_wins_over_a_replace(pg, db_url):
    first = unique_tasks.debounced.using(unique_key="cr", on_conflict="replace").enqueue(1)
    with psycopg.connect(db_url, autocommit=True) as observer, pg.transaction():
        [claimed] = claim(pg)  # running, not yet committed
        replace = InThread(
            lambda: unique_tasks.debounced.using(unique_key="cr", on_conflict="replace").enqueue(2)
        )
        wait_until(lambda: lock_waiters(observer) == 1, message="the replace to wait")

    assert replace.join() == first
    assert claimed.args == [1]
    row = Task.objects.get(pk=first)
    assert (row.state, row.args) == ("running", [1])


@committed
def test_a_replace_holding_the_row_is_skipped_by_a_claim_until_it_commits(pg):
    first = unique_tasks.debounced.using(unique_key="rc", on_conflict="replace").enqueue(1)
    with transaction.atomic():
        unique_tasks.debounced.using(unique_key="rc", on_conflict="replace").enqueue(2)
        assert claim(pg) == []  # the row is locked by the replace: skipped

    [claimed] = claim(pg)
    assert (claimed.id, claimed.args) == (first, [2])


# --- processes ---------------------------------------------------------------------

CHILD = """
import json, sys, time
import django
django.setup()
from django.db import connection, transaction
from tests import tasks

options, n, rollback = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
with connection.cursor() as cursor:  # the barrier: the test holds this lock
    cursor.execute("SELECT pg_advisory_lock_shared(1885827399, 1)")
    cursor.execute("SELECT pg_advisory_unlock_shared(1885827399, 1)")
with transaction.atomic():
    task_id = tasks.noop.using(unique_key="processes", **options).enqueue(n)
    time.sleep(0.2)  # the transactions overlap
    transaction.set_rollback(rollback)
print(json.dumps({"id": task_id, "committed": not rollback}))
"""


@committed
@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        [
            {"unique_for": 60},
            {"on_conflict": "replace"},
            {"unique_states": [*LIVE, "succeeded"]},
            {"unique_for": 60, "on_conflict": "replace"},
            {"unique_for": 60},
            {"on_conflict": "replace"},
        ],
        # Calls with and without options, at once.
        [{"unique_for": 60}, {}, {"on_conflict": "replace"}, {}, {"unique_for": 60}, {}],
    ],
    ids=["options", "mixed"],
)
def test_processes_enqueueing_one_key_at_once_make_one_row_and_all_get_its_id(
    pg, db_url, options
):
    pg.execute("SELECT pg_advisory_lock(1885827399, 1)")
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(opts), str(n), "1" if n == 0 else "0"],
            env=django_env(db_url), cwd=REPO, stdout=subprocess.PIPE, text=True,
        )
        for n, opts in enumerate(options)
    ]  # fmt: skip
    try:
        wait_until(lambda: lock_waiters(pg) == len(children), 60, message="all at the barrier")
    finally:
        pg.execute("SELECT pg_advisory_unlock(1885827399, 1)")
    answers = []
    for child in children:
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0
        answers.append(json.loads(out))

    [row] = rows("processes")
    # Every committed caller got the row's id; the one that rolled back left nothing.
    assert {a["id"] for a in answers if a["committed"]} == {row.id}


@committed
@pytest.mark.slow
def test_a_worker_claiming_while_calls_replace_runs_each_task_with_its_final_arguments(
    start_worker, tmp_path: Path
):
    ledger = tmp_path / "ledger.jsonl"
    os.environ[LEDGER_ENV] = str(ledger)  # the worker's environment
    try:
        start_worker()
    finally:
        del os.environ[LEDGER_ENV]
    call = unique_tasks.debounced.using(unique_key="debounce", on_conflict="replace")
    returned = []
    for n in range(300):
        returned.append(call.enqueue(n))
        time.sleep(0.003)
    wait_until(
        lambda: not Task.objects.filter(unique_key="debounce").exclude(state="succeeded").exists(),
        60,
        message="every task run",
    )

    runs = {run["task"]: run["n"] for run in map(json.loads, ledger.read_text().splitlines())}
    done = {r.id: r.args for r in rows("debounce")}
    # Each task ran once, with the arguments its row holds: a replace never reached a
    # claimed task.
    assert len(runs) == len(ledger.read_text().splitlines()) == len(done)
    assert {task_id: [n] for task_id, n in runs.items()} == done
    # The calls that returned a task's id are consecutive: the first inserted it, the
    # next replaced it until a worker claimed it, the rest found it running and were
    # dropped (on_conflict="replace" never changes a started task). It ran with the
    # arguments of one of them: never another task's.
    calls_of: dict[int, list[int]] = {}
    for n, task_id in enumerate(returned):
        calls_of.setdefault(task_id, []).append(n)
    assert set(calls_of) == set(done)
    for task_id, calls in calls_of.items():
        assert calls == list(range(calls[0], calls[-1] + 1))
        assert runs[task_id] in calls
    # Calls were folded (replaced), and claims came between them.
    assert 1 < len(done) < 300


# --- cost ----------------------------------------------------------------------------


@committed
def test_finding_a_duplicate_reads_the_key_s_rows_only_whatever_the_table_holds(pg):
    # Given 20,000 finished tasks of other keys and 50 of this one, with statistics
    pg.execute(
        "INSERT INTO pgqueue_task (queue, task_name, state, unique_key, finished_at) "
        "SELECT 'default', 'tests.tasks.noop', 'succeeded', "
        "       CASE WHEN n <= 50 THEN 'hot' ELSE 'key:' || n END, now() "
        "FROM generate_series(1, 20000) AS n"
    )
    pg.execute("VACUUM ANALYZE pgqueue_task")
    params = {
        "unique_key": "hot",
        "unique_states": [*LIVE, "succeeded"],
        "unique_for": timedelta(hours=1),
        "task_name": "tests.tasks.noop",
    }

    # When the duplicate check runs, for that key and for a key no task has
    analyze(pg, "find_unique", params)  # warm the caches
    hot = analyze(pg, "find_unique", params)
    cold = analyze(pg, "find_unique", {**params, "unique_key": "none"})

    # Then it walks the key's index entries only
    for plan in (hot, cold):
        assert "Seq Scan pgqueue_task" not in node_types(plan), plan
        assert buffers(plan) < 20, plan
    assert rows_read(hot) <= 51


@committed
def test_the_options_work_with_prepared_statements_as_with_unprepared_ones():
    from django.conf import settings
    from django.test import override_settings

    connection.close()
    with override_settings(PGQUEUE={**settings.PGQUEUE, "PREPARE_ENQUEUE": True}):
        for n in range(8):  # past PostgreSQL's switch to a generic plan (5 executions)
            first = tasks.noop.using(unique_key="prepared", on_conflict="replace").enqueue(n)
            assert tasks.noop.using(unique_key="prepared", unique_for=60).enqueue(n) == first
            if n % 2:
                end(first)
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            prepared = " ".join(text for (text,) in cursor.fetchall())
    assert "1885827335" in prepared and "UPDATE pgqueue_task" in prepared
    assert [r.args for r in rows("prepared")] == [[1], [3], [5], [7]]


@pytest.mark.parametrize(
    "options", [{"unique_for": 60}, {"unique_states": LIVE}, {"on_conflict": "replace"}]
)
def test_a_schedule_refuses_the_unique_options_like_unique_key(options):
    from django.core.exceptions import ImproperlyConfigured

    from django_pgqueue.tasking.periodic import periodic, schedule_registry

    with pytest.raises(ImproperlyConfigured, match=f"using\\({next(iter(options))}=...\\)"):
        periodic(tasks.noop.using(**options), every=60, name="tests.test_unique.tick")
    assert "tests.test_unique.tick" not in {s.name for s in schedule_registry.all()}
