"""Ordered work per key (docs/tenants.md): the tasks of one sequence run one at a time,
in enqueue order, across the fleet; a retry keeps its place; a failure holds the
sequence, or lets it go on.

The SQL tests call the statements as a worker does (tests/sqlhelpers.py); the worker
tests run real worker processes and judge them by the ledger (tests/ledger.py).
"""

from __future__ import annotations

import io
import itertools
import json
import os
import random
import threading
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection, transaction
from django.urls import reverse

from django_pgqueue import task
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Task
from django_pgqueue.ops import operations
from django_pgqueue.tasking.registry import registry
from django_pgqueue.worker.connection import connect
from tests import ledger, tasks
from tests.conftest import WorkerProcess, wait_until
from tests.sqlhelpers import claim, expire_lease, settle, success, sweep
from tests.tenant_tasks import ordered_continue, ordered_job, ordered_run

pytestmark = pytest.mark.django_db(transaction=True)

ROUTES = [(ordered_job.name, 1), (ordered_continue.name, 1), (ordered_run.name, 1)]
CHAOS_SECONDS = float(os.environ.get("PGQUEUE_CHAOS_SECONDS", "15"))


def states(*ids: int) -> list[str]:
    found = dict(Task.objects.filter(pk__in=ids).values_list("id", "state"))
    return [found[i] for i in ids]


def take(pg, limit: int = 10):
    return claim(pg, limit, routes=ROUTES)


def failure(claimed, state: str = "failed", delay: float = 0) -> dict:
    return {
        "id": claimed.id, "attempt": claimed.attempt, "token": claimed.lease_token,
        "label": "failure", "state": state, "delay": delay,
        "error": {"attempt": claimed.attempt, "type": "ValueError", "message": "boom",
                  "traceback": None},
    }  # fmt: skip


# -- declaring and enqueueing ----------------------------------------------------------
def test_the_first_task_of_a_sequence_is_due_and_the_others_wait_their_turn():
    a1, a2, a3 = ordered_job.enqueue_many([("a", 1), ("a", 2), ("a", 3)])
    b1 = ordered_job.enqueue("b", 1)
    free = ordered_job.enqueue(None, 1)  # no key: in no sequence

    assert states(a1, a2, a3, b1, free) == ["pending", "waiting", "waiting", "pending", "pending"]
    rows = Task.objects.in_bulk([a1, a2, free])
    assert (rows[a2].wait_reason, rows[a2].sequence_key) == ("sequence", "account:a")
    assert rows[a1].sequence_hold and rows[free].sequence_key is None


def test_a_sequence_key_given_per_call_and_the_refusals():
    given = ordered_job.using(sequence_key="account:z").enqueue("a", 1)
    assert Task.objects.get(id=given).sequence_key == "account:z"

    with pytest.raises(InvalidTaskError, match="not a sequenced task"):
        tasks.noop.using(sequence_key="x")
    with pytest.raises(InvalidTaskError, match="cannot also wait for other tasks"):
        ordered_job.using(after=[given])
    with pytest.raises(InvalidTaskError, match="on_conflict='replace'"):
        ordered_job.using(unique_key="u", on_conflict="replace")
    with pytest.raises(ImproperlyConfigured, match="on_failure must be one of"):
        task(name="tests.seq_bad", sequence_key=lambda: "k", on_failure="retry")(lambda: None)
    with pytest.raises(ImproperlyConfigured, match="give the task a sequence_key"):
        task(name="tests.seq_bad", on_failure="continue")(lambda: None)
    assert "tests.seq_bad" not in registry
    assert Task.objects.count() == 1


# -- the order ---------------------------------------------------------------------------
def test_each_end_starts_the_next_task_of_the_sequence_in_id_order(pg):
    a = ordered_job.enqueue_many([("a", n) for n in range(3)])
    b = ordered_job.enqueue_many([("b", n) for n in range(2)])

    first = take(pg)
    assert sorted(t.id for t in first) == [a[0], b[0]]  # one per sequence
    assert take(pg) == []  # nothing else is due while they run
    settle(pg, [success(t) for t in first])
    second = take(pg)
    assert sorted(t.id for t in second) == [a[1], b[1]]
    settle(pg, [success(t) for t in second])
    third = take(pg)
    assert [t.id for t in third] == [a[2]]


