"""Pauses and limits where an operator sees and steers them: ``manage.py pgqueue_queue``,
the admin's queue overview (what is throttled, the Pause / Resume buttons and their
permission), ``pgqueue_status`` and the queue gauges.

Limits come from tests/settings.py: "limited" (concurrency 3), "rated" (10/s, so a
burst of 1 and one start per 0.1 s) and "limited_rated" (concurrency 2, 20/s).
"""

import json
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import pause, resume
from django_pgqueue.models import Queue, Task, Worker
from django_pgqueue.ops.metrics import QueueCollector
from django_pgqueue.ops.overview import build_overview
from tests import tasks
from tests.conftest import PLAIN_CLAIM_ENV, wait_until
from tests.factories import TaskFactory
from tests.test_metrics import scrape_collector
from tests.testapp.models import Run

OVERVIEW = reverse("admin:django_pgqueue_queueoverview_changelist")
PAUSE = reverse("admin:django_pgqueue_queueoverview_pause")
NOOP = "tests.tasks.noop"


def ago(**kwargs):
    return timezone.now() - timedelta(**kwargs)


def due(**kwargs) -> Task:
    # The test transaction's now() is its start; "now" by the Python clock is later.
    return TaskFactory(**{"run_at": ago(seconds=5), **kwargs})


def running(**kwargs) -> Task:
    defaults = {
        "state": "running",
        "attempt": 1,
        "lease_token": uuid.uuid4(),
        "lease_expires_at": timezone.now() + timedelta(seconds=30),
        "last_attempted_at": ago(seconds=1),
    }
    return TaskFactory(**{**defaults, **kwargs})


def live_worker(*queues: str, routes=((NOOP, 1), ("tests.tasks.record", 1))) -> Worker:
    return Worker.objects.create(
        id=f"w-{'-'.join(queues)}",
        hostname="h",
        pid=1,
        concurrency=8,
        queues=list(queues),
        routes=[list(r) for r in routes],
    )


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def queue_row(name: str) -> Queue:
    # Not every column: last_escape_at may be -infinity, which datetime cannot hold.
    return Queue.objects.only("paused", "paused_tasks", "paused_at").get(pk=name)


def spent_rate_budget(queue: str, rate_tat) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_queue (name, rate_tat) VALUES (%s, %s)", [queue, rate_tat]
        )


def groups() -> dict:
    return {group.name: group for group in build_overview()["queues"]}


def task_row(group, task_name: str = NOOP) -> dict:
    [row] = [r for r in group.rows if r["task_name"] == task_name]
    return row


def row_html(html: str, marker: str) -> str:
    return html.split(marker, 1)[1].split("</tr>", 1)[0]


@pytest.fixture
def staff_client(client, django_user_model):
    """A client logged in as a staff user holding exactly the given permissions."""

    def make(*codenames: str, client: Client = client):
        user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label="django_pgqueue", codename__in=codenames
            )
        )
        client.force_login(user)
        return client

    return make


# -- manage.py pgqueue_queue ----------------------------------------------------------


@pytest.mark.django_db
def test_the_command_pauses_a_queue_in_the_database():
    output = run("pgqueue_queue", "pause", "emails")

    row = queue_row("emails")
    assert (row.paused, row.paused_tasks) == (True, [])
    assert row.paused_at is not None
    assert output.startswith("paused queue emails: every worker's next claim skips it")


@pytest.mark.django_db
def test_the_command_pauses_one_task_name_and_leaves_the_queue_running():
    run("pgqueue_queue", "pause", "emails", "--task", NOOP)

    row = queue_row("emails")
    assert (row.paused, row.paused_tasks) == (False, [NOOP])


@pytest.mark.django_db
def test_resuming_a_queue_lifts_its_own_pause_and_names_the_task_names_still_paused():
    pause("emails")
    pause("emails", NOOP)

    output = run("pgqueue_queue", "resume", "emails")

    row = queue_row("emails")
    assert (row.paused, row.paused_tasks) == (False, [NOOP])
    assert output.splitlines() == [
        "resumed queue emails",
        f"task names still paused in queue emails: {NOOP}",
    ]


@pytest.mark.django_db
def test_resuming_a_task_name_clears_the_pause_entirely():
    pause("emails", NOOP)

    output = run("pgqueue_queue", "resume", "emails", "--task", NOOP)

    row = queue_row("emails")
    assert (row.paused, row.paused_tasks, row.paused_at) == (False, [], None)
    assert output == f"resumed task {NOOP} in queue emails\n"


@pytest.mark.django_db
def test_resuming_a_queue_that_was_not_paused_says_so():
    assert run("pgqueue_queue", "resume", "default") == "queue default was not paused\n"


