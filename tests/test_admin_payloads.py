"""PGQUEUE['ADMIN_SHOW_PAYLOADS']: the admin's task pages show or hide what the tasks'
code put in a row (docs/security.md), for a staff user as for a superuser."""

import pytest
from django.contrib.auth.models import Permission
from django.test import override_settings
from django.urls import reverse

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
    # given: the same task, and payloads hidden
    task = TaskFactory(state="succeeded", signals={"approved": SECRET}, **PAYLOADS)

    with override_settings(PGQUEUE={"ADMIN_SHOW_PAYLOADS": False}):
        # when: the operator opens the list and the task's page
        listing, detail = pages(operator, task)

    # then: the address is on neither; the page says the fields are hidden, and why
    assert SECRET not in listing
    assert SECRET not in detail
    assert task.task_name in listing
    assert detail.count('class="pgqueue-hidden') == len(PAYLOADS) + 1  # + the signals
    assert "ADMIN_SHOW_PAYLOADS" in detail


def test_hiding_payloads_holds_for_a_superuser_too(admin_client):
    task = TaskFactory(state="succeeded", **PAYLOADS)

    with override_settings(PGQUEUE={"ADMIN_SHOW_PAYLOADS": False}):
        listing, detail = pages(admin_client, task)

    assert SECRET not in listing + detail
