"""The ledger checker's rules (tests/ledger.py), on hand-written ledgers and rows.

The crash and chaos tests trust this checker to find lost tasks, rolled-back tasks that
ran, and overlapping runs; these tests show it does, and what it excuses.
"""

from __future__ import annotations

from typing import Any

from tests.ledger import TaskRow, check

TOKEN_A = "aaaaaaaa-0000-0000-0000-000000000000"
TOKEN_B = "bbbbbbbb-0000-0000-0000-000000000000"


def run(task: int, attempt: int, token: str, pid: int, start: float,
        end: float | None) -> list[dict[str, Any]]:
    common = {"task": task, "attempt": attempt, "token": token, "pid": pid}
    events = [{"event": "start", **common, "t": start}]
    if end is not None:
        events.append({"event": "end", **common, "t": end})
    return events


def row(task: int = 1, state: str = "succeeded", attempt: int = 2,
        errors: list | None = None, executions: list | None = None) -> TaskRow:
    return TaskRow(task, state, attempt, errors or [], executions or [])


def lost(attempt: int, token: str) -> dict[str, Any]:
    return {"attempt": attempt, "token": token, "outcome": "lost", "source": "sweep"}


def lease_expired(attempt: int, pid: int) -> dict[str, Any]:
    return {"attempt": attempt, "type": "LeaseExpired", "worker_id": f"host-a-{pid}-abc123"}


def test_two_runs_that_overlap_without_a_recovered_lease_are_a_violation():
    events = run(1, 1, TOKEN_A, 10, 0.0, 4.0) + run(1, 1, TOKEN_B, 20, 3.0, 7.0)

    report = check(events, [row(attempt=1)], committed=[1])

    assert len(report.overlaps) == 1
    assert (report.overlaps[0].earlier.token, report.overlaps[0].later.token) == (TOKEN_A, TOKEN_B)
    assert "(c) 1 unjustified overlaps" in report.describe()
    assert "token aaaaaaaa, pid 10" in report.describe()


def test_an_overlap_after_the_earlier_runs_lease_was_recovered_is_justified():
    events = run(1, 1, TOKEN_A, 10, 0.0, 4.0) + run(1, 2, TOKEN_B, 20, 3.0, 7.0)
    history = [lost(1, TOKEN_A), {"attempt": 2, "token": TOKEN_B, "outcome": "success"}]

    report = check(events, [row(executions=history)], committed=[1])

    assert report.violations == 0
    assert report.justified_overlaps == 1


def test_an_old_claim_started_after_the_new_one_is_justified_by_its_own_recovered_lease():
    # The first claim's process stalled before starting it; its lease was recovered and
    # the second attempt began; then the stalled process woke and started the first.
    events = run(1, 2, TOKEN_B, 20, 3.0, 7.0) + run(1, 1, TOKEN_A, 10, 4.0, 5.0)
    history = [lost(1, TOKEN_A), {"attempt": 2, "token": TOKEN_B, "outcome": "success"}]

    report = check(events, [row(executions=history)], committed=[1])

    assert report.violations == 0
    assert report.justified_overlaps == 1


def test_a_recovery_of_another_lease_does_not_justify_an_overlap():
    # The same attempt, claimed twice (the first claim forgotten by a crash); only the
    # second claim's lease was ever recovered.
    token_c = "cccccccc-0000-0000-0000-000000000000"
    events = (run(1, 1, TOKEN_A, 10, 0.0, 4.0) + run(1, 1, TOKEN_B, 20, 3.0, 9.0)
              + run(1, 2, token_c, 30, 8.0, 9.5))
    history = [lost(1, TOKEN_B), {"attempt": 2, "token": token_c, "outcome": "success"}]

    report = check(events, [row(executions=history)], committed=[1])

    assert [(o.earlier.token, o.later.token) for o in report.overlaps] == [(TOKEN_A, TOKEN_B)]
    assert report.justified_overlaps == 1


def test_without_executions_a_lease_expired_error_of_the_runs_attempt_and_pid_justifies():
    events = run(1, 1, TOKEN_A, 10, 0.0, 4.0) + run(1, 2, TOKEN_B, 20, 3.0, 7.0)

    justified = check(events, [row(errors=[lease_expired(1, 10)])], committed=[1])
    other_worker = check(events, [row(errors=[lease_expired(1, 99)])], committed=[1])

    assert (justified.violations, justified.justified_overlaps) == (0, 1)
    assert len(other_worker.overlaps) == 1


def test_a_run_cut_short_by_its_process_kill_ends_when_the_process_died():
    killed = {"event": "exit", "pid": 10, "t": 1.0}
    events = [*run(1, 1, TOKEN_A, 10, 0.0, None), killed, *run(1, 2, TOKEN_B, 20, 3.5, 4.0)]

    report = check(events, [row()], committed=[1])

    assert report.violations == 0
    assert report.justified_overlaps == 0


def test_a_run_without_an_end_or_a_known_death_overlaps_every_later_run():
    events = run(1, 1, TOKEN_A, 10, 0.0, None) + run(1, 2, TOKEN_B, 20, 300.0, 301.0)

    report = check(events, [row()], committed=[1])

    assert len(report.overlaps) == 1
    assert "(no end, process not known dead)" in report.describe()


def test_a_committed_task_that_did_not_succeed_or_whose_final_run_never_finished_is_reported():
    events = run(1, 1, TOKEN_A, 10, 0.0, 1.0) + run(2, 1, TOKEN_B, 10, 0.0, None)

    report = check(events, [row(1, "failed", 1), row(2, "succeeded", 1)], committed=[1, 2, 3])

    assert report.not_done == [(1, "failed"), (3, "missing")]
    assert report.unfinished == [2]


def test_a_task_enqueued_in_a_rolled_back_transaction_must_neither_exist_nor_run():
    events = run(1, 1, TOKEN_A, 10, 0.0, 1.0) + run(7, 1, TOKEN_B, 10, 0.0, 1.0)

    report = check(events, [row(1, attempt=1), row(8, "pending", 0)], committed=[1],
                   rolled_back=[7, 8, 9])

    assert report.rolled_back_ran == [7]
    assert report.rolled_back_exists == [8]
    assert report.unknown == []
    assert report.violations == 2


def test_one_lease_run_twice_at_once_is_never_justified():
    events = run(1, 1, TOKEN_A, 10, 0.0, 2.0) + run(1, 1, TOKEN_A, 10, 1.0, 3.0)

    report = check(events, [row(attempt=1, executions=[lost(1, TOKEN_A)])], committed=[1])

    assert len(report.overlaps) == 1
    assert report.justified_overlaps == 0


def test_a_success_recorded_for_a_run_that_never_finished_is_reported():
    # Attempt 1 was claimed twice; the run that finished is not the one the row says
    # succeeded.
    events = run(1, 1, TOKEN_A, 10, 0.0, 1.0) + run(1, 1, TOKEN_B, 20, 5.0, None)
    settled = {"attempt": 1, "token": TOKEN_B, "outcome": "success", "state": "succeeded"}

    report = check(events, [row(attempt=1, executions=[settled])], committed=[1])

    assert report.unfinished == [1]
