"""The admin: task list and detail, state-checked actions, permissions, overview, workers."""

import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from django_pgqueue.models import Task, Worker
from django_pgqueue.ops import operations
from tests import sqlhelpers, tasks
from tests.conftest import wait_until
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

TASKS = reverse("admin:django_pgqueue_task_changelist")
OVERVIEW = reverse("admin:django_pgqueue_queueoverview_changelist")
WORKERS = reverse("admin:django_pgqueue_worker_changelist")


def ago(**kwargs):
    return timezone.now() - timedelta(**kwargs)


def due(**kwargs) -> Task:
    # The test transaction's now() is its start; "now" by the Python clock is later.
    return TaskFactory(**{"run_at": ago(seconds=5), **kwargs})


def dead(**kwargs) -> Task:
    defaults = {"state": "failed", "attempt": 3, "max_attempts": 3, "finished_at": ago(minutes=1)}
    return TaskFactory(**{**defaults, **kwargs})


def running(**kwargs) -> Task:
    defaults = {
        "state": "running",
        "attempt": 1,
        "lease_token": uuid.uuid4(),
        "lease_expires_at": timezone.now() + timedelta(seconds=30),
        "worker_id": "w-1",
    }
    return TaskFactory(**{**defaults, **kwargs})


@pytest.fixture
def staff_client(client, django_user_model):
    """A client logged in as a staff user holding exactly the given permissions."""

    def make(*codenames: str):
        user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label="django_pgqueue", codename__in=codenames
            )
        )
        client.force_login(user)
        return client

    return make


def act(client, action: str, *tasks: Task):
    return client.post(
        TASKS, {"action": action, "_selected_action": [t.pk for t in tasks]}, follow=True
    )


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# -- the task list --------------------------------------------------------------------


@pytest.mark.slow
def test_the_task_list_filters_by_state_queue_and_task_name(admin_client):
    wanted = dead(queue="emails", task_name="tests.tasks.record")
    dead(queue="default", task_name="tests.tasks.record")
    dead(queue="emails", task_name="tests.tasks.noop")
    due(queue="emails", task_name="tests.tasks.record")

    response = admin_client.get(
        TASKS, {"state__exact": "failed", "queue": "emails", "task_name": "tests.tasks.record"}
    )

    assert [t.pk for t in response.context["cl"].result_list] == [wanted.pk]


@pytest.mark.slow
def test_the_due_filter_separates_due_from_scheduled_tasks(admin_client):
    now_due = due()
    TaskFactory(run_at=timezone.now() + timedelta(hours=1))

    response = admin_client.get(TASKS, {"state__exact": "pending", "due": "due"})

    assert [t.pk for t in response.context["cl"].result_list] == [now_due.pk]


@pytest.mark.slow
def test_search_finds_a_task_by_id_or_by_its_exact_unique_key(admin_client):
    first, second = due(unique_key="order-7"), due(unique_key="order-77")

    by_id = admin_client.get(TASKS, {"q": f"#{second.pk}"})
    by_key = admin_client.get(TASKS, {"q": "order-7"})

    assert [t.pk for t in by_id.context["cl"].result_list] == [second.pk]
    assert [t.pk for t in by_key.context["cl"].result_list] == [first.pk]


def test_the_task_list_shows_state_attempts_priority_run_at_and_age(admin_client):
    dead(priority=7, attempt=3, max_attempts=3, enqueued_at=ago(minutes=3, seconds=5))

    html = admin_client.get(TASKS).content.decode()

    for header in ("state", "attempts", "priority", "run at", "age"):
        assert f">{header.capitalize()}<" in html or f">{header}<" in html.lower(), header
    assert "3/3" in html
    # 3m 05s when the page is rendered at once; a loaded machine may take a few seconds
    assert re.search(r"3m 0[5-9]s", html), "the age, in minutes and seconds"
    assert 'class="pgqueue-state pgqueue-state-failed"' in html


def test_the_task_list_drills_down_by_enqueue_date(admin_client):
    today = timezone.localdate()
    due()

    html = admin_client.get(TASKS).content.decode()

    assert f"enqueued_at__day={today.day}" in html
    assert 'class="toplinks"' in html


