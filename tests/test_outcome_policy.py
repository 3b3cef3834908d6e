"""The outcome policy (worker/outcomes.py), one row of its table per test: what each way
an attempt ends writes, as the settle row the worker sends; and the retry policy's
delays (retry.py). The worker tests run the same transitions end to end; these pin each
decision, in this process (mutmut's tests of the policy, CONTRIBUTING.md)."""

from __future__ import annotations

import json
import random
import traceback
from datetime import UTC, datetime

import pytest

from django_pgqueue.core.retry import RetryPolicy
from django_pgqueue.worker import outcomes
from django_pgqueue.worker.claimed import ClaimedTask

NOW = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = {"base": 10.0, "factor": 3.0, "cap": 200.0, "jitter": 0.0}


def claimed(attempt: int = 1, max_attempts: int = 3, policy: object = POLICY) -> ClaimedTask:
    return ClaimedTask(
        id=7, task_name="tests.tasks.noop", handler_version=1, queue="default",
        priority=0, args=[], kwargs={}, attempt=attempt, max_attempts=max_attempts,
        retry_policy_json=json.dumps(policy), timeout=None,
        lease_token="00000000-0000-0000-0000-000000000001", lease_expires_at=NOW,
        claimed_at=NOW, enqueued_at=NOW, run_at=NOW, checkpoint_json=None,
        cancel_requested=False, cancel_hard=False, metadata_json="{}",
    )  # fmt: skip


def boom(message: str = "boom") -> ValueError:
    try:
        raise ValueError(message)
    except ValueError as exc:
        return exc


# -- the settle row ---------------------------------------------------------------------


def test_a_success_row_names_the_lease_and_leaves_out_what_is_unset():
    row = outcomes.succeeded(claimed(), 42, 0.5).as_row()

    assert row == {
        "id": 7, "attempt": 1, "token": "00000000-0000-0000-0000-000000000001",
        "label": "success", "state": "succeeded", "result": 42,
    }  # fmt: skip


def test_a_row_keeps_false_values_and_sets_only_true_flags():
    row = outcomes.continued(claimed(), checkpoint=False, save=True).as_row()

    assert row["checkpoint"] is False
    assert row["save_checkpoint"] is True and row["attempt_reset"] is True
    assert "attempt_refund" not in row
    assert row["delay"] == 0


# -- raised -----------------------------------------------------------------------------


@pytest.mark.parametrize(("attempt", "delay"), [(1, 10.0), (2, 30.0), (3, 90.0), (4, 200.0)])
def test_a_raise_with_attempts_left_is_pending_after_the_frozen_backoff(attempt, delay):
    outcome = outcomes.raised(claimed(attempt=attempt, max_attempts=5), boom())

    assert (outcome.label, outcome.state, outcome.delay) == ("failure", "pending", delay)
    assert outcome.error["attempt"] == attempt
    assert outcome.error["type"] == "builtins.ValueError"
    assert outcome.error["message"] == "boom"
    assert outcome.error["outcome"] == "failure"
    assert "Traceback" in outcome.error["traceback"]


def test_a_raise_on_the_last_attempt_is_a_dead_letter_with_its_error():
    outcome = outcomes.raised(claimed(attempt=3, max_attempts=3), boom("last"))

    assert (outcome.state, outcome.delay) == ("failed", None)
    assert outcome.error["message"] == "last"
    assert "rule" not in outcome.error


def test_a_raise_of_a_discard_on_class_fails_at_once_naming_the_rule():
    policy = {**POLICY, "discard_on": ["builtins.ValueError"]}

    outcome = outcomes.raised(claimed(attempt=1, max_attempts=5, policy=policy), boom())

    assert (outcome.label, outcome.state, outcome.delay) == ("failure", "failed", None)
    assert outcome.error["rule"] == "discard_on"


def test_a_raise_outside_retry_on_fails_at_once_naming_the_rule():
    policy = {**POLICY, "retry_on": ["builtins.KeyError"]}

    outcome = outcomes.raised(claimed(attempt=1, max_attempts=5, policy=policy), boom())

    assert outcome.state == "failed"
    assert outcome.error["rule"] == "retry_on"


