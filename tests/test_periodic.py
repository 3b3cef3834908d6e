"""Periodic tasks (docs/periodic.md): tick computation, the database's once-per-tick
decision, the scheduler in real worker processes, the admin and pgqueue_status."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from io import StringIO
from itertools import pairwise
from zoneinfo import ZoneInfo

import psycopg
import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connections as django_connections
from django.urls import reverse

from django_pgqueue import InvalidTaskError, periodic
from django_pgqueue.core.ticks import ON_TIME, Cron, Every, due
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Schedule, Task
from django_pgqueue.tasking.periodic import (
    ScheduleNotDeclared,
    run_now,
    schedule_registry,
    schedules,
)
from django_pgqueue.tasking.registry import registry
from django_pgqueue.worker.connection import connect
from django_pgqueue.worker.scheduler import tick_params
from tests import periodic_tasks
from tests.conftest import server_address, url_through, wait_until
from tests.faultproxy import ReplyLosingProxy
from tests.test_faults import statement_marker

PARIS = ZoneInfo("Europe/Paris")
SCHEDULES = reverse("admin:django_pgqueue_schedule_changelist")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def paris(*args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=PARIS, fold=fold)


@pytest.fixture
def declare():
    """periodic(...) in the test process; the schedules are forgotten after the test."""
    names: list[str] = []

    def make(task=periodic_tasks.beat, **options):
        schedule = periodic(task, **options)
        names.append(schedule.name)
        return schedule

    yield make
    for name in names:
        schedule_registry.unregister(name)


def db_now(pg: psycopg.Connection) -> datetime:
    return pg.execute("SELECT now()").fetchone()[0]


def see(pg: psycopg.Connection, schedule) -> datetime:
    """A worker's first sight of a schedule: its row; returns the row's created_at."""
    pg.execute(
        QUERIES["schedule_seen"],
        {
            "names": [schedule.name],
            "task_names": [schedule.task.name],
            "specs": [schedule.spec],
            "timezones": [schedule.timezone],
        },
    )
    return pg.execute(
        "SELECT created_at FROM pgqueue_schedule WHERE name = %s", [schedule.name]
    ).fetchone()[0]


def enqueue_tick(conn: psycopg.Connection, schedule, tick: datetime, worker: str = "w-1"):
    cursor = conn.execute(QUERIES["enqueue_tick"], tick_params(schedule, tick, worker))
    columns = [c.name for c in cursor.description]
    return dict(zip(columns, cursor.fetchone(), strict=True))


def a_due_tick(pg: psycopg.Connection, schedule) -> datetime:
    """A tick of ``schedule`` after its row was created, once the database reached it."""
    tick = schedule.next_tick(see(pg, schedule))
    wait_until(lambda: db_now(pg) >= tick, timeout=5, message="the tick")
    return tick


def tick_tasks(name: str) -> list[Task]:
    return list(Task.objects.filter(metadata__schedule=name).order_by("id"))


def ticks_of(name: str) -> list[datetime]:
    return [datetime.fromisoformat(t.metadata["tick"]) for t in tick_tasks(name)]


def schedules_env(*names: str) -> dict[str, str]:
    return {"PGQUEUE_TEST_SCHEDULES": ",".join(names)}


# -- ticks: when they fall ----------------------------------------------------------


def test_every_ticks_on_whole_multiples_of_its_interval_since_the_epoch():
    every = Every(10)

    assert every.after(utc(2025, 1, 1, 7, 0, 3)) == utc(2025, 1, 1, 7, 0, 10)
    assert every.after(utc(2025, 1, 1, 7, 0, 10)) == utc(2025, 1, 1, 7, 0, 20)


def test_every_takes_a_fractional_number_of_seconds():
    ticks = Every(1.5).latest(utc(2025, 1, 1, 0, 0, 5), utc(2025, 1, 1, 0, 0, 10), limit=10)

    assert ticks == [
        utc(2025, 1, 1, 0, 0, 6),
        datetime(2025, 1, 1, 0, 0, 7, 500000, tzinfo=UTC),
        utc(2025, 1, 1, 0, 0, 9),
    ]


def test_a_cron_schedule_ticks_in_its_time_zone():
    cron = Cron("0 7 * * mon", PARIS)

    assert cron.after(utc(2025, 1, 1)) == paris(2025, 1, 6, 7)  # CET, UTC+1
    assert cron.after(utc(2025, 7, 1)) == paris(2025, 7, 7, 7)  # CEST, UTC+2


def test_a_time_skipped_by_the_spring_forward_runs_once_right_after_the_jump():
    # Europe/Paris, 2025-03-30: 02:00 CET jumps to 03:00 CEST; 02:30 never happens.
    cron = Cron("30 2 * * *", PARIS)

    ticks = cron.latest(paris(2025, 3, 29, 12), paris(2025, 3, 30, 12), limit=10)

    assert ticks == [paris(2025, 3, 30, 3, 0)]


def test_a_time_repeated_by_the_fall_back_runs_once():
    # Europe/Paris, 2025-10-26: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    cron = Cron("30 2 * * *", PARIS)

    ticks = cron.latest(paris(2025, 10, 25, 12), paris(2025, 10, 26, 12), limit=10)

    assert ticks == [utc(2025, 10, 26, 0, 30)]  # the first 02:30, CEST (UTC+2)


def test_a_job_with_a_wildcard_hour_follows_the_clock_through_both_transitions():
    hourly = Cron("0 * * * *", PARIS)

    spring = hourly.latest(paris(2025, 3, 30, 0), paris(2025, 3, 30, 23, 59), limit=100)
    autumn = hourly.latest(paris(2025, 10, 26, 0), paris(2025, 10, 26, 23, 59), limit=100)

    assert len(spring) == 22  # 01:00 .. 23:00 without 02:00
    assert len(autumn) == 24  # 01:00 .. 23:00 with 02:00 twice
    assert all(later - earlier == timedelta(hours=1) for earlier, later in pairwise(spring))


def test_the_next_tick_of_a_cron_after_the_fall_back_hour_is_not_in_the_past():
    # From inside the repeated hour (02:15 CET, the second one) the 02:30 job has run.
    moment = paris(2025, 10, 26, 2, 15, fold=1)

    assert Cron("30 2 * * *", PARIS).after(moment) == paris(2025, 10, 27, 2, 30)


def test_a_cron_expression_needs_five_fields():
    with pytest.raises(ImproperlyConfigured, match="five fields"):
        periodic(periodic_tasks.beat, cron="*/5 * * * * *", name="six-fields")


# -- ticks: which are due -------------------------------------------------------------

MINUTELY = Every(60)
SEEN = utc(2025, 1, 1, 6, 0, 30)


def due_at(now: datetime, *, last_tick=None, missed="once", catch_up_limit=10, seen=SEEN):
    return due(
        MINUTELY,
        last_tick=last_tick,
        first_seen=seen,
        now=now,
        missed=missed,
        catch_up_limit=catch_up_limit,
    )


def test_nothing_is_due_between_ticks():
    assert due_at(utc(2025, 1, 1, 7, 0, 40), last_tick=utc(2025, 1, 1, 7, 0)) == []


def test_the_tick_just_reached_is_due():
    assert due_at(utc(2025, 1, 1, 7, 1, 0, 3), last_tick=utc(2025, 1, 1, 7, 0)) == [
        utc(2025, 1, 1, 7, 1)
    ]


def test_a_new_schedule_runs_no_tick_from_before_it_was_first_seen():
    assert due_at(utc(2025, 1, 1, 6, 0, 31)) == []
    assert due_at(utc(2025, 1, 1, 6, 1, 0, 1)) == [utc(2025, 1, 1, 6, 1)]


def test_a_new_schedule_seen_exactly_on_a_tick_runs_that_tick():
    assert due_at(utc(2025, 1, 1, 6, 1, 0, 5), seen=utc(2025, 1, 1, 6, 1)) == [
        utc(2025, 1, 1, 6, 1)
    ]


def test_missed_once_runs_only_the_latest_missed_tick():
    ticks = due_at(utc(2025, 1, 1, 9, 30, 5), last_tick=utc(2025, 1, 1, 7, 0), missed="once")

    assert ticks == [utc(2025, 1, 1, 9, 30)]


def test_missed_all_runs_each_missed_tick_in_order():
    ticks = due_at(utc(2025, 1, 1, 7, 3, 5), last_tick=utc(2025, 1, 1, 7, 0), missed="all")

    assert ticks == [utc(2025, 1, 1, 7, 1), utc(2025, 1, 1, 7, 2), utc(2025, 1, 1, 7, 3)]


def test_missed_all_runs_the_latest_catch_up_limit_ticks_and_skips_the_older_ones():
    ticks = due_at(
        utc(2025, 1, 1, 9, 0, 5), last_tick=utc(2025, 1, 1, 7, 0), missed="all", catch_up_limit=3
    )

    assert ticks == [utc(2025, 1, 1, 8, 58), utc(2025, 1, 1, 8, 59), utc(2025, 1, 1, 9, 0)]


def test_missed_skip_runs_a_tick_on_time_but_never_a_late_one():
    last = utc(2025, 1, 1, 7, 0)
    on_time = utc(2025, 1, 1, 7, 5) + ON_TIME - timedelta(seconds=1)
    late = utc(2025, 1, 1, 7, 5) + ON_TIME

    assert due_at(on_time, last_tick=last, missed="skip") == [utc(2025, 1, 1, 7, 5)]
    assert due_at(late, last_tick=last, missed="skip") == []


# -- declaring schedules --------------------------------------------------------------


def test_a_schedule_is_named_after_its_task_by_default(declare):
    schedule = declare(every=30)

    assert schedule.name == "tests.periodic_tasks.beat"
    assert schedule_registry.find(schedule.name) is schedule


def test_a_task_with_two_schedules_needs_a_name_for_each(declare):
    declare(every=30)

    with pytest.raises(ImproperlyConfigured, match="several schedules: give each"):
        periodic(periodic_tasks.beat, cron="0 7 * * *")


def test_a_schedule_takes_either_cron_or_every(declare):
    with pytest.raises(ImproperlyConfigured, match=r"either cron=\.\.\. or every=\.\.\."):
        declare(cron="0 7 * * *", every=60)
    with pytest.raises(ImproperlyConfigured, match=r"either cron=\.\.\. or every=\.\.\."):
        declare()


def test_a_bad_cron_expression_is_refused_with_cronsims_reason(declare):
    with pytest.raises(ImproperlyConfigured, match="Bad minute"):
        declare(cron="61 7 * * *")


def test_every_is_at_least_a_second(declare):
    with pytest.raises(ImproperlyConfigured, match="every must be a number of seconds >= 1"):
        declare(every=0.5)


def test_an_unknown_time_zone_is_refused(declare):
    with pytest.raises(ImproperlyConfigured, match="not a known IANA time zone"):
        declare(cron="0 7 * * *", timezone="Europe/Atlantis")


def test_a_time_zone_applies_to_cron_schedules_only(declare):
    with pytest.raises(ImproperlyConfigured, match="timezone applies to cron schedules only"):
        declare(every=60, timezone="Europe/Paris")


def test_a_schedules_arguments_are_checked_like_an_enqueues(declare):
    with pytest.raises(InvalidTaskError, match="args"):
        declare(every=60, args=[object()])


def test_a_schedule_refuses_options_a_tick_cannot_honour(declare):
    with pytest.raises(ImproperlyConfigured, match=r"using\(delay=...\)"):
        declare(periodic_tasks.beat.using(delay=5), every=60)


def test_periodic_stacks_over_task_as_a_decorator():
    from django_pgqueue import task

    @periodic(cron="0 7 * * *", name="decorated")
    @task(name="tests.decorated")
    def decorated() -> None: ...

    try:
        assert schedule_registry.find("decorated").task is decorated
    finally:
        schedule_registry.unregister("decorated")
        registry.unregister("tests.decorated")


def test_periodic_under_task_says_to_put_it_above():
    with pytest.raises(ImproperlyConfigured, match="put @periodic"):
        periodic(every=60)(lambda: None)


# -- the database decides each tick once ------------------------------------------


def test_a_tick_enqueues_one_pending_task_with_the_schedule_in_its_metadata(pg, declare):
    schedule = declare(every=1, name="one", args=["hello"])
    tick = a_due_tick(pg, schedule)

    result = enqueue_tick(pg, schedule, tick, worker="w-1")

    task = Task.objects.get(pk=result["task_id"])
    assert (task.state, task.task_name, task.args) == ("pending", schedule.task.name, ["hello"])
    assert task.metadata == {"schedule": "one", "tick": tick.isoformat(), "worker": "w-1"}
    row = Schedule.objects.get(pk="one")
    assert (row.last_tick, row.last_task_id, row.last_worker_id) == (tick, task.pk, "w-1")


def test_a_tick_enqueued_once_is_not_enqueued_again(pg, declare):
    schedule = declare(every=1, name="twice")
    tick = a_due_tick(pg, schedule)
    enqueue_tick(pg, schedule, tick)

    again = enqueue_tick(pg, schedule, tick, worker="w-2")

    assert again["task_id"] is None
    assert len(tick_tasks("twice")) == 1


def test_a_worker_waiting_on_another_ones_tick_enqueues_nothing(pg, declare, db_url):
    schedule = declare(every=1, name="race")
    tick = a_due_tick(pg, schedule)
    first = connect("default")
    results = {}
    try:
        with first.transaction():
            results["first"] = enqueue_tick(first, schedule, tick, worker="w-1")
            # The second worker's statement waits on the row the first one holds.
            second = threading.Thread(
                target=lambda: results.update(second=enqueue_tick(pg, schedule, tick, "w-2"))
            )
            second.start()
            time.sleep(0.3)
            assert second.is_alive()
        second.join(5)
    finally:
        first.close()

    assert results["first"]["task_id"] is not None
    assert results["second"]["task_id"] is None
    assert [t.pk for t in tick_tasks("race")] == [results["first"]["task_id"]]


def test_eight_workers_racing_for_one_tick_enqueue_one_task(pg, declare):
    schedule = declare(every=1, name="stampede")
    tick = a_due_tick(pg, schedule)
    connections = [connect("default") for _ in range(8)]
    start = threading.Barrier(8)

    def race(conn, n):
        start.wait()
        enqueue_tick(conn, schedule, tick, worker=f"w-{n}")

    threads = [threading.Thread(target=race, args=(c, n)) for n, c in enumerate(connections)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    finally:
        for conn in connections:
            conn.close()

    assert len(tick_tasks("stampede")) == 1


def test_a_tick_older_than_the_last_one_is_never_enqueued(pg, declare):
    schedule = declare(every=1, name="late")
    earlier = a_due_tick(pg, schedule)
    later = earlier + timedelta(seconds=1)
    wait_until(lambda: db_now(pg) >= later, timeout=5)
    enqueue_tick(pg, schedule, later)

    assert enqueue_tick(pg, schedule, earlier)["task_id"] is None
    assert ticks_of("late") == [later]


def test_a_tick_the_database_has_not_reached_is_not_enqueued(pg, declare):
    schedule = declare(every=1, name="early")
    see(pg, schedule)

    result = enqueue_tick(pg, schedule, schedule.next_tick(db_now(pg) + timedelta(hours=1)))

    assert result["task_id"] is None
    assert tick_tasks("early") == []


def test_a_tick_before_the_schedule_was_first_seen_is_not_enqueued(pg, declare):
    schedule = declare(every=1, name="past")
    seen = see(pg, schedule)

    result = enqueue_tick(pg, schedule, schedule.next_tick(seen - timedelta(seconds=5)))

    assert result["task_id"] is None


# -- the scheduler in real workers ----------------------------------------------------


def start_fleet(start_worker, count: int, *names: str):
    workers = [start_worker(wait=False, env=schedules_env(*names)) for _ in range(count)]
    for worker in workers:
        worker.wait_started()
    return workers


@pytest.mark.slow  # ten ticks of a one-second schedule: over 10 s by design
def test_three_workers_enqueue_each_tick_of_a_one_second_schedule_once(pg, start_worker):
    start_fleet(start_worker, 3, "every_second")
    first = Every(1).after(db_now(pg)) + timedelta(seconds=1)
    last = first + timedelta(seconds=9)  # ten ticks: first .. last

    wait_until(lambda: db_now(pg) > last + timedelta(seconds=1.5), timeout=20)

    ticks = ticks_of("every_second")
    assert len(ticks) == len(set(ticks)), "a tick was enqueued twice"
    window = [t for t in ticks if first <= t <= last]
    assert window == [first + timedelta(seconds=n) for n in range(10)]
    assert all(later - earlier == timedelta(seconds=1) for earlier, later in pairwise(ticks))
    for task in tick_tasks("every_second"):
        tick = datetime.fromisoformat(task.metadata["tick"])
        assert task.enqueued_at - tick < timedelta(seconds=1), "a tick was enqueued late"


@pytest.mark.slow
def test_the_next_tick_comes_when_the_worker_that_enqueued_the_last_one_is_killed(pg, start_worker):
    workers = start_fleet(start_worker, 3, "every_second")
    wait_until(lambda: Schedule.objects.filter(last_tick__isnull=False).exists(), timeout=10)
    row = Schedule.objects.get(pk="every_second")
    pid = int(row.last_worker_id.rsplit("-", 2)[1])
    [victim] = [w for w in workers if w.pid == pid]

    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(5)
    killed_at = db_now(pg)

    after = wait_until(
        lambda: [t for t in tick_tasks("every_second") if t.enqueued_at > killed_at],
        timeout=5,
        message="a tick after the kill",
    )
    assert after[0].metadata["worker"] != row.last_worker_id
    assert datetime.fromisoformat(after[0].metadata["tick"]) - killed_at < timedelta(seconds=1)


@pytest.mark.slow
def test_a_schedule_removed_from_the_code_stops_firing(pg, start_worker):
    worker = start_worker(env=schedules_env("every_second", "to_remove"))
    wait_until(lambda: tick_tasks("to_remove"), timeout=10, message="a tick of to_remove")
    worker.stop()
    start_worker(env=schedules_env("every_second"))
    redeployed = db_now(pg)

    wait_until(
        lambda: len([t for t in ticks_of("every_second") if t > redeployed]) >= 3,
        timeout=10,
        message="three ticks after the deploy",
    )

    assert [t for t in ticks_of("to_remove") if t > redeployed] == []


@pytest.fixture
def lossy(db_url: str):
    """A proxy in front of the test database that can lose one statement's reply."""
    settings = django_connections["default"].settings_dict
    proxy = ReplyLosingProxy(server_address(settings))
    proxy.url = url_through(settings, proxy.port)
    yield proxy
    proxy.close()


