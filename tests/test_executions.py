"""Every execution is recorded: on the row (executions), in log lines, on the admin page."""

import logging

import pytest
from django.urls import reverse

from django_pgqueue.models import Task
from django_pgqueue.worker.execution import execute
from django_pgqueue.worker.inflight import InFlight
from django_pgqueue.worker.outcomes import SUCCESS, Outcome, failed, plain_error
from django_pgqueue.worker.settler import Settler
from django_pgqueue.worker.stats import WorkerStats
from tests import tasks
from tests.conftest import wait_until
from tests.sqlhelpers import claim, expire_lease, row, sweep

pytestmark = pytest.mark.django_db(transaction=True)


def settle_with_worker(*outcomes: Outcome, worker_id: str = "w-a") -> WorkerStats:
    stats, inflight = WorkerStats(), InFlight()
    inflight.add(o.task for o in outcomes)
    settler = Settler("default", inflight, stats, worker_id)
    settler.start()
    for outcome in outcomes:
        settler.put(outcome)
    settler.stop(timeout=10)
    return stats


def test_each_settled_run_appends_an_entry_with_its_attempt_token_worker_and_outcome(pg):
    task_id = tasks.noop.enqueue(1)
    (first,) = claim(pg, worker_id="w-a")
    settle_with_worker(failed(first, plain_error(first, "ValueError", "no")))
    pg.execute("UPDATE pgqueue_task SET run_at = now() WHERE id = %s", [task_id])
    (second,) = claim(pg, worker_id="w-b")
    settle_with_worker(Outcome(second, SUCCESS, "succeeded", result=1), worker_id="w-b")

    history = row(pg, task_id)["executions"]

    assert [(e["attempt"], e["outcome"], e["state"], e["source"]) for e in history] == [
        (1, "failure", "scheduled", "settle"),
        (2, "success", "succeeded", "settle"),
    ]
    assert [e["token"] for e in history] == [first.lease_token, second.lease_token]
    assert [e["worker"] for e in history] == ["w-a", "w-b"]
    assert all(e["started"] and e["ended"] for e in history)


def test_a_run_whose_lease_was_recovered_is_recorded_as_lost_by_the_sweep(pg):
    task_id = tasks.noop.enqueue(1)
    (mine,) = claim(pg, worker_id="w-a")
    expire_lease(pg, task_id)

    sweep(pg)

    (entry,) = row(pg, task_id)["executions"]
    assert (entry["attempt"], entry["token"], entry["outcome"], entry["source"]) == (
        1,
        mine.lease_token,
        "lost",
        "sweep",
    )
    assert entry["ended"] is None


def test_a_late_outcome_is_refused_but_its_run_is_kept_in_the_history(pg):
    task_id = tasks.noop.enqueue(1)
    (stale,) = claim(pg, worker_id="w-a")
    expire_lease(pg, task_id)
    sweep(pg)
    (current,) = claim(pg, worker_id="w-b")

    stats = settle_with_worker(Outcome(stale, SUCCESS, "succeeded", result="late"))

    stored = row(pg, task_id)
    assert stats.get("lost") == 1
    assert (stored["state"], str(stored["lease_token"])) == ("running", current.lease_token)
    assert stored["result"] is None
    assert [(e["attempt"], e["source"]) for e in stored["executions"]] == [
        (1, "sweep"),
        (1, "late"),
    ]
    assert stored["executions"][1]["outcome"] == "success"


def test_a_settle_replayed_after_it_committed_counts_as_written_not_lost(pg):
    task_id = tasks.noop.enqueue(1)
    (mine,) = claim(pg, worker_id="w-a")
    outcome = Outcome(mine, SUCCESS, "succeeded", result=1)
    settle_with_worker(outcome)  # the first write: its reply "was lost"

    stats = settle_with_worker(Outcome(mine, SUCCESS, "succeeded", result=1))

    assert (stats.get(SUCCESS), stats.get("lost")) == (1, 0)
    assert len(row(pg, task_id)["executions"]) == 1


def test_log_lines_emitted_by_a_handler_name_its_execution(pg, caplog):
    tasks.logs_a_line.enqueue()
    (mine,) = claim(pg, worker_id="w-a")
    handler = logging.getLogger("tests.tasks")
    from django_pgqueue.worker.logging import ExecutionFilter

    log_filter = ExecutionFilter()
    handler.addFilter(log_filter)
    try:
        with caplog.at_level(logging.INFO, logger="tests.tasks"):
            execute(mine, "default", None)
    finally:
        handler.removeFilter(log_filter)

    (record,) = [r for r in caplog.records if r.name == "tests.tasks"]
    assert record.pgqueue_execution == (
        f"task {mine.id} attempt 1 lease {mine.lease_token[:8]}"
    )


def test_the_admin_detail_page_lists_every_execution(start_worker, admin_client):
    task_id = tasks.fail_until.enqueue(2)
    start_worker()
    wait_until(lambda: Task.objects.filter(pk=task_id, state="succeeded").exists())

    html = admin_client.get(reverse("admin:django_pgqueue_task_change", args=[task_id])).content
    html = html.decode()

    assert "Executions (every run)" in html
    assert html.count("<td>settlement</td>") == 2
    token = Task.objects.get(pk=task_id).executions[1]["token"]
    assert f"<code>{token[:8]}</code>" in html
