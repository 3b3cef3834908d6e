"""Forged requests to the admin, searched for (Hypothesis).

Properties, for a superuser, a staff user who may only view tasks, and an anonymous
visitor: no request is answered with a server error (500), whatever its query string
(filters, search, ordering, page, date drill-down, ``db``), its action form (forged or
foreign ids, ``select_across``), its object id, its Send signal form or its pause
button; and a user without the permission changes nothing (the task, queue, worker
and schedule tables and the admin log are as before). Query strings and forms are
sent percent-encoded as bytes, so they may hold NUL and invalid UTF-8 (a lone
surrogate's bytes), as a forger's may.

The same holds for every input that takes JSON (admin/input.py): the enqueue form,
Send signal, the schedule forms (add and change) and the task list's search by
content, given text nested thousands deep, megabytes long, numbers past a bigint or
past 1,000 digits, NaN, NUL and lone surrogates, escaped or not.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from urllib.parse import quote

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from hypothesis import example, given, settings
from hypothesis import strategies as st

from django_pgqueue import add_schedule
from django_pgqueue.models import Queue, Schedule, Task, Worker
from tests import periodic_tasks
from tests.factories import TaskFactory
from tests.fuzzing import big_ints, examples, hostile_text, json_ish

pytestmark = pytest.mark.django_db

ADMIN = "/admin/django_pgqueue"
LISTS = [f"{ADMIN}/task/", f"{ADMIN}/worker/", f"{ADMIN}/schedule/", f"{ADMIN}/queueoverview/"]
REAL = [f"<task {i}>" for i in range(6)]  # the tasks made by the fixture, by position

values = st.one_of(
    hostile_text,
    big_ints.map(str),
    st.integers(-3, 3).map(str),
    st.sampled_from(
        ["default", "queue2", "nope", "pending", "failed", "running", "waiting", "due",
         "scheduled", "signal", "parents", "tests.tasks.noop", "#1", "²", "٣", "-1", "",
         "9" * 30, "9" * 5000, "task_name", "-id", "1.2.3", "2026", "13", "0"]
    ),
)  # fmt: skip
parameters = st.one_of(
    st.sampled_from(
        ["q", "o", "p", "db", "e", "all", "queue", "task_name", "state__exact", "due",
         "handler_version", "handler_version__exact", "wait_reason", "enqueued_at__year",
         "enqueued_at__month", "enqueued_at__day", "_changelist_filters", "refresh",
         "id__gt", "_to_field", "_popup"]
    ),
    hostile_text,
)  # fmt: skip
queries = st.lists(st.tuples(parameters, values), max_size=4)
object_ids = st.one_of(
    st.sampled_from(REAL), big_ints.map(str), hostile_text, st.sampled_from(["abc", "²", "0"])
)
actions = st.one_of(
    st.sampled_from(["retry_now", "cancel", "cancel_hard", "requeue", "delete",
                     "delete_selected", "remove_stale", "run_now", "delete_removed"]),
    hostile_text,
)  # fmt: skip


# Text typed where the admin takes JSON.
json_texts = st.one_of(
    st.integers(1, 5000).flatmap(
        lambda n: st.sampled_from(["[" * n + "]" * n, '{"k":' * n + "1" + "}" * n, "[" * n])
    ),
    st.sampled_from(
        ["", " ", "null", "[]", "{}", "1", '"x"', "NaN", "[-Infinity]", "1e999", '{"a": 1e999}',
         "9" * 5000, "[" + "9" * 5000 + "]", "-" + "9" * 1001, str(2**63), f"[{2**64}]",
         '"\\u0000"', '["\\ud800"]', '{"\\udce9": 1}', "\x00", '["a\x00b"]', "\ud800",
         '"caf\udce9"', '{"email": "ann@example.com"}', '[1, "fr"]', "[1,", "{'a': 1}",
         "[" + "1," * 200_000 + "1]"]
    ),
    st.sampled_from([10**5, 2 * 10**6]).map(lambda n: json.dumps(["x" * n])),
    json_ish.map(lambda value: json.dumps(value, skipkeys=True, default=repr)),
)  # fmt: skip
NOOP = "tests.tasks.noop"
BEAT = periodic_tasks.beat.name
RUNTIME = "fuzzed"  # the runtime schedule the fixture adds, whose change form is posted


def _form(**fields) -> st.SearchStrategy[list[tuple[str, str]]]:
    return st.fixed_dictionaries(fields).map(lambda d: list(d.items()))


post_enqueue = st.tuples(
    st.just("POST"),
    st.just(f"{ADMIN}/task/enqueue/"),
    st.just([]),
    _form(
        task=st.sampled_from([f"{NOOP}@1", f"{NOOP}@9", "os.system@1"]) | values,
        args=json_texts,
        kwargs=json_texts,
        queue=st.sampled_from(["", "default"]) | values,
        priority=st.sampled_from(["", "5"]) | values,
        delay=st.sampled_from(["", "1", "1e308", "1e999", "nan", "-0"]) | values,
    ),
)
schedule_fields = _form(
    name=st.sampled_from(["new", RUNTIME]) | values,
    task=st.sampled_from([BEAT, "os.system"]) | values,
    cron=st.sampled_from(["", "0 7 * * mon", "* * * * *"]) | values,
    every=st.sampled_from(["", "1", "60", "1e999", "nan"]) | values,
    timezone=st.sampled_from(["UTC", "Europe/Paris", "../etc"]) | values,
    args=json_texts,
    kwargs=json_texts,
    missed=st.sampled_from(["once", "skip", "all"]) | values,
    catch_up_limit=st.sampled_from(["10"]) | values,
    queue=st.sampled_from(["", "default"]) | values,
    priority=st.sampled_from(["", "1"]) | values,
    max_attempts=st.sampled_from(["", "3"]) | values,
    timeout=st.sampled_from(["", "1.5", "1e999"]) | values,
    metadata=json_texts,
)
post_schedule = st.tuples(
    st.just("POST"),
    st.sampled_from([f"{ADMIN}/schedule/add/", f"{ADMIN}/schedule/{RUNTIME}/change/"]),
    st.just([]),
    schedule_fields,
)
post_signal = st.tuples(
    st.just("POST"),
    st.tuples(st.sampled_from(REAL), st.just("signal")),
    st.just([]),
    _form(name=st.sampled_from(["go", "other"]) | values, payload=json_texts),
)
search_content = st.tuples(
    st.just("GET"),
    st.just(f"{ADMIN}/task/"),
    st.lists(
        st.tuples(
            st.sampled_from(["args", "kwargs", "metadata", "error", "search_below", "q"]),
            json_texts | values,
        ),
        min_size=1,
        max_size=3,
    ),
    st.just([]),
)
json_requests = st.one_of(post_enqueue, post_schedule, post_signal, search_content)


def _encode(text: str) -> str:
    """Percent-encoded UTF-8, lone surrogates included (what no browser sends)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def _query(pairs: list[tuple[str, str]]) -> str:
    return "&".join(f"{_encode(k)}={_encode(v)}" for k, v in pairs)