@pytest.mark.slow
def test_a_tick_whose_reply_was_lost_after_it_committed_is_not_enqueued_again(lossy, start_worker):
    # The worker's connection drops after the server committed a tick: it reconnects
    # and sends the same statement again, which finds its tick taken.
    lossy.lose_reply_to(statement_marker("enqueue_tick"))
    worker = start_worker(env=schedules_env("every_second"), database_url=lossy.url)
    assert lossy.fired.wait(10), "the worker never enqueued a tick"

    wait_until(lambda: len(ticks_of("every_second")) >= 4, timeout=10, message="four ticks")

    # (the scheduler's statements run on the worker's shared maintenance session)
    assert "maintenance: database unavailable" in worker.log()

    ticks = ticks_of("every_second")
    assert len(ticks) == len(set(ticks)), "a tick was enqueued twice"
    assert all(later - earlier == timedelta(seconds=1) for earlier, later in pairwise(ticks))


@pytest.mark.slow
def test_a_worker_fires_only_the_schedules_of_its_queues(pg, start_worker):
    start_worker(env=schedules_env("every_second", "other_queue"))  # serves "default"

    wait_until(lambda: len(tick_tasks("every_second")) >= 2, timeout=10)

    assert tick_tasks("other_queue") == []
    assert not Schedule.objects.filter(pk="other_queue").exists()