def test_a_raise_listed_in_retry_on_retries():
    policy = {**POLICY, "retry_on": ["builtins.ValueError"]}

    outcome = outcomes.raised(claimed(attempt=1, max_attempts=5, policy=policy), boom())

    assert (outcome.state, outcome.delay) == ("pending", 10.0)


def test_an_invalid_stored_policy_falls_back_to_the_default_backoff(caplog, settings):
    settings.PGQUEUE = {**settings.PGQUEUE, "DEFAULT_BACKOFF": 7}
    task = claimed(attempt=1, max_attempts=5, policy={"base": -1})

    outcome = outcomes.raised(task, boom())

    assert (outcome.state, outcome.delay) == ("pending", 7.0)
    (record,) = [r for r in caplog.records if "retry policy" in r.getMessage()]
    assert record.getMessage() == (
        f"{task.log_prefix()}: the stored retry policy is invalid (backoff base and cap "
        "must be seconds between 0 and 315360000 (10 years), not base=-1.0, cap=600.0); "
        "using DEFAULT_BACKOFF"
    )


def test_an_explicit_retry_delay_replaces_the_backoff():
    outcome = outcomes.failed(claimed(), {"attempt": 1}, retry_delay=3.5)

    assert (outcome.state, outcome.delay) == ("pending", 3.5)


# -- timeouts, releases, expiry ----------------------------------------------------------


def test_a_timeout_retries_as_a_failure_labelled_timeout():
    outcome = outcomes.timed_out(claimed(attempt=1), "ran past 1s")

    assert (outcome.label, outcome.state, outcome.delay) == ("timeout", "pending", 10.0)
    assert outcome.error["type"] == "TimeoutError"
    assert outcome.error["message"] == "ran past 1s"
    assert outcome.error["traceback"] is None


def test_a_timeout_is_not_refused_by_retry_on_but_is_by_discard_on():
    retry_on = {**POLICY, "retry_on": ["builtins.KeyError"]}
    discard = {**POLICY, "discard_on": ["builtins.TimeoutError"]}

    assert outcomes.timed_out(claimed(policy=retry_on), "late").state == "pending"
    task = claimed(policy=discard)
    discarded = outcomes.timed_out(task, "late")
    assert discarded.task is task
    assert (discarded.label, discarded.state) == ("timeout", "failed")
    assert discarded.error["rule"] == "discard_on"
    assert discarded.error["outcome"] == "timeout"


def test_an_abandoned_handler_is_due_no_sooner_than_the_release_delay():
    quick = {"base": 0.1, "factor": 1.0, "cap": 0.1, "jitter": 0.0}
    slow = {"base": 60.0, "factor": 1.0, "cap": 60.0, "jitter": 0.0}

    assert outcomes.abandoned(claimed(policy=quick), "stuck").delay == outcomes.RELEASE_DELAY
    assert outcomes.abandoned(claimed(policy=slow), "stuck").delay == 60.0
    assert outcomes.abandoned(claimed(attempt=3, policy=slow), "stuck").state == "failed"


def test_a_release_hands_the_task_back_after_the_release_delay_without_a_refund():
    outcome = outcomes.released(claimed(attempt=2, max_attempts=3))

    assert (outcome.label, outcome.state, outcome.delay) == ("released", "pending", 1.0)
    assert not outcome.attempt_refund and outcome.error is None


def test_a_release_of_the_last_attempt_is_a_dead_letter_saying_why():
    outcome = outcomes.released(claimed(attempt=3, max_attempts=3))

    assert (outcome.label, outcome.state) == ("released", "failed")
    assert outcome.error["type"] == "WorkerShutdown"
    assert outcome.error["outcome"] == "released"


def test_a_lease_lapsed_before_the_start_is_pending_now_or_failed_on_the_last_attempt():
    task = claimed(attempt=2, max_attempts=3)
    again = outcomes.expired_before_start(task)
    last = outcomes.expired_before_start(claimed(attempt=3, max_attempts=3))

    assert again.task is task
    assert (again.label, again.state, again.delay) == ("lost", "pending", 0)
    assert (last.state, last.delay) == ("failed", None)
    assert again.error["type"] == last.error["type"] == "LeaseExpired"
    assert again.error["outcome"] == "lost"
    assert again.error["message"] == (
        "the lease expired while the task waited to start in this worker (the process "
        "stalled for longer than the lease); it was not run here"
    )