# A request: (method, path, query pairs, form pairs). Paths and ids are resolved at send
# time, so that a request may name the fixture's real tasks.
get_list = st.tuples(st.just("GET"), st.sampled_from(LISTS), queries, st.just([]))
get_object = st.tuples(
    st.just("GET"),
    st.tuples(object_ids, st.sampled_from(["change", "signal", "delete", "history"])),
    queries,
    st.just([]),
)
post_action = st.tuples(
    st.just("POST"),
    st.sampled_from(LISTS[:3]),
    queries,
    st.tuples(
        st.just("action"), actions
    ).map(lambda pair: [pair]) | st.just([("action", "retry_now")]),
)
selections = st.lists(
    st.tuples(
        st.sampled_from(["_selected_action", "select_across", "index"]),
        st.one_of(st.sampled_from(REAL), values),
    ),
    max_size=4,
)
post_operate = st.tuples(
    st.just("POST"),
    st.tuples(object_ids, st.one_of(st.sampled_from(
        ["operate/retry_now", "operate/cancel", "operate/cancel_hard", "operate/requeue",
         "operate/delete", "signal"]), hostile_text.map(lambda t: f"operate/{t}"))),
    queries,
    st.lists(st.tuples(st.sampled_from(["name", "payload", "post"]), values), max_size=3),
)  # fmt: skip
post_pause = st.tuples(
    st.just("POST"),
    st.just(f"{ADMIN}/queueoverview/pause/"),
    st.just([]),
    st.lists(
        st.tuples(st.sampled_from(["action", "queue", "task_name"]),
                  st.one_of(st.sampled_from(["pause", "resume"]), values)),
        max_size=4,
    ),
)  # fmt: skip
forged_requests = st.one_of(
    get_list,
    get_object,
    st.tuples(post_action, selections).map(lambda r: (*r[0][:3], r[0][3] + r[1])),
    post_operate,
    post_pause,
)