def test_a_worker_serving_the_queue_fires_its_schedule(pg, start_worker):
    start_worker("--queues", "other", env=schedules_env("other_queue"))

    wait_until(lambda: tick_tasks("other_queue"), timeout=10, message="a tick of other_queue")

    assert tick_tasks("other_queue")[0].queue == "other"


@pytest.mark.slow
def test_a_new_schedule_does_not_run_for_the_ticks_before_a_worker_saw_it(pg, start_worker):
    start_worker(env=schedules_env("minutely"))

    row = wait_until(lambda: Schedule.objects.filter(pk="minutely").first(), timeout=10)
    time.sleep(1.5)

    assert all(tick >= row.created_at for tick in ticks_of("minutely"))


@pytest.mark.slow
def test_a_schedule_missed_while_no_worker_ran_runs_once_for_the_latest_tick(pg, start_worker):
    now = db_now(pg)
    Schedule.objects.create(
        name="minutely",
        task_name=periodic_tasks.beat.name,
        spec="* * * * *",
        timezone="UTC",
        created_at=now - timedelta(days=1),
        last_tick=(now - timedelta(hours=2)).replace(second=0, microsecond=0),
    )

    start_worker(env=schedules_env("minutely"))

    wait_until(lambda: ticks_of("minutely"), timeout=10, message="the missed tick")
    time.sleep(1)
    latest_missed = now.replace(second=0, microsecond=0)
    ticks = ticks_of("minutely")
    # One run, for the latest missed tick (or, past a minute boundary, the next tick).
    assert ticks[0] in (latest_missed, latest_missed + timedelta(minutes=1))
    assert len(ticks) == 1 or ticks[1] == latest_missed + timedelta(minutes=1)


