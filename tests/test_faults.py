"""Faults the worker must absorb without losing, repeating or misreporting work.

Each test stages one fault with real worker processes and a real server: the worker
stalled past its leases (SIGSTOP), outcomes the database refuses to store, a handler
that locks its own row and hangs, and replies lost after the server committed the
statement (a proxy that drops the connection between the commit and the reply).
Handlers write a ledger file (tests/fault_tasks.py), so runs are counted outside the
database.
"""

import re
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from django.db import connections

from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Task
from tests import fault_tasks, framework_tasks
from tests.conftest import server_address, url_through, wait_until
from tests.fault_tasks import runs
from tests.faultproxy import ReplyLosingProxy
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

FAST_LEASE = ("--lease", "2", "--heartbeat", "0.5", "--sweep-interval", "0.25")
UNFINISHED = ("pending", "running")


def unfinished(ids: list[int]) -> bool:
    return Task.objects.filter(pk__in=ids, state__in=UNFINISHED).exists()


def within(seconds: float, predicate: Callable[[], bool]) -> bool:
    """Whether ``predicate`` becomes true within ``seconds`` (polled)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def states(ids: list[int]) -> dict[str, int]:
    return dict(Counter(Task.objects.filter(pk__in=ids).values_list("state", flat=True)))


def statement_marker(name: str) -> str:
    """The longest line of the named statement that no other statement contains.

    Its text reaches the server in the Parse message, so the proxy can recognise the
    statement on the wire (placeholders are rewritten on the way: lines with none).
    """
    others = [text for other, text in QUERIES.items() if other != name]
    lines = [line.strip() for line in QUERIES[name].splitlines() if "%" not in line]
    unique = [line for line in lines if len(line) > 20 and not any(line in t for t in others)]
    if not unique:
        raise AssertionError(f"statement {name!r} has no line of its own to recognise it by")
    return max(unique, key=len)


@pytest.fixture
def lossy(db_url: str):
    """A proxy in front of the test database that can lose one statement's reply."""
    settings = connections["default"].settings_dict
    proxy = ReplyLosingProxy(server_address(settings))
    proxy.url = url_through(settings, proxy.port)
    yield proxy
    proxy.close()


# -- issue 8.1: a re-claimed task keeps its lease -------------------------------------
@pytest.mark.slow  # a 3 s lease recovered within 10 s: not under other tests' load
def test_the_late_outcome_of_an_old_run_does_not_cost_the_new_attempt_its_lease(
    start_worker, tmp_path
):
    # Given four 8 s tasks running on a worker whose leases last 3 s, with slots to
    # spare, and another worker (serving another queue) whose sweep recovers leases
    ledger = tmp_path / "runs"
    ids = fault_tasks.sleep_then_succeed.enqueue_many([(str(ledger), 8)] * 4)
    worker = start_worker(
        "--lease", "3", "--heartbeat", "1", "--concurrency", "8", "--sweep-interval", "0.25"
    )
    start_worker("--queues", "other", "--sweep-interval", "0.25")
    wait_until(lambda: len(runs(ledger)) == 4, message="the four handlers to start")

    # When the worker stalls until its leases are recovered, then claims the tasks
    # again while their first runs are still going
    worker.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: states(ids) == {"pending": 4}, timeout=10, message="the recovery")
    finally:
        worker.signal(signal.SIGCONT)
    wait_until(lambda: not unfinished(ids), timeout=25, message="the four tasks to finish")

    # Then every second attempt keeps its lease while the first runs' outcomes are
    # refused, and succeeds
    rows = Task.objects.filter(pk__in=ids).order_by("id")
    assert [(r.id, r.state, r.attempt) for r in rows] == [(i, "succeeded", 2) for i in ids], [
        [e["type"] for e in r.errors] for r in rows
    ]
    assert [[e["type"] for e in r.errors] for r in rows] == [["LeaseExpired"]] * 4


# -- issue 8.2: one bad outcome fails only its own task -------------------------------
BAD_KINDS = [
    fault_tasks.raise_nul_message,
    fault_tasks.raise_lone_surrogate_message,
    fault_tasks.return_huge_int,
]


@dataclass
class Drain:
    healthy: list[int]
    bad: dict[str, list[int]]  # task name -> ids
    ran: Counter[int]  # task id -> runs


def drain_with_bad_outcomes(start_worker: Callable[..., object], tmp_path: Path) -> Drain:
    """400 healthy tasks with 20 bad ones among them (an exception message with a NUL,
    one with a lone surrogate, a result with more digits than can be written), drained
    by one worker whose settle batches mix them."""
    ledger = tmp_path / "runs"
    healthy: list[int] = []
    bad: dict[str, list[int]] = {kind.name: [] for kind in BAD_KINDS}
    for block in range(20):
        healthy += fault_tasks.healthy.enqueue_many([(str(ledger),)] * 20)
        kind = BAD_KINDS[block % len(BAD_KINDS)]
        bad[kind.name].append(kind.enqueue(str(ledger)))
    every = healthy + [task_id for ids in bad.values() for task_id in ids]
    start_worker(*FAST_LEASE, "--concurrency", "16")
    wait_until(lambda: not unfinished(every), timeout=30, message="the drain")
    return Drain(healthy, bad, runs(ledger))