@pytest.fixture
def visitors(django_user_model) -> dict[str, Client]:
    """A superuser, a staff user who may only view tasks, and an anonymous visitor."""
    root = django_user_model.objects.create_superuser("root", password="pw")
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="django_pgqueue",
            codename__in=["view_task", "view_worker", "view_schedule"],
        )
    )
    clients = {}
    for name, user in (("superuser", root), ("viewer", viewer), ("anonymous", None)):
        client = Client(raise_request_exception=False)
        if user is not None:
            client.force_login(user)
        clients[name] = client
    return clients


@pytest.fixture
def real_tasks() -> list[int]:
    """One task per state a button or action can change."""
    now = timezone.now()
    lease = {"lease_token": uuid.uuid4(), "lease_expires_at": now + timedelta(seconds=30)}
    rows = [
        TaskFactory(run_at=now - timedelta(seconds=5)),
        TaskFactory(state="running", attempt=1, worker_id="w-1", **lease),
        TaskFactory(state="waiting", wait_reason="signal", wait_signal="go"),
        TaskFactory(state="failed", attempt=3, max_attempts=3, finished_at=now),
        TaskFactory(state="succeeded", attempt=1, finished_at=now),
        TaskFactory(run_at=now + timedelta(hours=1)),
    ]
    Worker.objects.create(
        id="w-1", hostname="h", pid=1, queues=["default"], routes=[["tests.tasks.noop", 1]],
        concurrency=1, last_heartbeat_at=now - timedelta(days=1),
    )  # fmt: skip
    Schedule.objects.create(name="removed", task_name="gone", spec="every 1h", timezone="UTC")
    add_schedule(RUNTIME, BEAT, every=60, args=["a"])
    return [row.pk for row in rows]


def _real(text: str, ids: list[int]) -> str:
    return str(ids[REAL.index(text)]) if text in REAL else text


def _send(client: Client, request, ids: list[int]):
    method, path, query, form = request
    if isinstance(path, tuple):  # (object id, page) of a task
        object_id, page = path
        path = f"{ADMIN}/task/{_encode(_real(object_id, ids))}/{page}/"
    url = f"{path}?{_query(query)}" if query else path
    if method == "GET":
        return client.get(url)
    body = _query([(k, _real(v, ids)) for k, v in form])
    return client.post(url, body, content_type="application/x-www-form-urlencoded")


def _state() -> tuple:
    """What a change would change: every table the admin can write, and its log."""
    return (
        list(Task.objects.order_by("pk").values_list(
            "pk", "state", "attempt", "max_attempts", "run_at", "cancel_requested",
            "cancel_hard", "signals", "wake",
        )),
        list(Queue.objects.order_by("name").values_list("name", "paused", "paused_tasks")),
        list(Worker.objects.order_by("id").values_list("id", flat=True)),
        list(Schedule.objects.order_by("name").values_list("name", "last_task_id")),
        LogEntry.objects.count(),
    )  # fmt: skip


