"""The admin for operators: search by content, bulk actions on every match, enqueue from
the admin, and the overview's JSON endpoint (docs/admin.md)."""

import uuid
from datetime import timedelta

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_pgqueue.admin import bulk
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Task, Worker
from django_pgqueue.ops import operations
from django_pgqueue.templatetags.pgqueue_admin import short_name
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

TASKS = reverse("admin:django_pgqueue_task_changelist")
ENQUEUE = reverse("admin:django_pgqueue_task_enqueue")
OVERVIEW = reverse("admin:django_pgqueue_queueoverview_changelist")
DATA = reverse("admin:django_pgqueue_queueoverview_data")


def ago(**kwargs):
    return timezone.now() - timedelta(**kwargs)


@pytest.fixture
def staff_client(client, django_user_model):
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


def listed(response) -> list[int]:
    return sorted(t.pk for t in response.context["cl"].result_list)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# -- search by content ----------------------------------------------------------------


def test_search_finds_tasks_by_kwargs_args_and_metadata_containment(admin_client):
    order_42 = TaskFactory(kwargs={"order_id": 42, "shop": "a"}, args=[7, "fr"])
    TaskFactory(kwargs={"order_id": 43, "shop": "a"}, args=[8, "de"])
    tagged = TaskFactory(metadata={"tenant": "acme", "request_id": "r1"})

    assert listed(admin_client.get(TASKS, {"kwargs": '{"order_id": 42}'})) == [order_42.pk]
    assert listed(admin_client.get(TASKS, {"args": '["fr"]'})) == [order_42.pk]
    assert listed(admin_client.get(TASKS, {"args": "7"})) == [order_42.pk]
    assert listed(admin_client.get(TASKS, {"metadata": '{"tenant": "acme"}'})) == [tagged.pk]
    both = admin_client.get(TASKS, {"kwargs": '{"shop": "a"}', "args": '["de"]'})
    assert listed(both) == [order_42.pk + 1]


def test_search_finds_text_in_the_errors_and_combines_with_the_filters(admin_client):
    error = {"attempt": 1, "type": "ConnectionError", "message": "shop.example.com: 100% down"}
    refused = TaskFactory(state="failed", finished_at=ago(minutes=1), errors=[error])
    TaskFactory(state="pending", errors=[error])
    TaskFactory(state="failed", finished_at=ago(minutes=1), errors=[{"message": "other"}])

    found = admin_client.get(TASKS, {"error": "100% DOWN", "state__exact": "failed"})

    assert listed(found) == [refused.pk]
    # % and _ are text, not patterns
    assert listed(admin_client.get(TASKS, {"error": "1_0%"})) == []


def test_the_page_says_which_ids_it_searched_and_links_to_the_window_before(admin_client):
    old = TaskFactory(kwargs={"order_id": 42})
    new = TaskFactory(kwargs={"order_id": 42})

    page = admin_client.get(TASKS, {"kwargs": '{"order_id": 42}'})
    window = page.context["pgqueue_search"]["window"]
    assert (window.below, window.low) == (new.pk + 1, max(1, new.pk + 1 - 1_000_000))
    assert f"Searched tasks #{window.low} to #{new.pk}" in page.content.decode()

    below = admin_client.get(TASKS, {"kwargs": '{"order_id": 42}', "search_below": new.pk})
    assert listed(below) == [old.pk]


@override_settings(PGQUEUE={"ADMIN_SEARCH_ROWS": 1000})
def test_a_search_reads_only_its_window_of_ids(admin_client):
    target = TaskFactory(kwargs={"order_id": 42})
    with connection.cursor() as cursor:  # 1,000 newer rows push it out of the window
        cursor.execute(
            "INSERT INTO pgqueue_task (task_name, state, kwargs) "
            "SELECT 'tests.tasks.noop', 'succeeded', jsonb_build_object('n', n) "
            "FROM generate_series(1, 1000) AS n"
        )

    page = admin_client.get(TASKS, {"kwargs": '{"order_id": 42}'})
    assert listed(page) == []
    older = page.context["pgqueue_search"]["older_url"]
    assert listed(admin_client.get(TASKS + older)) == [target.pk]


def test_a_search_that_is_not_json_says_why_and_lists_nothing(admin_client):
    TaskFactory(kwargs={"order_id": 42})

    page = admin_client.get(TASKS, {"kwargs": "{order_id: 42}"})

    assert page.status_code == 200
    assert listed(page) == []
    assert any("kwargs contain is not JSON" in m for m in messages_of(page))


