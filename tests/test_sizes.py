"""Bounded sizes: arguments, metadata, results, checkpoints and signal payloads each have
a limit in bytes of JSON (a setting each), refused with an error naming the limit and
its setting before anything is written; error text is truncated instead; and one claim
loads at most CLAIM_BATCH_BYTES of stored payloads into a worker."""

from __future__ import annotations

import json
import secrets
import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import InvalidTaskError, PayloadTooLarge, signal
from django_pgqueue.models import Task
from django_pgqueue.tasking.workflows import chain, group
from tests import framework_tasks, size_tasks, sqlhelpers, tasks
from tests.conftest import wait_until
from tests.factories import TaskFactory
from tests.test_metrics import free_port, scrape
from tests.test_unique import InThread, lock_waiters
from tests.test_unroutable import add_worker, sweep_unroutable

MIB = 1024 * 1024
FIFTY_MB = "x" * 50_000_000


def refused(call, limit: str, no_queries) -> str:
    """Given a block in the caller's transaction, when ``call`` is refused, then the
    error names ``limit`` (the setting), no SQL ran, and nothing is written."""
    with transaction.atomic():
        with no_queries(0), pytest.raises(PayloadTooLarge) as caught:
            call()
        assert Task.objects.count() == 0  # the caller's transaction is still usable
    message = str(caught.value)
    assert f"PGQUEUE['{limit}']" in message, message
    return message


# -- enqueue ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_50_mb_argument_is_refused_naming_the_limit_and_its_size_before_any_sql(
    django_assert_num_queries,
):
    message = refused(
        lambda: tasks.noop.enqueue(FIFTY_MB), "MAX_ARGS_BYTES", django_assert_num_queries
    )

    assert "the arguments (args and kwargs together): 50,000,006 bytes as JSON" in message
    assert "more than the limit of 1,048,576 bytes" in message
    assert "nothing was enqueued" in message


@pytest.mark.django_db
def test_args_and_kwargs_count_together_and_a_call_at_the_limit_is_accepted():
    # '[]' and '{"label":"' + label + '"}': 2 + 12 + len(label) bytes
    with override_settings(PGQUEUE={"MAX_ARGS_BYTES": 2048}):
        task_id = tasks.record.enqueue(label="z" * (2048 - 12 - 2))
        with pytest.raises(PayloadTooLarge, match="2,049 bytes as JSON"):
            tasks.record.enqueue(label="z" * (2048 - 12 - 1))

    assert Task.objects.get().pk == task_id


@pytest.mark.django_db
def test_the_limit_counts_utf8_bytes_not_characters():
    two_bytes_each = "é" * 600  # 1,200 bytes in UTF-8, 600 characters

    with (
        override_settings(PGQUEUE={"MAX_ARGS_BYTES": 1024}),
        pytest.raises(PayloadTooLarge, match="1,206 bytes as JSON"),
    ):
        tasks.noop.enqueue(two_bytes_each)


@pytest.mark.django_db
def test_enqueue_many_refuses_the_batch_naming_the_item_over_the_limit(
    django_assert_num_queries,
):
    message = refused(
        lambda: tasks.noop.enqueue_many([1, FIFTY_MB, 3]), "MAX_ARGS_BYTES",
        django_assert_num_queries,
    )  # fmt: skip

    assert message.startswith("item 1: the arguments"), message


@pytest.mark.django_db
def test_enqueue_many_accepts_a_large_batch_of_calls_each_within_the_limit():
    calls = ["y" * 1000] * 2000  # 2 MB in all, 1 KB per call

    ids = tasks.noop.enqueue_many(calls)

    assert Task.objects.filter(pk__in=ids).count() == 2000


