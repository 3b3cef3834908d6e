"""django_pgqueue.celery in this process: the app's configuration, Celery's options
as rows (priority, countdown, eta, expires, task_id, time and rate limits), results
read from rows, the canvas's rows, beat entries as periodic schedules, the
django-celery-beat import, and every refusal's message. Real PostgreSQL; the workers'
side is tests/test_celery_port.py."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone

from django_pgqueue import celery as celery_package
from django_pgqueue.celery import (
    AsyncResult,
    Celery,
    EagerResult,
    GroupResult,
    Signature,
    Unsupported,
    UnsupportedImport,
    chain,
    chord,
    chunks,
    crontab,
    group,
    schedule,
    shared_task,
    signature,
    solar,
    xmap,
    xstarmap,
)
from django_pgqueue.celery import app as celery_app_module
from django_pgqueue.celery import options as celery_options
from django_pgqueue.celery import signals as celery_signals
from django_pgqueue.celery import states as celery_states
from django_pgqueue.celery.beat import declare
from django_pgqueue.celery.canvas import META
from django_pgqueue.celery.exceptions import NotRegistered, TaskRevokedError, TimeoutError
from django_pgqueue.celery.task import backoff_interval
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.limits import Rate
from django_pgqueue.models import Schedule, Task
from django_pgqueue.tasking.periodic import schedule_registry
from tests import ledger
from tests.celery_project.proj import celery as proj_celery
from tests.celery_project.proj import settings as proj_settings
from tests.celery_project.shop import tasks

pytestmark = pytest.mark.django_db

ADD = "tests.celery_project.shop.tasks.add"


@pytest.fixture(autouse=True)
def celery_settings(settings):
    for name in dir(proj_settings):
        if name.startswith("CELERY_"):
            setattr(settings, name, getattr(proj_settings, name))


@pytest.fixture
def ledger_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    path.touch()
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    return path


def row(result: AsyncResult) -> Task:
    return Task.objects.get(pk=int(result.id))


def new_app(**conf) -> Celery:
    app = Celery("t", set_as_current=False)
    app.conf.update(conf)
    return app


# Tasks of this module (registered in this process only; run here with apply()).
@shared_task
def waits_for_another():
    return AsyncResult("1").get()


@shared_task(bind=True)
def retries_with_new_args(self, x):
    raise self.retry(args=(x + 1,))


@shared_task(bind=True)
def retries_without_throwing(self):
    self.retry(throw=False)


@shared_task(bind=True)
def replaces_itself(self):
    raise self.replace(tasks.add.s(1, 1))


@shared_task(soft_time_limit=5)
def soft_only():
    return None


seen: list = []


@shared_task
def remember(*args):
    seen.append(args)


@shared_task
def remember_failure(request, exc, traceback):
    seen.append((request.id, repr(exc), "ValueError" in traceback))


class Flaky(Celery("t", set_as_current=False).Task):
    autoretry_for = (KeyError,)
    max_retries = 2
    default_retry_delay = 0
    tries = 0

    def run(self, x):
        type(self).tries += 1
        if self.tries < 3:
            raise KeyError(x)
        return x


# -- the app -------------------------------------------------------------------------
def test_config_from_object_reads_the_namespaced_settings_on_first_use(settings):
    app = Celery("t", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    settings.CELERY_TASK_DEFAULT_QUEUE = "first"
    assert app.conf.task_default_queue == "first"
    settings.CELERY_TASK_DEFAULT_QUEUE = "second"  # override_settings: read again
    assert app.conf.task_default_queue == "second"
    assert app.conf.timezone == "Europe/Paris" and app.conf.broker_url.startswith("redis://")
    app.conf.task_default_queue = "set-in-code"
    assert app.conf["task_default_queue"] == "set-in-code"


def test_config_from_object_reads_a_module_without_namespace():
    app = Celery("t", set_as_current=False)
    app.config_from_object({"task_default_queue": "q", "TIMEZONE": "UTC"})
    assert app.conf.task_default_queue == "q" and app.conf.timezone == "UTC"
    assert app.conf.task_always_eager is False  # Celery's default


def test_a_task_is_named_after_its_module_and_function():
    assert tasks.add.name == ADD
    assert proj_celery.ping.name == "tests.celery_project.proj.celery.ping"
    assert proj_celery.app.tasks[ADD] is tasks.add


def test_an_unknown_task_name_is_not_registered_naming_the_known_ones():
    with pytest.raises(NotRegistered, match=rf"'nope' is not registered.*{ADD}"):
        proj_celery.app.tasks["nope"]


def test_autodiscover_tasks_imports_the_related_modules_when_the_app_is_finalized():
    sys.modules.pop("tests.celery_project.shop.jobs", None)
    app = new_app()
    app.autodiscover_tasks(["tests.celery_project.shop"], related_name="jobs")
    assert "tests.celery_project.shop.jobs" not in sys.modules
    app.finalize()
    assert "tests.celery_project.shop.jobs.nightly_cleanup" in app.tasks


def test_the_default_app_reads_celerys_settings_and_leaves_beat_to_celery(settings):
    # a project moving queue by queue: its proj/celery.py still creates Celery's own app
    from django_pgqueue.celery.app import _default_app

    settings.CELERY_TASK_SERIALIZER = "pickle"  # Celery's tasks' business, not ours
    app = _default_app()
    assert app.conf.task_routes == proj_settings.CELERY_TASK_ROUTES
    app.finalize()
    assert "add-every-second" not in schedule_registry


def test_pickle_in_the_configuration_is_refused_when_the_app_is_finalized():
    app = new_app(task_serializer="pickle")
    with pytest.raises(Unsupported, match=r"CELERY_TASK_SERIALIZER='pickle' is refused: .*JSON"):
        app.finalize()
    app = new_app(accept_content=["json", "pickle"])
    with pytest.raises(Unsupported, match=r"CELERY_ACCEPT_CONTENT='pickle' is refused"):
        app.finalize()


def test_task_annotations_are_refused_naming_the_alternative():
    with pytest.raises(Unsupported, match=r"set rate_limit.*on the tasks themselves"):
        new_app(task_annotations={"*": {"rate_limit": "10/s"}}).finalize()


# -- task options --------------------------------------------------------------------
def test_max_retries_and_default_retry_delay_become_the_rows_attempts_and_backoff():
    definition = tasks.send_twitter_status.definition()
    assert definition.max_attempts == 4  # max_retries=3, plus the first run
    assert (definition.backoff.base, definition.backoff.factor) == (0.1, 1.0)
    assert tasks.add.definition().max_attempts == 4  # Celery's default max_retries
    assert tasks.refresh_timeline.definition().max_attempts == 6  # retry_kwargs max_retries=5
    # an exception fails at once unless the function retries it, as in Celery
    assert definition.retry_on == ()


def test_a_tasks_queue_and_priority_are_its_rows_defaults():
    def report():
        return None

    task = proj_celery.app.task(queue="reports", priority=9, name="t.report")(report)
    row_ = row(task.delay())
    assert (row_.queue, row_.priority) == ("reports", -100)


class _Attempt:
    """The TaskContext fields retry() reads: the row was enqueued with 4 attempts."""

    task_id = 1
    max_attempts = 4


def _retry_in_a_worker(retries: int, **kwargs):
    tasks.send_twitter_status.push_request(
        id="1", retries=retries, called_directly=False, task_context=_Attempt()
    )
    try:
        tasks.send_twitter_status.retry(**kwargs)
    finally:
        tasks.send_twitter_status.pop_request()


def test_retry_eta_becomes_the_delay_of_the_next_attempt():
    from django_pgqueue.celery import Retry

    with pytest.raises(Retry) as raised:
        _retry_in_a_worker(0, eta=timezone.now() + timedelta(seconds=30))
    assert 28 <= raised.value.when <= 30
    with pytest.raises(Retry) as raised:
        _retry_in_a_worker(0, countdown=5)
    assert raised.value.when == 5.0


def test_retry_max_retries_of_the_call_lowers_the_limit():
    with pytest.raises(KeyError):
        _retry_in_a_worker(1, exc=KeyError("x"), max_retries=1)


def test_retry_max_retries_above_the_rows_attempts_fails_saying_so():
    from django_pgqueue.celery.exceptions import MaxRetriesExceededError

    with pytest.raises(MaxRetriesExceededError, match=r"max_retries=10 asks for more retries"):
        _retry_in_a_worker(3, max_retries=10)


def test_time_limit_is_the_timeout_and_a_timeout_fails_at_once():
    assert tasks.bounded.definition().timeout == 30.0  # time_limit, not soft_time_limit
    assert soft_only.definition().timeout == 5.0  # soft_time_limit alone
    assert tasks.bounded.definition().discard_on == ("builtins.TimeoutError",)


def test_acks_late_and_reject_on_worker_lost_are_accepted():
    assert tasks.bounded.acks_late is True and tasks.bounded.reject_on_worker_lost is True
    assert tasks.bounded.definition().name == "tests.celery_project.shop.tasks.bounded"


def test_rate_limit_becomes_a_fleet_wide_rate_of_the_task_name():
    assert tasks.throttled.definition().key_rate == Rate(10, 60.0)
    result = tasks.throttled.delay(1)
    assert row(result).concurrency_key == tasks.throttled.name


@pytest.mark.parametrize(
    ("celery", "ours"),
    [("10/s", "10/s"), ("100/m", "100/m"), ("5/h", "5/h"), (2, "2/s"), ("0.5", "1/2s"),
     (0, None), (None, None)],
)  # fmt: skip
def test_rate_limit_strings(celery, ours):
    assert celery_options.rate_limit(celery) == ours


def test_a_bad_rate_limit_says_how_to_write_one():
    with pytest.raises(InvalidTaskError, match=r"'ten a minute' is not a Celery rate: write"):
        celery_options.rate_limit("ten a minute")


@pytest.mark.parametrize(
    ("style", "celery", "ours"),
    [("redis", 0, 0), ("redis", 3, -33), ("redis", 9, -100), ("redis", 12, -100),
     ("rabbitmq", 0, 0), ("rabbitmq", 3, 30), ("rabbitmq", 10, 100), ("rabbitmq", 255, 100)],
)  # fmt: skip
def test_celery_priorities_in_this_queues_direction(style, celery, ours):
    assert celery_options.priority(celery, style) == ours


def test_the_priority_direction_follows_the_brokers_scheme():
    assert celery_options.priority_style({"broker_url": "redis://h:6379/0"}) == "redis"
    assert celery_options.priority_style({"broker_url": "amqp://guest@h//"}) == "rabbitmq"
    assert celery_options.priority_style({"broker_url": "pyamqp://h//"}) == "rabbitmq"
    assert celery_options.priority_style({}) == "redis"
    style = {"broker_url": "redis://", "pgqueue_priority": "rabbitmq"}
    assert celery_options.priority_style(style) == "rabbitmq"
    with pytest.raises(InvalidTaskError, match=r"CELERY_PGQUEUE_PRIORITY must be 'redis'"):
        celery_options.priority_style({"pgqueue_priority": "up"})


def test_a_priority_out_of_celerys_range_is_refused():
    with pytest.raises(InvalidTaskError, match=r"-1 is not a Celery priority: an int from 0"):
        tasks.add.apply_async((1, 2), priority=-1)


def test_serializer_json_is_accepted_and_pickle_refused():
    def f():
        return None

    assert proj_celery.app.task(serializer="json", name="t.json_ok")(f).name == "t.json_ok"
    with pytest.raises(Unsupported, match=r"serializer.*='pickle' is refused: .*JSON only"):
        proj_celery.app.task(serializer="pickle", name="t.pickled")(f)
    with pytest.raises(Unsupported, match=r"serializer='pickle' is refused"):
        tasks.add.apply_async((1, 2), serializer="pickle")


def test_an_async_def_task_is_refused_naming_djangos_pgqueue_task():
    async def fetch():
        return None

    with pytest.raises(Unsupported, match=r"async def task.*django_pgqueue's @task"):
        shared_task(fetch)


def test_celerys_exponential_backoff():
    assert [backoff_interval(1, n, 600) for n in range(5)] == [1, 2, 4, 8, 16]
    assert backoff_interval(3, 10, 600) == 600
    assert all(0 <= backoff_interval(1, 3, 600, full_jitter=True) <= 8 for _ in range(50))


# -- calling -------------------------------------------------------------------------
def test_delay_is_part_of_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        result = tasks.add.delay(1, 2)
        assert Task.objects.filter(pk=int(result.id)).exists()
        raise RuntimeError("the view failed")
    assert not Task.objects.filter(pk=int(result.id)).exists()
    assert result.state == celery_states.PENDING


def test_the_publish_signals_carry_celerys_arguments():
    from django_pgqueue.celery.signals import after_task_publish, before_task_publish

    seen = []

    def before(sender=None, body=None, headers=None, routing_key=None, **kwargs):
        seen.append(("before", sender, headers["id"], headers["task"], body[0], routing_key))

    def after(sender=None, body=None, headers=None, routing_key=None, exchange=None, **kwargs):
        seen.append(("after", sender, headers["id"], body[1], routing_key, exchange))

    before_task_publish.connect(before)
    after_task_publish.connect(after, sender=ADD)
    try:
        result = tasks.add.apply_async((1,), {"y": 2}, queue="emails")
        tasks.mul.delay(1, 2)  # another sender: only `before` hears it
    finally:
        before_task_publish.disconnect(before)
        after_task_publish.disconnect(after, sender=ADD)
    assert seen == [
        ("before", ADD, None, ADD, [1], "emails"),
        ("after", ADD, result.id, {"y": 2}, "emails", ""),
        ("before", tasks.mul.name, None, tasks.mul.name, [1, 2], "default"),
    ]


@pytest.mark.django_db(transaction=True)
def test_delay_from_transaction_on_commit_enqueues_after_the_commit():
    results = []
    with transaction.atomic():
        transaction.on_commit(lambda: results.append(tasks.add.delay(1, 2)))
        assert results == []
    assert row(results[0]).args == [1, 2]


@pytest.mark.django_db(transaction=True)
def test_delay_on_commit_returns_the_id_now_and_writes_at_the_commit():
    with transaction.atomic():
        result = tasks.add.delay_on_commit(3, 4)
        assert not Task.objects.filter(pk=int(result.id)).exists()
    assert row(result).args == [3, 4]


def test_apply_async_options_become_the_rows():
    eta = timezone.now() + timedelta(hours=1)
    result = tasks.add.apply_async(
        (1, 2), countdown=60, expires=120, queue="emails", priority=9, time_limit=5
    )
    task = row(result)
    assert task.state == "scheduled" and task.queue == "emails" and task.priority == -100
    assert 59 <= (task.run_at - task.enqueued_at).total_seconds() <= 61
    assert 119 <= (task.expires_at - task.enqueued_at).total_seconds() <= 121
    assert task.timeout == timedelta(seconds=5)
    assert row(tasks.add.apply_async((1, 2), eta=eta)).run_at == eta
    naive = datetime(2030, 1, 1, 12, 0)  # read as UTC, as Celery's enable_utc does
    assert row(tasks.add.apply_async((1, 2), eta=naive)).run_at == naive.replace(tzinfo=UTC)


def test_a_route_sends_a_task_to_its_queue_unless_the_call_names_one():
    assert row(tasks.send_welcome_email.delay(1)).queue == "emails"
    assert row(tasks.send_welcome_email.apply_async((1,), queue="default")).queue == "default"


def test_task_id_names_the_result_and_a_live_duplicate_is_not_enqueued_twice():
    first = tasks.add.apply_async((1, 2), task_id="order-42")
    again = tasks.add.apply_async((1, 2), task_id="order-42")
    assert first.id == again.id == "order-42"
    assert Task.objects.filter(unique_key="celery:order-42").count() == 1
    assert AsyncResult("order-42").args == [1, 2]


def test_datetimes_decimals_and_uuids_travel_as_celerys_json_encodes_them():
    import uuid
    from decimal import Decimal

    moment = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    result = tasks.add.delay(Decimal("1.5"), uuid.UUID(int=7))
    assert row(result).args == [
        {"__type__": "decimal", "__value__": "1.5"},
        {"__type__": "uuid", "__value__": {"hex": uuid.UUID(int=7).hex}},
    ]
    assert tasks.dump_context.apply((moment, 1)).get()["args"] == [moment, 1]


def test_an_argument_that_is_not_json_is_refused_by_its_path():
    with pytest.raises(InvalidTaskError, match=r"args\[0\]"):
        tasks.add.delay(object(), 1)


def test_an_unknown_option_is_a_type_error_listing_the_options():
    with pytest.raises(TypeError, match=r"unknown option\(s\) colour; it takes .*countdown"):
        tasks.add.apply_async((1, 2), colour="red")


def test_send_task_of_a_name_this_process_lacks_enqueues_it_with_celerys_defaults():
    result = proj_celery.app.send_task("billing.tasks.invoice", (7,), countdown=10)
    task = row(result)
    assert (task.task_name, task.queue, task.max_attempts) == (
        "billing.tasks.invoice", "default", 4,
    )  # fmt: skip
    assert task.state == "scheduled" and result.state == celery_states.PENDING


def test_apply_runs_the_task_here_with_its_retries(ledger_file):
    assert tasks.add.apply((2, 2)).get() == 4
    result = tasks.send_twitter_status.apply(({"fail": 2}, "eager"))
    assert isinstance(result, EagerResult) and result.get() == "posted eager"
    assert len([e for e in ledger.read(ledger_file) if e.get("label") == "eager"]) == 3
    failed = tasks.fail.apply(("here",))
    assert failed.state == celery_states.FAILURE and isinstance(failed.result, ValueError)
    with pytest.raises(ValueError, match=r"here"):
        failed.get()
    assert not Task.objects.exists()


def test_apply_runs_link_and_link_error_here():
    seen.clear()
    tasks.add.apply((2, 2), link=remember.s("linked"))
    failed = tasks.fail.apply(("no",), link_error=remember_failure.s())
    assert seen == [(4, "linked"), (failed.id, "ValueError('no')", True)]


def test_a_class_based_task_registers_and_autoretries():
    flaky = proj_celery.app.register_task(Flaky)
    assert flaky.name == "tests.test_celery.Flaky" and proj_celery.app.tasks[flaky.name] is flaky
    assert flaky.apply((7,)).get() == 7 and Flaky.tries == 3
    assert flaky.definition().max_attempts == 3


def test_task_always_eager_runs_delay_here(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    result = tasks.add.delay(1, 2)
    assert isinstance(result, EagerResult) and result.get() == 3
    assert not Task.objects.exists()


def test_get_inside_a_task_is_refused_as_in_celery():
    result = waits_for_another.apply()
    assert isinstance(result.result, RuntimeError)
    assert "Never call result.get() within a task!" in str(result.result)


def test_calling_a_task_runs_its_function_directly():
    assert tasks.add(2, 3) == 5
    assert tasks.add.s(2)(3) == 5  # a signature's arguments first


# -- results -------------------------------------------------------------------------
def test_an_unknown_id_reads_pending():
    result = AsyncResult("424242")
    assert (result.state, result.result, result.ready(), result.traceback) == (
        celery_states.PENDING, None, False, None,
    )  # fmt: skip


def test_get_with_a_timeout_raises_timeout_error():
    result = tasks.add.apply_async((1, 2), countdown=3600)
    with pytest.raises(TimeoutError, match=r"timed out"):
        result.get(timeout=0.1)


def test_the_rows_states_read_as_celerys():
    result = tasks.add.delay(1, 2)
    rows = Task.objects.filter(pk=int(result.id))
    assert result.state == celery_states.PENDING
    rows.update(state="running", attempt=1)
    assert result.state == result.status == celery_states.STARTED
    retried = {"type": "django_pgqueue.exceptions.Retry", "traceback": "Traceback...",
               "message": "Retry in 5s: builtins.KeyError: 'gone'"}  # fmt: skip
    rows.update(state="scheduled", errors=[retried])
    assert result.state == celery_states.RETRY and isinstance(result.result, KeyError)
    rows.update(state="succeeded", result={"total": 3}, errors=[])
    assert (result.state, result.result, result.successful()) == ("SUCCESS", {"total": 3}, True)
    failed = {"type": "shop.errors.PaymentDeclined", "message": "card", "traceback": "Tb..."}
    rows.update(state="failed", errors=[failed])
    assert result.failed() and result.traceback == "Tb..."
    assert type(result.result).__name__ == "PaymentDeclined" and str(result.result) == "card"


def test_revoke_cancels_a_task_not_started_yet():
    result = tasks.add.apply_async((1, 2), countdown=60)
    result.revoke()
    assert row(result).state == "cancelled" and result.state == celery_states.REVOKED
    with pytest.raises(TaskRevokedError):
        result.get(timeout=1)


def test_revoke_terminate_asks_for_a_hard_cancel():
    result = tasks.add.delay(1, 2)
    Task.objects.filter(pk=int(result.id)).update(state="running", attempt=1)
    result.revoke(terminate=True)
    task = row(result)
    assert task.cancel_requested and task.cancel_hard


def test_a_group_result_has_no_row_to_save():
    result = GroupResult("g", [AsyncResult("1")])
    for call in (result.save, result.delete, lambda: GroupResult.restore("g")):
        with pytest.raises(Unsupported, match=r"a group is its members' rows"):
            call()


# -- canvas --------------------------------------------------------------------------
def test_a_chain_step_waits_for_its_parent_and_reads_its_result():
    result = (tasks.add.s(2, 2) | tasks.mul.s(4)).apply_async()
    parent, child = row(result.parent), row(result)
    assert child.state == "waiting" and child.metadata[META] == {"pipe": parent.id}
    assert child.args == [4]


def test_an_immutable_step_waits_without_reading_its_parents_result():
    result = chain(tasks.add.s(2, 2), tasks.add.si(1, 1)).apply_async()
    assert row(result).state == "waiting" and META not in row(result).metadata


def test_a_chords_callback_reads_its_members_results_in_their_order():
    header = group(tasks.add.s(1, 1), tasks.mul.s(2, 2), tasks.add.s(3, 3))
    result = chord(header, tasks.xsum.s()).apply_async()
    members = [int(r.id) for r in result.parent.results]
    assert row(result).metadata[META] == {"pipe": members}
    assert row(result).parents_pending == 3


def test_canvas_operators_build_chains_and_chords():
    assert isinstance(tasks.add.s(1, 1) | tasks.mul.s(2), chain)
    assert isinstance(group(tasks.add.s(1, 1)) | tasks.xsum.s(), chord)
    assert repr(tasks.add.s(1, 1) | tasks.mul.si(2, 3)) == (
        f"{ADD}(1, 1) | tests.celery_project.shop.tasks.mul(2, 3)!"
    )


def test_the_canvas_runs_here_with_apply():
    assert (tasks.add.s(2, 2) | tasks.mul.s(4)).apply().get() == 16
    assert group(tasks.add.s(i, i) for i in range(3)).apply().get() == [0, 2, 4]
    assert chord((tasks.add.s(i, i) for i in range(3)), tasks.xsum.s()).apply().get() == 6


def test_signature_by_name_and_its_clone():
    sig = signature(ADD, args=(2,), countdown=10)
    assert isinstance(sig, Signature) and sig.type is tasks.add and sig.options == {"countdown": 10}
    assert sig.clone(args=(1,)).args == (1, 2)
    assert row(sig.apply_async((3,))).state == "scheduled"


# -- beat ----------------------------------------------------------------------------
@pytest.fixture
def beat_names():
    names: list[str] = []
    yield names
    for name in names:
        schedule_registry.unregister(name)


def test_beat_entries_become_periodic_schedules(beat_names):
    app = new_app(timezone="Europe/Paris")
    entries = {
        "t-morning": {"task": ADD, "schedule": crontab(minute=0, hour=7, day_of_week="mon"),
                      "args": (1, 2)},
        "t-sets": {"task": ADD, "schedule": crontab(minute={0, 30}, hour=range(8, 10))},
        "t-seconds": {"task": ADD, "schedule": 10.0, "options": {"queue": "emails",
                                                                 "priority": 9}},
        "t-timedelta": {"task": ADD, "schedule": timedelta(minutes=5)},
        "t-schedule": {"task": ADD, "schedule": schedule(run_every=timedelta(hours=1))},
    }  # fmt: skip
    beat_names.extend(entries)
    morning, sets, seconds, delta, hourly = declare(app, entries)
    assert (morning.spec, morning.timezone, morning.args) == ("0 7 * * mon", "Europe/Paris", (1, 2))
    assert sets.spec == "0,30 8,9 * * *"
    assert (seconds.spec, seconds.queue, seconds.task.options.priority) == (
        "every 10s", "emails", -100,
    )  # fmt: skip
    assert (delta.spec, hourly.spec) == ("every 300s", "every 3600s")


def test_add_periodic_task_is_declared_when_the_app_is_finalized(beat_names):
    app = new_app()
    beat_names.append("t-ping")
    app.add_periodic_task(30, tasks.add.s(1, 1), name="t-ping")
    assert "t-ping" not in schedule_registry
    app.finalize()
    assert schedule_registry.get("t-ping").spec == "every 30s"


def test_a_beat_entry_of_an_unknown_task_is_refused_naming_it():
    app = new_app()
    with pytest.raises(ImproperlyConfigured, match=r"beat schedule entry 'x': task 'no.such'"):
        declare(app, {"x": {"task": "no.such", "schedule": 10}})


def test_a_beat_entry_option_a_tick_cannot_take_is_refused():
    app = new_app()
    with pytest.raises(ImproperlyConfigured, match=r"'x': option\(s\) countdown cannot apply"):
        declare(app, {"x": {"task": ADD, "schedule": 10, "options": {"countdown": 5}}})
    with pytest.raises(ImproperlyConfigured, match=r"relative=True has no counterpart"):
        declare(app, {"x": {"task": ADD, "schedule": 10, "relative": True}})


def test_solar_is_refused_naming_the_alternative():
    with pytest.raises(Unsupported, match=r"solar\('sunrise'.*no counterpart.*crontab"):
        solar("sunrise", 48.85, 2.35)


def test_schedule_relative_is_refused():
    with pytest.raises(Unsupported, match=r"relative=True\) has no counterpart"):
        schedule(run_every=10, relative=True)


# -- django-celery-beat's tables -----------------------------------------------------
BEAT_TABLES = """
CREATE TABLE django_celery_beat_intervalschedule (id serial PRIMARY KEY, every int NOT NULL,
    period varchar(24) NOT NULL);