def test_a_retry_keeps_its_place_at_the_head(pg):
    a1, a2 = ordered_job.using(max_attempts=3).enqueue_many([("a", 1), ("a", 2)])

    (first,) = take(pg)
    settle(pg, [failure(first, state="pending", delay=0.05)])  # a retry, after a backoff
    assert states(a1, a2) == ["scheduled", "waiting"]
    time.sleep(0.1)
    (again,) = take(pg)  # the stager makes it due; it is still the only one
    assert (again.id, again.attempt) == (a1, 2)
    settle(pg, [success(again)])
    assert states(a1, a2) == ["succeeded", "pending"]


def test_a_task_whose_worker_died_is_recovered_at_the_head(pg):
    a1, a2 = ordered_job.using(max_attempts=3).enqueue_many([("a", 1), ("a", 2)])
    (first,) = take(pg)

    expire_lease(pg, first.id)
    sweep(pg)

    assert states(a1, a2) == ["pending", "waiting"]
    (again,) = take(pg)
    assert again.id == a1


def test_a_failure_holds_the_sequence_until_it_is_released(pg):
    a1, a2, a3 = ordered_job.enqueue_many([("a", 1), ("a", 2), ("a", 3)])
    b1 = ordered_job.enqueue("b", 1)
    (first,) = [t for t in take(pg) if t.id == a1]
    settle(pg, [failure(first)])

    held = operations.held_sequences(using="default")
    assert states(a1, a2, a3, b1) == ["failed", "waiting", "waiting", "running"]
    assert [(h["key"], h["task_id"], h["waiting"]) for h in held] == [("account:a", a1, 2)]

    assert operations.release_sequence("default", "account:a") == a2
    assert states(a1, a2, a3) == ["failed", "pending", "waiting"]
    assert operations.held_sequences(using="default") == []
    assert operations.release_sequence("default", "account:a") is None  # not held


def test_with_on_failure_continue_a_failure_lets_the_sequence_go_on(pg):
    a1, a2 = ordered_continue.enqueue_many([("a", 1), ("a", 2)])
    (first,) = take(pg)

    settle(pg, [failure(first)])

    assert states(a1, a2) == ["failed", "pending"]
    assert operations.held_sequences(using="default") == []


def test_retrying_the_task_that_holds_the_sequence_runs_it_first(pg):
    a1, a2 = ordered_job.enqueue_many([("a", 1), ("a", 2)])
    (first,) = take(pg)
    settle(pg, [failure(first)])

    operations.retry_now([a1])

    assert states(a1, a2) == ["pending", "waiting"]
    (again,) = take(pg)
    settle(pg, [success(again)])
    assert states(a1, a2) == ["succeeded", "pending"]


def test_a_dead_letter_retried_after_its_sequence_went_on_waits_for_its_turn(pg):
    a1, a2, a3 = ordered_continue.enqueue_many([("a", 1), ("a", 2), ("a", 3)])
    (first,) = take(pg)
    settle(pg, [failure(first)])  # continue: a2 starts
    (second,) = take(pg)
    assert second.id == a2

    operations.retry_now([a1])  # while a2 runs

    assert states(a1, a2, a3) == ["waiting", "running", "waiting"]
    settle(pg, [success(second)])
    assert states(a1, a2, a3) == ["pending", "succeeded", "waiting"]  # the lowest id next


def test_cancelling_the_head_or_a_waiting_task_lets_the_sequence_go_on():
    a1, a2, a3 = ordered_job.enqueue_many([("a", 1), ("a", 2), ("a", 3)])

    operations.cancel(a2)  # a waiting one: leaves the sequence
    assert states(a1, a2, a3) == ["pending", "cancelled", "waiting"]
    operations.cancel(a1)  # the head: the next one starts
    assert states(a1, a2, a3) == ["cancelled", "cancelled", "pending"]


def test_deleting_the_task_that_holds_a_sequence_releases_it(pg):
    a1, a2 = ordered_job.enqueue_many([("a", 1), ("a", 2)])
    (first,) = take(pg)
    settle(pg, [failure(first)])

    assert operations.delete_finished([a1]) == [a1]

    assert states(a2) == ["pending"]