@pytest.mark.django_db
def test_enqueue_on_commit_refuses_when_called_and_defers_nothing_to_the_commit(
    django_assert_num_queries, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        refused(
            lambda: tasks.noop.enqueue_on_commit(FIFTY_MB), "MAX_ARGS_BYTES",
            django_assert_num_queries,
        )  # fmt: skip

    assert callbacks == []
    assert Task.objects.count() == 0


@pytest.mark.django_db
def test_metadata_over_its_limit_is_refused(django_assert_num_queries):
    message = refused(
        lambda: tasks.noop.using(metadata={"note": "m" * 70_000}).enqueue(),
        "MAX_METADATA_BYTES",
        django_assert_num_queries,
    )

    assert "the metadata: 70,011 bytes as JSON" in message
    assert "limit of 65,536 bytes" in message


@pytest.mark.django_db
def test_the_tasks_framework_backend_refuses_a_50_mb_argument(django_assert_num_queries):
    message = refused(
        lambda: framework_tasks.send_email.enqueue(FIFTY_MB), "MAX_ARGS_BYTES",
        django_assert_num_queries,
    )  # fmt: skip

    assert message.startswith("cannot enqueue tests.framework_tasks.send_email: the arguments")


@pytest.mark.django_db
def test_a_group_refuses_a_step_over_the_limit_before_any_sql(django_assert_num_queries):
    refused(
        lambda: group([tasks.noop.step(1), tasks.noop.step(FIFTY_MB)]), "MAX_ARGS_BYTES",
        django_assert_num_queries,
    )  # fmt: skip


@pytest.mark.django_db
def test_a_chain_in_a_transaction_refuses_a_step_over_the_limit_and_writes_nothing():
    # The steps before it were inserted in the caller's transaction: it rolls back.
    with pytest.raises(PayloadTooLarge), transaction.atomic():
        chain(tasks.noop.step(1), tasks.noop.step(FIFTY_MB))

    assert Task.objects.count() == 0


@pytest.mark.django_db
def test_a_limit_of_none_accepts_any_size():
    with override_settings(PGQUEUE={"MAX_ARGS_BYTES": None}):
        task_id = tasks.noop.enqueue("x" * (2 * MIB))

    assert len(Task.objects.get(pk=task_id).args[0]) == 2 * MIB


# -- signals ---------------------------------------------------------------------------


def waiting_for(name: str) -> Task:
    return TaskFactory(state="waiting", wait_reason="signal", wait_signal=name)


@pytest.mark.django_db
def test_a_signal_payload_over_its_limit_is_refused_and_nothing_is_sent():
    task = waiting_for("approved")

    with pytest.raises(PayloadTooLarge) as caught:
        signal(task.pk, "approved", {"blob": "s" * (2 * MIB)})

    assert "PGQUEUE['MAX_SIGNAL_BYTES']" in str(caught.value)
    assert "nothing was sent" in str(caught.value)
    task.refresh_from_db()
    assert (task.state, task.signals) == ("waiting", {})


@pytest.mark.django_db
def test_pgqueue_signal_refuses_a_payload_over_the_limit():
    task = waiting_for("approved")

    with (
        override_settings(PGQUEUE={"MAX_SIGNAL_BYTES": 1024}),
        pytest.raises(CommandError, match=r"PGQUEUE\['MAX_SIGNAL_BYTES'\]"),
    ):
        call_command("pgqueue_signal", task.pk, "approved", "--payload", json.dumps("p" * 2000))

    task.refresh_from_db()
    assert (task.state, task.signals) == ("waiting", {})


@pytest.mark.django_db
def test_the_admins_send_signal_form_shows_the_limit_and_sends_nothing(admin_client):
    task = waiting_for("approved")
    url = reverse("admin:django_pgqueue_task_signal", args=[task.pk])

    with override_settings(PGQUEUE={"MAX_SIGNAL_BYTES": 1024}):
        response = admin_client.post(url, {"name": "approved", "payload": json.dumps("p" * 2000)})

    assert response.status_code == 200  # the form again, with the error
    assert "MAX_SIGNAL_BYTES" in response.content.decode()
    task.refresh_from_db()
    assert (task.state, task.signals) == ("waiting", {})


@pytest.mark.django_db
def test_signals_of_distinct_names_cannot_make_a_50_mb_row():
    # Given a live task, and a caller that forwards input to signal: payloads just
    # within MAX_SIGNAL_BYTES, each under a new name
    task = TaskFactory(state="running")
    payload = "s" * (MIB - 64)
    sent = 0

    # When it keeps sending
    with pytest.raises(PayloadTooLarge) as caught:
        for n in range(60):
            signal(task.pk, f"event-{n}", payload)
            sent += 1

    # Then the task's signals stop at the default total (4 MiB): the fifth, which would
    # pass it, is refused, naming the limit, and not stored
    message = str(caught.value)
    assert "PGQUEUE['MAX_TASK_SIGNALS_BYTES']" in message and "nothing was sent" in message
    assert f"task {task.pk}" in message
    task.refresh_from_db()
    assert sorted(task.signals) == sorted(f"event-{n}" for n in range(sent))
    assert sent == 4
    assert len(json.dumps(task.signals)) <= 4 * MIB


@pytest.mark.django_db
def test_a_signal_over_the_number_of_names_is_refused_and_a_known_name_is_still_taken():
    task = TaskFactory(state="running")
    with override_settings(PGQUEUE={"MAX_TASK_SIGNALS": 2}):
        signal(task.pk, "a", 1)
        signal(task.pk, "b", 2)

        with transaction.atomic():
            with pytest.raises(PayloadTooLarge) as caught:
                signal(task.pk, "c", 3)
            assert signal(task.pk, "a", 10) == "stored"  # the block is still usable

    message = str(caught.value)
    assert "PGQUEUE['MAX_TASK_SIGNALS']" in message and "nothing was sent" in message
    task.refresh_from_db()
    assert task.signals == {"a": 10, "b": 2}


@pytest.mark.django_db
def test_a_signal_that_would_wake_a_task_past_the_total_leaves_it_waiting():
    task = waiting_for("approved")
    signal(task.pk, "note", "n" * 3000)

    with (
        override_settings(PGQUEUE={"MAX_TASK_SIGNALS_BYTES": 4096}),
        pytest.raises(PayloadTooLarge, match=r"PGQUEUE\['MAX_TASK_SIGNALS_BYTES'\]"),
    ):
        signal(task.pk, "approved", "a" * 2000)

    task.refresh_from_db()
    assert (task.state, sorted(task.signals), task.wake) == ("waiting", ["note"], None)


@pytest.mark.django_db(transaction=True)
def test_two_signals_sent_at_once_cannot_both_pass_the_total_only_one_fits(pg):
    # Given a task, and a signal in flight that takes most of the total (not committed)
    task = TaskFactory(state="running")
    release = threading.Event()

    def first() -> str | None:
        with transaction.atomic():
            outcome = signal(task.pk, "first", "f" * 3000)
            release.wait(10)
        return outcome

    with override_settings(PGQUEUE={"MAX_TASK_SIGNALS_BYTES": 4096}):
        sender = InThread(first)
        wait_until(lambda: lock_holders(pg, task.pk), message="the first signal")

        # When a second one, which would fit alone, is sent meanwhile: it waits
        second = InThread(lambda: signal(task.pk, "second", "s" * 3000))
        wait_until(lambda: lock_waiters(pg) == 1, message="the second signal to wait")
        release.set()

        # Then it is measured with the first one stored, and refused
        assert sender.join() == "stored"
        with pytest.raises(PayloadTooLarge, match=r"PGQUEUE\['MAX_TASK_SIGNALS_BYTES'\]"):
            second.join()
    task.refresh_from_db()
    assert sorted(task.signals) == ["first"]


def lock_holders(pg, task_id: int) -> bool:
    """Whether another transaction holds the task's row lock (a probe would wait)."""
    try:
        with pg.transaction(force_rollback=True):
            pg.execute("SET LOCAL lock_timeout = '50ms'")
            pg.execute("SELECT 1 FROM pgqueue_task WHERE id = %s FOR NO KEY UPDATE", [task_id])
    except psycopg.errors.LockNotAvailable:
        return True
    return False


@pytest.mark.django_db
def test_pgqueue_signal_and_the_admin_refuse_a_signal_past_the_tasks_total(admin_client):
    task = waiting_for("approved")
    signal(task.pk, "note", "n" * 3000)
    url = reverse("admin:django_pgqueue_task_signal", args=[task.pk])

    with override_settings(PGQUEUE={"MAX_TASK_SIGNALS_BYTES": 4096}):
        with pytest.raises(CommandError, match=r"PGQUEUE\['MAX_TASK_SIGNALS_BYTES'\]"):
            call_command("pgqueue_signal", task.pk, "approved", "--payload", json.dumps("p" * 2000))
        response = admin_client.post(url, {"name": "approved", "payload": json.dumps("p" * 2000)})

    assert response.status_code == 200  # the form again, with the error
    assert "MAX_TASK_SIGNALS_BYTES" in response.content.decode()
    task.refresh_from_db()
    assert (task.state, sorted(task.signals)) == ("waiting", ["note"])


# -- errors: a row keeps its last 100 ---------------------------------------------------


def earlier_errors(count: int) -> list[dict]:
    return [
        {"attempt": n, "type": "Old", "message": f"old {n}", "traceback": None}
        for n in range(1, count + 1)
    ]


def a_failed_attempt(pg, task_id: int) -> None:
    [claimed] = sqlhelpers.claim(pg, routes=[NOOP])
    error = {"attempt": claimed.attempt, "type": "New", "message": "new", "traceback": None}
    outcome = {**sqlhelpers.success(claimed), "label": "failure", "state": "pending"}
    assert sqlhelpers.settle(pg, [{**outcome, "error": error, "delay": 0}]) == {task_id: "pending"}


def a_lost_lease(pg, task_id: int) -> None:
    sqlhelpers.claim(pg, routes=[NOOP])
    sqlhelpers.expire_lease(pg, task_id)
    assert [r[0] for r in sqlhelpers.sweep(pg)] == [task_id]


def an_unroutable_task(pg, task_id: int) -> None:
    add_worker(pg, "w-other", ["default"], [("tests.tasks.other", 1)])
    assert sweep_unroutable() == 1


def an_expiry_at_the_claim(pg, task_id: int) -> None:
    Task.objects.filter(pk=task_id).update(expires_at=timezone.now() - timedelta(hours=1))
    [expired] = sqlhelpers.claim(pg, routes=[NOOP])
    assert expired.expired


def an_expiry_at_the_stage(pg, task_id: int) -> None:
    Task.objects.filter(pk=task_id).update(
        state="scheduled", expires_at=timezone.now() - timedelta(hours=1)
    )
    assert sqlhelpers.claim(pg, routes=[NOOP]) == []  # staged: expired, not claimed


NOOP = (tasks.noop.name, tasks.noop.version)
# Every statement that appends an error, and the type of the error it appends.
APPENDS = {
    "a failed attempt (settle)": (a_failed_attempt, "New"),
    "a lost lease (the sweep)": (a_lost_lease, "LeaseExpired"),
    "an unroutable task": (an_unroutable_task, "TaskNotRegistered"),
    "an expiry at the claim": (an_expiry_at_the_claim, "Expired"),
    "an expiry at the stage": (an_expiry_at_the_stage, "Expired"),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("before", [3, 100, 150])
@pytest.mark.parametrize("how", APPENDS)
def test_a_row_keeps_its_last_100_errors_and_counts_those_it_dropped(pg, how, before):
    # Given a task with earlier errors (150: more than a row of an older release kept)
    task_id = TaskFactory(
        errors=earlier_errors(before),
        errors_dropped=7,
        max_attempts=1000,
        run_at=timezone.now() - timedelta(hours=2),
    ).pk
    append, kind = APPENDS[how]

    # When one more error is appended
    append(pg, task_id)

    # Then the row keeps the last 100 (the new one last) and counts what it dropped
    row = Task.objects.get(pk=task_id)
    kept = min(before, 99)
    assert [e["message"] for e in row.errors[:-1]] == [
        f"old {n}" for n in range(before - kept + 1, before + 1)
    ]
    assert row.errors[-1]["type"] == kind
    assert row.errors_dropped == 7 + before - kept


@pytest.mark.django_db
def test_the_admin_says_how_many_earlier_errors_were_dropped(admin_client):
    task = TaskFactory(state="failed", errors=earlier_errors(100), errors_dropped=412)

    page = admin_client.get(reverse("admin:django_pgqueue_task_change", args=[task.pk]))

    assert "412 earlier error(s) dropped: a task keeps its last 100." in page.content.decode()


# -- the worker ------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


@pytest.mark.django_db(transaction=True)
def test_a_task_returning_50_mb_fails_at_once_and_its_result_is_never_stored(start_worker):
    # Given an idle worker
    worker = start_worker("--concurrency", "1")
    wait_until(lambda: " started: " in worker.log())
    idle = rss_kib(worker.pid)

    # When a task (of two attempts) returns 50 MB
    task_id = size_tasks.return_megabytes.enqueue(50)

    # Then it fails on its first attempt, without retry, saying which limit it broke
    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="failed").first())
    assert (row.attempt, row.result) == (1, None)
    (error,) = row.errors
    assert error["type"] == "PayloadTooLarge"
    assert "the task's result: 50,000,002 bytes as JSON" in error["message"]
    assert "PGQUEUE['MAX_RESULT_BYTES']" in error["message"]
    # and the worker holds none of it once the task is settled (the 50 MB string and
    # its JSON text were freed; a worker that kept either would hold 50 MB more)
    after = wait_until(lambda: (rss := rss_kib(worker.pid)) < idle + 25_000 and rss, timeout=5)
    assert after < idle + 25_000, (idle, after)