# -- run now, the admin, pgqueue_status -----------------------------------------------


@pytest.mark.django_db
def test_run_now_enqueues_the_task_without_moving_the_last_tick(declare):
    schedule = declare(every=60, name="digest", args=["now"])
    last = utc(2025, 1, 1, 7)
    Schedule.objects.create(name="digest", task_name=schedule.task.name, spec="x", timezone="UTC",
                            last_tick=last, last_task_id=1)  # fmt: skip

    task = Task.objects.get(pk=run_now("digest"))

    assert (task.state, task.args) == ("pending", ["now"])
    assert task.metadata == {"schedule": "digest", "run_now": True}
    row = Schedule.objects.get(pk="digest")
    assert (row.last_tick, row.last_task_id) == (last, 1)


@pytest.mark.django_db
def test_run_now_of_an_undeclared_schedule_names_the_declared_ones(declare):
    declare(every=60, name="known")

    with pytest.raises(ScheduleNotDeclared, match="declared schedules: known"):
        run_now("unknown")


def _row(name: str, **fields) -> Schedule:
    defaults = {"task_name": periodic_tasks.beat.name, "spec": "every 60s", "timezone": "UTC"}
    return Schedule.objects.create(name=name, **{**defaults, **fields})


@pytest.mark.django_db
def test_the_admin_lists_each_schedule_with_its_last_task_and_next_tick(admin_client, declare):
    declare(cron="0 7 * * mon", name="weekly", timezone="Europe/Paris", missed="all")
    _row("weekly", last_tick=utc(2025, 1, 6, 6), last_task_id=42)

    html = admin_client.get(SCHEDULES).content.decode()

    assert "<code>0 7 * * mon</code>" in html and "Europe/Paris" in html
    assert "all (up to 10)" in html
    assert reverse("admin:django_pgqueue_task_change", args=[42]) in html
    next_tick = schedule_registry.find("weekly").next_tick(datetime.now(UTC))
    assert next_tick.isoformat(timespec="seconds") in html


