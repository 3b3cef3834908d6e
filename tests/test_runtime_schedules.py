"""Schedules at runtime (docs/periodic.md, "Schedules at runtime"): add_schedule and the
others validated and written in the caller's transaction, the database's refusals
(paused, resumed, changed), real worker processes picking up additions, changes,
pauses and removals without a restart, and the previous release's statements against
the new columns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO
from itertools import pairwise

import psycopg
import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import transaction
from django.urls import reverse

from django_pgqueue import (
    InvalidScheduleError,
    InvalidTaskError,
    ScheduleDoesNotExist,
    add_schedule,
    pause_schedule,
    remove_schedule,
    resume_schedule,
    task,
    update_schedule,
)
from django_pgqueue.core.ticks import Every
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Schedule, Task
from django_pgqueue.tasking.periodic import run_now, schedules
from django_pgqueue.tasking.registry import registry
from django_pgqueue.worker.scheduler import tick_params
from tests import periodic_tasks
from tests.conftest import wait_until
from tests.test_periodic import db_now, declare, enqueue_tick, see, tick_tasks, ticks_of

__all__ = ["declare"]  # a fixture of test_periodic, used here

BEAT = periodic_tasks.beat.name
POLL_INTERVAL = 0.5  # tests/settings.py
# How late a worker may take in a change on a loaded test machine: one POLL_INTERVAL,
# plus a second of slack (the assertion is that it needs no restart, not a speed).
TAKE_IN = timedelta(seconds=POLL_INTERVAL + 1.5)


@pytest.fixture
def only_here():
    """A task registered in the test process only: the worker subprocesses do not have
    it (their TASK_MODULES lack it). Forgotten after the test."""

    @task(name="tests.only_in_the_test_process")
    def only_in_the_test_process() -> None: ...

    yield only_in_the_test_process
    registry.unregister("tests.only_in_the_test_process")


def rows() -> dict[str, Schedule]:
    return {row.name: row for row in Schedule.objects.all()}


def a_due_runtime_tick(pg: psycopg.Connection, schedule) -> datetime:
    created = pg.execute(
        "SELECT created_at FROM pgqueue_schedule WHERE name = %s", [schedule.name]
    ).fetchone()[0]
    tick = schedule.next_tick(created)
    wait_until(lambda: db_now(pg) >= tick, timeout=5, message="the tick")
    return tick


# -- the API: validated, written in the caller's transaction ------------------------


@pytest.mark.django_db
def test_add_schedule_writes_the_schedule_and_lists_it_as_a_runtime_schedule():
    add_schedule("nightly", BEAT, cron="0 2 * * *", args=["n"], timezone="Europe/Paris",
                 priority=7, missed="skip")  # fmt: skip

    row = Schedule.objects.get(pk="nightly")
    assert row.definition["task"] == BEAT
    assert (row.definition["cron"], row.definition["args"]) == ("0 2 * * *", ["n"])
    assert (row.definition["queue"], row.definition["priority"]) == ("default", 7)
    assert (row.task_name, row.spec, row.timezone) == (BEAT, "0 2 * * *", "Europe/Paris")
    [listed] = [s for s in schedules() if s["name"] == "nightly"]
    assert (listed["origin"], listed["declared"], listed["paused"]) == ("runtime", False, False)
    assert listed["missed"] == "skip"
    assert listed["next_tick"] is not None


@pytest.mark.django_db(transaction=True)
def test_add_schedule_is_part_of_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        add_schedule("rolled-back", BEAT, every=60)
        raise RuntimeError

    assert not Schedule.objects.filter(pk="rolled-back").exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"task": "os.system", "every": 1}, "'os.system' is not registered"),
        ({"task": BEAT, "cron": "61 * * * *"}, "cron expression '61 \\* \\* \\* \\*'"),
        ({"task": BEAT, "cron": "* * *"}, "must have five fields"),
        ({"task": BEAT, "every": 0.5}, "every must be a number of seconds >= 1"),
        ({"task": BEAT}, "either cron=... or every=..."),
        ({"task": BEAT, "every": 1, "args": [object()]}, "args"),
        ({"task": BEAT, "every": 1, "kwargs": {"label": {1, 2}}}, "kwargs"),
        ({"task": BEAT, "every": 1, "args": "abc"}, "args must be a list or tuple"),
        ({"task": BEAT, "cron": "0 7 * * *", "timezone": "Mars/Olympus"}, "IANA time zone"),
        ({"task": BEAT, "every": 1, "missed": "sometimes"}, "missed='sometimes'"),
        ({"task": BEAT, "every": 1, "priority": "high"}, "priority must be an int"),
        ({"task": BEAT, "every": 1, "queue": "no spaces"}, "not a valid queue name"),
        ({"task": BEAT, "every": 1, "metadata": [1]}, "metadata must be a dict"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error_and_nothing_written(options, message):
    with pytest.raises(InvalidScheduleError, match=message):
        add_schedule("bad", **options)

    assert not Schedule.objects.filter(pk="bad").exists()


@pytest.mark.django_db
def test_an_invalid_schedule_is_an_invalid_task_error():
    with pytest.raises(InvalidTaskError):
        add_schedule("bad", BEAT, every=0)


@pytest.mark.django_db
def test_a_name_is_taken_once(declare):
    add_schedule("taken", BEAT, every=60)
    declare(every=60, name="in-code")

    with pytest.raises(InvalidScheduleError, match="exists already; change it with update"):
        add_schedule("taken", BEAT, every=30)
    with pytest.raises(InvalidScheduleError, match="declared in the code"):
        add_schedule("in-code", BEAT, every=30)
    assert Schedule.objects.get(pk="taken").definition["every"] == 60


@pytest.mark.django_db
def test_update_schedule_replaces_what_it_is_given_and_keeps_the_rest():
    add_schedule("report", BEAT, every=60, args=["a"], priority=3)
    Schedule.objects.filter(pk="report").update(last_tick=datetime(2026, 1, 1, tzinfo=UTC))

    update_schedule("report", cron="*/5 * * * *", args=["b"])

    row = Schedule.objects.get(pk="report")
    assert (row.definition["cron"], row.definition["every"]) == ("*/5 * * * *", None)
    assert (row.definition["args"], row.definition["priority"]) == (["b"], 3)
    assert row.spec == "*/5 * * * *"
    assert row.last_tick is not None  # kept: later ticks count as missed


@pytest.mark.django_db
def test_update_schedule_refuses_bad_input_and_keeps_the_schedule():
    add_schedule("report", BEAT, every=60)

    with pytest.raises(InvalidScheduleError, match="five fields"):
        update_schedule("report", cron="nope")
    with pytest.raises(InvalidScheduleError, match="unknown argument"):
        update_schedule("report", colour="red")

    assert Schedule.objects.get(pk="report").definition["every"] == 60


@pytest.mark.django_db
def test_a_schedule_from_code_cannot_be_changed_or_removed_only_paused(declare):
    declare(every=60, name="from-code")

    with pytest.raises(InvalidScheduleError, match="declared in the code"):
        update_schedule("from-code", every=30)
    with pytest.raises(InvalidScheduleError, match="declared in the code"):
        remove_schedule("from-code")

    pause_schedule("from-code")  # no worker has seen it yet: its row is made, paused
    row = Schedule.objects.get(pk="from-code")
    assert row.paused_at is not None and row.definition is None
    [listed] = [s for s in schedules() if s["name"] == "from-code"]
    assert (listed["origin"], listed["paused"], listed["next_tick"]) == ("code", True, None)
    assert resume_schedule("from-code") is True
    assert Schedule.objects.get(pk="from-code").paused_at is None


@pytest.mark.django_db
def test_unknown_names_raise_schedule_does_not_exist():
    for call in (pause_schedule, resume_schedule, remove_schedule):
        with pytest.raises(ScheduleDoesNotExist, match="no schedule named 'ghost'"):
            call("ghost")
    with pytest.raises(ScheduleDoesNotExist):
        update_schedule("ghost", every=5)


@pytest.mark.django_db
def test_remove_schedule_deletes_a_runtime_schedule():
    add_schedule("gone", BEAT, every=60)

    remove_schedule("gone")

    assert "gone" not in rows()


@pytest.mark.django_db
def test_resume_of_a_running_schedule_says_false():
    add_schedule("running", BEAT, every=60)

    assert resume_schedule("running") is False


@pytest.mark.django_db
def test_run_now_enqueues_a_runtime_schedules_task():
    add_schedule("adhoc", BEAT, every=3600, args=["now"], priority=9)

    task_id = run_now("adhoc")

    task_row = Task.objects.get(pk=task_id)
    assert (task_row.args, task_row.priority) == (["now"], 9)
    assert task_row.metadata == {"schedule": "adhoc", "run_now": True}


@pytest.mark.django_db
def test_status_shows_runtime_schedules_and_which_are_paused():
    add_schedule("hourly", BEAT, cron="0 * * * *")
    add_schedule("halted", BEAT, every=60, paused=True)
    out = StringIO()

    call_command("pgqueue_status", stdout=out)

    lines = {line.split()[0]: line for line in out.getvalue().splitlines() if line.strip()}
    assert lines["halted"].endswith("paused")
    assert "0 * * * *" in lines["hourly"] and not lines["hourly"].endswith("paused")


# -- the database's decision: paused, resumed, changed ------------------------------


def test_a_paused_schedule_enqueues_no_tick_and_says_so(pg):
    schedule = add_schedule("paused", BEAT, every=1)
    tick = a_due_runtime_tick(pg, schedule)
    pause_schedule("paused")

    result = enqueue_tick(pg, schedule, tick)

    assert (result["task_id"], result["row_exists"], result["row_current"]) == (None, True, False)
    assert tick_tasks("paused") == []


def test_a_code_schedules_pause_is_honoured_by_the_database(pg, declare):
    schedule = declare(every=1, name="code-paused")
    tick = schedule.next_tick(see(pg, schedule))
    pause_schedule("code-paused")
    wait_until(lambda: db_now(pg) >= tick, timeout=5)

    assert enqueue_tick(pg, schedule, tick)["task_id"] is None


def test_the_ticks_of_a_pause_are_skipped_after_resume(pg):
    schedule = add_schedule("resumed", BEAT, every=1, missed="all")
    pause_schedule("resumed")
    during = a_due_runtime_tick(pg, schedule)
    resume_schedule("resumed")
    resumed_at = Schedule.objects.get(pk="resumed").resumed_at
    after = schedule.next_tick(resumed_at)
    wait_until(lambda: db_now(pg) >= after, timeout=5)

    assert during < resumed_at
    assert enqueue_tick(pg, schedule, during)["task_id"] is None
    assert enqueue_tick(pg, schedule, after)["task_id"] is not None
    assert ticks_of("resumed") == [after]


def test_a_worker_holding_the_old_version_of_a_changed_schedule_enqueues_nothing(pg):
    old = add_schedule("changed", BEAT, every=1, args=["old"])
    tick = a_due_runtime_tick(pg, old)
    new = update_schedule("changed", args=["new"])

    stale = enqueue_tick(pg, old, tick)
    current = enqueue_tick(pg, new, tick)

    assert (stale["task_id"], stale["row_current"]) == (None, False)
    assert current["task_id"] is not None
    assert [t.args for t in tick_tasks("changed")] == [["new"]]


def test_a_schedule_from_code_does_not_fire_onto_a_runtime_schedule_of_its_name(pg, declare):
    add_schedule("clash", BEAT, every=1, args=["runtime"])
    code = declare(every=1, name="clash", args=["code"])
    tick = a_due_runtime_tick(pg, code)

    assert enqueue_tick(pg, code, tick)["task_id"] is None


# -- the previous release against the new columns ------------------------------------

# The previous release's scheduler statements, verbatim: a worker of that release reads
# the rows of its own schedules by name, and advances them without knowing of pauses
# or definitions.
PREVIOUS_SCHEDULE_STATE = """
SELECT n.name, s.last_tick, s.created_at, now() AS now
  FROM unnest(%(names)s::text[]) AS n(name)
  LEFT JOIN pgqueue_schedule AS s ON s.name = n.name