@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_over_its_limit_fails_the_attempt_and_is_not_saved(start_worker):
    saved = size_tasks.save_big_checkpoint.enqueue(2 * MIB)
    continued = size_tasks.continue_with_big_checkpoint.enqueue(2 * MIB)
    start_worker()

    for task_id in (saved, continued):
        row = wait_until(lambda t=task_id: Task.objects.filter(pk=t, state="failed").first())
        assert row.checkpoint is None
        (error,) = row.errors  # Continue's too: failed at once, not retried
        assert error["type"] == "django_pgqueue.exceptions.PayloadTooLarge"
        assert "the checkpoint: 2,097,163 bytes as JSON" in error["message"]
        assert "PGQUEUE['MAX_CHECKPOINT_BYTES']" in error["message"]


@pytest.mark.django_db(transaction=True)
def test_a_huge_error_message_is_truncated_not_refused(start_worker):
    task_id = size_tasks.raise_long_message.enqueue(3 * MIB)
    start_worker()

    row = wait_until(lambda: Task.objects.filter(pk=task_id, state="failed").first())
    message = row.errors[0]["message"]
    assert message.startswith("y" * 10_000)
    assert message.endswith(f"... [{3 * MIB - 10_000} characters cut]")
    assert len(row.errors[0]["traceback"]) < 51_000