def _short(request) -> str:
    """The request for a failure's message, cut to 2,000 characters."""
    text = repr(request)
    return text if len(text) <= 2000 else f"{text[:1000]} ... {text[-1000:]}"


def _check(visitors: dict[str, Client], request, ids: list[int]) -> None:
    for name in ("anonymous", "viewer"):
        before = _state()
        response = _send(visitors[name], request, ids)
        assert response.status_code != 500, (name, _short(request))
        assert _state() == before, f"{name} changed something with {_short(request)}"
    response = _send(visitors["superuser"], request, ids)
    assert response.status_code != 500, ("superuser", _short(request))


@settings(max_examples=examples(150))
@given(request=forged_requests)
@example(request=("GET", f"{ADMIN}/task/", [("q", "²")], []))  # int('²'): ValueError
@example(request=("GET", f"{ADMIN}/task/", [("q", "9" * 30)], []))  # id past bigint
@example(request=("GET", f"{ADMIN}/task/", [("queue", "\x00")], []))  # DataError: NUL
@example(request=("GET", f"{ADMIN}/task/", [("state__exact", "\x00")], []))
@example(request=("GET", f"{ADMIN}/queueoverview/", [("refresh", "²")], []))
@example(request=("GET", f"{ADMIN}/queueoverview/", [("refresh", "9" * 5000)], []))
@example(request=("POST", f"{ADMIN}/task/", [], [("action", "retry_now"),
                                                 ("_selected_action", "abc")]))
@example(request=("POST", f"{ADMIN}/task/", [], [("action", "cancel"),
                                                 ("_selected_action", "\x00")]))
@example(request=("POST", f"{ADMIN}/worker/", [], [("action", "remove_stale"),
                                                   ("_selected_action", "\x00")]))
@pytest.mark.slow
@example(request=("POST", ("abc", "operate/cancel"), [], []))  # ValueError: not an id
@example(request=("POST", ("\x00", "operate/cancel"), [], []))
@example(request=("POST", (REAL[2], "signal"), [], [("name", "go"), ("payload", "[" * 2000)]))
@example(request=("POST", (REAL[2], "signal"), [], [("name", "go"), ("payload", "9" * 5000)]))
def test_no_forged_request_is_a_server_error_nor_a_change_without_permission(
    visitors, real_tasks, request
):
    _check(visitors, request, real_tasks)


@settings(max_examples=examples(120))
@given(request=json_requests)
@example(request=("POST", f"{ADMIN}/schedule/add/", [], [("name", "deep"), ("task", BEAT),
    ("every", "60"), ("timezone", "UTC"), ("args", "[" * 5000 + "]" * 5000),
    ("missed", "once"), ("catch_up_limit", "10")]))  # RecursionError in the form field
@example(request=("POST", f"{ADMIN}/task/enqueue/", [], [("task", f"{NOOP}@1"),
    ("args", "[" * 5000 + "]" * 5000)]))
@pytest.mark.slow
@example(request=("GET", f"{ADMIN}/task/", [("kwargs", '{"k":' * 5000 + "1" + "}" * 5000)], []))
def test_no_json_typed_into_a_form_or_a_search_box_is_a_server_error(
    visitors, real_tasks, request
):
    _check(visitors, request, real_tasks)


# -- regressions: each input Hypothesis found, as a plain test --------------------------
@pytest.mark.parametrize("term", ["²", "٣", "9" * 30, "#" + "9" * 5000])
def test_searching_for_what_is_no_task_id_finds_nothing_and_is_no_error(admin_client, term):
    TaskFactory()

    response = admin_client.get(reverse("admin:django_pgqueue_task_changelist"), {"q": term})

    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []


@pytest.mark.parametrize("parameter", ["queue", "task_name", "state__exact", "wait_reason"])
def test_a_list_filter_holding_a_nul_is_a_bad_lookup_not_a_server_error(admin_client, parameter):
    url = reverse("admin:django_pgqueue_task_changelist")

    response = admin_client.get(f"{url}?{parameter}=%00")

    assert (response.status_code, response["Location"]) == (302, f"{url}?e=1")