@pytest.mark.django_db
def test_the_admin_shows_a_schedule_removed_from_the_code_as_removed(admin_client):
    _row("gone", spec="*/5 * * * *")

    html = admin_client.get(SCHEDULES).content.decode()

    assert "<code>*/5 * * * *</code>" in html
    assert 'class="pgqueue-removed"' in html and ">removed<" in html


@pytest.mark.django_db
def test_the_admins_run_now_enqueues_the_schedules_task(admin_client, declare):
    declare(every=60, name="digest")
    _row("digest", last_tick=utc(2025, 1, 1))

    response = admin_client.post(
        SCHEDULES, {"action": "run_now", "_selected_action": ["digest"]}, follow=True
    )

    [task] = tick_tasks("digest")
    assert f"Enqueued 1 task(s) now: #{task.pk}." in [str(m) for m in response.context["messages"]]
    assert Schedule.objects.get(pk="digest").last_tick == utc(2025, 1, 1)


@pytest.mark.django_db
def test_run_now_in_the_admin_needs_the_change_permission(client, django_user_model, declare):
    declare(every=60, name="digest")
    _row("digest")
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_schedule"))
    client.force_login(user)

    page = client.get(SCHEDULES).content.decode()
    client.post(SCHEDULES, {"action": "run_now", "_selected_action": ["digest"]})

    assert 'value="run_now"' not in page
    assert tick_tasks("digest") == []