"""
PREVIOUS_ENQUEUE_TICK = (
    QUERIES["enqueue_tick"]
    .replace(
        """       AND s.paused_at IS NULL
       AND (s.resumed_at IS NULL OR s.resumed_at <= %(tick)s::timestamptz)
       AND s.definition IS NOT DISTINCT FROM %(definition)s::jsonb
""",
        "",
    )
    .replace(
        """       (SELECT EXISTS (SELECT 1 FROM pgqueue_schedule
                        WHERE name = %(name)s::text AND paused_at IS NULL
                          AND definition IS NOT DISTINCT FROM %(definition)s::jsonb))
           AS row_current,
""",
        "",
    )
)


def test_a_previous_release_worker_ticks_its_code_schedules_and_never_sees_runtime_ones(
    pg, declare
):
    assert "definition" not in PREVIOUS_ENQUEUE_TICK  # the three new conditions are out
    code = declare(every=1, name="old-code")
    add_schedule("new-runtime", BEAT, every=1)
    tick = schedule_tick = code.next_tick(see(pg, code))
    wait_until(lambda: db_now(pg) >= schedule_tick, timeout=5)

    state = pg.execute(PREVIOUS_SCHEDULE_STATE, {"names": ["old-code"]}).fetchall()
    params = {k: v for k, v in tick_params(code, tick, "old").items() if k != "definition"}
    [(task_id, *_)] = pg.execute(PREVIOUS_ENQUEUE_TICK, params).fetchall()

    assert [row[0] for row in state] == ["old-code"]
    assert task_id is not None and ticks_of("old-code") == [tick]
    assert tick_tasks("new-runtime") == []


# -- real workers -------------------------------------------------------------------


def first_tick_at_or_after(moment: datetime) -> datetime:
    return Every(1).after(moment - timedelta(microseconds=1))


def commit_time(pg: psycopg.Connection) -> datetime:
    """The database's now() after a change committed (the change is visible from it)."""
    return db_now(pg)


