"""Batch handlers (docs/tenants.md): a handler takes a list of calls, each call a task of
its own, settled on its own lease by its own outcome.

The first tests run the batch's execution in this process on rows claimed as a worker
claims them (tests/sqlhelpers.py); the others run real worker processes and read what
the handlers recorded in the ledger (tests/ledger.py).
"""

from __future__ import annotations

import json
import signal

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_pgqueue import BatchCall, InvalidTaskError, task
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Task
from django_pgqueue.tasking.registry import registry
from django_pgqueue.worker.execution import execute_batch
from tests import ledger
from tests.conftest import wait_until
from tests.sqlhelpers import claim, expire_lease, settle, sweep
from tests.tenant_tasks import batch_boom, batch_send

pytestmark = pytest.mark.django_db(transaction=True)

SEND = (batch_send.name, batch_send.version)


def batches(path) -> list[list[int]]:
    return [e["tasks"] for e in ledger.read(path) if e["event"] == "batch"]


def outcome_rows(outcomes) -> list[dict]:
    return [o.as_row() for o in outcomes]


# -- declaring -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, "batch_size must be an int from 1 to 10,000"),
        ({"batch_size": True}, "batch_size must be an int"),
        ({"batch_size": 5, "batch_wait": -1}, "batch_wait must be a number of seconds"),
        ({"batch_wait": 1.0}, "give batch_size too"),
        ({"batch_size": 5, "takes_context": True}, "cannot have takes_context=True"),
        ({"batch_size": 5, "fair_key": lambda n: "k"}, "cannot have fair_key"),
        ({"batch_size": 5, "sequence_key": lambda n: "k"}, "cannot have sequence_key"),
        ({"batch_size": 5, "atomic": True}, "cannot have atomic=True"),
    ],
)
def test_a_batch_handler_with_bad_options_is_refused_at_declaration(options, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        task(name="tests.batch_bad", **options)(lambda batch: None)

    async def handler(batch: list[BatchCall]) -> None: ...

    with pytest.raises(ImproperlyConfigured, match="cannot have async def"):
        task(name="tests.batch_bad", batch_size=5)(handler)
    assert "tests.batch_bad" not in registry


def test_a_batch_handler_is_not_made_atomic_by_a_call():
    with pytest.raises(InvalidTaskError, match=r"is a batch handler .* does not run atomically"):
        batch_send.using(atomic=True)


# -- one batch, in this process ----------------------------------------------------------
def test_each_call_of_a_batch_gets_its_own_outcome(pg, tmp_path, monkeypatch):
    monkeypatch.setenv(ledger.LEDGER_ENV, str(tmp_path / "ledger.jsonl"))
    ok = batch_send.enqueue(1)
    failing = batch_send.enqueue(2, fail_until=1)  # fails its first attempt
    dead = batch_send.using(max_attempts=1).enqueue(3, fail_until=9)
    broken = batch_send.enqueue(4)
    pg.execute("UPDATE pgqueue_task SET args = '{\"not\": \"a list\"}' WHERE id = %s", [broken])

    claimed = sorted(claim(pg, 10, routes=[SEND]), key=lambda t: t.id)
    outcomes = execute_batch(claimed, "default")
    written = settle(pg, [o.as_row() for o in outcomes])

    # One call of the handler with the three readable calls
    assert batches(tmp_path / "ledger.jsonl") == [[ok, failing, dead]]
    assert written == {ok: "succeeded", failing: "scheduled", dead: "failed", broken: "failed"}
    rows = Task.objects.in_bulk([ok, failing, dead, broken])
    assert rows[ok].result == 2
    assert rows[failing].errors[-1]["message"].endswith("failing on attempt 1")
    assert rows[broken].errors[-1]["type"] == "InvalidTaskError"


def test_an_encrypted_batch_call_reaches_the_handler_in_clear_and_its_result_sealed(
    pg, tmp_path, monkeypatch
):
    monkeypatch.setenv(ledger.LEDGER_ENV, str(tmp_path / "ledger.jsonl"))
    with override_settings(PGQUEUE={**settings.PGQUEUE, "ENCRYPT_ALL": True}):
        sealed = batch_send.enqueue(21)
        claimed = claim(pg, 10, routes=[SEND])
        written = settle(pg, outcome_rows(execute_batch(claimed, "default")))

    assert written == {sealed: "succeeded"}
    row = Task.objects.get(id=sealed)
    assert row.cleartext("result") == 42
    # Stored as a sealed envelope only: no cleartext field beside the ciphertext
    # (a search for "42" in the ciphertext would match by chance now and then)
    assert list(row.result) == ["$enc"]


def test_a_handler_that_raises_fails_every_call_by_its_own_policy(pg):
    retried = batch_boom.enqueue(1)
    last = batch_boom.using(max_attempts=1).enqueue(2)

    claimed = claim(pg, 10, routes=[(batch_boom.name, 1)])
    written = settle(pg, outcome_rows(execute_batch(claimed, "default")))

    assert written == {retried: "scheduled", last: "failed"}
    assert Task.objects.get(id=last).errors[-1]["message"] == "a batch of 2 failed"


def test_a_call_whose_lease_was_lost_is_not_written_and_the_others_are(pg):
    # Given a batch of three, one of whose leases lapsed and went to another worker
    ids = [batch_send.enqueue(n) for n in range(3)]
    claimed = claim(pg, 3, routes=[SEND], worker_id="w1")
    expire_lease(pg, ids[1])
    sweep(pg)
    (taken_over,) = claim(pg, 1, routes=[SEND], worker_id="w2")

    # When the first worker settles its batch
    outcomes = [{"id": t.id, "attempt": t.attempt, "token": t.lease_token,
                 "label": "success", "state": "succeeded", "result": t.id} for t in claimed]
    rows = pg.execute(QUERIES["settle"], {"outcomes": json.dumps(outcomes), "limit_queues": [],
                                          "limit_concurrency": []}).fetchall()  # fmt: skip

    # Then the lost call's write is refused (fenced), the others' are written
    assert sorted(r[0] for r in rows) == [ids[0], ids[2]]
    assert taken_over.id == ids[1]
    assert Task.objects.get(id=ids[1]).state == "running"


# -- real workers -----------------------------------------------------------------------------
def test_a_worker_hands_its_handler_batches_and_retries_failed_calls_alone(
    start_worker, tmp_path
):
    # Given 12 calls, one of which fails on its first attempt
    path = tmp_path / "ledger.jsonl"
    ids = [batch_send.enqueue(n, fail_until=1 if n == 4 else 0) for n in range(12)]

    # When a worker runs them
    start_worker("--concurrency", "2", env={"PGQUEUE_TEST_TENANTS": "1",
                                            ledger.LEDGER_ENV: str(path)})  # fmt: skip
    wait_until(lambda: Task.objects.filter(state="succeeded").count() == 12, timeout=60,
               message="every call to succeed")  # fmt: skip

    # Then its handler took them in batches of at most 5, each call once but the failed
    # one, which ran again in a later batch; each call's result is its own
    taken = batches(path)
    assert all(len(batch) <= 5 for batch in taken), taken
    assert sorted(i for batch in taken for i in batch) == sorted([*ids, ids[4]])
    assert len(taken) <= 5
    results = dict(Task.objects.values_list("id", "result"))
    assert [results[i] for i in ids] == [2 * n for n in range(12)]


def test_calls_that_arrive_within_the_wait_share_a_batch(start_worker, tmp_path):
    path = tmp_path / "ledger.jsonl"
    worker = start_worker("--concurrency", "2", env={"PGQUEUE_TEST_TENANTS": "1",
                                                     ledger.LEDGER_ENV: str(path)})  # fmt: skip
    # Given an idle worker, when three calls come one after another
    first = [batch_send.enqueue(n) for n in range(3)]
    wait_until(lambda: Task.objects.filter(state="succeeded").count() == 3, timeout=30,
               message="the calls to run")  # fmt: skip

    # Then its handler took them together (they came within the 0.3 s batch_wait)
    assert batches(path) == [first]
    worker.stop()


@pytest.mark.slow
def test_a_batch_that_overruns_its_timeout_times_out_every_call(start_worker, tmp_path):
    ids = [batch_boom.enqueue(n, sleep=2.0) for n in range(3)]

    start_worker("--concurrency", "2", env={"PGQUEUE_TEST_TENANTS": "1",
                                            "PGQUEUE_TEST_TIMEOUT_GRACE": "0.2"})  # fmt: skip
    wait_until(lambda: all(row.errors for row in Task.objects.filter(id__in=ids)),
               timeout=30, message="the calls' first attempts to end")  # fmt: skip

    for row in Task.objects.filter(id__in=ids):
        assert row.errors[0]["type"] == "TimeoutError", row.errors


@pytest.mark.slow
def test_the_calls_of_a_batch_whose_worker_was_killed_run_again(start_worker, tmp_path):
    path = tmp_path / "ledger.jsonl"
    env = {"PGQUEUE_TEST_TENANTS": "1", ledger.LEDGER_ENV: str(path)}
    fast = ("--lease", "2", "--heartbeat", "0.5", "--sweep-interval", "0.25")
    ids = [batch_send.enqueue(n, sleep=10) for n in range(4)]
    doomed = start_worker(*fast, env=env)
    wait_until(lambda: batches(path), message="the batch to start")

    doomed.signal(signal.SIGKILL)
    doomed.proc.wait(10)
    Task.objects.filter(id__in=ids).update(kwargs={})  # quick, the second time
    start_worker(*fast, env=env)

    wait_until(lambda: Task.objects.filter(id__in=ids, state="succeeded").count() == 4,
               timeout=60, message="the batch to run again")  # fmt: skip
    assert [sorted(batch) for batch in batches(path)] == [ids, ids]
    assert set(Task.objects.filter(id__in=ids).values_list("attempt", flat=True)) == {2}
