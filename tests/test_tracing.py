"""OpenTelemetry spans (django_pgqueue/tasking/tracing.py): a PRODUCER span per enqueue call in
the enqueuing process (recorded here with the SDK's InMemorySpanExporter), a CONSUMER
span per attempt in real worker processes (exported to a file by tests/span_capture.py),
parented to the producer's; and nothing at all without opentelemetry."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db import transaction
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_pgqueue import InvalidTaskError
from django_pgqueue.models import Task
from django_pgqueue.tasking import tracing
from tests import middleware_fixtures, span_capture, tasks
from tests.conftest import REPO, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def exporter(monkeypatch) -> InMemorySpanExporter:
    """The enqueues of this process traced by an SDK provider of the test's own (the
    global provider can be set only once per process)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    monkeypatch.setattr(tracing, "_active_tracer", lambda: tracer)
    return exporter


@pytest.fixture
def worker_spans(start_worker, tmp_path):
    """Start a worker exporting its spans to a file; returns a reader of them."""
    path = tmp_path / "spans.jsonl"

    def start(*args: str):
        start_worker(*args, env={span_capture.SPANS_ENV: str(path)})
        return lambda: span_capture.read(path)

    return start


def span_id(span) -> str:
    return format(span.context.span_id, "#018x")


def trace_id(span) -> str:
    return format(span.context.trace_id, "#034x")


# -- producer spans --------------------------------------------------------------------


def test_enqueue_is_a_producer_span_with_the_messaging_attributes(exporter):
    task_id = tasks.noop.using(queue="other").enqueue(1)

    [span] = exporter.get_finished_spans()
    assert span.name == f"enqueue {tasks.noop.name}"
    assert span.kind == SpanKind.PRODUCER
    assert dict(span.attributes) == {
        "messaging.system": "django_pgqueue",
        "messaging.destination.name": "other",
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.message.id": str(task_id),
        "django_pgqueue.task.name": tasks.noop.name,
    }


def test_the_stored_traceparent_is_the_producer_spans(exporter):
    task_id = tasks.noop.enqueue(1)

    [span] = exporter.get_finished_spans()
    traceparent = Task.objects.get(pk=task_id).metadata["traceparent"]
    assert traceparent.split("-")[1:3] == [trace_id(span)[2:], span_id(span)[2:]]


def test_enqueue_many_and_enqueue_on_commit_are_producer_spans(exporter):
    tasks.noop.enqueue_many([1, 2, 3])
    with transaction.atomic():
        reserved = tasks.noop.enqueue_on_commit(4)

    many, on_commit = exporter.get_finished_spans()
    assert many.attributes["messaging.operation.name"] == "enqueue_many"
    assert many.attributes["messaging.batch.message_count"] == 3
    assert on_commit.attributes["messaging.operation.name"] == "enqueue_on_commit"
    assert on_commit.attributes["messaging.message.id"] == str(reserved)


def test_the_producer_span_names_the_queue_an_enqueue_hook_chose(exporter, settings):
    settings.PGQUEUE = {**settings.PGQUEUE, "MIDDLEWARE": [
        f"{middleware_fixtures.__name__}.ForceQueue"
    ]}  # fmt: skip

    tasks.noop.enqueue(1)

    [span] = exporter.get_finished_spans()
    assert span.attributes["messaging.destination.name"] == "other"


def test_a_refused_enqueue_records_its_exception_on_the_producer_span(exporter):
    with pytest.raises(InvalidTaskError):
        tasks.noop.enqueue(object())

    [span] = exporter.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in span.events] == [
        "django_pgqueue.exceptions.InvalidTaskError"
    ]


# -- consumer spans --------------------------------------------------------------------


@pytest.mark.parametrize("task_name", ["noop", "async_double"])
def test_each_execution_is_a_consumer_span_child_of_the_enqueues(
    exporter, worker_spans, task_name
):
    task_id = getattr(tasks, task_name).enqueue(2)
    [producer] = exporter.get_finished_spans()

    spans = worker_spans()
    [consumer] = wait_until(lambda: [s for s in spans() if s["name"].startswith("process ")])

    assert consumer["name"] == f"process {getattr(tasks, task_name).name}"
    assert consumer["kind"] == "SpanKind.CONSUMER"
    assert consumer["context"]["trace_id"] == trace_id(producer)
    assert consumer["parent_id"] == span_id(producer)
    assert consumer["attributes"] == {
        "messaging.system": "django_pgqueue",
        "messaging.destination.name": "default",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": str(task_id),
        "django_pgqueue.task.name": getattr(tasks, task_name).name,
        "django_pgqueue.task.attempt": 1,
        "django_pgqueue.task.outcome": "success",
        "django_pgqueue.task.state": "succeeded",
    }
    assert consumer["status"]["status_code"] == "UNSET"


def test_a_failing_attempt_records_its_exception_and_an_error_status(exporter, worker_spans):
    tasks.fail_always.enqueue("kaput")

    spans = worker_spans()
    attempts = wait_until(
        lambda: len(found := [s for s in spans() if s["name"].startswith("process ")]) == 3
        and found
    )

    assert [s["attributes"]["django_pgqueue.task.attempt"] for s in attempts] == [1, 2, 3]
    assert [s["attributes"]["django_pgqueue.task.state"] for s in attempts] == [
        "pending", "pending", "failed"
    ]  # fmt: skip
    for number, span in enumerate(attempts, 1):
        assert span["status"] == {
            "status_code": "ERROR", "description": f"kaput on attempt {number}"
        }  # fmt: skip
        [event] = span["events"]
        assert event["name"] == "exception"
        assert event["attributes"]["exception.type"] == "ValueError"


# -- without opentelemetry -------------------------------------------------------------

WITHOUT_OPENTELEMETRY = """
import sys
sys.modules["opentelemetry"] = None  # as if not installed: every import of it fails
import django
django.setup()
from django.db import transaction
from django_pgqueue.tasking import tracing
from django_pgqueue.models import Task
from django_pgqueue.worker import execution
from tests import tasks

assert not tracing.ENABLED
assert execution._execute.__name__ == "_execute" and not hasattr(execution._execute, "__wrapped__")
assert not hasattr(execution.execute_async, "__wrapped__")
with transaction.atomic():
    task_id = tasks.noop.enqueue(1)
print(Task.objects.get(pk=task_id).state, Task.objects.get(pk=task_id).metadata)
print(sorted(m for m in sys.modules if m.startswith("opentelemetry.")))
"""


def test_without_opentelemetry_nothing_of_it_is_imported_and_enqueue_works(db_url):
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_OPENTELEMETRY],
        cwd=REPO,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": db_url,
            "PYTHONPATH": str(REPO),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["pending {}", "[]"]


# -- when spans are made ----------------------------------------------------------------
def test_no_span_is_made_while_the_sdk_has_no_processor_to_give_it_to(monkeypatch) -> None:
    # Given the SDK's provider configured without any span processor (so no exporter)
    provider = TracerProvider()
    monkeypatch.setattr(tracing.trace, "get_tracer_provider", lambda: provider)
    # Then the library makes no span: nobody could receive it
    assert tracing._active_tracer() is None
    # When a processor is added later (an exporter configured after start-up)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # Then spans are made from the next call on
    assert tracing._active_tracer() is not None