def test_outcomes_the_database_cannot_store_cost_their_neighbours_nothing(start_worker, tmp_path):
    # Given / When 400 healthy tasks drain with 20 bad outcomes among theirs
    drain = drain_with_bad_outcomes(start_worker, tmp_path)

    # Then every healthy task ran once and succeeded at its first attempt
    again = [i for i in drain.healthy if drain.ran[i] != 1]
    assert again == [], f"{len(again)} of {len(drain.healthy)} healthy tasks ran more than once"
    late = Task.objects.filter(pk__in=drain.healthy).exclude(state="succeeded", attempt=1)
    assert list(late.values_list("id", "state", "attempt")) == []


def test_an_outcome_the_database_cannot_store_fails_its_task_with_the_real_error(
    start_worker, tmp_path
):
    # Given / When 400 healthy tasks drain with 20 bad outcomes among theirs
    drain = drain_with_bad_outcomes(start_worker, tmp_path)

    # Then every bad task ran once and failed with its own error, not LeaseExpired
    def error(task_id: int) -> dict:
        row = Task.objects.get(pk=task_id)
        assert (row.state, drain.ran[task_id], len(row.errors)) == ("failed", 1, 1), row.errors
        assert row.errors[0]["type"] != "LeaseExpired", row.errors
        return row.errors[0]

    for task_id in drain.bad[fault_tasks.raise_nul_message.name]:
        message = error(task_id)["message"]  # the NUL replaced or escaped
        assert message.startswith("nul here:") and message.endswith(":end"), message
        assert "\x00" not in message
    for task_id in drain.bad[fault_tasks.raise_lone_surrogate_message.name]:
        message = error(task_id)["message"]  # the surrogate replaced
        assert message.startswith("lone surrogate here:") and message.endswith(":end"), message
        assert "\ud800" not in message
    for task_id in drain.bad[fault_tasks.return_huge_int.name]:
        message = error(task_id)["message"]  # says why the result was not stored
        assert "result" in message, message


# -- issue 8.3: settlement never waits on one row -------------------------------------
def row_is_locked(pg: psycopg.Connection, task_id: int) -> bool:
    try:
        with pg.transaction():
            pg.execute("SELECT 1 FROM pgqueue_task WHERE id = %s FOR UPDATE NOWAIT", [task_id])
    except psycopg.errors.LockNotAvailable:
        return True
    return False


@pytest.mark.slow
def test_outcomes_are_written_while_a_hung_handler_locks_its_own_row(
    start_worker, tmp_path, pg, monkeypatch
):
    # Given a handler that locked its own row (progress written inside its atomic()
    # block) and hangs past timeout + grace, so its slot is written off and a timeout
    # outcome is due for a row its own handler keeps locked
    monkeypatch.setenv("PGQUEUE_TEST_TIMEOUT_GRACE", "0.5")
    ledger = str(tmp_path / "runs")
    hung = fault_tasks.hang_holding_row_lock.enqueue(ledger, 60)
    worker = start_worker("--concurrency", "4")
    wait_until(lambda: "written off" in worker.log(), timeout=10, message="the write-off")

    # When quick tasks run meanwhile
    quick = fault_tasks.healthy.enqueue_many([(ledger,)] * 50)

    # Then their outcomes are written within seconds, while the hung row stays locked
    assert within(5, lambda: states(quick) == {"succeeded": len(quick)}), states(quick)
    assert row_is_locked(pg, hung)


CONCURRENCY = 4
# A worker holds at most its slots and its largest prefetch (3 x CONCURRENCY by default,
# see slots.py) plus max(slots, 100) claims unsettled (running, waiting for a slot, or
# run and waiting for the database): a bound that does not grow with the backlog.
HELD_LIMIT = 4 * CONCURRENCY + max(CONCURRENCY, 100)


@pytest.mark.slow  # long: run by CI's slow step, not the README's command
def test_a_worker_whose_outcomes_cannot_be_written_stops_claiming(start_worker, tmp_path, pg):
    # Given a worker with 4 slots and a backlog of short tasks three times its limit
    ledger = str(tmp_path / "runs")
    worker = start_worker("--concurrency", str(CONCURRENCY))
    ids = fault_tasks.nap.enqueue_many([(ledger, 0.1)] * (3 * HELD_LIMIT))

    # When every running row is locked by someone else as soon as it is claimed, so
    # no outcome can be written, for 4 s (what 160 of these tasks take on 4 slots)
    peak = 0
    with pg.transaction():
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            pg.execute("SELECT id FROM pgqueue_task WHERE state = 'running' FOR SHARE SKIP LOCKED")
            peak = max(peak, Task.objects.filter(pk__in=ids, state="running").count())
            time.sleep(0.02)
    wait_until(lambda: not unfinished(ids), timeout=20, message="the tasks to finish")

    # Then the claimed-but-unsettled tasks stayed within the limit, and once the locks
    # were gone every task was written
    assert peak <= HELD_LIMIT, (
        f"{peak} tasks were claimed and not settled at once, by a worker with {CONCURRENCY} "
        f"slots (limit {HELD_LIMIT})"
    )
    assert states(ids) == {"succeeded": len(ids)}
    # and the rows held past the first retry were logged at WARNING, with the hint
    assert re.search(
        r"WARNING.*its row is locked by another transaction for over 0\.2s", worker.log()
    ), worker.log()[-2000:]