CREATE TABLE django_celery_beat_crontabschedule (id serial PRIMARY KEY, minute varchar(240),
    hour varchar(96), day_of_week varchar(64), day_of_month varchar(124),
    month_of_year varchar(64), timezone varchar(63));
CREATE TABLE django_celery_beat_periodictask (id serial PRIMARY KEY,
    name varchar(200) UNIQUE, task varchar(200), interval_id int, crontab_id int,
    solar_id int, clocked_id int, args text DEFAULT '[]', kwargs text DEFAULT '{}',
    queue varchar(200), exchange varchar(200), routing_key varchar(200),
    headers text DEFAULT '{}', priority int, expires timestamptz, expire_seconds int,
    one_off bool DEFAULT false, start_time timestamptz, enabled bool DEFAULT true,
    last_run_at timestamptz, total_run_count int DEFAULT 0, date_changed timestamptz,
    description text DEFAULT '');
INSERT INTO django_celery_beat_intervalschedule (id, every, period) VALUES (1, 10, 'minutes');
INSERT INTO django_celery_beat_crontabschedule VALUES (1, '30', '7', '1', '*', '*',
    'Europe/Paris');
INSERT INTO django_celery_beat_periodictask (name, task, interval_id, args, queue)
    VALUES ('every ten minutes', 'tests.celery_project.shop.tasks.add', 1, '[1, 2]',
            'emails');