@pytest.mark.parametrize(("model", "value"), [("task", "abc"), ("task", "\x00"),
                                              ("worker", "\x00"), ("schedule", "\x00")])
def test_an_action_on_a_forged_selection_runs_nothing_and_says_so(admin_client, model, value):
    pending = TaskFactory()
    url = reverse(f"admin:django_pgqueue_{model}_changelist")
    action = {"task": "cancel", "worker": "remove_stale", "schedule": "run_now"}[model]

    response = admin_client.post(
        url, {"action": action, "_selected_action": [value, pending.pk]}, follow=True
    )

    assert response.status_code == 200
    [message] = [str(m) for m in response.context["messages"]]
    assert message.startswith(f"No action was run: the selection holds {value!r}")
    pending.refresh_from_db()
    assert pending.state == "pending"


@pytest.mark.parametrize("object_id", ["abc", "²", "%00", str(2**70)])
def test_a_button_on_a_forged_task_id_is_not_found(admin_client, object_id):
    response = admin_client.post(f"{ADMIN}/task/{object_id}/operate/cancel/")

    assert response.status_code == 404


@pytest.mark.parametrize("refresh", ["²", "9" * 5000, "1", "86401", "abc"])
def test_an_overview_refresh_that_is_no_interval_keeps_the_default(admin_client, refresh):
    response = admin_client.get(reverse("admin:django_pgqueue_queueoverview_changelist"),
                                {"refresh": refresh})  # fmt: skip

    assert (response.status_code, response.context["refresh"]) == (200, None)
    assert b'data-every="10"' in response.content


def test_an_overview_refresh_of_whole_seconds_sets_the_in_place_refresh_interval(admin_client):
    response = admin_client.get(reverse("admin:django_pgqueue_queueoverview_changelist"),
                                {"refresh": "30"})  # fmt: skip

    assert response.context["refresh"] == 30
    assert b'data-every="30"' in response.content
    assert b'http-equiv="refresh"' not in response.content  # counts refresh, no reload


@pytest.mark.parametrize(
    ("payload", "error"),
    [("[" * 2000, "nested deeper than 100 levels"),
     ("9" * 5000, "a number is longer than 1000 digits")],
)  # fmt: skip
def test_a_signal_payload_python_cannot_parse_is_a_form_error(admin_client, payload, error):
    task = TaskFactory(state="waiting", wait_reason="signal", wait_signal="go")

    response = admin_client.post(
        f"{ADMIN}/task/{task.pk}/signal/", {"name": "go", "payload": payload}
    )

    assert response.status_code == 200
    assert error in response.content.decode()
    task.refresh_from_db()
    assert (task.state, task.signals) == ("waiting", {})


@pytest.mark.parametrize(
    ("field", "text", "error"),
    [("args", "[" * 5000 + "]" * 5000, "args: nested deeper than 100 levels"),
     ("kwargs", '{"k":' * 5000 + "1" + "}" * 5000, "kwargs: nested deeper than 100 levels"),
     ("metadata", '{"n": ' + "9" * 5000 + "}", "metadata: a number is longer than 1000 digits"),
     ("args", '["\\u0000"]', "args[0]: strings must not contain NUL characters"),
     ("args", "[NaN]", "args[0]: nan is not valid JSON")],
)  # fmt: skip
def test_json_a_schedule_form_cannot_take_is_a_form_error_and_writes_nothing(
    admin_client, field, text, error
):
    form = {"name": "bad", "task": BEAT, "cron": "", "every": "60", "timezone": "UTC",
            "args": "[]", "kwargs": "{}", "missed": "once", "catch_up_limit": "10",
            "metadata": "", field: text}  # fmt: skip

    response = admin_client.post(f"{ADMIN}/schedule/add/", form)

    assert response.status_code == 200  # the form again, with the error
    assert error in response.content.decode()
    assert not Schedule.objects.filter(pk="bad").exists()