@pytest.mark.slow
def test_a_fleet_picks_up_a_schedule_added_paused_resumed_and_removed_without_a_restart(
    pg, start_worker
):
    workers = [start_worker(wait=False) for _ in range(3)]
    for worker in workers:
        worker.wait_started()

    add_schedule("live", BEAT, every=1, args=["live"])  # autocommit: committed here
    created = Schedule.objects.get(pk="live").created_at
    first = first_tick_at_or_after(created)
    wait_until(lambda: len(ticks_of("live")) >= 4, timeout=10, message="four ticks")

    # Added while the workers ran: from its first tick on, each tick once, no gap.
    ticks = ticks_of("live")
    assert ticks[0] == first
    assert all(later - earlier == timedelta(seconds=1) for earlier, later in pairwise(ticks))
    assert tick_tasks("live")[0].enqueued_at - first < TAKE_IN
    assert len({t.metadata["worker"] for t in tick_tasks("live")}) >= 1

    pause_schedule("live")
    paused = commit_time(pg)
    wait_until(lambda: db_now(pg) > paused + timedelta(seconds=2.5), timeout=10)
    assert [t for t in tick_tasks("live") if t.enqueued_at > paused] == []
    before_resume = len(ticks_of("live"))

    resume_schedule("live")
    resumed_at = Schedule.objects.get(pk="live").resumed_at
    wait_until(
        lambda: len(ticks_of("live")) >= before_resume + 3, timeout=10, message="ticks again"
    )
    after = ticks_of("live")[before_resume:]
    assert after[0] == first_tick_at_or_after(resumed_at)  # the pause's ticks: skipped
    assert all(later - earlier == timedelta(seconds=1) for earlier, later in pairwise(after))

    remove_schedule("live")
    removed = commit_time(pg)
    wait_until(lambda: db_now(pg) > removed + timedelta(seconds=2.5), timeout=10)
    assert [t for t in tick_tasks("live") if t.enqueued_at > removed] == []

    ticks = ticks_of("live")
    assert len(ticks) == len(set(ticks)), "a tick was enqueued twice"
    for worker in workers:
        assert worker.proc.poll() is None