@pytest.mark.django_db
def test_status_lists_the_schedules_with_their_last_and_next_tick(declare):
    declare(cron="0 7 * * *", name="daily", timezone="Europe/Paris")
    _row("daily", last_tick=utc(2025, 1, 1, 6))
    _row("gone")
    out = StringIO()

    call_command("pgqueue_status", stdout=out)

    lines = {line.split()[0]: line for line in out.getvalue().splitlines() if line.strip()}
    assert lines["schedule"].split() == ["schedule", "task", "when", "last", "tick", "next", "tick"]
    assert "0 7 * * * (Europe/Paris)" in lines["daily"]
    assert "2025-01-01T06:00:00+00:00" in lines["daily"]
    assert lines["gone"].endswith("removed from the code")


@pytest.mark.django_db
def test_status_json_has_the_schedules(declare):
    declare(every=60, name="poll")
    out = StringIO()

    call_command("pgqueue_status", "--json", stdout=out)

    [schedule] = json.loads(out.getvalue())["schedules"]
    assert (schedule["name"], schedule["schedule"], schedule["declared"]) == (
        "poll",
        "every 60s",
        True,
    )
    assert schedule["last_tick"] is None and schedule["next_tick"] is not None


@pytest.mark.django_db
def test_schedules_lists_declared_schedules_and_rows_of_removed_ones(declare):
    declare(every=60, name="poll")
    _row("gone")

    listing = {s["name"]: s for s in schedules()}

    assert listing["poll"]["declared"] and not listing["gone"]["declared"]
    assert listing["gone"]["next_tick"] is None