def test_a_payload_that_cannot_run_fails_at_once_with_attempts_left():
    task = claimed(attempt=1, max_attempts=5)
    outcome = outcomes.unrunnable(task, "BadPayload", "no")

    assert outcome.task is task
    assert outcome.state == "failed"
    assert (outcome.error["type"], outcome.error["message"]) == ("BadPayload", "no")


# -- snooze, continue, suspend, cancel -----------------------------------------------------


def test_a_snooze_refunds_the_attempt_and_records_no_error():
    task = claimed(attempt=3, max_attempts=3)
    outcome = outcomes.snoozed(task, 5.0)

    assert outcome.task is task

    assert (outcome.label, outcome.state, outcome.delay) == ("snoozed", "pending", 5.0)
    assert outcome.attempt_refund and outcome.error is None


def test_a_continue_resets_the_attempt_budget_and_saves_the_checkpoint():
    outcome = outcomes.continued(claimed(attempt=3), {"done": 4}, True)

    assert (outcome.label, outcome.state, outcome.delay) == ("continued", "pending", 0)
    assert outcome.attempt_reset and outcome.save_checkpoint
    assert outcome.checkpoint == {"done": 4}


def test_a_suspension_waits_with_the_attempt_refunded():
    task = claimed()
    outcome = outcomes.suspended(task, "signal", "go", 30.0, {"at": 1}, True)

    assert outcome.task is task
    assert (outcome.label, outcome.state) == ("suspended", "waiting")
    assert outcome.attempt_refund and outcome.save_checkpoint
    assert outcome.checkpoint == {"at": 1}
    assert (outcome.wait_reason, outcome.wait_signal, outcome.wait_seconds) == (
        "signal", "go", 30.0,
    )  # fmt: skip


def test_a_hard_cancel_is_cancelled_saying_the_process_was_killed():
    task = claimed()
    outcome = outcomes.killed_on_cancel(task)

    assert outcome.task is task
    assert (outcome.label, outcome.state) == ("cancelled", "cancelled")
    assert outcome.error == {
        "attempt": 1, "type": "Cancelled",
        "message": "cancelled with hard=True: the handler's process was killed",
        "traceback": None, "outcome": "cancelled",
    }  # fmt: skip


def test_a_cancel_is_cancelled_with_the_error_it_is_given():
    task = claimed()
    outcome = outcomes.cancelled(task, {"attempt": 1, "type": "Cancelled"})

    assert outcome.task is task
    assert outcome.error == {"attempt": 1, "type": "Cancelled", "outcome": "cancelled"}


# -- error text ---------------------------------------------------------------------------


def test_error_text_is_stored_without_nul_or_lone_surrogates_and_capped():
    assert outcomes.clean_text("a\x00b", 100) == "a\\x00b"
    assert outcomes.clean_text("a\ud800b", 100) == "a\\ud800b"
    assert outcomes.clean_text("x" * 12, 10) == "x" * 10 + "... [2 characters cut]"
    assert outcomes.clean_text("x" * 10, 10) == "x" * 10


class CustomError(Exception):
    pass


def test_an_error_names_the_exception_by_module_and_qualname_and_keeps_its_traceback():
    task = claimed()
    try:
        raise CustomError("custom")
    except CustomError as exc:
        raised = exc

    error = outcomes.error_entry(task, raised)

    assert task.raised is raised  # for the log record of the settlement, never the row
    assert error["type"] == "tests.test_outcome_policy.CustomError"
    assert error["traceback"] == "".join(traceback.format_exception(raised))
    long = outcomes.error_entry(task, raised, kind="K" * 600)["type"]
    assert long == "K" * 500 + "... [100 characters cut]"
    assert outcomes.plain_error(task, "K" * 600, "m")["type"] == long