@pytest.mark.django_db
def test_the_command_refuses_an_invalid_queue_name_and_pauses_nothing():
    with pytest.raises(CommandError, match="is not a valid queue name"):
        run("pgqueue_queue", "pause", "no such queue!")

    assert not Queue.objects.exists()


@pytest.mark.django_db
def test_pausing_a_queue_nothing_names_notes_it_and_pauses_it_anyway():
    err = StringIO()

    call_command("pgqueue_queue", "pause", "emials", stdout=StringIO(), stderr=err)

    assert "no worker has served queue 'emials'" in err.getvalue()
    assert queue_row("emials").paused


@pytest.mark.django_db
def test_the_command_requires_an_action():
    with pytest.raises(CommandError, match="pause,resume,list"):
        run("pgqueue_queue")


@pytest.mark.django_db
def test_list_shows_each_queue_with_its_pause_and_its_limits():
    pause("limited")
    pause("default", NOOP)

    rows = {r["queue"]: r for r in json.loads(run("pgqueue_queue", "list", "--json"))}

    assert rows["limited"]["paused"] is True
    assert rows["limited"]["limits"] == {"concurrency": 3, "rate": None}
    assert rows["rated"]["limits"] == {"concurrency": None, "rate": "10/s"}
    assert rows["limited_rated"]["limits"] == {"concurrency": 2, "rate": "20/s"}
    assert (rows["default"]["paused"], rows["default"]["paused_tasks"]) == (False, [NOOP])


@pytest.mark.django_db
def test_list_prints_a_table_of_the_queues():
    pause("default", NOOP)

    lines = run("pgqueue_queue", "list").splitlines()

    assert lines[0].split() == ["queue", "paused", "paused", "tasks", "since", "concurrency",
                                "rate"]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows["default"][1:3] == ["no", NOOP]
    assert rows["limited_rated"][1:] == ["no", "-", "-", "2", "20/s"]


# -- what the overview counts as throttled ---------------------------------------------


@pytest.mark.django_db
def test_a_paused_queue_holds_back_its_routable_due_tasks_but_not_its_unroutable_ones():
    live_worker("default")
    for _ in range(3):
        due()
    due(task_name="billing.charge")  # no worker registered it: unroutable
    pause("default")

    group = groups()["default"]

    assert (group.paused, group.held_by) == (True, ["paused"])
    assert group.totals["throttled"] == 3
    assert task_row(group)["throttled"] == 3
    assert task_row(group, "billing.charge")["throttled"] == 0


@pytest.mark.django_db
def test_a_paused_task_name_holds_back_only_its_own_tasks():
    live_worker("default")
    due()
    due(task_name="tests.tasks.record")
    pause("default", NOOP)

    group = groups()["default"]

    assert (group.paused, group.paused_tasks, group.held_by) == (False, [NOOP], [])
    assert (task_row(group)["paused"], task_row(group)["throttled"]) == (True, 1)
    assert task_row(group, "tests.tasks.record")["throttled"] == 0
    assert task_row(group)["held_by"] == ["task_paused"]


@pytest.mark.django_db
def test_a_paused_queue_with_nothing_due_is_still_shown():
    pause("emails")

    group = groups()["emails"]

    assert group.paused and group.rows == []


@pytest.mark.django_db
def test_a_queue_at_its_concurrency_limit_holds_back_its_due_tasks():
    live_worker("limited")
    for _ in range(3):
        running(queue="limited")
    due(queue="limited")
    due(queue="limited")

    group = groups()["limited"]

    assert group.held_by == ["concurrency"]
    assert group.totals["throttled"] == 2
    assert group.limits == {"concurrency": 3, "rate": None, "latency_objective": None}


@pytest.mark.django_db
def test_a_queue_below_its_concurrency_limit_throttles_nothing():
    live_worker("limited")
    running(queue="limited")
    running(queue="limited")
    due(queue="limited")

    group = groups()["limited"]

    assert (group.held_by, group.totals["throttled"]) == ([], 0)


@pytest.mark.django_db
def test_a_queue_out_of_rate_budget_holds_back_its_due_tasks():
    # Given a rate of 10/s (burst 1): the budget is spent while rate_tat > now().
    live_worker("rated")
    due(queue="rated")
    spent_rate_budget("rated", timezone.now() + timedelta(seconds=30))

    group = groups()["rated"]

    assert group.held_by == ["rate"]
    assert group.totals["throttled"] == 1


@pytest.mark.django_db
def test_a_queue_whose_rate_budget_has_come_back_throttles_nothing():
    live_worker("rated")
    due(queue="rated")
    spent_rate_budget("rated", ago(seconds=30))

    assert groups()["rated"].held_by == []


@pytest.mark.django_db
def test_the_oldest_unthrottled_age_leaves_out_paused_tasks():
    live_worker("default")
    due(run_at=ago(minutes=30))  # paused below
    due(task_name="tests.tasks.record", run_at=ago(minutes=2))
    pause("default", NOOP)

    totals = groups()["default"].totals

    assert totals["oldest_due_seconds"] > 1790
    assert 110 < totals["oldest_unthrottled_seconds"] < 300