@pytest.mark.slow
def test_a_change_reaches_the_workers_and_no_tick_of_the_old_version_follows_it(pg, start_worker):
    for _ in range(2):
        start_worker(wait=False)
    add_schedule("args", BEAT, every=1, args=["before"])
    wait_until(lambda: tick_tasks("args"), timeout=10, message="a tick")

    update_schedule("args", args=["after"])
    changed = commit_time(pg)
    wait_until(
        lambda: [t for t in tick_tasks("args") if t.enqueued_at > changed],
        timeout=10,
        message="a tick after the change",
    )
    wait_until(lambda: db_now(pg) > changed + timedelta(seconds=2), timeout=10)

    later = [t for t in tick_tasks("args") if t.enqueued_at > changed]
    assert {tuple(t.args) for t in later} == {("after",)}
    assert later[0].enqueued_at - changed < TAKE_IN
    ticks = ticks_of("args")
    assert len(ticks) == len(set(ticks))
    assert all(later - earlier == timedelta(seconds=1) for earlier, later in pairwise(ticks))


@pytest.mark.slow
def test_a_worker_without_the_task_skips_the_schedule_and_says_why(pg, start_worker, only_here):
    worker = start_worker()
    add_schedule("unknown-here", "tests.only_in_the_test_process", every=1)
    add_schedule("known", BEAT, every=1)

    wait_until(lambda: len(tick_tasks("known")) >= 2, timeout=10, message="two ticks")

    assert tick_tasks("unknown-here") == []
    assert (
        "not firing schedule unknown-here: its task 'tests.only_in_the_test_process' "
        "is not registered in this worker"
    ) in worker.log()