def test_an_exception_whose_str_raises_still_gives_an_error():
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    error = outcomes.error_entry(claimed(), Unprintable())

    assert error["message"] == "<str() of the exception raised RuntimeError>"
    assert error["type"].endswith("Unprintable")


# -- the retry policy -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "delays"),
    [(RetryPolicy(base=5, factor=2, cap=600, jitter=0), [5, 10, 20, 40]),
     (RetryPolicy(base=5, factor=2, cap=15, jitter=0), [5, 10, 15, 15]),
     (RetryPolicy(base=5, factor=1, cap=600, jitter=0), [5, 5, 5, 5]),
     (RetryPolicy(base=0, factor=2, cap=600, jitter=0), [0, 0, 0, 0])],
)  # fmt: skip
def test_the_backoff_grows_by_its_factor_from_the_first_attempt_up_to_its_cap(policy, delays):
    assert [policy.delay(n) for n in (1, 2, 3, 4)] == delays


def test_the_backoff_of_an_attempt_before_the_first_is_the_base():
    assert RetryPolicy(base=5, factor=2, cap=600, jitter=0).delay(0) == 5


def test_a_backoff_past_what_a_float_holds_is_the_cap():
    assert RetryPolicy(base=1, factor=10, cap=600, jitter=0).delay(10_000) == 600
    assert RetryPolicy(base=0, factor=10, cap=600, jitter=0).delay(10_000) == 0


def test_jitter_spreads_the_delay_both_ways_within_its_fraction():
    policy = RetryPolicy(base=100, factor=1, cap=100, jitter=0.25)
    delays = [policy.delay(1, random.Random(seed)) for seed in range(200)]

    assert all(75 <= d <= 125 for d in delays)
    assert min(delays) < 85 and max(delays) > 115
    assert policy.delay(1, random.Random(5)) == policy.delay(1, random.Random(5))  # its rng


def test_a_backoff_field_past_what_a_float_holds_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^backoff cap an int of 1329 bits is too large$"):
        RetryPolicy.from_value({"cap": 10**400})
    with pytest.raises(ValueError, match=r"^backoff an int of 1329 bits is too large$"):
        RetryPolicy.from_value(10**400)


def test_a_backoff_out_of_range_is_refused_saying_what_is_allowed():
    with pytest.raises(ValueError) as caught:
        RetryPolicy(base=1, cap=-1)
    assert str(caught.value) == (
        "backoff base and cap must be seconds between 0 and 315360000 (10 years), "
        "not base=1, cap=-1"
    )
    with pytest.raises(ValueError) as caught:
        RetryPolicy(jitter=1.5)
    assert str(caught.value) == "backoff jitter must be between 0 and 1, not 1.5"
    with pytest.raises(TypeError) as caught:
        RetryPolicy.from_value("5s")
    assert str(caught.value) == (
        "backoff must be a RetryPolicy, a dict or a number of seconds, not '5s'"
    )
    with pytest.raises(ValueError) as caught:
        RetryPolicy.from_value({"base": 1, "spread": 2})
    assert str(caught.value) == (
        "unknown backoff option(s) ['spread']; valid: base, factor, cap, jitter"
    )


def test_a_backoff_at_the_ends_of_its_ranges_is_accepted():
    limit = 10 * 365 * 24 * 3600.0
    assert RetryPolicy(base=limit, cap=limit, jitter=1).delay(1, random.Random(1)) <= 2 * limit
    assert RetryPolicy(base=0, cap=0, jitter=0).delay(1) == 0


def test_a_number_is_a_constant_backoff_and_a_dict_names_the_fields():
    assert RetryPolicy.from_value(3) == RetryPolicy(base=3, factor=1, cap=3, jitter=0)
    assert RetryPolicy.from_value({"base": 1, "cap": 9}) == RetryPolicy(base=1, cap=9)
    policy = RetryPolicy(base=2)
    assert RetryPolicy.from_value(policy) is policy
    assert RetryPolicy(base=2).as_dict() == {
        "base": 2, "factor": 2.0, "cap": 600.0, "jitter": 0.25,
    }  # fmt: skip