def incompressible(size: int) -> str:
    """Random text PostgreSQL cannot compress: stored (pg_column_size) at about its size."""
    return secrets.token_urlsafe(size * 3 // 4)[:size]


@pytest.mark.django_db(transaction=True)
def test_the_claim_takes_rows_in_priority_order_until_the_batch_bytes_are_spent(pg):
    # Given five pending rows of about 300 KB each, highest priority first by id
    ids = [
        tasks.noop.using(priority=10 - n).enqueue(incompressible(300_000)) for n in range(5)
    ]

    # When a worker with ten free slots claims with a budget of 1 MiB
    first = sqlhelpers.claim(pg, 10, batch_bytes=MIB)

    # Then it takes the three that fit, in priority order, and says it left two behind
    assert [t.id for t in first] == ids[:3]
    assert {t.left_out for t in first} == {2}
    # which stay pending, unlocked, for the next claim at once
    assert Task.objects.filter(pk__in=ids[3:], state="pending").count() == 2
    second = sqlhelpers.claim(pg, 10, batch_bytes=MIB)
    assert [t.id for t in second] == ids[3:]
    assert {t.left_out for t in second} == {0}


@pytest.mark.django_db(transaction=True)
def test_a_row_larger_than_the_batch_bytes_is_claimed_alone(pg):
    big = tasks.noop.using(priority=5).enqueue(incompressible(300_000))
    small = tasks.noop.enqueue(1)

    first = sqlhelpers.claim(pg, 10, batch_bytes=100_000)
    second = sqlhelpers.claim(pg, 10, batch_bytes=100_000)

    assert [(t.id, t.left_out) for t in first] == [(big, 1)]
    assert [(t.id, t.left_out) for t in second] == [(small, 0)]


@pytest.mark.django_db(transaction=True)
def test_small_rows_are_never_cut_by_the_default_batch_bytes(pg):
    ids = tasks.noop.enqueue_many(range(30))

    claimed = sqlhelpers.claim(pg, 30, batch_bytes=8 * MIB)

    assert sorted(t.id for t in claimed) == ids
    assert {t.left_out for t in claimed} == {0}


@pytest.mark.django_db(transaction=True)
def test_a_worker_claims_large_rows_a_few_at_a_time_and_never_waits_for_a_poll(start_worker):
    # Given twelve rows of 900 KB and a worker of eight slots whose claims may load
    # 2 MiB, and whose idle claimer would sleep a minute between polls
    ids = size_tasks.measure.enqueue_many([incompressible(900_000) for _ in range(12)])
    port = free_port()
    start_worker(
        "--concurrency", "8", "--prefetch", "0", "--poll-interval", "60",
        "--metrics-port", str(port),
        env={"PGQUEUE_TEST_CLAIM_BATCH_BYTES": str(2 * MIB)},
    )  # fmt: skip

    # When it runs them
    wait_until(
        lambda: Task.objects.filter(pk__in=ids, state="succeeded").count() == 12,
        timeout=30,
        message="the twelve rows to succeed (a claimer that parked would wait 60 s)",
    )

    # Then each claim statement (one lease token each) took at most two of them
    tokens = Counter(
        entry["token"]
        for executions in Task.objects.filter(pk__in=ids).values_list("executions", flat=True)
        for entry in executions
    )
    assert sum(tokens.values()) == 12
    assert max(tokens.values()) == 2, tokens
    # and the worker counted the claims it cut (at least the five that left rows out)
    assert scrape(port)[("pgqueue_claims_cut_total",)] >= 5


def test_payload_too_large_is_an_invalid_task_error():
    assert issubclass(PayloadTooLarge, InvalidTaskError)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("scope", ["queue", "key"])
def test_a_rate_limited_claim_cut_by_the_batch_bytes_spends_the_starts_it_took_only(pg, scope):
    # Given six rows of about 300 KB, 100 starts an hour (5 at once) for their queue or
    # for their key
    from django_pgqueue.core.limits import parse_limits, parse_rate
    from tests.factories import TaskFactory
    from tests.ledger_tasks import ledger_key_rated

    if scope == "queue":
        extra = {"limits": parse_limits({"default": {"rate": "100/h"}})}
        ids = [tasks.noop.enqueue(incompressible(300_000)) for _ in range(6)]
    else:
        route = (ledger_key_rated.name, ledger_key_rated.version)
        extra = {"routes": [route], "key_rates": {route: parse_rate("100/h")}}
        ids = [TaskFactory(task_name=route[0], handler_version=route[1], concurrency_key="k",
                           args=[n, "k", incompressible(300_000)]).id for n in range(6)]

    def claim() -> list[int]:
        return [t.id for t in sqlhelpers.claim(pg, 5, batch_bytes=MIB, look_for_starving=False,
                                               statement="claim", **extra)]

    # When a claim of 5 takes the 3 that fit in 1 MiB
    first = claim()
    assert len(first) == 3

    # Then the budget paid for those 3 starts only: the next claim starts 2, the rest of
    # the 5, and the last row waits
    second = claim()
    assert len(second) == 2
    assert Task.objects.filter(pk__in=ids, state="pending").count() == 1