@pytest.mark.slow  # 50,000 rows to read
@override_settings(PGQUEUE={"ADMIN_SEARCH_TIMEOUT": 0.001})
def test_a_search_past_its_timeout_is_stopped_and_says_so(admin_client):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_task (task_name, state, kwargs, errors) "
            "SELECT 'tests.tasks.noop', 'failed', jsonb_build_object('n', n), "
            "jsonb_build_array(jsonb_build_object('message', repeat('x', 100))) "
            "FROM generate_series(1, 50000) AS n"
        )

    page = admin_client.get(TASKS, {"error": "no such text", "state__exact": "failed"}, follow=True)

    assert page.redirect_chain and "error=" not in page.redirect_chain[-1][0]
    assert "state__exact=failed" in page.redirect_chain[-1][0]
    assert any("took longer than 0.001 s" in m for m in messages_of(page))


def test_the_search_form_keeps_the_other_filters(admin_client):
    page = admin_client.get(TASKS, {"state__exact": "failed", "queue": "default"})
    form = page.context["pgqueue_search"]
    assert ("state__exact", "failed") in form["kept"] and ("queue", "default") in form["kept"]


# -- bulk actions on every match ------------------------------------------------------


def select_all(client, action: str, query: str = "", **extra):
    return client.post(
        f"{TASKS}?{query}",
        # As the list's "Select all N" sends it: the page's ids, and select_across.
        {"action": action, "select_across": "1", "index": "0", "_selected_action": "1", **extra},
        follow=True,
    )


def test_select_all_shows_the_count_first_and_changes_nothing(admin_client):
    dead = [
        TaskFactory(state="failed", attempt=3, finished_at=ago(minutes=1), queue="q1")
        for _ in range(3)
    ]
    TaskFactory(state="succeeded", finished_at=ago(minutes=1), queue="q1")
    TaskFactory(state="failed", attempt=3, finished_at=ago(minutes=1), queue="q2")

    page = select_all(admin_client, "retry_now", "queue=q1")

    assert page.templates[0].name == "admin/django_pgqueue/task/bulk_confirm.html"
    assert (page.context["count"], page.context["others"]) == (3, 1)
    assert page.context["upto"] == max(t.pk for t in dead)
    assert Task.objects.filter(state="failed").count() == 4


def test_a_confirmed_bulk_retry_works_in_batches_and_skips_running_and_newer_tasks(
    admin_client, monkeypatch
):
    monkeypatch.setattr(bulk, "BATCH_SIZE", 2)
    dead = [
        TaskFactory(state="failed", attempt=3, finished_at=ago(minutes=1), kwargs={"o": 1})
        for _ in range(5)
    ]
    page = select_all(admin_client, "retry_now", "kwargs=%7B%22o%22%3A+1%7D")
    upto = page.context["upto"]
    # Meanwhile: a worker claimed one (it runs now); a new dead letter appears.
    Task.objects.filter(pk=dead[0].pk).update(
        state="running", lease_token=uuid.uuid4(), lease_expires_at=timezone.now()
    )
    later = TaskFactory(state="failed", attempt=3, finished_at=ago(minutes=1), kwargs={"o": 1})

    done = select_all(
        admin_client,
        "retry_now",
        "kwargs=%7B%22o%22%3A+1%7D",
        pgqueue_confirm="yes",
        pgqueue_upto=upto,
    )

    states = dict(Task.objects.values_list("pk", "state"))
    assert [states[t.pk] for t in dead] == ["running"] + ["pending"] * 4
    assert states[later.pk] == "failed"
    assert any("4 tasks done in 2 batches of up to 2" in m for m in messages_of(done))
    assert LogEntry.objects.filter(change_message="Retried now (bulk).").count() == 4


def test_a_bulk_delete_needs_the_delete_permission(staff_client):
    for _ in range(3):
        TaskFactory(state="succeeded", finished_at=ago(minutes=1))
    client = staff_client("view_task", "change_task")

    refused = select_all(client, "delete", pgqueue_confirm="yes", pgqueue_upto=2**40)

    assert Task.objects.count() == 3
    assert any("No action selected" in m for m in messages_of(refused))


def test_a_bulk_delete_with_the_permission_leaves_live_tasks(admin_client):
    for _ in range(3):
        TaskFactory(state="succeeded", finished_at=ago(minutes=1))
    live = TaskFactory(state="pending")
    upto = select_all(admin_client, "delete").context["upto"]

    select_all(admin_client, "delete", pgqueue_confirm="yes", pgqueue_upto=upto)

    assert list(Task.objects.values_list("pk", flat=True)) == [live.pk]