# -- issue 8.4: a statement whose reply is lost after it committed -------------------
@pytest.mark.slow
def test_a_task_whose_claim_reply_was_lost_still_runs(lossy, start_worker, tmp_path):
    # Given a task with one attempt, and a network that will lose the claim's reply
    # after the server committed it
    ledger = tmp_path / "runs"
    task_id = fault_tasks.once.enqueue(str(ledger))
    lossy.lose_reply_to(statement_marker("claim"))

    # When a worker claims it
    start_worker(*FAST_LEASE, database_url=lossy.url)
    assert lossy.fired.wait(10), "the worker never sent the claim"
    wait_until(lambda: not unfinished([task_id]), timeout=20, message="the task to finish")

    # Then it ran once and succeeded: it was not dead-lettered without running
    row = Task.objects.get(pk=task_id)
    assert (row.state, runs(ledger)[task_id]) == ("succeeded", 1), row.errors
    assert "LeaseExpired" not in [e["type"] for e in row.errors], row.errors


def test_the_rows_of_a_claim_whose_reply_was_lost_are_found_by_its_tokens(pg):
    # Given three running tasks, claimed by three claims (three tokens), and a task that
    # ran under a fourth claim and succeeded
    from tests import sqlhelpers

    ids = [fault_tasks.healthy.enqueue("unused") for _ in range(4)]
    claimed = [sqlhelpers.claim(pg, 1)[0] for _ in ids]
    assert sorted(t.id for t in claimed) == sorted(ids)
    lost, other, _unasked, finished = claimed
    assert sqlhelpers.settle(pg, [sqlhelpers.success(finished)]) == {finished.id: "succeeded"}

    # When a claimer looks up the claims whose reply it lost, by their tokens (one of
    # them a token no claim used, one of them the finished task's)
    tokens = [lost.lease_token, other.lease_token, finished.lease_token, str(uuid.uuid4())]
    found = pg.execute(QUERIES["find_claimed"], {"tokens": tokens}).fetchall()

    # Then it finds the rows those claims hold while they run, and no other: not the
    # claim it did not ask about, not the task that ended
    assert sorted(row[0] for row in found) == sorted([lost.id, other.id])
    assert {str(row[11]) for row in found} == {lost.lease_token, other.lease_token}


@pytest.mark.slow
def test_a_settle_whose_reply_was_lost_is_counted_as_written(lossy, start_worker, tmp_path):
    # Given a worker whose first settle's reply will be lost after the server committed it
    ledger = tmp_path / "runs"
    lossy.lose_reply_to(statement_marker("settle"))
    worker = start_worker(*FAST_LEASE, database_url=lossy.url)

    # When it runs one task
    task_id = fault_tasks.healthy.enqueue(str(ledger))
    assert lossy.fired.wait(10), "the worker never sent the settle"
    wait_until(lambda: not unfinished([task_id]), message="the task to finish")
    worker.stop()  # flushes the settler, then logs the counts

    # Then the task succeeded once and the worker counts a success, not a lost outcome
    row = Task.objects.get(pk=task_id)
    assert (row.state, row.attempt, row.errors, runs(ledger)[task_id]) == ("succeeded", 1, [], 1)
    log = worker.log()
    after_start = "\n".join(log.splitlines()[1:])
    assert "success=1" in log, after_start
    assert not re.search(r"\blost=|lease lost", log), after_start


@pytest.mark.slow
def test_task_finished_is_sent_when_the_settles_reply_was_lost(lossy, start_worker):
    # Given a worker whose first settle's reply will be lost after the server committed it
    lossy.lose_reply_to(statement_marker("settle"))
    start_worker(*FAST_LEASE, database_url=lossy.url)

    # When it runs a task of Django's Tasks framework
    result = framework_tasks.observed.enqueue()
    assert lossy.fired.wait(10), "the worker never sent the settle"

    # Then task_finished is sent for it, once
    def labels() -> list[str]:
        return list(Run.objects.filter(task_id=int(result.id)).values_list("label", flat=True))

    wait_until(
        lambda: "finished:SUCCESSFUL:PgQueueBackend" in labels(),
        timeout=10,
        message="task_finished",
    )
    time.sleep(0.5)  # a second signal would follow at once
    assert labels().count("finished:SUCCESSFUL:PgQueueBackend") == 1