# -- the admin's overview page ---------------------------------------------------------


@pytest.mark.django_db
def test_the_overview_shows_a_paused_queue_and_its_throttled_count(staff_client):
    live_worker("default")
    for _ in range(3):
        due()
    pause("default")

    html = staff_client("view_task").get(OVERVIEW).content.decode()

    queue = row_html(html, 'data-queue="default">')
    assert 'data-pause="queue"' in queue and "paused since" in queue
    assert '<td class="num" data-count="throttled">3</td>' in queue
    assert "held back: paused" in queue
    task = row_html(html, f'data-task="{NOOP}"')
    assert 'data-count="throttled" title="Held back: paused"><a' in task and ">3</a>" in task
    assert 'id="pgqueue-total-throttled">3<' in html


@pytest.mark.django_db
def test_the_overview_marks_a_paused_task_name(staff_client):
    live_worker("default")
    due()
    pause("default", NOOP)

    html = staff_client("view_task").get(OVERVIEW).content.decode()

    assert f"paused tasks: {NOOP}" in row_html(html, 'data-queue="default">')
    assert 'data-pause="task"' in row_html(html, f'data-task="{NOOP}"')


@pytest.mark.django_db
def test_the_overview_shows_a_queues_limits_with_its_running_count(staff_client):
    live_worker("limited_rated")
    running(queue="limited_rated")

    html = staff_client("view_task").get(OVERVIEW).content.decode()

    queue = row_html(html, 'data-queue="limited_rated">')
    assert "concurrency 2 (1 running)" in queue
    assert "rate 20/s" in queue


@pytest.mark.django_db
def test_an_operator_with_the_pause_permission_pauses_and_resumes_a_queue(staff_client):
    client = staff_client("view_task", "pause_queue")
    due()

    html = client.get(OVERVIEW).content.decode()
    paused = client.post(PAUSE, {"queue": "default", "action": "pause"}, follow=True)
    after_pause = queue_row("default").paused
    client.post(PAUSE, {"queue": "default", "action": "resume"})

    assert 'value="pause">Pause queue</button>' in row_html(html, 'data-queue="default">')
    assert after_pause is True
    assert 'value="resume">Resume queue</button>' in paused.content.decode()
    assert queue_row("default").paused is False
    log = [e.change_message for e in LogEntry.objects.order_by("pk")]
    assert log == ["Paused queue default.", "Resumed queue default."]


@pytest.mark.django_db
def test_a_task_rows_button_pauses_its_task_name_in_its_queue(admin_client):
    due()

    html = admin_client.get(OVERVIEW).content.decode()
    admin_client.post(PAUSE, {"queue": "default", "task_name": NOOP, "action": "pause"})

    assert 'value="pause">Pause task</button>' in row_html(html, f'data-task="{NOOP}"')
    row = queue_row("default")
    assert (row.paused, row.paused_tasks) == (False, [NOOP])


@pytest.mark.django_db
def test_without_the_pause_permission_there_are_no_buttons_and_a_post_is_refused(staff_client):
    client = staff_client("view_task", "change_task")
    due()

    html = client.get(OVERVIEW).content.decode()
    response = client.post(PAUSE, {"queue": "default", "action": "pause"})

    assert "Pause queue" not in html and 'class="pgqueue-pause"' not in html
    assert response.status_code == 403
    assert not Queue.objects.filter(paused=True).exists()


@pytest.mark.django_db
def test_a_pause_button_needs_the_csrf_token(staff_client):
    client = staff_client("view_task", "pause_queue", client=Client(enforce_csrf_checks=True))

    response = client.post(PAUSE, {"queue": "default", "action": "pause"})

    assert response.status_code == 403
    assert not Queue.objects.exists()


@pytest.mark.django_db
def test_a_pause_with_an_invalid_queue_name_is_refused_with_a_message(admin_client):
    response = admin_client.post(PAUSE, {"queue": "bad name!", "action": "pause"}, follow=True)

    [message] = [str(m) for m in response.context["messages"]]
    assert message.startswith("Not paused: queue 'bad name!' is not a valid queue name")
    assert not Queue.objects.exists()


# -- pgqueue_status and the queue gauges -----------------------------------------------


