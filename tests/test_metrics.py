"""Prometheus metrics: the queue gauges (web process) and a worker's own /metrics."""

import re
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from django_pgqueue.models import Task, Worker
from django_pgqueue.ops.metrics import DoctorCollector, QueueCollector
from django_pgqueue.worker.metrics_server import WorkerMetrics
from tests import prefork_tasks, tasks
from tests.conftest import REPO, wait_until
from tests.factories import TaskFactory
from tests.testapp.models import Run


def samples(text: str) -> dict[tuple, float]:
    """{(name, (label, value), ...): value} for every sample of an exposition."""
    return {
        (s.name, *sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape_collector(collector: QueueCollector) -> dict[tuple, float]:
    registry = CollectorRegistry()
    registry.register(collector)
    return samples(generate_latest(registry).decode())


def ago(**kwargs):
    return timezone.now() - timedelta(**kwargs)


def seed_queue() -> None:
    Worker.objects.create(
        id="w1",
        hostname="h",
        pid=1,
        concurrency=6,
        queues=["default", "emails"],
        routes=[["tests.tasks.noop", 1]],
    )
    TaskFactory.create_batch(3, run_at=ago(minutes=2))
    TaskFactory(task_name="billing.charge", run_at=ago(seconds=30))
    TaskFactory(run_at=timezone.now() + timedelta(hours=1))
    TaskFactory(state="running", attempt=1, lease_token=uuid.uuid4(), lease_expires_at=ago())
    TaskFactory.create_batch(2, state="failed", queue="emails", finished_at=ago(hours=1))


NOOP = (("queue", "default"), ("task_name", "tests.tasks.noop"))


@pytest.mark.django_db
def test_the_queue_collector_exposes_tasks_by_state_queue_and_task_name():
    seed_queue()

    values = scrape_collector(QueueCollector(ttl=0))

    assert values[("pgqueue_tasks_pending", *NOOP)] == 3
    assert values[("pgqueue_tasks_unroutable", *NOOP)] == 0
    assert values[("pgqueue_tasks_scheduled", *NOOP)] == 1
    assert values[("pgqueue_tasks_running", *NOOP)] == 1
    billing = (("queue", "default"), ("task_name", "billing.charge"))
    assert values[("pgqueue_tasks_pending", *billing)] == 1
    assert values[("pgqueue_tasks_unroutable", *billing)] == 1
    emails = (("queue", "emails"), ("task_name", "tests.tasks.noop"))
    assert values[("pgqueue_tasks_failed", *emails)] == 2
    assert values[("pgqueue_queue_metrics_up",)] == 1


@pytest.mark.django_db
def test_the_queue_collector_exposes_oldest_due_age_and_slots_by_queue():
    seed_queue()

    values = scrape_collector(QueueCollector(ttl=0))

    assert 110 <= values[("pgqueue_queue_oldest_due_seconds", ("queue", "default"))] < 180
    assert values[("pgqueue_queue_oldest_due_seconds", ("queue", "emails"))] == 0
    assert values[("pgqueue_queue_slots", ("queue", "default"))] == 6
    assert values[("pgqueue_queue_workers", ("queue", "emails"))] == 1


@pytest.mark.django_db
def test_the_queue_collector_exposes_the_age_of_the_oldest_running_attempt_by_queue():
    # Given two attempts running in "default", claimed 90 s and 20 s ago, none in "emails"
    seed_queue()
    for seconds in (90, 20):
        TaskFactory(
            state="running",
            attempt=1,
            lease_token=uuid.uuid4(),
            lease_expires_at=timezone.now() + timedelta(seconds=30),
            last_attempted_at=ago(seconds=seconds),
        )

    values = scrape_collector(QueueCollector(ttl=0))

    # The database's now() is the test transaction's start, a moment before ago().
    assert 85 <= values[("pgqueue_queue_oldest_running_seconds", ("queue", "default"))] < 150
    assert values[("pgqueue_queue_oldest_running_seconds", ("queue", "emails"))] == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_task_running_for_seconds_shows_that_age_since_its_claim(start_worker):
    # Given a task that was due an hour ago, claimed by a worker and running for 2 s
    task_id = tasks.sleep_and_record.enqueue(30)
    Task.objects.filter(pk=task_id).update(run_at=ago(hours=1))
    start_worker("--shutdown-grace", "0.5")
    wait_until(lambda: Run.objects.filter(task_id=task_id).exists())
    time.sleep(2)

    values = scrape_collector(QueueCollector(ttl=0))

    # Its age is the attempt's run time, not its wait in the queue.
    assert 2 <= values[("pgqueue_queue_oldest_running_seconds", ("queue", "default"))] < 30


@pytest.mark.django_db
def test_a_scrape_within_the_cache_window_does_not_read_the_database():
    seed_queue()
    registry = CollectorRegistry()
    registry.register(QueueCollector(ttl=60))
    generate_latest(registry)
    TaskFactory.create_batch(5, run_at=ago(minutes=1))

    with CaptureQueriesContext(connection) as queries:
        values = samples(generate_latest(registry).decode())

    assert len(queries) == 0
    assert values[("pgqueue_tasks_pending", *NOOP)] == 3  # the cached read


@pytest.mark.django_db
def test_a_failed_read_reports_down_instead_of_failing_the_scrape(settings):
    settings.PGQUEUE = {**settings.PGQUEUE, "DATABASE": "no-such-alias"}

    values = scrape_collector(QueueCollector(ttl=0))

    assert values == {("pgqueue_queue_metrics_up",): 0}


@pytest.mark.django_db
def test_the_web_process_serves_the_queue_gauges_through_django_prometheus(settings):
    from django_prometheus.exports import ExportToDjangoView

    settings.PGQUEUE = {**settings.PGQUEUE, "METRICS_CACHE_SECONDS": 0}
    seed_queue()

    response = ExportToDjangoView(RequestFactory().get("/metrics"))

    values = samples(response.content.decode())
    assert values[("pgqueue_tasks_pending", *NOOP)] == 3
    assert values[("pgqueue_queue_metrics_up",)] == 1


def metric_names() -> set[str]:
    registry = CollectorRegistry()
    WorkerMetrics(registry)
    names = {family.name for family in registry.collect()}
    names |= {family.name for family in DoctorCollector().describe()}
    return names | {family.name for family in QueueCollector().describe()}


def test_every_metric_is_in_the_metrics_reference():
    reference = (REPO / "docs" / "metrics.md").read_text()

    missing = sorted(n for n in metric_names() if f"`{n}" not in reference)

    assert not missing, f"not documented in docs/metrics.md: {missing}"


def test_the_alert_rules_use_only_metrics_that_exist():
    text = (REPO / "docs" / "prometheus-alerts.yml").read_text()
    # Comments and the annotations' words (which may name a command) are not rules.
    words = ("#", "summary:", "description:")
    rules = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(words))
    exposed = {f"{name}{suffix}" for name in metric_names() for suffix in ("", "_total", "_bucket")}

    used = set(re.findall(r"\bpgqueue_[a-z_]+", rules))

    assert used and used <= exposed, sorted(used - exposed)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_the_alert_rules_pass_their_promtool_unit_tests():
    result = subprocess.run(
        ["promtool", "test", "rules", "prometheus-alerts.test.yml"],
        cwd=REPO / "docs",
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stdout + result.stderr


# -- a worker's own /metrics ----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return samples(response.read().decode())


@pytest.mark.django_db(transaction=True)
def test_a_worker_serves_outcomes_histograms_slots_and_lease_renewals(start_worker):
    port = free_port()
    ok = tasks.noop.enqueue_many(range(4))
    broken = tasks.fail_always.enqueue()
    slow = tasks.sleep_and_record.enqueue(0.6)
    start_worker("--metrics-port", str(port), "--concurrency", "3", "--heartbeat", "0.1")

    wait_until(
        lambda: (
            Task.objects.filter(pk__in=[*ok, broken, slow])
            .exclude(state__in=["pending", "running"])
            .count()
            == 6
        ),
        message="every task to finish",
    )
    values = wait_until(
        lambda: (
            (v := scrape(port)).get(("pgqueue_task_outcomes_total", ("outcome", "success"))) == 5
            and v
        ),
        message="the settled outcomes to be counted",
    )

    assert values[("pgqueue_task_outcomes_total", ("outcome", "failure"))] == 3
    assert values[("pgqueue_tasks_claimed_total",)] == 8
    assert values[("pgqueue_worker_slots",)] == 3
    assert values[("pgqueue_lease_renewals_total",)] >= 1
    noop = (("queue", "default"), ("task_name", "tests.tasks.noop"))
    assert values[("pgqueue_task_runtime_seconds_count", *noop)] == 4
    assert values[("pgqueue_task_queue_wait_seconds_count", *noop)] == 4
    slow_labels = (("queue", "default"), ("task_name", "tests.tasks.sleep_and_record"))
    assert values[("pgqueue_task_runtime_seconds_sum", *slow_labels)] >= 0.6
    assert not any(key[0].startswith("pgqueue_tasks_pending") for key in values)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_counts_a_lease_it_lost(start_worker, pg):
    port = free_port()
    task_id = tasks.sleep_and_record.enqueue(1.5)
    start_worker("--metrics-port", str(port), "--heartbeat", "0.1")
    wait_until(lambda: Task.objects.filter(pk=task_id, state="running").exists())

    # Another party takes the task over (as the lease sweep and a new claim would).
    pg.execute("UPDATE pgqueue_task SET lease_token = gen_random_uuid() WHERE id = %s", [task_id])

    values = wait_until(
        lambda: (
            (v := scrape(port)).get(("pgqueue_task_outcomes_total", ("outcome", "lost"))) == 1 and v
        ),
        message="the lost outcome to be counted",
    )
    assert values[("pgqueue_leases_lost_total",)] >= 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_process_mode_worker_counts_the_handler_processes_it_killed_and_those_that_died(
    start_worker,
):
    # given: a worker running handlers in processes, serving its /metrics
    port = free_port()
    start_worker("--execution", "process", "--concurrency", "2", "--metrics-port", str(port))

    # when: one handler overruns its timeout (killed) and one ends its own process (died)
    overrun = tasks.sleep_and_record.using(timeout=0.5, max_attempts=1).enqueue(30)
    crash = prefork_tasks.exit_process.enqueue(3)
    wait_until(
        lambda: Task.objects.filter(pk__in=[overrun, crash], state="failed").count() == 2,
        message="both attempts to fail",
    )

    # then: each is counted once, under its own counter
    values = wait_until(
        lambda: (
            (v := scrape(port)).get(("pgqueue_handler_processes_killed_total",)) == 1
            and v.get(("pgqueue_handler_processes_died_total",)) == 1
            and v
        ),
        message="the killed and the dead process to be counted",
    )
    assert values[("pgqueue_task_outcomes_total", ("outcome", "timeout"))] == 1
