"""Waiting work where an operator sees and steers it: the admin's task page (what a task
waits for, its parents and children, Send signal, Cancel), the queue overview and
``pgqueue_status`` (waiting tasks by what they wait for), the gauge
``pgqueue_queue_waiting`` and ``manage.py pgqueue_signal``.

Rows are made by the real enqueue (``after=``, chains, chords of tests/workflow_tasks.py),
by the contract statements a worker runs (a suspension settled through
tests/sqlhelpers.py), or by the factory where only the columns matter. No worker runs.
"""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import cancel
from django_pgqueue.models import Task, Worker
from django_pgqueue.ops.metrics import QueueCollector
from django_pgqueue.ops.operations import queue_overview
from django_pgqueue.tasking.workflows import chain, chord
from tests import sqlhelpers
from tests.factories import TaskFactory
from tests.test_metrics import scrape_collector
from tests.test_overview import plan
from tests.workflow_tasks import step, wait_for_signal

TASKS = reverse("admin:django_pgqueue_task_changelist")
OVERVIEW = reverse("admin:django_pgqueue_queueoverview_changelist")
STEP = step.name
WAITER = wait_for_signal.name


def ago(**kwargs):
    return timezone.now() - timedelta(**kwargs)


def page(task_id: int) -> str:
    return reverse("admin:django_pgqueue_task_change", args=[task_id])


def signal_url(task_id: int) -> str:
    return reverse("admin:django_pgqueue_task_signal", args=[task_id])


def waiting_on_signal(name: str = "approved", **kwargs) -> Task:
    """A row as a settled Suspend(name) leaves it (the columns only)."""
    defaults = {"task_name": WAITER, "state": "waiting", "wait_reason": "signal",
                "wait_signal": name}  # fmt: skip
    return TaskFactory(**{**defaults, **kwargs})


def suspend(pg, name: str = "approved") -> int:
    """A real suspension: enqueue, claim and settle Suspend(name), as a worker does."""
    task_id = wait_for_signal.enqueue(name)
    (claimed,) = sqlhelpers.claim(pg, 1)
    outcome = {
        "id": claimed.id, "attempt": claimed.attempt, "token": claimed.lease_token,
        "label": "suspended", "state": "waiting", "attempt_refund": True,
        "wait_reason": "signal", "wait_signal": name,
    }  # fmt: skip
    sqlhelpers.settle(pg, [outcome])
    return task_id