# -- the admin ----------------------------------------------------------------------

SCHEDULES = reverse("admin:django_pgqueue_schedule_changelist")
ADD = reverse("admin:django_pgqueue_schedule_add")


def change_url(name: str) -> str:
    return reverse("admin:django_pgqueue_schedule_change", args=[name])


def form_data(**fields) -> dict[str, str]:
    data = dict(name="from-admin", task=BEAT, cron="", every="60", timezone="UTC",
                args='["x"]', kwargs="{}", missed="once", catch_up_limit="10", queue="",
                priority="", max_attempts="", timeout="", metadata="")  # fmt: skip
    return {**data, **fields}


def staff(django_user_model, client, *codenames: str):
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


@pytest.mark.django_db
def test_the_admin_adds_a_runtime_schedule(admin_client):
    response = admin_client.post(ADD, form_data(priority="4"), follow=True)

    assert response.status_code == 200
    row = Schedule.objects.get(pk="from-admin")
    assert (row.definition["every"], row.definition["args"]) == (60, ["x"])
    assert row.definition["priority"] == 4
    html = admin_client.get(SCHEDULES).content.decode()
    assert f'href="{change_url("from-admin")}"' in html and ">runtime<" in html


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cron": "not cron", "every": ""}, "five fields"),
        ({"args": "[1,"}, "not JSON"),
        ({"every": "0.5"}, "every must be a number of seconds"),
        ({"task": "os.system"}, "Select a valid choice"),
        ({"cron": "0 7 * * *"}, "either cron=... or every=..."),
    ],
)
def test_the_admins_form_refuses_bad_input_and_writes_nothing(admin_client, fields, message):
    response = admin_client.post(ADD, form_data(**fields))

    assert response.status_code == 200  # the form again, with the error
    assert message in response.content.decode()
    assert not Schedule.objects.filter(pk="from-admin").exists()