@pytest.mark.django_db
def test_status_json_gives_each_queue_its_pause_limits_and_throttled_count():
    live_worker("default", "limited")
    for _ in range(2):
        due()
    pause("default")
    pause("limited", NOOP)

    document = json.loads(run("pgqueue_status", "--json"))

    queues = {q["queue"]: q for q in document["queues"]}
    default, limited = queues["default"], queues["limited"]
    assert (default["paused"], default["paused_tasks"], default["throttled"]) == (True, [], 2)
    assert default["limits"] == {"concurrency": None, "rate": None, "latency_objective": None}
    assert default["held_by"] == ["paused"] and default["paused_at"]
    assert (limited["paused"], limited["paused_tasks"], limited["throttled"]) == (False, [NOOP], 0)
    assert limited["limits"] == {"concurrency": 3, "rate": None, "latency_objective": None}
    [row] = document["tasks"]
    assert (row["queue"], row["throttled"], row["held_by"]) == ("default", 2, ["paused"])


@pytest.mark.django_db
def test_status_prints_a_paused_queue_with_its_limits_and_what_holds_it_back():
    live_worker("limited")
    for _ in range(3):
        running(queue="limited")
    due(queue="limited")
    pause("limited", NOOP)

    lines = run("pgqueue_status").splitlines()

    [queue_line] = [line for line in lines if line.startswith("limited ") and "@" not in line]
    assert f"tasks {NOOP} since " in queue_line
    assert "concurrency 3 (3 running)" in queue_line
    assert "at its concurrency limit" in queue_line and queue_line.endswith(" 1")
    [task_line] = [line for line in lines if line.startswith("limited") and "@1" in line]
    assert task_line.split()[-1] == "1"  # throttled


@pytest.mark.django_db
def test_the_queue_gauges_report_pauses_limits_and_throttled_tasks():
    live_worker("default", "emails")
    for _ in range(3):
        due(run_at=ago(minutes=10))
    due(queue="emails", run_at=ago(minutes=4))
    pause("default")
    pause("emails", NOOP)
    resume("emails")  # the queue's own pause was never set: the task name stays paused

    values = scrape_collector(QueueCollector(ttl=0))

    assert values[("pgqueue_queue_paused", ("queue", "default"))] == 1
    assert values[("pgqueue_queue_paused", ("queue", "emails"))] == 0
    assert values[("pgqueue_task_paused", ("queue", "emails"), ("task_name", NOOP))] == 1
    assert not any(k[0] == "pgqueue_task_paused" and ("queue", "default") in k for k in values)
    assert values[("pgqueue_queue_throttled", ("queue", "default"))] == 3
    assert values[("pgqueue_queue_throttled", ("queue", "emails"))] == 1
    assert values[("pgqueue_queue_oldest_due_seconds", ("queue", "default"))] > 590
    assert values[("pgqueue_queue_oldest_unthrottled_seconds", ("queue", "default"))] == 0
    assert values[("pgqueue_queue_oldest_unthrottled_seconds", ("queue", "emails"))] == 0
    assert values[("pgqueue_queue_concurrency_limit", ("queue", "limited"))] == 3
    assert values[("pgqueue_queue_concurrency_limit", ("queue", "limited_rated"))] == 2
    assert ("pgqueue_queue_concurrency_limit", ("queue", "rated")) not in values


@pytest.mark.django_db
def test_a_queue_at_its_limit_is_throttled_in_the_gauges_not_starving():
    live_worker("limited")
    for _ in range(3):
        running(queue="limited")
    due(queue="limited", run_at=ago(minutes=20))

    values = scrape_collector(QueueCollector(ttl=0))

    assert values[("pgqueue_queue_throttled", ("queue", "limited"))] == 1
    assert values[("pgqueue_queue_oldest_due_seconds", ("queue", "limited"))] > 1190
    assert values[("pgqueue_queue_oldest_unthrottled_seconds", ("queue", "limited"))] == 0


# -- end to end: a worker honours the command's pause ----------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("claim", ["claim", "claim_plain"])
def test_a_worker_claims_nothing_from_a_queue_paused_by_the_command_until_it_is_resumed(
    start_worker, claim
):
    """Both claim statements honour a pause: claim, of a worker with routes limited by
    key (the test settings' keyed tasks), and claim_plain, of a worker without them."""
    run("pgqueue_queue", "pause", "default")
    task_id = tasks.record.enqueue("after resume")
    env = PLAIN_CLAIM_ENV if claim == "claim_plain" else None
    start_worker("--queues", "default,other", "--poll-interval", "0.2", env=env)

    wait_until(
        lambda: groups()["default"].totals["throttled"] == 1,
        message="the worker to register and the task to show as throttled",
    )
    # A task of another queue, enqueued now, runs: a claim after the pause took it, and
    # left the paused queue's task alone
    sentinel = tasks.record.using(queue="other").enqueue("sentinel")
    wait_until(lambda: Task.objects.filter(pk=sentinel, state="succeeded").exists())
    assert not Run.objects.filter(task_id=task_id).exists()
    run("pgqueue_queue", "resume", "default")

    wait_until(lambda: Task.objects.filter(pk=task_id, state="succeeded").exists())
