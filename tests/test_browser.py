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


@pytest.mark.slow  # long: run by CI's slow step, not the README's command
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


@pytest.mark.slow
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


# -- the admin for operators: fit, refresh in place, search, bulk ---------------------

WINDOW_WIDTH = 1400
LONG_NAME = "shop.integrations.erp.orders.tasks.synchronise_order_with_the_erp"


def assert_fits(page, what: str) -> None:
    """The page scrolls no wider than the window, and no list hides its right-hand
    columns in its own scroll box."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= WINDOW_WIDTH, f"{what}: the page is {width} px wide"
    clipped = page.evaluate(
        "Array.from(document.querySelectorAll('#changelist .results, .module:has(> table)'))"
        ".filter(el => el.scrollWidth > el.clientWidth + 1)"
        ".map(el => (el.id || el.className) + ': ' + el.scrollWidth + ' > ' + el.clientWidth)"
    )
    columns = page.evaluate(
        "Array.from(document.querySelectorAll('#result_list thead th'))"
        ".map(th => th.innerText.trim() + ' ' + th.offsetWidth)"
    )
    assert clipped == [], f"{what}: {clipped}; columns: {columns}"


@pytest.mark.slow
def test_every_admin_page_fits_a_1400px_window_with_long_names_and_pauses(
    live_server, browser_context, django_user_model
):
    from django_pgqueue.models import Schedule
    from django_pgqueue.ops import operations

    django_user_model.objects.create_superuser("root", password="s3cret-pw")
    Worker.objects.create(
        id="browser-worker-with-a-long-id-0123456789",
        hostname="worker-host-with-a-long-name.internal.example.com",
        pid=12345,
        concurrency=16,
        queues=["default", "emails", "reports-and-exports"],
        routes=[["tests.tasks.noop", 1], [LONG_NAME, 3], ["billing.tasks.charge_customer", 2]],
    )
    past = timezone.now() - timedelta(minutes=3)
    for queue in ("default", "emails", "reports-and-exports"):
        kwargs = {"order_id": 42, "customer": "c" * 40}
        TaskFactory.create_batch(
            2, queue=queue, task_name=LONG_NAME, handler_version=3, run_at=past, kwargs=kwargs
        )
        error = {"attempt": 3, "type": "ConnectionError", "message": "x " * 300}
        TaskFactory(queue=queue, state="failed", finished_at=timezone.now(), attempt=3,
                    task_name=LONG_NAME, handler_version=3, unique_key="k" * 200,
                    errors=[error])  # fmt: skip
    TaskFactory.create_batch(2, queue="nightly-exports", task_name=LONG_NAME, run_at=past)
    operations.pause("nightly-exports")  # and no worker serves it
    TaskFactory(state="waiting", wait_reason="signal", wait_signal="approved-by-finance")
    Schedule.objects.create(name="nightly-export-of-every-order-for-the-erp", task_name=LONG_NAME,
                            spec="0 3 * * *", timezone="Europe/Amsterdam")  # fmt: skip
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser_context.new_page()
    log_in(page, live_server.url, "root")
    base = f"{live_server.url}/admin/django_pgqueue"
    task = Task.objects.filter(state="failed").first()
    for name, url in [
        ("admin index", f"{live_server.url}/admin/"),
        ("overview", f"{base}/queueoverview/"),
        ("task list", f"{base}/task/"),
        ("task list, failed", f"{base}/task/?state__exact=failed"),
        ("task list, search", f'{base}/task/?kwargs={{"order_id":42}}'),
        ("task page", f"{base}/task/{task.pk}/change/"),
        ("enqueue", f"{base}/task/enqueue/"),
        ("workers", f"{base}/worker/"),
        ("schedules", f"{base}/schedule/"),
    ]:
        page.goto(url)
        page.screenshot(path=str(ARTIFACTS / f"admin-fit-{name.replace(' ', '-')}.png"),
                        full_page=True)  # fmt: skip
        assert_fits(page, name)

    # The overview: a paused queue with no worker reads paused, not unroutable (red).
    page.goto(f"{base}/queueoverview/")
    row = 'tr.pgqueue-task[data-queue="nightly-exports"]'
    assert page.inner_text(f'{row} td[data-count="pending_unroutable"]').strip() == "0"
    assert page.inner_text(f'{row} td[data-count="throttled"]').strip() == "2"
    assert page.inner_text(f"{row} .pgqueue-why").strip() == "waits: paused"
    assert page.eval_on_selector_all(f"{row} td.alert", "els => els.length") == 0
    # Long dotted names are shortened, the full name on hover.
    link = page.locator(f"{row} td.pgqueue-task-name a")
    assert link.inner_text().startswith("…") and link.get_attribute("title") == LONG_NAME


@pytest.mark.slow
def test_the_overview_refreshes_its_counts_in_place_without_reloading(
    live_server, browser_context, django_user_model
):
    make_staff(django_user_model, "watcher", "view_task")
    Worker.objects.create(id="w", hostname="ci", pid=1, concurrency=4, queues=["default"],
                          routes=[["tests.tasks.noop", 1]])  # fmt: skip
    TaskFactory(run_at=timezone.now() - timedelta(minutes=1))
    page = browser_context.new_page()
    log_in(page, live_server.url, "watcher")
    page.goto(f"{live_server.url}/admin/django_pgqueue/queueoverview/?refresh=2")
    assert cell(page, "tests.tasks.noop", "pending_routable") == 1
    page.evaluate("window.pgqueueNotReloaded = true")
    polls = []
    page.on("request", lambda r: polls.append(r.url) if "/queueoverview/data/" in r.url else None)

    TaskFactory.create_batch(2, run_at=timezone.now() - timedelta(minutes=1))
    page.wait_for_function(
        """() => document.querySelector(
            'tr[data-task="tests.tasks.noop"] td[data-count="pending_routable"]'
        ).innerText.trim() === "3" """,
        timeout=15_000,
    )

    assert page.evaluate("window.pgqueueNotReloaded") is True  # the same page, updated
    assert page.inner_text("#pgqueue-total-due").strip() == "3"
    assert polls
    page.click("#pgqueue-refresh-toggle")
    assert "paused" in page.inner_text("#pgqueue-refresh-status")


@pytest.mark.slow
def test_an_operator_searches_by_kwargs_and_retries_every_match_after_the_count(
    live_server, browser_context, django_user_model
):
    make_staff(django_user_model, "operator", "view_task", "change_task")
    dead = dict(state="failed", attempt=3, finished_at=timezone.now())
    # More matches than a page shows (100), so that "Select all 105" is offered.
    matches = Task.objects.bulk_create(
        Task(task_name="tests.tasks.noop", kwargs={"order_id": 42, "n": n}, **dead)
        for n in range(105)
    )
    TaskFactory(kwargs={"order_id": 43}, **dead)
    page = browser_context.new_page()
    log_in(page, live_server.url, "operator")
    page.goto(f"{live_server.url}/admin/django_pgqueue/task/")

    page.fill('#pgqueue-content-search input[name="kwargs"]', '{"order_id": 42}')
    page.click('#pgqueue-content-search input[type="submit"]')
    page.wait_for_selector("#pgqueue-search-window")
    ids = {int(a) for a in page.locator("#result_list tbody th a").all_inner_texts()}
    assert ids == {t.pk for t in matches[-100:]}  # the newest first
    assert "Searched tasks #1 to" in page.inner_text("#pgqueue-search-window")

    # Select every match, retry: a count to confirm first, then the work.
    page.check("#action-toggle")
    page.click("div.actions span.question a")  # "Select all 105 tasks"
    page.select_option('select[name="action"]', "retry_now")
    page.click('button[name="index"]')
    page.wait_for_selector("#pgqueue-bulk-count")
    assert page.get_attribute("#pgqueue-bulk-count", "data-count") == "105"
    assert Task.objects.filter(state="failed").count() == 106  # nothing yet
    page.screenshot(path=str(ARTIFACTS / "admin-bulk-confirm.png"), full_page=True)
    assert_fits(page, "bulk confirmation")
    page.click("#pgqueue-bulk-confirm")
    page.wait_for_selector("ul.messagelist")
    assert "105 tasks done in 1 batch" in page.inner_text("ul.messagelist")
    retried = Task.objects.filter(pk__in=[t.pk for t in matches])
    assert set(retried.values_list("state", flat=True)) == {"pending"}
    assert Task.objects.filter(state="failed").count() == 1