INSERT INTO django_celery_beat_periodictask (name, task, crontab_id, enabled,
    expire_seconds) VALUES ('monday report', 'tests.celery_project.shop.tasks.report', 1,
    false, 60);
INSERT INTO django_celery_beat_periodictask (name, task, solar_id)
    VALUES ('at sunrise', 'tests.celery_project.shop.tasks.report', 1);
INSERT INTO django_celery_beat_periodictask (name, task, clocked_id, one_off)
    VALUES ('once', 'tests.celery_project.shop.tasks.report', 1, true);
INSERT INTO django_celery_beat_periodictask (name, task, interval_id)
    VALUES ('elsewhere', 'billing.tasks.invoice', 1);
INSERT INTO django_celery_beat_periodictask (name, task, interval_id)
    VALUES ('cleanup', 'celery.backend_cleanup', 1);
"""


@pytest.fixture
def beat_tables():
    with connection.cursor() as cursor:
        cursor.execute(BEAT_TABLES)
    yield
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TABLE django_celery_beat_periodictask, django_celery_beat_crontabschedule, "
            "django_celery_beat_intervalschedule"
        )


def test_import_celery_beat_is_a_dry_run_by_default(beat_tables, capsys):
    call_command("pgqueue_import_celery_beat")
    out = capsys.readouterr().out
    assert f"would add 'every ten minutes': {ADD} every 600s, queue emails" in out
    assert ("would add 'monday report': tests.celery_project.shop.tasks.report "
            "30 7 * * 1 (Europe/Paris), paused (disabled in beat)") in out  # fmt: skip
    assert "not carried over: its expiry" in out
    assert "skipped 'at sunrise' (tests.celery_project.shop.tasks.report): a solar" in out
    assert "skipped 'once'" in out and "apply_async(eta=...)" in out
    assert "skipped 'elsewhere' (billing.tasks.invoice): task 'billing.tasks.invoice' is not" in out
    assert "skipped 'cleanup'" in out
    assert "Dry run: 2 schedule(s) would be added; pass --apply." in out
    assert not Schedule.objects.exists()


def test_import_celery_beat_apply_adds_runtime_schedules(beat_tables, capsys):
    call_command("pgqueue_import_celery_beat", "--apply")
    assert "2 schedule(s) added." in capsys.readouterr().out
    ten = Schedule.objects.get(name="every ten minutes")
    assert (ten.task_name, ten.spec, ten.paused_at) == (ADD, "every 600s", None)
    assert ten.definition["args"] == [1, 2] and ten.definition["queue"] == "emails"
    report = Schedule.objects.get(name="monday report")
    assert (report.spec, report.timezone) == ("30 7 * * 1", "Europe/Paris")
    assert report.paused_at is not None


def test_import_celery_beat_of_an_unknown_database_names_the_aliases():
    with pytest.raises(CommandError, match=r"--database 'nope' is not an alias of DATABASES: use"):
        call_command("pgqueue_import_celery_beat", "--database", "nope")


def test_import_celery_beat_without_its_tables_says_so():
    with pytest.raises(CommandError, match=r"no django_celery_beat_periodictask table"):
        call_command("pgqueue_import_celery_beat")


# -- what has no counterpart ---------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "instead"),
    [("control", "django_pgqueue.cancel"), ("events", "admin"), ("Worker", "runtaskworker"),
     ("Beat", "no beat process"), ("amqp", "no broker"), ("backend", "its row")],
)  # fmt: skip
def test_the_apps_remote_control_and_broker_are_refused_naming_the_alternative(name, instead):
    with pytest.raises(Unsupported, match=instead):
        getattr(proj_celery.app, name)


@pytest.mark.parametrize("name", sorted(celery_app_module._UNSUPPORTED))
def test_every_app_attribute_with_no_counterpart_is_refused(name):
    with pytest.raises(Unsupported, match=rf"^app\.{name} has no counterpart here: \w"):
        getattr(proj_celery.app, name)


@pytest.mark.parametrize("name", sorted(celery_package._UNSUPPORTED))
def test_every_celery_name_with_no_counterpart_cannot_be_imported(name):
    with pytest.raises(UnsupportedImport, match=rf"celery's {name} has no counterpart"):
        exec(f"from django_pgqueue.celery import {name}")


@pytest.mark.parametrize("name", sorted(celery_signals._UNSUPPORTED))
def test_every_celery_signal_with_no_counterpart_cannot_be_imported(name):
    with pytest.raises(ImportError, match=rf"celery.signals.{name} has no counterpart in "):
        exec(f"from django_pgqueue.celery.signals import {name}")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: tasks.add.add_to_chord(tasks.add.s(1, 1)), r"add_to_chord\(\) has no"),
        (lambda: tasks.add.send_event("task-progress"), r"send_event\(\) has no counterpart"),
        (lambda: tasks.add.backend, "task.backend has no counterpart.*AsyncResult"),
        (lambda: AsyncResult("1").then(print), "then has no counterpart.*link"),
        (lambda: tasks.add.apply_async((1, 2), group_id="g"), r"group_id=...\) has no"),
        (lambda: tasks.add.apply_async((1, 2), chord="c"), r"chord=...\) has no"),
        (lambda: tasks.add.apply_async((1, 2), chain=["c"]), r"chain=...\) has no"),
    ],
)
def test_task_and_result_methods_with_no_counterpart_are_refused(call, message):
    with pytest.raises(Unsupported, match=message):
        call()


def test_a_beat_entry_with_an_exchange_or_an_unknown_key_is_refused():
    app = new_app()
    with pytest.raises(ImproperlyConfigured, match="'x': exchange has no counterpart: use queue"):
        declare(app, {"x": {"task": ADD, "schedule": 10, "options": {"exchange": "e"}}})
    with pytest.raises(ImproperlyConfigured, match=r"'x': unknown key\(s\) every"):
        declare(app, {"x": {"task": ADD, "schedule": 10, "every": 3}})


@pytest.mark.parametrize("refused", [chunks, xmap, xstarmap])
def test_chunks_and_starmap_are_refused_naming_a_group(refused):
    with pytest.raises(Unsupported, match=r"no counterpart.*group\(task.s"):
        refused(tasks.add, [(1, 2)], 10)


@pytest.mark.parametrize("method", ["map", "starmap", "chunks"])
def test_the_task_methods_map_starmap_and_chunks_are_refused(method):
    with pytest.raises(Unsupported, match=r"enqueue_many"):
        getattr(tasks.add, method)([(1, 2)])


@pytest.mark.parametrize(("name", "instead"), [("Ignore", "return None"), ("Reject", "Snooze")])
def test_ignore_and_reject_cannot_be_imported(name, instead):
    with pytest.raises(UnsupportedImport, match=rf"celery's {name} has no counterpart.*{instead}"):
        exec(f"from django_pgqueue.celery import {name}")


def test_a_signal_with_no_counterpart_cannot_be_imported():
    with pytest.raises(ImportError, match=r"worker_process_init has no counterpart.*ready"):
        exec("from django_pgqueue.celery.signals import worker_process_init")


def test_retry_with_new_arguments_is_refused():
    with pytest.raises(Unsupported, match=r"self.retry\(args=...\) has no counterpart"):
        retries_with_new_args.apply((1,), throw=True)


def test_retry_without_throwing_is_refused():
    with pytest.raises(Unsupported, match=r"retry\(throw=False\).*raise self.retry"):
        retries_without_throwing.apply(throw=True)


def test_replace_is_refused_naming_wait_for():
    with pytest.raises(Unsupported, match=r"replace\(\) has no counterpart.*wait_for"):
        replaces_itself.apply(throw=True)


@pytest.mark.parametrize(
    ("option", "instead"),
    [("exchange", "pass queue="), ("shadow", "task_name"), ("compression", "TOAST")],
)  # fmt: skip
def test_broker_options_with_no_counterpart_are_refused(option, instead):
    with pytest.raises(Unsupported, match=rf"apply_async\({option}=...\).*{instead}"):
        tasks.add.apply_async((1, 2), **{option: "x"})
    assert not Task.objects.exists()


def test_freeze_is_refused_naming_task_id():
    with pytest.raises(Unsupported, match=r"freeze\(\) has no counterpart.*task_id"):
        tasks.add.s(1, 2).freeze()


def test_waiting_on_result_messages_is_refused():
    with pytest.raises(Unsupported, match=r"on_message"):
        AsyncResult("1").get(on_message=print)


def test_update_state_of_another_task_is_refused():
    tasks.add.push_request(task_context=_StubContext(), called_directly=False)
    try:
        with pytest.raises(Unsupported, match=r"update_state\(task_id=...\) of another task"):
            tasks.add.update_state(task_id="999", state="PROGRESS")
    finally:
        tasks.add.pop_request()


class _StubContext:
    task_id = 1
