"""PGQUEUE['ADMIN_SHOW_PAYLOADS']: the admin's task pages show or hide what the tasks'
code put in a row (docs/security.md), for a staff user as for a superuser."""

import pytest
from django.contrib.auth.models import Permission
from django.db.models import JSONField
from django.test import override_settings
from django.urls import reverse

from django_pgqueue import add_schedule
from django_pgqueue.admin.common import PAYLOAD_FIELDS, RECORD_FIELDS
from django_pgqueue.models import Schedule, Task
from tests import periodic_tasks
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

SECRET = "ann.secret@example.com"
PAYLOADS = {
    "args": [SECRET],
    "kwargs": {"email": SECRET},
    "result": {"sent_to": SECRET},
    "checkpoint": {"last": SECRET},
    "progress": {"at": SECRET},
}


@pytest.fixture
def operator(client, django_user_model):
    """A staff user who may view tasks, logged in."""
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_pgqueue", codename="view_task")
    )
    client.force_login(user)
    return client


def pages(client, task) -> list[str]:
    """The task list and the task's page, as HTML."""
    listing = client.get(reverse("admin:django_pgqueue_task_changelist"))
    detail = client.get(reverse("admin:django_pgqueue_task_change", args=[task.pk]))
    assert listing.status_code == detail.status_code == 200
    return [listing.content.decode(), detail.content.decode()]


def test_by_default_the_task_page_shows_args_kwargs_result_checkpoint_and_progress(operator):
    # given: a finished task whose row holds an email address everywhere
    task = TaskFactory(state="succeeded", **PAYLOADS)

    # when: a staff operator opens its page
    _, detail = pages(operator, task)

    # then: each payload is shown (as JSON)
    assert detail.count(SECRET) == len(PAYLOADS)


def test_with_admin_show_payloads_false_no_page_shows_them(operator):
    # given: the same task, woken by a signal whose payload is the address, and
    # payloads hidden
    task = TaskFactory(
        state="pending",
        signals={"approved": SECRET},
        wake={"reason": "signal", "signal": "approved", "payload": SECRET},
        **PAYLOADS,
    )

    with override_settings(PGQUEUE={"ADMIN_SHOW_PAYLOADS": False}):
        # when: the operator opens the list and the task's page
        listing, detail = pages(operator, task)

    # then: the address is on neither; the page says the fields are hidden, and why;
    # what woke the task is still said, without the signal's payload
    assert SECRET not in listing
    assert SECRET not in detail
    assert task.task_name in listing
    # + the signals, + the wake-up's payload
    assert detail.count('class="pgqueue-hidden quiet"') == len(PAYLOADS) + 2
    assert "ADMIN_SHOW_PAYLOADS" in detail
    assert "&quot;signal&quot;: &quot;approved&quot;" in detail


def test_every_json_column_of_a_task_is_a_payload_or_the_queues_record():
    # A new JSON column must be sorted into one (admin/common.py): a payload is hidden
    # with ADMIN_SHOW_PAYLOADS = False and not searched; the record is always shown.
    columns = {f.name for f in Task._meta.get_fields() if isinstance(f, JSONField)}

    assert columns == PAYLOAD_FIELDS | RECORD_FIELDS
    assert not PAYLOAD_FIELDS & RECORD_FIELDS


@pytest.mark.parametrize(("field", "term"), [("args", f'["{SECRET}"]'),
                                             ("kwargs", f'{{"email": "{SECRET}"}}')])  # fmt: skip