def test_a_sequenced_task_with_a_delay_is_scheduled_when_its_turn_comes(pg):
    a1 = ordered_job.enqueue("a", 1)
    a2 = ordered_job.using(delay=3600).enqueue("a", 2)
    assert states(a1, a2) == ["pending", "waiting"]

    settle(pg, [success(t) for t in take(pg)])

    assert states(a2) == ["scheduled"]


# -- races --------------------------------------------------------------------------------
def test_an_enqueue_that_commits_after_the_head_ended_starts_its_task(pg):
    (a1,) = ordered_job.enqueue_many([("a", 1)])
    (first,) = take(pg)
    with transaction.atomic():
        a2 = ordered_job.enqueue("a", 2)  # the head runs: a2 waits its turn
        settle(pg, [success(first)])  # the head ends before this transaction commits
        assert states(a1) == ["succeeded"]

    assert states(a2) == ["pending"]


def test_an_enqueue_committing_while_the_head_ends_waits_for_that_end(pg):
    # Given the head's end written but not committed (another connection's transaction)
    a1 = ordered_job.enqueue("a", 1)
    (first,) = take(pg)
    ending = connect("default")
    ending.execute("BEGIN")
    ending.execute(QUERIES["settle"], {"outcomes": json.dumps([success(first)]),
                                       "limit_queues": [], "limit_concurrency": []})
    committed = threading.Event()
    found: list[int] = []

    def enqueue() -> None:
        try:
            with transaction.atomic():
                found.append(ordered_job.enqueue("a", 2))
            committed.set()
        finally:
            connection.close()

    # When a transaction that enqueued the next task commits meanwhile
    thread = threading.Thread(target=enqueue)
    thread.start()
    try:
        # Then its commit waits for the end, and then starts its task
        assert not committed.wait(0.5)
        ending.execute("COMMIT")
        thread.join(10)
    finally:
        ending.close()
    assert committed.is_set()
    assert states(a1, found[0]) == ["succeeded", "pending"]


def test_concurrent_enqueues_of_an_idle_sequence_start_one_task():
    barrier = threading.Barrier(4)
    found: list[int] = []

    def enqueue(n: int) -> None:
        try:
            with transaction.atomic():
                found.append(ordered_job.enqueue("a", n))
                barrier.wait(5)  # all four in flight at once, then all commit
        finally:
            connection.close()

    threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    assert sorted(states(*found)) == ["pending", "waiting", "waiting", "waiting"]


# -- operators -----------------------------------------------------------------------------
def test_the_sequence_command_lists_held_sequences_and_releases_one(pg):
    a1, a2 = ordered_job.enqueue_many([("a", 1), ("a", 2)])
    (first,) = take(pg)
    settle(pg, [failure(first)])
    out = io.StringIO()

    call_command("pgqueue_sequence", "held", stdout=out)
    call_command("pgqueue_sequence", "release", "default", "account:a", stdout=out)
    call_command("pgqueue_sequence", "release", "default", "account:a", stdout=out)

    text = out.getvalue()
    assert "account:a" in text and f"{a1}" in text and "1 waiting" in text
    assert f"released account:a in queue default: task {a2} starts" in text
    assert "account:a in queue default is not held" in text


def test_the_overview_shows_held_sequences_with_a_button_that_releases_one(pg, admin_client):
    a1, a2 = ordered_job.enqueue_many([("a", 1), ("a", 2)])
    (first,) = take(pg)
    settle(pg, [failure(first)])
    overview = reverse("admin:django_pgqueue_queueoverview_changelist")

    html = admin_client.get(overview).content.decode()
    response = admin_client.post(
        reverse("admin:django_pgqueue_queueoverview_release"),
        {"queue": "default", "key": "account:a"}, follow=True,
    )

    held = html.split('id="pgqueue-held-sequences"', 1)[1]
    assert 'data-sequence="account:a"' in held and f">{a1}</a>" in held
    assert f"Released account:a in queue default: task {a2} starts." in response.content.decode()
    assert states(a2) == ["pending"]


def test_releasing_a_sequence_needs_the_change_task_permission(client, django_user_model):
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    from django.contrib.auth.models import Permission

    user.user_permissions.set(Permission.objects.filter(codename="view_task"))
    client.force_login(user)

    response = client.post(
        reverse("admin:django_pgqueue_queueoverview_release"),
        {"queue": "default", "key": "account:a"},
    )

    assert response.status_code == 403