def test_a_bulk_cancel_ends_pending_tasks_and_asks_running_ones_to_stop(admin_client):
    pending = TaskFactory(state="pending", queue="q")
    running = TaskFactory(
        state="running", queue="q", lease_token=uuid.uuid4(), lease_expires_at=timezone.now()
    )
    upto = select_all(admin_client, "cancel", "queue=q").context["upto"]

    select_all(admin_client, "cancel", "queue=q", pgqueue_confirm="yes", pgqueue_upto=upto)

    pending.refresh_from_db()
    running.refresh_from_db()
    assert pending.state == "cancelled"
    assert (running.state, running.cancel_requested) == ("running", True)


def test_a_bulk_requeue_gives_the_matching_dead_letters_fresh_attempts(admin_client):
    dead = [TaskFactory(state="failed", attempt=3, finished_at=ago(minutes=1)) for _ in range(2)]
    upto = select_all(admin_client, "requeue").context["upto"]
    select_all(admin_client, "requeue", pgqueue_confirm="yes", pgqueue_upto=upto)
    rows = Task.objects.filter(pk__in=[t.pk for t in dead])
    assert set(rows.values_list("state", "attempt")) == {("pending", 0)}


def test_a_user_who_may_only_view_cannot_run_a_bulk_action(staff_client):
    TaskFactory(state="failed", attempt=3, finished_at=ago(minutes=1))
    client = staff_client("view_task")

    page = select_all(client, "retry_now", pgqueue_confirm="yes", pgqueue_upto=2**40)

    assert Task.objects.get().state == "failed"
    assert page.templates[0].name != "admin/django_pgqueue/task/bulk_confirm.html"


# -- enqueue from the admin -----------------------------------------------------------


@pytest.mark.parametrize("codenames", [("view_task", "change_task"), ("view_task", "add_task")])
def test_enqueue_needs_a_permission_of_its_own_not_add_task(staff_client, codenames):
    # add_task is Django's "can add task": granting it must not hand out running any
    # registered task with any arguments, queue and priority.
    client = staff_client(*codenames)
    assert client.get(ENQUEUE).status_code == 403
    assert client.post(ENQUEUE, {"task": "tests.tasks.noop@1"}).status_code == 403
    assert "pgqueue-enqueue-link" not in client.get(TASKS).content.decode()
    assert Task.objects.count() == 0


def test_an_operator_enqueues_a_registered_task_with_json_arguments(staff_client):
    client = staff_client("view_task", "enqueue_task")
    assert "pgqueue-enqueue-link" in client.get(TASKS).content.decode()

    page = client.post(
        ENQUEUE,
        {"task": "tests.tasks.record@1", "args": "", "kwargs": '{"label": "from ops"}',
         "priority": "5"},
        follow=True,
    )  # fmt: skip

    task = Task.objects.get()
    assert (task.task_name, task.args, task.kwargs, task.priority) == (
        "tests.tasks.record",
        [],
        {"label": "from ops"},
        5,
    )
    assert task.metadata["enqueued_by"] == "admin:operator"
    assert f"as task #{task.pk}" in " ".join(messages_of(page))
    assert LogEntry.objects.get(action_flag=ADDITION).object_id == str(task.pk)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"task": "tests.tasks.noop@1", "args": "[1, 2, 3]"}, "do not fit"),
        ({"task": "tests.tasks.noop@1", "kwargs": '{"m": 1}'}, "do not fit"),
        ({"task": "tests.tasks.noop@1", "args": "[1,"}, "args is not JSON"),
        ({"task": "tests.tasks.noop@1", "args": '{"n": 1}'}, "must be a JSON array"),
        ({"task": "tests.tasks.noop@1", "kwargs": "[1]"}, "must be a JSON object"),
        ({"task": "tests.tasks.noop@1", "args": '["a\\u0000b"]'}, "NUL"),
        ({"task": "os.system@1", "args": '["rm"]'}, "Select a valid choice"),
        ({"task": "tests.tasks.noop@1", "queue": "bad\x00queue"}, "Null characters"),
    ],
)
def test_enqueue_refuses_what_enqueue_refuses_and_writes_nothing(admin_client, data, error):
    page = admin_client.post(ENQUEUE, data)

    assert page.status_code == 200
    assert error in page.content.decode()
    assert Task.objects.count() == 0


# -- the overview ---------------------------------------------------------------------