@pytest.mark.django_db
def test_the_admin_changes_a_runtime_schedule(admin_client):
    add_schedule("editable", BEAT, every=60, args=["a"])
    page = admin_client.get(change_url("editable")).content.decode()
    assert "[&quot;a&quot;]" in page  # the form shows the stored definition

    admin_client.post(change_url("editable"), form_data(name="ignored", every="", cron="0 * * * *"))

    row = Schedule.objects.get(pk="editable")
    assert (row.definition["cron"], row.definition["every"]) == ("0 * * * *", None)
    assert not Schedule.objects.filter(pk="ignored").exists()


@pytest.mark.django_db
def test_a_schedule_from_code_has_no_change_form_and_is_not_deleted(admin_client, declare):
    declare(every=60, name="coded")
    Schedule.objects.create(name="coded", task_name=BEAT, spec="every 60s", timezone="UTC")

    response = admin_client.post(change_url("coded"), form_data(name="coded", every="5"))
    admin_client.post(SCHEDULES, {"action": "delete_removed", "_selected_action": ["coded"]})

    assert response.status_code == 403
    row = Schedule.objects.get(pk="coded")
    assert row.definition is None and row.spec == "every 60s"


@pytest.mark.django_db
def test_the_admin_pauses_and_resumes_code_and_runtime_schedules(admin_client, declare):
    declare(every=60, name="coded")
    Schedule.objects.create(name="coded", task_name=BEAT, spec="every 60s", timezone="UTC")
    add_schedule("runtime", BEAT, every=60)
    selected = {"_selected_action": ["coded", "runtime"]}

    paused = admin_client.post(SCHEDULES, {"action": "pause", **selected}, follow=True)

    assert "Paused 2 schedule(s): coded, runtime." in messages_of(paused)
    assert all(row.paused_at is not None for row in rows().values())
    assert 'class="pgqueue-paused"' in admin_client.get(SCHEDULES).content.decode()

    resumed = admin_client.post(SCHEDULES, {"action": "resume", **selected}, follow=True)

    assert "Resumed 2 schedule(s): coded, runtime." in messages_of(resumed)
    assert all(row.paused_at is None and row.resumed_at for row in rows().values())


@pytest.mark.django_db
def test_the_admin_deletes_runtime_schedules_and_leaves_code_ones(admin_client, declare):
    declare(every=60, name="coded")
    Schedule.objects.create(name="coded", task_name=BEAT, spec="every 60s", timezone="UTC")
    add_schedule("runtime", BEAT, every=60)

    response = admin_client.post(
        SCHEDULES,
        {"action": "delete_removed", "_selected_action": ["coded", "runtime"]},
        follow=True,
    )

    assert set(rows()) == {"coded"}
    assert "Deleted 1 schedule(s)." in messages_of(response)


@pytest.mark.django_db
def test_each_admin_write_needs_its_permission(client, django_user_model):
    add_schedule("runtime", BEAT, every=60)
    viewer = staff(django_user_model, client, "view_schedule")

    assert viewer.post(ADD, form_data()).status_code == 403
    viewer.post(change_url("runtime"), form_data(name="runtime", every="5"))
    for action in ("pause", "delete_removed"):
        viewer.post(SCHEDULES, {"action": action, "_selected_action": ["runtime"]})

    row = Schedule.objects.get(pk="runtime")
    assert (row.definition["every"], row.paused_at) == (60, None)
    assert not Schedule.objects.filter(pk="from-admin").exists()


@pytest.mark.django_db
def test_a_viewer_sees_a_runtime_schedule_as_stored(client, django_user_model):
    add_schedule("runtime", BEAT, every=60, args=["shown"])
    viewer = staff(django_user_model, client, "view_schedule")

    response = viewer.get(change_url("runtime"))

    assert response.status_code == 200
    html = response.content.decode()
    assert "shown" in html and 'name="every"' not in html


@pytest.mark.django_db
def test_the_admin_marks_a_runtime_schedule_whose_task_is_not_registered(admin_client):
    add_schedule("orphan", BEAT, every=60)
    data = {**Schedule.objects.get(pk="orphan").definition, "task": "tests.gone_task"}
    Schedule.objects.filter(pk="orphan").update(definition=data)

    html = admin_client.get(SCHEDULES).content.decode()

    assert "runtime (task not registered)" in html