def html_of(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def state(task_id: int) -> str:
    return Task.objects.values_list("state", flat=True).get(pk=task_id)


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


# -- the task page: what it waits for ---------------------------------------------------


@pytest.mark.django_db
def test_a_waiting_tasks_page_lists_its_parents_with_links_states_and_resolution(admin_client):
    # Given a task after two parents, one of which has ended (it runs anyway on failure)
    first, second = step.enqueue("a"), step.enqueue("b")
    child = step.using(after=[first, second], after_failure="run").enqueue("child")
    cancel(first)

    html = html_of(admin_client, page(child))

    assert "its parents: 1 of 2 not yet ended" in html
    assert f'<a href="{page(first)}">#{first}</a>' in html
    assert f'<a href="{page(second)}">#{second}</a>' in html
    table = html.split('class="pgqueue-edges"', 1)[1].split("</table>", 1)[0]
    rows = table.split("<tr>")[2:]  # the header, then those not yet resolved first
    assert f"#{second}" in rows[0] and "pgqueue-state-pending" in rows[0]
    assert "<td>no</td><td>run</td>" in rows[0]
    assert f"#{first}" in rows[1] and "pgqueue-state-cancelled" in rows[1]
    assert "<td>yes</td><td>run</td>" in rows[1]
    assert "2 parents, 1 not yet resolved" in html


@pytest.mark.django_db
def test_a_parents_page_lists_the_tasks_waiting_for_it(admin_client):
    head, second, third = chain(step.step("1"), step.step("2"), step.step("3"))

    html = html_of(admin_client, page(head))

    children = html.split("Children (the tasks waiting for it)", 1)[1]
    assert f'<a href="{page(second)}">#{second}</a>' in children
    assert "pgqueue-state-waiting" in children and "<td>cancel</td>" in children
    assert f">#{third}<" not in children  # a grandchild waits for the second, not for it
    assert "1 child, 1 not yet resolved" in html


@pytest.mark.django_db
def test_a_chord_callbacks_page_lists_the_first_100_parents_and_counts_the_rest(admin_client):
    _, callback = chord([step.step(str(n)) for n in range(150)], step.step("cb"))

    html = html_of(admin_client, page(callback))

    table = html.split('class="pgqueue-edges"', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr>") == 1 + 100
    assert "150 parents, 150 not yet resolved; those not yet resolved first" in html
    assert "and 50 more" in html
    assert "its parents: 150 of 150 not yet ended" in html


@pytest.mark.django_db
def test_the_task_page_reads_as_many_statements_for_10000_parents_as_for_101(admin_client):
    # Given two chord callbacks, both past the page's limit of 100 parents
    def queries_for_callback_of(members: int) -> int:
        _, callback = chord([step.step(str(n)) for n in range(members)], step.step("cb"))
        with CaptureQueriesContext(connection) as queries:
            html_of(admin_client, page(callback))
        return len(queries)

    # Then the page costs the same: 100 edges, their tasks, one count
    assert queries_for_callback_of(101) == queries_for_callback_of(10_000)


@pytest.mark.django_db
def test_a_task_suspended_on_a_signal_shows_the_signal_its_timeout_and_the_signals_so_far(
    admin_client,
):
    task = waiting_on_signal(
        "approved", wait_until=timezone.now() + timedelta(hours=1), signals={"early": 1}
    )

    html = html_of(admin_client, page(task.pk))

    assert "the signal <code>approved</code>" in html
    assert task.wait_until.isoformat(timespec="seconds") in html and "(in 59m" in html
    assert "&quot;early&quot;: 1" in html


@pytest.mark.django_db
def test_a_resumed_tasks_page_shows_what_woke_it(admin_client):
    task = TaskFactory(
        task_name=WAITER,
        signals={"approved": {"by": "ops"}},
        wake={"reason": "signal", "signal": "approved", "payload": {"by": "ops"}},
    )

    html = html_of(admin_client, page(task.pk))

    woken = html.split("Woken by", 1)[1]
    assert "&quot;reason&quot;: &quot;signal&quot;" in woken
    assert "&quot;by&quot;: &quot;ops&quot;" in woken


@pytest.mark.django_db
def test_a_task_with_nothing_to_do_with_waiting_has_no_waiting_section(admin_client):
    task = TaskFactory()

    html = html_of(admin_client, page(task.pk))

    assert "Waiting (docs/workflows.md)" not in html and "Woken by" not in html


# -- Send signal ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_sending_a_signal_from_the_admin_resumes_the_task_waiting_for_it(admin_client, pg):
    # Given a task a worker suspended on "approved"
    task_id = suspend(pg, "approved")
    assert state(task_id) == "waiting"

    # When an operator sends "approved" with a payload from its page
    response = admin_client.post(
        signal_url(task_id), {"name": "approved", "payload": '{"by": "ops"}'}, follow=True
    )

    # Then it is pending, due now, and its next attempt sees what woke it
    task = Task.objects.get(pk=task_id)
    assert (task.state, task.wait_reason, task.wait_signal) == ("pending", None, None)
    assert task.wake == {"reason": "signal", "signal": "approved", "payload": {"by": "ops"}}
    assert task.signals == {"approved": {"by": "ops"}}
    assert response.redirect_chain[-1][0] == page(task_id)
    assert any("was waiting for it and is pending now" in m for m in messages_of(response))
    entry = LogEntry.objects.get(object_id=str(task_id))
    assert "Sent signal 'approved'" in entry.change_message
    (claimed,) = sqlhelpers.claim(pg, 1)
    assert claimed.id == task_id


@pytest.mark.django_db
def test_a_signal_the_task_does_not_wait_for_is_stored_and_the_task_left_as_it_is(admin_client):
    task = waiting_on_signal("approved")

    response = admin_client.post(signal_url(task.pk), {"name": "rejected"}, follow=True)

    task.refresh_from_db()
    assert (task.state, task.wait_signal) == ("waiting", "approved")
    assert task.signals == {"rejected": None}
    assert any("stored" in m and "it waits for 'approved'" in m for m in messages_of(response))


@pytest.mark.django_db
def test_a_payload_that_is_not_json_is_shown_as_an_error_and_nothing_is_sent(admin_client):
    task = waiting_on_signal("approved")

    response = admin_client.post(signal_url(task.pk), {"name": "approved", "payload": "{by: ops"})

    assert response.status_code == 200
    html = response.content.decode()
    assert "the payload is not JSON" in html and "line 1, column 2" in html
    assert 'value="approved"' in html  # the form keeps what was typed
    task.refresh_from_db()
    assert (task.state, task.signals) == ("waiting", {})


@pytest.mark.django_db
def test_a_signal_needs_a_name(admin_client):
    task = waiting_on_signal("approved")

    response = admin_client.post(signal_url(task.pk), {"name": "", "payload": "1"})

    assert response.status_code == 200
    assert "This field is required." in response.content.decode()
    task.refresh_from_db()
    assert task.signals == {}


@pytest.mark.django_db
def test_a_finished_task_offers_no_signal_and_takes_none(admin_client):
    task = TaskFactory(state="succeeded", finished_at=ago(minutes=1))

    html = html_of(admin_client, page(task.pk))
    response = admin_client.post(signal_url(task.pk), {"name": "approved"}, follow=True)

    assert 'value="Send signal"' not in html
    assert any("has finished (succeeded)" in m for m in messages_of(response))
    task.refresh_from_db()
    assert task.signals == {}


@pytest.mark.django_db
def test_a_waiting_tasks_page_offers_send_signal_with_the_awaited_name_and_cancel(admin_client):
    task = waiting_on_signal("approved")

    html = html_of(admin_client, page(task.pk))

    form = html.split(f'action="{signal_url(task.pk)}" class="pgqueue-signal"', 1)[1]
    form = form.split("</form>", 1)[0]
    assert 'name="name" value="approved"' in form and 'value="Send signal"' in form
    assert 'value="Cancel"' in html


@pytest.mark.django_db
def test_the_signal_page_shows_the_form_prefilled_with_the_awaited_name(admin_client):
    task = waiting_on_signal("approved")

    html = html_of(admin_client, signal_url(task.pk))

    assert "waiting for the signal <code>approved</code>" in html
    assert 'value="approved"' in html and 'id="pgqueue-signal-form"' in html


@pytest.mark.django_db
def test_sending_a_signal_needs_the_change_permission(staff_client):
    client = staff_client("view_task")
    task = waiting_on_signal("approved")

    html = html_of(client, page(task.pk))
    shown = client.get(signal_url(task.pk))
    sent = client.post(signal_url(task.pk), {"name": "approved"})

    assert 'value="Send signal"' not in html
    assert (shown.status_code, sent.status_code) == (403, 403)
    task.refresh_from_db()
    assert (task.state, task.signals) == ("waiting", {})


@pytest.mark.django_db
def test_a_staff_user_with_the_change_permission_may_send_a_signal(staff_client):
    client = staff_client("view_task", "change_task")
    task = waiting_on_signal("approved")

    client.post(signal_url(task.pk), {"name": "approved", "payload": "true"})

    task.refresh_from_db()
    assert (task.state, task.wake["payload"]) == ("pending", True)


@pytest.mark.django_db
def test_a_user_who_is_not_staff_cannot_reach_the_signal_form(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("customer", password="pw"))
    task = waiting_on_signal("approved")

    response = client.post(signal_url(task.pk), {"name": "approved"})

    assert response.status_code == 302 and "/login/" in response["Location"]
    task.refresh_from_db()
    assert task.state == "waiting"


# -- Cancel of a waiting task -------------------------------------------------------------


@pytest.mark.django_db
def test_cancelling_a_waiting_task_in_the_admin_cancels_it_and_what_waits_for_it(admin_client):
    # Given a chain of three: the second and third wait
    head, second, third = chain(step.step("1"), step.step("2"), step.step("3"))

    # When the operator cancels the second from the task list
    response = admin_client.post(
        TASKS, {"action": "cancel", "_selected_action": [second]}, follow=True
    )

    # Then it ends cancelled, and so does the third (which waited for it); the head runs
    assert (state(head), state(second), state(third)) == ("pending", "cancelled", "cancelled")
    cancelled = Task.objects.get(pk=second)
    assert (cancelled.wait_reason, cancelled.wait_signal, cancelled.wait_until) == (None,) * 3
    assert Task.objects.get(pk=third).errors[-1]["type"] == "UpstreamFailed"
    [message] = messages_of(response)
    assert "Cancelled 1 task(s)." in message and "were cancelled with them" in message


@pytest.mark.django_db
def test_the_cancel_button_of_a_task_waiting_for_a_signal_cancels_it(admin_client):
    task = waiting_on_signal("approved", wait_until=timezone.now() + timedelta(hours=1))

    admin_client.post(reverse("admin:django_pgqueue_task_operate", args=[task.pk, "cancel"]))

    task.refresh_from_db()
    assert (task.state, task.wait_reason, task.wait_until) == ("cancelled", None, None)
    assert task.finished_at is not None


# -- the overview and pgqueue_status ------------------------------------------------------


def waiting_shapes() -> None:
    """Per (default, step): 2 waiting on parents (a chain of 3), 1 on a child; per
    (default, wait_for_signal): 2 on a signal; per (emails, step): 1 on parents."""
    chain(step.step("1"), step.step("2"), step.step("3"))
    TaskFactory(task_name=STEP, state="waiting", wait_reason="child", parents_pending=1)
    waiting_on_signal("approved")
    waiting_on_signal("shipped", wait_until=timezone.now() + timedelta(minutes=5))
    head = step.using(queue="emails").enqueue("head")
    step.using(queue="emails", after=[head]).enqueue("tail")


def overview_rows() -> dict:
    return {(r["queue"], r["task_name"]): r for r in queue_overview()}


@pytest.mark.django_db
def test_the_overview_counts_waiting_tasks_by_what_they_wait_for():
    waiting_shapes()

    rows = overview_rows()

    def by_reason(row):
        return (row["waiting"], row["waiting_parents"], row["waiting_signal"],
                row["waiting_child"])  # fmt: skip

    assert by_reason(rows[("default", STEP)]) == (3, 2, 0, 1)
    assert by_reason(rows[("default", WAITER)]) == (2, 0, 2, 0)
    assert by_reason(rows[("emails", STEP)]) == (1, 1, 0, 0)


@pytest.mark.django_db
def test_waiting_tasks_are_not_due_so_neither_old_nor_throttled():
    # Given only tasks that have waited for hours (enqueued and due long ago)
    waiting_on_signal("approved", run_at=ago(hours=5), enqueued_at=ago(hours=5))
    Worker.objects.create(id="w", hostname="h", pid=1, concurrency=4, queues=["default"],
                          routes=[[WAITER, 1]])  # fmt: skip

    [row] = queue_overview()

    assert (row["waiting"], row["pending_routable"], row["pending_unroutable"]) == (1, 0, 0)
    assert row["oldest_due_seconds"] is None


@pytest.mark.django_db
def test_the_overview_page_shows_waiting_by_reason_with_links_to_the_tasks(admin_client):
    waiting_shapes()

    html = html_of(admin_client, OVERVIEW)

    row = html.split(f'data-queue="default" data-task="{STEP}"', 1)[1].split("</tr>", 1)[0]
    assert 'data-waiting="parents"' in row and ">parents 2</a>" in row
    assert ">child 1</a>" in row and 'data-waiting="signal"' not in row
    queue = html.split('class="pgqueue-queue" data-queue="default"', 1)[1].split("</tr>", 1)[0]
    assert ">parents 2</a>" in queue and ">signal 2</a>" in queue and ">child 1</a>" in queue
    assert "wait_reason=signal" in queue
    card = html.split('id="pgqueue-total-waiting"', 1)[1].split("</div></div>", 1)[0]
    assert ">6<" in card and "parents 3" in card and "signal 2" in card and "child 1" in card


@pytest.mark.django_db
def test_the_task_list_filters_waiting_tasks_by_what_they_wait_for(admin_client):
    waiting_shapes()
    signalled = set(Task.objects.filter(wait_reason="signal").values_list("pk", flat=True))

    response = admin_client.get(TASKS, {"state__exact": "waiting", "wait_reason": "signal"})

    assert {t.pk for t in response.context["cl"].result_list} == signalled
    assert len(signalled) == 2


@pytest.mark.django_db
def test_status_shows_each_queues_waiting_tasks_by_reason():
    waiting_shapes()

    text = run("pgqueue_status")

    header, _, *queues = text.split("\n\n")[1].splitlines()
    column = header.index("waiting for")
    lines = {line.split()[0]: line[column:] for line in queues}
    assert lines["default"].startswith("parents 2, signal 2, child 1  ")
    assert lines["emails"].startswith("parents 1  ")


@pytest.mark.django_db
def test_status_json_gives_waiting_by_reason_per_queue_and_per_task():
    waiting_shapes()

    document = json.loads(run("pgqueue_status", "--json"))

    queues = {q["queue"]: q for q in document["queues"]}
    assert queues["default"]["waiting"] == 5
    assert queues["default"]["waiting_by_reason"] == {
        "parents": 2, "signal": 2, "child": 1, "sequence": 0,
    }  # fmt: skip
    assert queues["emails"]["waiting_by_reason"] == {
        "parents": 1, "signal": 0, "child": 0, "sequence": 0,
    }  # fmt: skip
    [signal_row] = [t for t in document["tasks"] if t["task_name"] == WAITER]
    assert (signal_row["waiting"], signal_row["waiting_signal"]) == (2, 2)


@pytest.mark.django_db
def test_the_overview_reads_waiting_rows_by_reason_through_their_index():
    # Given a table that is mostly history, and 2,000 waiting rows of each reason
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO pgqueue_task (queue, task_name, state, finished_at, run_at, attempt)
            SELECT 'default', 'tests.tasks.noop', 'succeeded',
                   now() - make_interval(secs => n), now() - make_interval(secs => n), 1
              FROM generate_series(1, 100000) AS n
        """)
        cursor.execute("""
            INSERT INTO pgqueue_task (queue, task_name, state, wait_reason)
            SELECT 'default', 'tests.tasks.noop', 'waiting',
                   (ARRAY['parents', 'signal', 'child'])[1 + n % 3]
              FROM generate_series(1, 6000) AS n
        """)
        cursor.execute("ANALYZE pgqueue_task")

    text = plan(connection, "queue_overview", {"stale_seconds": 60})

    assert "Seq Scan on pgqueue_task" not in text, text
    assert "pgqueue_task_waiting" in text, text


# -- the gauges ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_waiting_gauge_counts_each_queues_waiting_tasks_by_reason():
    waiting_shapes()

    values = scrape_collector(QueueCollector(ttl=0))

    def waiting(queue: str, reason: str) -> float:
        return values[("pgqueue_queue_waiting", ("queue", queue), ("reason", reason))]

    assert [waiting("default", r) for r in ("parents", "signal", "child")] == [2, 2, 1]
    assert [waiting("emails", r) for r in ("parents", "signal", "child")] == [1, 0, 0]
    assert values[("pgqueue_tasks_waiting", ("queue", "default"), ("task_name", WAITER))] == 2


@pytest.mark.django_db
def test_tasks_waiting_for_hours_are_never_counted_as_due_or_stuck():
    # Given a queue with live workers whose only tasks have waited for hours
    Worker.objects.create(id="w", hostname="h", pid=1, concurrency=4, queues=["default"],
                          routes=[[WAITER, 1], [STEP, 1]])  # fmt: skip
    waiting_on_signal("approved", run_at=ago(hours=5), enqueued_at=ago(hours=5))
    TaskFactory(task_name=STEP, state="waiting", wait_reason="parents", run_at=ago(hours=3))

    values = scrape_collector(QueueCollector(ttl=0))

    queue = ("queue", "default")
    assert values[("pgqueue_queue_waiting", queue, ("reason", "signal"))] == 1
    for name in ("pgqueue_queue_oldest_due_seconds", "pgqueue_queue_oldest_unthrottled_seconds",
                 "pgqueue_queue_throttled"):  # fmt: skip
        assert values[(name, queue)] == 0, name
    assert values[("pgqueue_tasks_pending", queue, ("task_name", WAITER))] == 0


@pytest.mark.django_db
def test_a_task_released_after_a_long_wait_is_due_from_its_release_not_its_enqueue():
    # Given a task that waited two hours for its parent (and runs whatever its end)
    parent = step.enqueue("parent")
    child = step.using(after=[parent], after_failure="run").enqueue("child")
    Task.objects.filter(pk=child).update(run_at=ago(hours=2), enqueued_at=ago(hours=2))

    # When its parent ends, it is due; its wait for the parent is not a wait in the queue
    cancel(parent)

    assert state(child) == "pending"
    values = scrape_collector(QueueCollector(ttl=0))
    assert values[("pgqueue_queue_oldest_due_seconds", ("queue", "default"))] < 60


# -- manage.py pgqueue_signal -------------------------------------------------------------


@pytest.mark.django_db
def test_the_signal_command_resumes_a_task_waiting_for_it():
    task = waiting_on_signal("approved")

    out = run("pgqueue_signal", str(task.pk), "approved", "--payload", '{"by": "ops"}')

    assert out.startswith(f"task {task.pk}: resumed by signal 'approved'")
    task.refresh_from_db()
    assert task.state == "pending"
    assert task.wake == {"reason": "signal", "signal": "approved", "payload": {"by": "ops"}}


@pytest.mark.django_db
def test_the_signal_command_stores_a_signal_the_task_is_not_waiting_for():
    task = TaskFactory(task_name=WAITER, run_at=ago(seconds=5))

    out = run("pgqueue_signal", str(task.pk), "approved")

    assert "signal 'approved' stored" in out
    task.refresh_from_db()
    assert (task.state, task.signals) == ("pending", {"approved": None})


@pytest.mark.django_db
def test_the_signal_command_refuses_a_payload_that_is_not_json_and_sends_nothing():
    task = waiting_on_signal("approved")

    with pytest.raises(CommandError, match=r"--payload is not JSON: Expecting value"):
        run("pgqueue_signal", str(task.pk), "approved", "--payload", "yes")
    with pytest.raises(CommandError, match="no NaN"):
        run("pgqueue_signal", str(task.pk), "approved", "--payload", "NaN")

    task.refresh_from_db()
    assert (task.state, task.signals) == ("waiting", {})


@pytest.mark.django_db
def test_the_signal_command_names_an_unknown_task():
    with pytest.raises(CommandError, match="no task with id 999999; nothing was sent"):
        run("pgqueue_signal", "999999", "approved")


@pytest.mark.django_db
def test_the_signal_command_says_a_finished_task_takes_no_signal():
    task = TaskFactory(state="cancelled", finished_at=ago(minutes=1))

    with pytest.raises(CommandError, match=r"has finished \(cancelled\)"):
        run("pgqueue_signal", str(task.pk), "approved")


@pytest.mark.django_db
def test_the_signal_command_refuses_a_signal_name_too_long():
    task = waiting_on_signal("approved")

    with pytest.raises(CommandError, match="1-255 characters"):
        run("pgqueue_signal", str(task.pk), "x" * 256)
