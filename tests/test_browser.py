"""The admin in a real browser: Debian's headless Chromium, driven by Playwright.

No browser is downloaded: Playwright drives /usr/bin/chromium (``.ci/run`` installs the
Debian package). Screenshots go to test-artifacts/ (gitignored).
"""

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.db import connections
from django.utils import timezone

from django_pgqueue.models import Task, Worker
from tests.conftest import ARTIFACTS
from tests.factories import TaskFactory

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def browser_context(tmp_path, monkeypatch):
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls the test
    # makes between browser steps are still plain synchronous calls.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            user_data_dir=str(tmp_path / "chromium-profile"),  # fresh, empty
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        context.set_default_timeout(15_000)
        try:
            yield context
        finally:
            context.close()
            # ORM calls made while Playwright's loop runs get connections of their own
            # (Django keys connections by context, not only by thread): close them, or
            # they outlive the test and keep the test database from being dropped.
            connections.close_all()


def make_staff(django_user_model, username: str, *codenames: str):
    user = django_user_model.objects.create_user(username, password="s3cret-pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_pgqueue", codename__in=codenames)
    )
    return user


def log_in(page, base_url: str, username: str) -> None:
    page.goto(f"{base_url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", "s3cret-pw")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base_url}/admin/")


def cell(page, task_name: str, count: str) -> int:
    selector = f'tr[data-task="{task_name}"] td[data-count="{count}"]'
    return int(page.inner_text(selector).strip())


def test_staff_see_the_overview_match_the_rows_retry_a_dead_task_and_others_are_refused(
    live_server, browser_context, django_user_model
):
    make_staff(django_user_model, "operator", "view_task", "change_task")
    make_staff(django_user_model, "outsider")
    Worker.objects.create(
        id="browser-worker",
        hostname="ci",
        pid=1,
        concurrency=4,
        queues=["default"],
        routes=[["tests.tasks.noop", 1]],
    )
    past = timezone.now() - timedelta(minutes=3)
    TaskFactory.create_batch(3, run_at=past)
    TaskFactory.create_batch(2, task_name="billing.charge", run_at=past)
    TaskFactory.create_batch(2, run_at=timezone.now() + timedelta(hours=1))
    TaskFactory(state="succeeded", finished_at=timezone.now(), last_attempted_at=past)
    dead = TaskFactory(
        state="failed",
        attempt=3,
        finished_at=timezone.now(),
        errors=[
            {
                "attempt": 3,
                "type": "builtins.ValueError",
                "message": "card declined",
                "traceback": "Traceback (most recent call last):\nValueError: card declined\n",
            }
        ],
    )
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser_context.new_page()

    # The operator opens the overview from the admin index.
    log_in(page, live_server.url, "operator")
    page.click("text=Queue overview")
    page.wait_for_selector("#pgqueue-overview")
    page.screenshot(path=str(ARTIFACTS / "admin-queue-overview.png"), full_page=True)

    # The numbers are the rows'.
    due = Task.objects.filter(state="pending", run_at__lte=timezone.now())
    assert (
        cell(page, "tests.tasks.noop", "pending_routable")
        == due.filter(task_name="tests.tasks.noop").count()
    )
    assert (
        cell(page, "billing.charge", "pending_unroutable")
        == due.filter(task_name="billing.charge").count()
    )
    assert (
        cell(page, "tests.tasks.noop", "scheduled")
        == Task.objects.filter(state="scheduled", run_at__gt=timezone.now()).count()
    )
    assert cell(page, "tests.tasks.noop", "failed") == Task.objects.filter(state="failed").count()
    assert cell(page, "tests.tasks.noop", "completed_1h") == 1
    assert page.is_visible("#pgqueue-chart")

    # From the dead count to the dead task and its readable error; back, and "retry now".
    page.click('tr[data-task="tests.tasks.noop"] td[data-count="failed"] a')
    page.click(f'#result_list a:text-is("{dead.pk}")')
    assert "ValueError: card declined" in page.inner_text(".pgqueue-traceback")
    page.go_back()
    page.check(f'input[name="_selected_action"][value="{dead.pk}"]')
    page.select_option('select[name="action"]', "retry_now")
    page.click('button[name="index"]')
    page.wait_for_selector("ul.messagelist")
    assert "Retried 1 task." in page.inner_text("ul.messagelist")
    page.screenshot(path=str(ARTIFACTS / "admin-task-retried.png"), full_page=True)
    dead.refresh_from_db()
    assert (dead.state, dead.finished_at) == ("pending", None)

    # A staff user without the task permissions is refused.
    browser_context.clear_cookies()
    log_in(page, live_server.url, "outsider")
    response = page.goto(f"{live_server.url}/admin/django_pgqueue/queueoverview/")
    assert response.status == 403
    page.screenshot(path=str(ARTIFACTS / "admin-refused.png"))


def test_an_operator_pauses_a_queue_from_the_overview_and_its_tasks_show_as_throttled(
    live_server, browser_context, django_user_model
):
    make_staff(django_user_model, "pauser", "view_task", "pause_queue")
    Worker.objects.create(
        id="browser-worker",
        hostname="ci",
        pid=1,
        concurrency=4,
        queues=["default", "limited"],
        routes=[["tests.tasks.noop", 1]],
    )
    TaskFactory.create_batch(3, run_at=timezone.now() - timedelta(minutes=3))
    TaskFactory(queue="limited", state="running", attempt=1, last_attempted_at=timezone.now())
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser_context.new_page()
    log_in(page, live_server.url, "pauser")
    page.goto(f"{live_server.url}/admin/django_pgqueue/queueoverview/")

    page.click('tr.pgqueue-queue[data-queue="default"] button:text-is("Pause queue")')

    page.wait_for_selector("ul.messagelist")
    assert "Paused queue default." in page.inner_text("ul.messagelist")
    queue_row = page.inner_text('tr.pgqueue-queue[data-queue="default"]')
    assert "paused since" in queue_row and "Resume queue" in queue_row
    assert cell(page, "tests.tasks.noop", "throttled") == 3
    assert "concurrency 3 (1 running)" in page.inner_text('tr[data-queue="limited"]')
    page.screenshot(path=str(ARTIFACTS / "admin-queue-paused.png"), full_page=True)