# -- the task detail ------------------------------------------------------------------


def test_the_detail_shows_payload_result_every_error_lease_checkpoint_and_progress(admin_client):
    token = uuid.uuid4()
    task = running(
        args=[42, "forty-two"],
        kwargs={"notify": True},
        result={"previous": "ok"},
        lease_token=token,
        worker_id="host-123-abc",
        checkpoint={"done": 17},
        progress={"step": 3, "of": 9},
        errors=[
            {
                "attempt": 1,
                "type": "builtins.ValueError",
                "message": "bad <input>",
                "traceback": 'Traceback (most recent call last):\n  File "x.py", line 1\n'
                "ValueError: bad <input>\n",
                "outcome": "failure",
            },
            {"attempt": 2, "type": "LeaseExpired", "message": "lease lapsed", "traceback": None},
        ],
    )

    html = admin_client.get(reverse("admin:django_pgqueue_task_change", args=[task.pk])).content
    html = html.decode()

    assert "forty-two" in html and "&quot;notify&quot;: true" in html
    assert "&quot;previous&quot;: &quot;ok&quot;" in html
    assert "Attempt 1: builtins.ValueError" in html and "Attempt 2: LeaseExpired" in html
    assert "Traceback (most recent call last):" in html
    assert "ValueError: bad &lt;input&gt;" in html  # escaped, never markup
    assert "host-123-abc" in html and str(token) in html
    assert "&quot;done&quot;: 17" in html and "&quot;of&quot;: 9" in html


def test_the_detail_page_never_saves_a_task(admin_client):
    task = running()

    response = admin_client.post(
        reverse("admin:django_pgqueue_task_change", args=[task.pk]), {"state": "pending"}
    )

    assert response.status_code == 403
    task.refresh_from_db()
    assert task.state == "running"


def test_the_detail_page_offers_the_operations_that_apply_to_its_state(admin_client):
    html = admin_client.get(reverse("admin:django_pgqueue_task_change", args=[dead().pk]))
    html = html.content.decode()

    assert 'value="Retry now"' in html and 'value="Requeue (fresh attempts)"' in html
    assert 'value="Cancel"' not in html
    assert 'class="deletelink"' in html  # Django's own, through a confirmation page


def test_a_live_task_offers_no_delete_and_cannot_be_deleted(admin_client):
    task = running()
    change_url = reverse("admin:django_pgqueue_task_change", args=[task.pk])
    delete_url = reverse("admin:django_pgqueue_task_delete", args=[task.pk])

    html = admin_client.get(change_url).content.decode()
    response = admin_client.post(delete_url, {"post": "yes"})

    assert 'class="deletelink"' not in html and 'value="Cancel"' in html
    assert response.status_code == 403
    assert Task.objects.filter(pk=task.pk).exists()


def test_a_finished_task_can_be_deleted_from_its_page_after_confirmation(admin_client):
    task = dead()
    delete_url = reverse("admin:django_pgqueue_task_delete", args=[task.pk])

    admin_client.post(delete_url, {"post": "yes"})

    assert not Task.objects.filter(pk=task.pk).exists()


def test_a_detail_page_button_runs_its_state_checked_operation(admin_client):
    task = dead()

    admin_client.post(reverse("admin:django_pgqueue_task_operate", args=[task.pk, "requeue"]))

    task.refresh_from_db()
    assert (task.state, task.attempt) == ("pending", 0)


# -- actions --------------------------------------------------------------------------


def test_retry_now_makes_pending_and_dead_tasks_due_at_once(admin_client):
    later = TaskFactory(run_at=timezone.now() + timedelta(hours=2))
    died = dead()

    response = act(admin_client, "retry_now", later, died)

    later.refresh_from_db()
    died.refresh_from_db()
    assert later.run_at <= timezone.now()
    assert (died.state, died.finished_at) == ("pending", None)
    assert "Retried 2 tasks." in messages_of(response)


