"""manage.py pgqueue_status, pgqueue_prune and pgqueue_requeue."""

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_pgqueue.models import Task
from tests.conftest import REPO
from tests.factories import TaskFactory

HOUR = 3600


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def ago(**kwargs):
    return timezone.now() - timedelta(**kwargs)


def dead(**kwargs) -> Task:
    defaults = {"state": "failed", "attempt": 3, "finished_at": ago(minutes=1)}
    return TaskFactory(**{**defaults, **kwargs})


@pytest.mark.django_db
def test_status_prints_a_row_per_queue_and_task_with_its_counts():
    TaskFactory.create_batch(2, run_at=ago(seconds=5))
    dead(queue="emails", task_name="tests.tasks.record")

    lines = run("pgqueue_status").splitlines()

    header = lines[0].split()
    assert header[:4] == ["queue", "task", "due", "unroutable"]
    rows = {tuple(line.split()[:2]): line.split() for line in lines[2:] if line.strip()}
    assert rows[("default", "tests.tasks.noop@1")][3] == "2"  # unroutable: no live worker
    assert rows[("emails", "tests.tasks.record@1")][7] == "1"  # dead


@pytest.mark.django_db
def test_status_json_is_the_overview_and_each_queues_capacity():
    dead()

    document = json.loads(run("pgqueue_status", "--json"))

    [row] = document["tasks"]
    assert (row["queue"], row["task_name"], row["failed"]) == ("default", "tests.tasks.noop", 1)
    [queue] = document["queues"]
    assert (queue["queue"], queue["workers"], queue["slots"]) == ("default", 0, 0)
    assert "generated_at" in document


@pytest.mark.django_db
def test_status_watch_refuses_a_non_positive_interval():
    with pytest.raises(CommandError, match="positive"):
        run("pgqueue_status", "--watch", "0")


@pytest.mark.django_db(transaction=True)
def test_status_watch_redraws_in_place_until_interrupted(db_url):
    dead()
    env = {**os.environ, "DATABASE_URL": db_url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "manage.py"), "pgqueue_status", "--watch", "0.2"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    output = b""
    deadline = time.monotonic() + 30
    try:
        while output.count(b"\x1b[H\x1b[2J") < 3 and time.monotonic() < deadline:
            output += os.read(proc.stdout.fileno(), 65536)
        proc.send_signal(signal.SIGINT)
        # Read on while it exits: a redraw (or its last words) blocked on a full pipe
        # would otherwise never end.
        rest, _ = proc.communicate(timeout=10)
        output += rest
        code = proc.returncode
    finally:
        proc.kill()
        proc.stdout.close()

    assert output.count(b"\x1b[H\x1b[2J") >= 3
    assert b"tests.tasks.noop" in output and b"refreshing every 0.2s" in output
    assert code == 0


@pytest.mark.django_db
def test_prune_dry_run_counts_per_state_and_deletes_nothing():
    TaskFactory(state="succeeded", finished_at=ago(days=2))
    TaskFactory(state="cancelled", finished_at=ago(days=2))
    dead(finished_at=ago(days=2))  # within DEAD_TTL (7 days)

    output = run("pgqueue_prune", "--dry-run")

    assert "would delete 2 task(s): cancelled 1, failed 0, succeeded 1" in output
    assert Task.objects.count() == 3


@pytest.mark.django_db
def test_prune_deletes_what_expired_and_honours_ttl_options():
    TaskFactory(state="succeeded", finished_at=ago(hours=3))
    kept = TaskFactory(state="succeeded", finished_at=ago(minutes=30))

    output = run("pgqueue_prune", "--result-ttl", str(HOUR), "--batch", "1")

    assert output.startswith("deleted 1 task(s)")
    assert list(Task.objects.values_list("pk", flat=True)) == [kept.pk]


@pytest.mark.django_db
def test_requeue_takes_dead_letters_of_one_task_name():
    wanted = dead(task_name="tests.tasks.record")
    other = dead(task_name="tests.tasks.noop")

    output = run("pgqueue_requeue", "--task", "tests.tasks.record")

    wanted.refresh_from_db()
    other.refresh_from_db()
    assert output == f"requeued 1 dead letter(s): {wanted.pk}\n"
    assert (wanted.state, wanted.attempt) == ("pending", 0)
    assert other.state == "failed"


@pytest.mark.django_db
def test_requeue_since_takes_only_tasks_that_died_since_then():
    recent = dead(finished_at=ago(minutes=10))
    old = dead(finished_at=ago(hours=5))

    run("pgqueue_requeue", "--since", "1h")

    assert set(Task.objects.filter(state="pending").values_list("pk", flat=True)) == {recent.pk}
    old.refresh_from_db()
    assert old.state == "failed"


@pytest.mark.django_db
def test_requeue_since_accepts_an_iso_date_time():
    recent = dead(finished_at=ago(minutes=10))
    dead(finished_at=ago(days=3))
    since = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")

    output = run("pgqueue_requeue", "--since", since)

    assert output == f"requeued 1 dead letter(s): {recent.pk}\n"


@pytest.mark.django_db
def test_requeue_dry_run_changes_nothing():
    died = dead()

    output = run("pgqueue_requeue", "--all", "--dry-run")

    died.refresh_from_db()
    assert output == f"would requeue 1 dead letter(s): {died.pk}\n"
    assert died.state == "failed"


@pytest.mark.django_db
def test_requeue_without_a_filter_or_all_refuses():
    dead()

    with pytest.raises(CommandError, match="--all"):
        run("pgqueue_requeue")
    assert Task.objects.get().state == "failed"


@pytest.mark.django_db
def test_requeue_rejects_a_since_it_cannot_read():
    with pytest.raises(CommandError, match="30m, 2h, 1d"):
        run("pgqueue_requeue", "--since", "yesterday")