# -- real workers ---------------------------------------------------------------------------
def sequence_violations(path, by_key: dict[str, list[int]]) -> list[str]:
    """Runs of one key that overlap, or tasks whose first run started before the run
    of the task before them that succeeded had ended (a run cut by its process's kill
    ends at the kill: tests/ledger.py)."""
    runs = ledger.runs_of(ledger.read(path))
    found = []
    for key, ids in by_key.items():
        for before, after in itertools.pairwise(ids):
            ended = max(run.until for run in runs.get(before, []))
            started = min(run.start for run in runs.get(after, []))
            if started < ended:
                found.append(f"{key}: task {after} started {ended - started:.3f}s before "
                             f"task {before} ended")  # fmt: skip
        every = sorted((run for i in ids for run in runs.get(i, [])), key=lambda r: r.start)
        for one, two in itertools.pairwise(every):
            if two.start < one.until:
                found.append(f"{key}: runs of tasks {one.task} and {two.task} overlap")
    return found


@pytest.mark.slow
def test_workers_run_interleaved_sequences_one_task_at_a_time_in_order(start_worker, tmp_path):
    # Given three accounts' tasks enqueued interleaved, some of which fail and retry
    path = tmp_path / "ledger.jsonl"
    by_key: dict[str, list[int]] = {}
    for n in range(30):
        account = "abc"[n % 3]
        task_id = ordered_run.enqueue(account, n, 0.01, 1 if n % 4 == 0 else 0)
        by_key.setdefault(account, []).append(task_id)

    # When two workers with 4 slots each drain them
    env = {"PGQUEUE_TEST_TENANTS": "1", ledger.LEDGER_ENV: str(path)}
    for _ in range(2):
        start_worker("--concurrency", "4", env=env, wait=False)
    wait_until(lambda: Task.objects.filter(state="succeeded").count() == 30, timeout=90,
               message="every task to succeed")  # fmt: skip

    # Then no task of an account started before the one before it ended
    assert sequence_violations(path, by_key) == []
    assert Task.objects.filter(attempt=2).count() == 8  # the failures retried


@pytest.mark.slow
def test_sequences_stay_in_order_while_workers_are_killed(start_worker, tmp_path):
    """Chaos: three workers with a 2 s lease drain accounts' sequences while one of them
    is SIGKILLed (and replaced) every 1-3 s; a killed run's task goes back to its
    sequence's head when its lease lapses, and nothing behind it starts before."""
    rng = random.Random(int(os.environ.get("PGQUEUE_CHAOS_SEED", time.time_ns() % 1_000_000)))
    path = tmp_path / "ledger.jsonl"
    env = {"PGQUEUE_TEST_TENANTS": "1", ledger.LEDGER_ENV: str(path)}
    fast = ("--lease", "2", "--heartbeat", "0.5", "--sweep-interval", "0.25")

    def start() -> WorkerProcess:
        return start_worker(*fast, "--concurrency", "4", env=env, wait=False)

    live = [start() for _ in range(3)]
    by_key: dict[str, list[int]] = {}
    kills = 0
    began = time.monotonic()
    next_kill = 1.0
    n = 0
    while (now := time.monotonic() - began) < CHAOS_SECONDS:
        if n < 240 and now * 20 >= n:  # 20 tasks a second, over 8 accounts
            account = f"c{rng.randrange(8)}"
            seconds = rng.uniform(0.02, 0.15)
            by_key.setdefault(account, []).append(ordered_run.enqueue(account, n, seconds))
            n += 1
        if now >= next_kill:
            victim = rng.choice(live)
            victim.kill()
            ledger.record_exit(path, victim.pid)
            live.remove(victim)
            live.append(start())
            kills += 1
            next_kill = now + rng.uniform(1, 3)
        time.sleep(0.01)
    wait_until(lambda: Task.objects.filter(state="succeeded").count() == n, timeout=120,
               interval=0.25, message="every task to succeed")  # fmt: skip

    assert sequence_violations(path, by_key) == []
    assert kills >= CHAOS_SECONDS / 3
    assert Task.objects.filter(attempt__gt=1).exists(), "no kill cut a run short"