def test_retry_now_gives_a_dead_letter_exactly_one_more_attempt(admin_client):
    died = dead(attempt=3, max_attempts=3)

    act(admin_client, "retry_now", died)

    died.refresh_from_db()
    assert (died.attempt, died.max_attempts) == (3, 4)


def test_retry_now_leaves_a_running_task_and_its_lease_alone(admin_client):
    task = running()
    before = Task.objects.get(pk=task.pk)

    response = act(admin_client, "retry_now", task)

    task.refresh_from_db()
    assert (task.state, task.lease_token, task.attempt, task.run_at) == (
        "running",
        before.lease_token,
        before.attempt,
        before.run_at,
    )
    assert any(
        "applies to scheduled, pending, failed tasks only" in m for m in messages_of(response)
    )


def test_cancel_ends_a_pending_task_and_asks_a_running_one_to_stop(admin_client):
    waiting, busy = due(), running()

    act(admin_client, "cancel", waiting, busy)

    waiting.refresh_from_db()
    busy.refresh_from_db()
    assert waiting.state == "cancelled"
    assert (busy.state, busy.cancel_requested) == ("running", True)
    assert busy.lease_token is not None


def test_requeue_gives_dead_letters_a_fresh_attempt_budget_and_keeps_their_errors(admin_client):
    died = dead(errors=[{"attempt": 3, "type": "ValueError", "message": "boom"}])

    act(admin_client, "requeue", died)

    died.refresh_from_db()
    assert (died.state, died.attempt, died.max_attempts) == ("pending", 0, 3)
    assert died.errors[0]["message"] == "boom"


def test_requeue_leaves_a_dead_letter_dead_while_its_unique_key_is_live_again(admin_client):
    died = dead(unique_key="invoice-1")
    due(unique_key="invoice-1")

    response = act(admin_client, "requeue", died)

    died.refresh_from_db()
    assert died.state == "failed"
    assert any("unique key" in m for m in messages_of(response))


def test_delete_removes_finished_tasks_and_never_a_live_one(admin_client):
    finished = [dead(), TaskFactory(state="succeeded", finished_at=ago(minutes=1))]
    live = [due(), running()]

    act(admin_client, "delete", *finished, *live)

    assert set(Task.objects.values_list("pk", flat=True)) == {t.pk for t in live}


def test_actions_are_written_to_the_admin_log(admin_client):
    died = dead()

    act(admin_client, "requeue", died)

    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.change_message) == (
        str(died.pk),
        "Requeued from the dead letters.",
    )


# -- permissions ----------------------------------------------------------------------


def test_a_user_who_may_only_view_tasks_cannot_run_the_actions(staff_client):
    client = staff_client("view_task")
    died = dead()

    listing = client.get(TASKS)
    act(client, "retry_now", died)
    button = client.post(reverse("admin:django_pgqueue_task_operate", args=[died.pk, "retry_now"]))

    assert listing.status_code == 200
    assert "retry_now" not in listing.content.decode()
    assert button.status_code == 403
    died.refresh_from_db()
    assert died.state == "failed"


def test_deleting_needs_the_delete_permission_not_just_change(staff_client):
    client = staff_client("view_task", "change_task")
    died = dead()

    html = client.get(TASKS).content.decode()
    act(client, "delete", died)

    assert "retry_now" in html and 'value="delete"' not in html
    assert Task.objects.filter(pk=died.pk).exists()


def test_a_staff_user_without_task_permissions_is_refused_the_overview_and_workers(staff_client):
    client = staff_client()

    assert client.get(OVERVIEW).status_code == 403
    assert client.get(WORKERS).status_code == 403
    assert client.get(TASKS).status_code == 403


def test_a_user_who_is_not_staff_is_sent_to_the_login_page(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("customer", password="pw"))

    response = client.get(OVERVIEW)

    assert response.status_code == 302 and "/login/" in response["Location"]


# -- the overview and workers pages ---------------------------------------------------


def test_the_admin_index_links_to_the_queue_overview(staff_client):
    html = staff_client("view_task").get(reverse("admin:index")).content.decode()

    assert f'href="{OVERVIEW}"' in html and "Queue overview" in html


