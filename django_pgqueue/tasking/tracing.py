"""OpenTelemetry spans for enqueues and executions (docs/tracing.md).

On whenever ``opentelemetry-api`` can be imported (``pip install django-pgqueue-tasks[otel]``):
the library calls the OpenTelemetry API itself, as the OpenTelemetry project asks of
libraries. While the project configures no SDK (no TracerProvider is set), no span is
made. When it cannot be imported, ``producer`` and ``consumer`` return the functions
they are given unchanged, so nothing is imported and nothing is paid.

- A PRODUCER span ``enqueue <task name>`` (``enqueue_many``, ``enqueue_on_commit``)
  around each enqueue call. It is current while the row is built, so the
  ``traceparent`` that enqueue stores in ``metadata`` is this span's.
- A CONSUMER span ``process <task name>`` around each attempt in the worker, a child
  of the span of the enqueue (the ``traceparent`` of ``metadata``), current while the
  middleware and the handler run.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import (
        NoOpTracerProvider,
        ProxyTracerProvider,
        SpanKind,
        Status,
        StatusCode,
    )
except ImportError:
    trace = None

ENABLED = trace is not None
SYSTEM = "django_pgqueue"
# The outcome labels (worker/outcomes.py) that mark a span as an error: the attempt
# failed (and will be retried, or dead-letters), timed out, or lost its lease.
ERROR_OUTCOMES = frozenset({"failure", "timeout", "lost"})
_TRACE_KEYS = ("traceparent", "tracestate")


class _Options(Protocol):
    @property
    def queue(self) -> str | None: ...


class EnqueuedTask(Protocol):
    """What a PRODUCER span reads of the task enqueued (registry.py's TaskDefinition)."""

    @property
    def name(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def options(self) -> _Options: ...


class RunningTask(Protocol):
    """What a CONSUMER span reads of the task it runs (the worker's ClaimedTask)."""

    @property
    def id(self) -> int: ...
    @property
    def task_name(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def metadata_json(self) -> str: ...
    @property
    def metadata(self) -> dict[str, Any]: ...


class AttemptOutcome(Protocol):
    """What a CONSUMER span records of how the attempt ended (the worker's Outcome)."""

    @property
    def label(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def error(self) -> dict[str, Any] | None: ...
    @property
    def exc(self) -> BaseException | None: ...


# The worker's own Outcome, returned through a consumer as it came.
OutcomeT = TypeVar("OutcomeT", bound=AttemptOutcome)

# A ProxyTracer until the project sets a TracerProvider, then the project's tracer.
_tracer: Any = trace.get_tracer("django_pgqueue") if ENABLED else None
# The API's own providers: no SDK is configured, every span would be a no-op.
_NO_SDK = (ProxyTracerProvider, NoOpTracerProvider) if ENABLED else ()


def _active_tracer() -> Any:
    """The tracer, or None while no span could reach anyone: no SDK is configured, or
    the SDK's provider has no span processor (so no exporter). Those spans are skipped,
    not made: an SDK span costs 15-25 us of CPU, a quarter of a short task's whole cost
    in the worker, for nothing. Checked on every call: a processor may be added later."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, _NO_SDK):
        return None
    # The SDK's TracerProvider keeps its processors here (not public API: a provider
    # of another make, without the attribute, always gets spans).
    active = getattr(provider, "_active_span_processor", None)
    processors = getattr(active, "_span_processors", None)
    if processors == ():
        return None
    return _tracer


def trace_context() -> dict[str, str]:
    """The W3C ``traceparent`` (and ``tracestate``) of the enqueuing code, when
    OpenTelemetry is installed and a span is active, for the row's ``metadata``: the
    handler finds them in ``context.metadata``, and its CONSUMER span continues the
    same trace."""
    if not ENABLED:
        return {}
    # No span, or no valid span context: the W3C propagator writes neither key.
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in _TRACE_KEYS}


def producer(operation: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn(definition, ...)`` (an enqueue returning an id, (id, enqueued_at), or a
    list of ids) in a PRODUCER span named ``<operation> <task name>``; ``fn`` itself
    without OpenTelemetry."""
    if not ENABLED:
        return fn

    @functools.wraps(fn)
    def traced(definition: EnqueuedTask, *args: Any) -> Any:
        tracer = _active_tracer()
        if tracer is None:
            return fn(definition, *args)
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": definition.options.queue or definition.queue,
            "messaging.operation.type": "send",
            "messaging.operation.name": operation,
            "django_pgqueue.task.name": definition.name,
        }
        span = tracer.start_span(
            f"{operation} {definition.name}", kind=SpanKind.PRODUCER, attributes=attributes
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            result = fn(definition, *args)
        except BaseException as exc:
            _failed(span, exc, f"{type(exc).__name__}: {exc}")
            raise
        else:
            if isinstance(result, list):
                span.set_attribute("messaging.batch.message_count", len(result))
            else:
                task_id = result[0] if isinstance(result, tuple) else result
                span.set_attribute("messaging.message.id", str(task_id))
            return result
        finally:
            otel_context.detach(token)
            span.end()

    return traced


def consumer(fn: Callable[..., OutcomeT]) -> Callable[..., OutcomeT]:
    """A sync ``fn(task, database, ...) -> Outcome`` in a CONSUMER span; ``fn`` itself
    without OpenTelemetry."""
    if not ENABLED:
        return fn

    @functools.wraps(fn)
    def traced(task: RunningTask, database: str, *args: Any, **kwargs: Any) -> OutcomeT:
        tracer = _active_tracer()
        if tracer is None:
            return fn(task, database, *args, **kwargs)
        span = _process_span(tracer, task)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            outcome = fn(task, database, *args, **kwargs)
            _ended(span, outcome)
            return outcome
        finally:
            otel_context.detach(token)
            span.end()

    return traced


def aconsumer(fn: Callable[..., Awaitable[OutcomeT]]) -> Callable[..., Awaitable[OutcomeT]]:
    """``consumer`` for ``async def fn(task, database, ...) -> Outcome``."""
    if not ENABLED:
        return fn

    @functools.wraps(fn)
    async def traced(task: RunningTask, database: str, *args: Any, **kwargs: Any) -> OutcomeT:
        tracer = _active_tracer()
        if tracer is None:
            return await fn(task, database, *args, **kwargs)
        span = _process_span(tracer, task)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            outcome = await fn(task, database, *args, **kwargs)
            _ended(span, outcome)
            return outcome
        finally:
            otel_context.detach(token)
            span.end()

    return traced


def _process_span(tracer: Any, task: RunningTask) -> Any:
    # Parse the metadata only when it holds a trace context: most rows carry none.
    parent = None
    if task.metadata_json and "traceparent" in task.metadata_json:
        metadata = task.metadata
        if isinstance(metadata, dict):
            carrier = {k: metadata[k] for k in _TRACE_KEYS if isinstance(metadata.get(k), str)}
            parent = propagate.extract(carrier)
    # Few attributes: the SDK pays for each one on every attempt. The span is made
    # current by hand (attach, detach): start_as_current_span's context manager costs
    # a fifth of the span.
    return tracer.start_span(
        f"process {task.task_name}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.destination.name": task.queue,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.id": str(task.id),
            "django_pgqueue.task.name": task.task_name,
            "django_pgqueue.task.attempt": task.attempt,
        },
    )


def _ended(span: Any, outcome: AttemptOutcome) -> None:
    """The outcome on the span; an error status and the exception when it failed."""
    if not span.is_recording():
        return
    span.set_attribute("django_pgqueue.task.outcome", outcome.label)
    span.set_attribute("django_pgqueue.task.state", outcome.state)
    if outcome.label not in ERROR_OUTCOMES:
        return
    _failed(span, outcome.exc, (outcome.error or {}).get("message") or outcome.label)


def _failed(span: Any, exc: BaseException | None, message: str) -> None:
    if exc is not None:
        span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, message))