def test_the_overview_data_endpoint_returns_each_rows_counts(staff_client):
    Worker.objects.create(
        id="w", hostname="h", pid=1, concurrency=2, queues=["default"],
        routes=[["tests.tasks.noop", 1]],
    )  # fmt: skip
    for _ in range(3):
        TaskFactory(run_at=ago(seconds=30))
    TaskFactory(state="failed", attempt=3, finished_at=ago(minutes=1))

    data = staff_client("view_task").get(DATA).json()

    row = data["rows"]["default|default|tests.tasks.noop|1"]
    assert (row["pending_routable"], row["failed"], row["why"]) == (3, 1, "")
    assert data["queues"]["default|default||"]["pending_routable"] == 3
    assert (data["totals"]["due"], data["totals"]["workers"], data["totals"]["slots"]) == (3, 1, 2)


def test_the_overview_data_endpoint_is_refused_without_view_task(staff_client):
    assert staff_client("view_worker").get(DATA).status_code == 403


def test_a_paused_queue_without_live_workers_shows_paused_not_unroutable(admin_client):
    for _ in range(2):
        TaskFactory(run_at=ago(seconds=30), queue="nightly", task_name="shop.reports.tasks.build")
    operations.pause("nightly")

    data = admin_client.get(DATA).json()
    row = data["rows"]["default|nightly|shop.reports.tasks.build|1"]
    assert (row["pending_unroutable"], row["pending_routable"], row["throttled"]) == (0, 2, 2)
    assert row["why"] == "paused"
    page = admin_client.get(OVERVIEW).content.decode()
    assert 'data-count="pending_unroutable" data-alert' in page
    assert "waits: <span>paused</span>" in page


def test_an_unpaused_queue_without_live_workers_says_its_tasks_wait_for_a_worker(admin_client):
    TaskFactory(run_at=ago(seconds=30), queue="nightly")
    row = admin_client.get(DATA).json()["rows"]["default|nightly|tests.tasks.noop|1"]
    assert row["pending_unroutable"] == 1
    assert row["why"] == "no live worker has this task and version"


def test_long_dotted_task_names_are_shortened_at_a_dot_keeping_the_last_part():
    assert short_name("tests.tasks.noop") == "tests.tasks.noop"
    assert short_name("shop.orders.tasks.sync_order_with_the_erp") == "…sync_order_with_the_erp"
    assert short_name("company.shop.orders.tasks.sync") == "…shop.orders.tasks.sync"


# -- the unfiltered list's count --------------------------------------------------------


def _fill_and_analyze(n: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_task (task_name, state) "
            "SELECT 'tests.tasks.noop', 'succeeded' FROM generate_series(1, %s)",
            [n],
        )
        cursor.execute("ANALYZE pgqueue_task")


def _counts_of_tasks(queries) -> list[str]:
    return [
        q["sql"] for q in queries if "COUNT(*)" in q["sql"].upper() and "pgqueue_task" in q["sql"]
    ]


@override_settings(PGQUEUE={"ADMIN_COUNT_ESTIMATE_ABOVE": 100})
def test_the_unfiltered_list_of_a_large_table_shows_the_estimate_without_counting(
    admin_client,
):
    _fill_and_analyze(300)
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["task_count_estimate"])
        (estimate,) = cursor.fetchone()

    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(TASKS)

    assert page.status_code == 200
    cl = page.context["cl"]
    assert cl.paginator.estimated
    assert cl.result_count == estimate and 200 < estimate < 400
    assert _counts_of_tasks(queries) == []
    assert f"about {estimate} tasks" in page.content.decode()
    assert len(cl.result_list) == 100  # the first page, newest first
    assert cl.result_list[0].pk == Task.objects.order_by("-pk").first().pk


@override_settings(PGQUEUE={"ADMIN_COUNT_ESTIMATE_ABOVE": 100})
def test_a_filtered_list_is_counted_exactly(admin_client):
    _fill_and_analyze(300)
    TaskFactory.create_batch(3, state="failed")

    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(TASKS, {"state__exact": "failed"})

    cl = page.context["cl"]
    assert not cl.paginator.estimated
    assert cl.result_count == 3
    assert len(_counts_of_tasks(queries)) == 1
    assert "about" not in page.content.decode().split('class="paginator"')[1]


@pytest.mark.parametrize("above", [None, 1_000_000])
def test_a_table_below_the_setting_or_with_it_off_is_counted_exactly(admin_client, above):
    _fill_and_analyze(300)

    with override_settings(PGQUEUE={"ADMIN_COUNT_ESTIMATE_ABOVE": above}):
        page = admin_client.get(TASKS)

    cl = page.context["cl"]
    assert not cl.paginator.estimated
    assert cl.result_count == Task.objects.count() == 300