def test_with_payloads_hidden_a_search_by_arguments_finds_nothing_and_says_why(
    operator, field, term
):
    # given: a task whose arguments hold the address, and payloads hidden
    task = TaskFactory(**PAYLOADS)
    changelist = reverse("admin:django_pgqueue_task_changelist")

    # when: a user who may only view tasks searches the arguments for it
    with override_settings(PGQUEUE={"ADMIN_SHOW_PAYLOADS": False}):
        response = operator.get(changelist, {field: term})

    # then: the search is refused, so it cannot confirm what the page hides, and the
    # form offers no such field
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []
    [message] = [str(m) for m in response.context["messages"]]
    assert "not searched while payloads are hidden" in message
    fields = [f["name"] for f in response.context["pgqueue_search"]["fields"]]
    assert fields == ["metadata"]
    # while with payloads shown, the same search finds the task
    response = operator.get(changelist, {field: term})
    assert [t.pk for t in response.context["cl"].result_list] == [task.pk]


@pytest.mark.parametrize("lookup", ["args__contains", "kwargs__email", "result__sent_to",
                                    "signals__approved", "args__0"])  # fmt: skip
def test_with_payloads_hidden_no_field_lookup_in_the_url_filters_by_a_payload(
    operator, lookup
):
    TaskFactory(signals={"approved": SECRET}, **PAYLOADS)
    changelist = reverse("admin:django_pgqueue_task_changelist")

    with override_settings(PGQUEUE={"ADMIN_SHOW_PAYLOADS": False}):
        response = operator.get(f"{changelist}?{lookup}={SECRET}")

    assert response.status_code == 400  # Django: a lookup the admin does not offer


def test_with_payloads_hidden_no_field_lookup_filters_schedules_by_their_arguments(
    admin_client, secret_schedule
):
    changelist = reverse("admin:django_pgqueue_schedule_changelist")

    with override_settings(PGQUEUE={"ADMIN_SHOW_PAYLOADS": False}):
        response = admin_client.get(f"{changelist}?definition__args__0={SECRET}")

    assert response.status_code == 400


@pytest.fixture
def secret_schedule():
    add_schedule("mailer", periodic_tasks.beat.name, every=60, args=[SECRET],
                 kwargs={"email": SECRET})  # fmt: skip
    return reverse("admin:django_pgqueue_schedule_change", args=["mailer"])


def staff_with(client, django_user_model, *codenames: str):
    user = django_user_model.objects.create_user("scheduler", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


def test_with_payloads_hidden_a_schedules_page_hides_its_arguments(
    client, django_user_model, secret_schedule
):
    viewer = staff_with(client, django_user_model, "view_schedule")

    with override_settings(PGQUEUE={"ADMIN_SHOW_PAYLOADS": False}):
        page = viewer.get(secret_schedule).content.decode()

    assert SECRET not in page
    assert page.count('class="pgqueue-hidden quiet"') == 2  # args, kwargs
    assert periodic_tasks.beat.name in page  # the rest of the definition is shown
    assert SECRET in viewer.get(secret_schedule).content.decode()  # shown by default


def test_with_payloads_hidden_a_schedules_change_form_hides_its_arguments_and_keeps_them(
    client, django_user_model, secret_schedule
):
    editor = staff_with(client, django_user_model, "view_schedule", "change_schedule")

    with override_settings(PGQUEUE={"ADMIN_SHOW_PAYLOADS": False}):
        form = editor.get(secret_schedule).content.decode()
        response = editor.post(secret_schedule, {
            "task": periodic_tasks.beat.name, "cron": "", "every": "120", "timezone": "UTC",
            "args": "", "kwargs": "", "missed": "once", "catch_up_limit": "10",
        })  # fmt: skip

    assert SECRET not in form
    assert response.status_code == 302
    definition = Schedule.objects.get(pk="mailer").definition
    assert (definition["every"], definition["args"]) == (120, [SECRET])
    assert definition["kwargs"] == {"email": SECRET}


def test_hiding_payloads_holds_for_a_superuser_too(admin_client):
    task = TaskFactory(state="succeeded", **PAYLOADS)

    with override_settings(PGQUEUE={"ADMIN_SHOW_PAYLOADS": False}):
        listing, detail = pages(admin_client, task)

    assert SECRET not in listing + detail