def test_the_overview_page_shows_counts_per_queue_and_task_with_a_chart(staff_client):
    Worker.objects.create(
        id="w",
        hostname="h",
        pid=1,
        concurrency=4,
        queues=["default"],
        routes=[["tests.tasks.noop", 1]],
    )
    for _ in range(3):
        due()
    due(task_name="billing.charge")
    dead()

    html = staff_client("view_task").get(OVERVIEW).content.decode()

    assert '<svg id="pgqueue-chart"' in html
    row = html.split('data-task="tests.tasks.noop"', 1)[1].split("</tr>", 1)[0]
    assert '<td class="num" data-count="pending_routable"><a' in row and ">3</a>" in row
    unroutable = html.split('data-task="billing.charge"', 1)[1].split("</tr>", 1)[0]
    assert 'class="num alert" data-count="pending_unroutable"' in unroutable


def test_the_workers_page_marks_stale_workers(admin_client):
    Worker.objects.create(
        id="live-1",
        hostname="web-1",
        pid=11,
        concurrency=8,
        queues=["default"],
        routes=[["a.b", 2]],
    )
    Worker.objects.create(id="gone-1", hostname="web-2", pid=12, concurrency=8, queues=["default"])
    Worker.objects.filter(id="gone-1").update(last_heartbeat_at=ago(hours=1))

    html = admin_client.get(WORKERS).content.decode()

    live_row = html.split("live-1", 1)[1].split("</tr>", 1)[0]
    stale_row = html.split("gone-1", 1)[1].split("</tr>", 1)[0]
    assert "pgqueue-live" in live_row and "<code>a.b@2</code>" in live_row
    assert "pgqueue-stale" in stale_row
    assert "1</strong> stale" in html


def test_removing_stale_workers_leaves_live_ones(admin_client):
    Worker.objects.create(id="live-1", hostname="a", pid=1, concurrency=1, queues=["default"])
    Worker.objects.create(id="gone-1", hostname="b", pid=2, concurrency=1, queues=["default"])
    Worker.objects.filter(id="gone-1").update(last_heartbeat_at=ago(hours=1))

    admin_client.post(WORKERS, {"action": "remove_stale", "_selected_action": ["live-1", "gone-1"]})

    assert list(Worker.objects.values_list("id", flat=True)) == ["live-1"]


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_running_task_reaches_its_handler_which_stops(admin_client, start_worker):
    task_id = tasks.wait_for_cancel.enqueue(30)
    start_worker("--heartbeat", "0.2")
    wait_until(lambda: Task.objects.filter(pk=task_id, state="running").exists())

    response = act(admin_client, "cancel", Task.objects.get(pk=task_id))

    task = wait_until(lambda: Task.objects.filter(pk=task_id, state="cancelled").first())
    assert any("Requested cancellation of 1 running" in m for m in messages_of(response))
    assert task.errors[-1]["message"] == "saw the cancel request"


# -- the statements behind the actions check the state themselves ---------------------
# The actions filter by state before calling them, but a worker may claim a task between
# that read and the write: the statements must hold on their own.


@pytest.mark.django_db(transaction=True)
def test_a_task_claimed_meanwhile_is_not_retried_and_its_worker_still_settles_it(pg):
    task_id = tasks.noop.enqueue(1)
    [claimed] = sqlhelpers.claim(pg)

    retried = operations.retry_now([task_id])
    requeued = operations.requeue_dead([task_id])
    deleted = operations.delete_finished([task_id])

    assert (retried, requeued, deleted) == ([], [], [])
    assert sqlhelpers.settle(pg, [sqlhelpers.success(claimed, 1)]) == {task_id: "succeeded"}


def test_requeue_matches_only_dead_letters():
    rows = [due(), running(), TaskFactory(state="succeeded", finished_at=ago(minutes=1))]
    died = dead()

    requeued = operations.requeue_dead([t.pk for t in [*rows, died]])

    assert requeued == [died.pk]


def test_delete_never_matches_a_live_task():
    rows = [due(), running(), TaskFactory(state="waiting")]

    assert operations.delete_finished([t.pk for t in rows]) == []
    assert Task.objects.count() == 3
