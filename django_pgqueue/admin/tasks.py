"""The task list and a task's page: filters, search, the state-checked actions and buttons."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.db import OperationalError, connections, transaction
from django.db.models import Count, Q, QuerySet
from django.db.models.functions import Now
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from django_pgqueue.admin.bulk import (
    bulk_action,
    cancel_batch,
    cancel_hard_batch,
    delete_batch,
    kept_message,
    requeue_batch,
    retry_batch,
)
from django_pgqueue.admin.common import (
    EMPTY,
    HIDDEN,
    MAY_DECRYPT,
    WithoutDeleteSelected,
    _payload,
    _pretty_json,
    _replica_of,
    _state_html,
    _url,
    _with_payloads,
    can_decrypt_tasks,
    payloads_shown,
    relative_time,
)
from django_pgqueue.admin.counts import TaskPaginator
from django_pgqueue.admin.databases import (
    DatabaseFilter,
    database_of,
    request_database,
    request_read_database,
    with_database,
)
from django_pgqueue.admin.enqueue import can_enqueue, enqueue_view
from django_pgqueue.admin.input import (
    ForgedInputMixin,
    JSONInput,
    task_id,
    task_id_or_404,
)
from django_pgqueue.admin.operation import Operation
from django_pgqueue.admin.search import PARAMETERS as SEARCH_PARAMETERS
from django_pgqueue.admin.search import ContentSearchFilter, search_context, searching
from django_pgqueue.core.conf import get_settings, queue_databases, read_database
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.models import (
    LIVE_STATES,
    TERMINAL_STATES,
    Dependency,
    Task,
    TaskLog,
    TaskState,
    Worker,
)
from django_pgqueue.ops import operations
from django_pgqueue.ops.overview import WAIT_REASONS, humanize_seconds
from django_pgqueue.tasking.registry import registry
from django_pgqueue.templatetags.pgqueue_admin import short_name

# Dependency edges listed on a task's page, each way: a chord's callback may wait for
# 10,000 parents, and its page reads the first 100 (and counts the rest).
EDGE_DISPLAY_LIMIT = 100
# Who wrote an executions entry (the settle, the lease sweep, or a refused late run).
_EXECUTION_SOURCES = {
    "settle": "settlement",
    "sweep": "lease expired",
    "late": "late (outcome refused)",
}


# -- waiting work: a task's dependency edges ------------------------------------------


@dataclass(frozen=True)
class Edges:
    """Some of a task's dependency edges, one way (``rows``: at most
    EDGE_DISPLAY_LIMIT, those not yet resolved first), and how many there are."""

    rows: list[dict[str, Any]]  # task (the other end's id), task_name, state, resolved,
    # proceed_on_failure; task_name and state are None for a task deleted since
    total: int
    unresolved: int
    database: str | None = None  # the alias of the tasks, for their links


def task_edges(task: Task, way: str) -> Edges:
    """``way="parents"``: the tasks ``task`` waits for (or waited for), through
    pgqueue_dep_child; ``"children"``: the tasks that wait for it, through
    pgqueue_dep_edge (parent_id, child_id), read only if it has dependents. At most
    EDGE_DISPLAY_LIMIT edges and their tasks (by primary key) are read, plus one count
    when there are more. Cached on ``task`` for the page's fields."""
    cache = task.__dict__.setdefault("_pgqueue_edges", {})
    using = task._state.db or read_database()  # where the page read the task
    if way not in cache:
        if way == "parents":
            edges, other = Dependency.objects.using(using).filter(child_id=task.pk), "parent_id"
        elif task.has_dependents:
            edges, other = Dependency.objects.using(using).filter(parent_id=task.pk), "child_id"
        else:
            cache[way] = Edges([], 0, 0, database_of(using))
            return cache[way]
        rows = list(
            edges.order_by("resolved", other).values(other, "resolved", "proceed_on_failure")[
                :EDGE_DISPLAY_LIMIT
            ]
        )
        if len(rows) < EDGE_DISPLAY_LIMIT:
            total, unresolved = len(rows), sum(not r["resolved"] for r in rows)
        else:
            counts = edges.aggregate(
                total=Count("pk"), unresolved=Count("pk", filter=Q(resolved=False))
            )
            total, unresolved = counts["total"], counts["unresolved"]
        ids = [r[other] for r in rows]
        found = {
            pk: (name, state)
            for pk, name, state in Task.objects.using(using)
            .filter(pk__in=ids)
            .values_list("pk", "task_name", "state")
        }
        cache[way] = Edges(
            [
                {
                    "task": r[other],
                    "task_name": found.get(r[other], (None, None))[0],
                    "state": found.get(r[other], (None, None))[1],
                    "resolved": r["resolved"],
                    "proceed_on_failure": r["proceed_on_failure"],
                }
                for r in rows
            ],
            total,
            unresolved,
            database_of(using),
        )
    return cache[way]


def _edges_table(edges: Edges, one: str, many: str, site: str) -> str:
    """The edges as a table of linked tasks (on the admin site named ``site``), with
    "and N more" past the limit."""
    if not edges.total:
        return EMPTY
    rows = [
        (
            with_database(
                reverse("admin:django_pgqueue_task_change", args=[edge["task"]], current_app=site),
                edges.database,
            ),
            edge["task"],
            edge["task_name"] or "(deleted since)",
            _state_html(edge["state"]) if edge["state"] else EMPTY,
            "yes" if edge["resolved"] else "no",
            "run" if edge["proceed_on_failure"] else "cancel",
        )
        for edge in edges.rows
    ]
    more = edges.total - len(edges.rows)
    return format_html(
        '<p class="pgqueue-edges-summary">{} {}, {} not yet resolved{}</p>'
        '<table class="pgqueue-edges"><thead><tr><th>task</th><th>name</th><th>state</th>'
        "<th>resolved</th><th>after_failure</th></tr></thead><tbody>{}</tbody></table>{}",
        edges.total,
        one if edges.total == 1 else many,
        edges.unresolved,
        "; those not yet resolved first" if more else "",
        format_html_join(
            "",
            '<tr><td><a href="{}">#{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
            rows,
        ),
        format_html('<p class="pgqueue-edges-more">and {} more</p>', more) if more else "",
    )


# -- a task's log records (TASK_LOGS) -------------------------------------------------


def task_log_rows(task: Task) -> list[TaskLog]:
    """The task's pgqueue_task_log rows, one per attempt that kept records, oldest
    first, read where the page read the task (by pgqueue_task_log_task). Bounded by
    TASK_LOG_TASK_BYTES. Cached on ``task`` for the page's fields."""
    cache = task.__dict__
    if "_pgqueue_logs" not in cache:
        using = task._state.db or read_database()
        cache["_pgqueue_logs"] = list(
            TaskLog.objects.using(using).filter(task_id=task.pk).order_by("id")
        )
    return cache["_pgqueue_logs"]


def _log_records_table(records: list[dict[str, Any]]) -> str:
    rows = []
    for record in records:
        exception = record.get("exception")
        moment = record.get("time")
        rows.append(
            (
                str(record.get("level", "")).lower(),
                moment.isoformat() if isinstance(moment, datetime) else moment,
                moment.strftime("%H:%M:%S.%f")[:-3] if isinstance(moment, datetime) else moment,
                record.get("level", ""),
                record.get("logger", ""),
                record.get("message", ""),
                format_html(
                    '<details><summary>Traceback</summary><pre class="pgqueue-traceback">'
                    "{}</pre></details>",
                    exception,
                )
                if exception
                else "",
            )
        )
    return format_html(
        '<table class="pgqueue-log-records"><thead><tr><th>time (UTC)</th><th>level</th>'
        "<th>logger</th><th>message</th></tr></thead><tbody>{}</tbody></table>",
        format_html_join(
            "",
            '<tr class="pgqueue-level-{}"><td title="{}">{}</td><td>{}</td><td>{}</td>'
            '<td><pre class="pgqueue-message">{}</pre>{}</td></tr>',
            rows,
        ),
    )


def _has_waiting_work(task: Task) -> bool:
    """Whether the task's page shows the Waiting fieldset: it waits, was woken, holds
    signals, or has dependency edges either way."""
    return bool(
        task.state == TaskState.WAITING
        or task.wake is not None
        or task.signals
        or task.has_dependents
        or task_edges(task, "parents").total
    )


class SignalForm(forms.Form):
    """Send signal: a name and a JSON payload (django_pgqueue.signal)."""

    name = forms.CharField(max_length=255, help_text="The name the task suspends on.")
    payload = JSONInput(
        where="the payload",
        required=False,
        help_text='JSON, e.g. {"approved_by": "ops"} or "yes"; empty for null. The task '
        "reads it in context.signals[name].",
    )


# -- list filters ---------------------------------------------------------------------
# Their choices come from the code and the worker registry, never from a DISTINCT over
# the task table (which would read every row of the history on each page view). A value
# that is not among them (an unknown task name, say) still filters, from the URL.


def _known_queues() -> set[str]:
    queues = set(get_settings().QUEUES) | {d.queue for d in registry.all()}
    for worker_queues in Worker.objects.using(read_database()).values_list("queues", flat=True):
        queues.update(worker_queues or [])
    return queues


def _known_task_names() -> set[str]:
    names = {d.name for d in registry.all()}
    for routes in Worker.objects.using(read_database()).values_list("routes", flat=True):
        names.update(route[0] for route in routes or [])
    return names


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        values = _known_queues() | ({self.value()} if self.value() else set())
        return [(v, v) for v in sorted(values)]

    def queryset(self, request, queryset):
        return queryset.filter(queue=self.value()) if self.value() else queryset


class TaskNameFilter(admin.SimpleListFilter):
    title = "task name"
    parameter_name = "task_name"

    def lookups(self, request, model_admin):
        values = _known_task_names() | ({self.value()} if self.value() else set())
        return [(v, v) for v in sorted(values)]

    def queryset(self, request, queryset):
        return queryset.filter(task_name=self.value()) if self.value() else queryset


class HandlerVersionFilter(admin.SimpleListFilter):
    """Handler versions from the code and the workers' routes, not a DISTINCT over the
    table (which read every row of the history: seconds on 10,000,000 rows)."""

    title = "handler version"
    parameter_name = "handler_version"
    ALSO = "handler_version__exact"  # the name of Django's field filter, kept working
    parameters = (parameter_name, ALSO)

    def __init__(self, request, params, model, model_admin):
        if self.ALSO in params and self.parameter_name not in params:
            params[self.parameter_name] = params.pop(self.ALSO)
        params.pop(self.ALSO, None)
        super().__init__(request, params, model, model_admin)

    def expected_parameters(self):
        return list(self.parameters)

    def lookups(self, request, model_admin):
        values = {d.version for d in registry.all()}
        for routes in Worker.objects.using(read_database()).values_list("routes", flat=True):
            values.update(route[1] for route in routes or [] if isinstance(route[1], int))
        current = task_id(self.value() or "")
        if current is not None:
            values.add(current)
        return [(str(v), f"v{v}") for v in sorted(values)]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        version = task_id(self.value())
        return queryset.filter(handler_version=version) if version else queryset.none()


class WaitReasonFilter(admin.SimpleListFilter):
    """Waiting tasks by what they wait for (through pgqueue_task_waiting)."""

    title = "waiting for"
    parameter_name = "wait_reason"

    def lookups(self, request, model_admin):
        return list(WAIT_REASONS.items())

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(state="waiting", wait_reason=self.value())
        return queryset


class DueFilter(admin.SimpleListFilter):
    title = "due"
    parameter_name = "due"

    def lookups(self, request, model_admin):
        return [("due", "due now"), ("scheduled", "scheduled (run_at in the future)")]

    def queryset(self, request, queryset):
        # A scheduled row whose run_at has passed is due: the stager has yet to move it.
        if self.value() == "due":
            return queryset.filter(state__in=["pending", "scheduled"], run_at__lte=Now())
        if self.value() == "scheduled":
            return queryset.filter(state="scheduled", run_at__gt=Now())
        return queryset


# -- operations shared by the list actions and the detail page's buttons --------------


def _report(request: HttpRequest, done: int, asked: int, success: str, skipped_reason: str) -> None:
    """``success`` is a template: "Retried {count} {noun}."."""
    if done:
        noun = "task" if done == 1 else "tasks"
        messages.success(request, success.format(count=done, noun=noun))
    if asked > done:
        level = messages.WARNING if done else messages.ERROR
        messages.add_message(request, level, f"Skipped {asked - done} of {asked}: {skipped_reason}")


def _retry_now(model_admin: TaskAdmin, request: HttpRequest, ids: list[int]) -> None:
    retried = operations.retry_now(ids, database=request_database(request))
    model_admin.log(request, retried, CHANGE, "Retried now.")
    _report(
        request,
        len(retried),
        len(ids) - len(retried.skipped),
        "Retried {count} {noun}.",
        "only pending and failed tasks can be retried now (a running task belongs to its "
        "worker: cancel it instead).",
    )
    if retried.skipped:
        messages.warning(request, kept_message(retried.skipped))


def _cancel(
    model_admin: TaskAdmin, request: HttpRequest, ids: list[int], hard: bool = False
) -> None:
    cancelled, requested = [], []
    database = request_database(request)
    with transaction.atomic(using=database):
        for task_id in ids:
            result = operations.cancel(task_id, hard=hard, database=database)
            if result == "cancelled":
                cancelled.append(task_id)
            elif result == "cancel_requested":
                requested.append(task_id)
    model_admin.log(request, cancelled, CHANGE, "Cancelled.")
    model_admin.log(
        request,
        requested,
        CHANGE,
        "Kill requested (the task was running)."
        if hard
        else "Cancel requested (the task was running).",
    )
    if cancelled:
        upstream = (
            Task.objects.using(database).filter(pk__in=cancelled, has_dependents=True).exists()
        )
        messages.success(
            request,
            f"Cancelled {len(cancelled)} task(s)."
            + (
                " Tasks waiting for them were cancelled with them, except those that go on "
                'after a failure (after_failure="run", or a context.wait_for).'
                if upstream
                else ""
            ),
        )
    if requested and hard:
        messages.success(
            request,
            f"Requested a kill of {len(requested)} running task(s): workers running "
            "handlers in processes kill them at their next heartbeat and record them "
            "cancelled; workers running handlers in threads can only ask them to stop.",
        )
    elif requested:
        messages.success(
            request,
            f"Requested cancellation of {len(requested)} running task(s): their handlers "
            "see it and stop; they end cancelled when they settle.",
        )
    skipped = len(ids) - len(cancelled) - len(requested)
    if skipped:
        messages.add_message(
            request,
            messages.WARNING if cancelled or requested else messages.ERROR,
            f"Skipped {skipped} of {len(ids)}: only pending, waiting and running tasks can "
            "be cancelled.",
        )


def _cancel_hard(model_admin: TaskAdmin, request: HttpRequest, ids: list[int]) -> None:
    _cancel(model_admin, request, ids, hard=True)


def _requeue(model_admin: TaskAdmin, request: HttpRequest, ids: list[int]) -> None:
    requeued = operations.requeue_dead(ids, database=request_database(request))
    model_admin.log(request, requeued, CHANGE, "Requeued from the dead letters.")
    _report(
        request,
        len(requeued),
        len(ids) - len(requeued.skipped),
        "Requeued {count} {noun} with a fresh attempt budget.",
        "only dead letters (failed tasks) can be requeued.",
    )
    if requeued.skipped:
        messages.warning(request, kept_message(requeued.skipped))


def _delete(model_admin: TaskAdmin, request: HttpRequest, ids: list[int]) -> None:
    database = request_database(request)
    doomed = list(Task.objects.using(database).filter(pk__in=ids, state__in=TERMINAL_STATES))
    deleted = set(operations.delete_finished([t.pk for t in doomed], database=database))
    model_admin.log(request, [t for t in doomed if t.pk in deleted], DELETION, "")
    _report(
        request,
        len(deleted),
        len(ids),
        "Deleted {count} {noun}.",
        "only finished tasks (succeeded, failed, cancelled) can be deleted; cancel a live "
        "task first.",
    )


OPERATIONS = {
    op.name: op
    for op in (
        Operation(
            name="retry_now",
            label="Retry now",
            permission="change",
            applies_to=("scheduled", "pending", "failed"),
            run=_retry_now,
            batch=retry_batch,
            history="Retried now (bulk).",
        ),
        Operation(
            name="cancel",
            label="Cancel",
            permission="change",
            applies_to=("scheduled", "pending", "waiting", "running"),
            run=_cancel,
            batch=cancel_batch,
            history="Cancelled (bulk).",
        ),
        Operation(
            name="cancel_hard",
            label="Cancel (kill the handler)",
            permission="change",
            applies_to=("running",),
            run=_cancel_hard,
            batch=cancel_hard_batch,
            history="Cancelled (bulk, kill).",
        ),
        Operation(
            name="requeue",
            label="Requeue (fresh attempts)",
            permission="change",
            applies_to=("failed",),
            run=_requeue,
            batch=requeue_batch,
            history="Requeued from the dead letters (bulk).",
        ),
        Operation(
            name="delete",
            label="Delete",
            permission="delete",
            applies_to=TERMINAL_STATES,
            run=_delete,
            batch=delete_batch,
            history="",
        ),
    )
}

DETAIL_BUTTONS = ("retry_now", "cancel", "cancel_hard", "requeue")


def _action(op: Operation, description: str):
    def action(
        model_admin: TaskAdmin, request: HttpRequest, queryset: QuerySet
    ) -> HttpResponse | None:
        # The selection (ids, or "select all" with the list's filters) is taken again on
        # the list's database itself: the list may come from a replica, whose states
        # may be behind.
        queryset = queryset.using(request_database(request))
        if request.POST.get("select_across") == "1":
            # Every task the list's filters match: counted, confirmed, then in batches.
            return bulk_action(model_admin, request, queryset, op)
        # Only the rows this operation can change are read: "select all" over a big
        # history must not load a million ids to skip them.
        eligible = list(queryset.filter(state__in=op.applies_to).values_list("pk", flat=True))
        others = queryset.exclude(state__in=op.applies_to).count() if eligible else 0
        if not eligible:
            messages.error(
                request,
                f"Nothing to do: {op.label.lower()} applies to {', '.join(op.applies_to)} "
                "tasks only.",
            )
            return
        op.run(model_admin, request, eligible)
        if others:
            messages.warning(
                request,
                f"Left {others} selected task(s) alone: {op.label.lower()} applies to "
                f"{', '.join(op.applies_to)} tasks only.",
            )
        return None

    action.__name__ = op.name
    return admin.action(description=description, permissions=[op.permission])(action)


# -- tasks ----------------------------------------------------------------------------


@admin.register(Task)
# Without Django's "delete selected": replaced by the state-checked delete.
class TaskAdmin(WithoutDeleteSelected, ForgedInputMixin, admin.ModelAdmin):
    # Compact, to fit a 1,400 px window beside the filters: a long dotted name is
    # shortened (full on hover), the handler version goes with it, and the times are
    # relative (the timestamp on hover); run at and expiry share a column.
    list_display = (
        "id",
        "name_display",
        "queue",
        "state_list_display",
        "attempts",
        "priority",
        "run_at_display",
        "age",
    )
    list_display_links = ("id", "name_display")
    list_filter = (
        DatabaseFilter,
        "state",
        QueueFilter,
        TaskNameFilter,
        HandlerVersionFilter,
        DueFilter,
        WaitReasonFilter,
        ContentSearchFilter,
    )
    search_fields = ("unique_key",)  # see get_search_results: exact id or unique key
    search_help_text = "An exact task id (123 or #123) or unique key."
    date_hierarchy = "enqueued_at"
    list_per_page = 100
    show_full_result_count = False  # one count(*) per page view is enough
    paginator = TaskPaginator  # an estimate for the unfiltered list of a large table
    show_facets = admin.ShowFacets.NEVER  # a count per filter choice: a scan each
    change_list_template = "admin/django_pgqueue/task/change_list.html"
    change_form_template = "admin/django_pgqueue/task/change_form.html"
    actions = [
        _action(OPERATIONS["retry_now"], "Retry now (pending or dead tasks)"),
        _action(OPERATIONS["cancel"], "Cancel (running tasks: request cancellation)"),
        _action(OPERATIONS["cancel_hard"], "Cancel (kill the handler)"),
        _action(OPERATIONS["requeue"], "Requeue dead letters with a fresh attempt budget"),
        _action(OPERATIONS["delete"], "Delete finished tasks"),
    ]
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "task_name",
                    "handler_version",
                    "queue",
                    "priority",
                    "state_display",
                    "unique_key",
                    "cancel_requested",
                )
            },
        ),
        ("Payload and result", {"fields": ("args_display", "kwargs_display", "result_display")}),
        (
            "Attempts",
            {
                "fields": (
                    "attempts",
                    "timeout",
                    "retry_policy_display",
                    "executions_display",
                    "errors_display",
                )
            },
        ),
        (
            "Lease",
            {"fields": ("worker_id", "lease_token", "lease_expires_display")},
        ),
        ("Progress", {"fields": ("checkpoint_display", "progress_display")}),
        (
            "Times",
            {
                "fields": (
                    "enqueued_at",
                    "run_at",
                    "expires_at",
                    "started_at",
                    "last_attempted_at",
                    "finished_at",
                    "age",
                )
            },
        ),
        ("Metadata", {"fields": ("metadata_display",), "classes": ("collapse",)}),
    )
    # Shown (after Attempts) with TASK_LOGS, or for a task that kept log records.
    logs_fieldset = ("Logs", {"fields": ("logs_display",)})
    # Shown (after the first fieldset) for a task that waits, waited, or is waited for.
    waiting_fieldset = (
        "Waiting (docs/workflows.md)",
        {
            "fields": (
                "wait_display",
                "wait_until_display",
                "parents_display",
                "children_display",
                "signals_display",
                "wake_display",
            )
        },
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        """The list and the detail page read from the read database of the page's
        database (admin/databases.py)."""
        return super().get_queryset(request).using(request_read_database(request))

    # A task is never edited through a form: see the module docstring.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        # The detail page is read-only for everyone; the change permission (obj=None)
        # is what the state-checked actions and buttons require.
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        if obj is not None and not obj.is_terminal:
            return False
        return super().has_delete_permission(request, obj)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None):
        """The task, marked with whether this page may show its payloads in clear if it
        is encrypted (``decrypt_task``: admin/common.py, ``_payload``)."""
        task = super().get_object(request, object_id, from_field)
        if task is not None and task.encrypted:
            setattr(task, MAY_DECRYPT, can_decrypt_tasks(request))
        return task

    def delete_model(self, request: HttpRequest, obj: Task) -> None:
        # State-checked at the moment of deleting, not when the page was drawn.
        if not operations.delete_finished([obj.pk], database=request_database(request)):
            raise PermissionDenied("only finished tasks can be deleted")

    def get_fieldsets(self, request: HttpRequest, obj: Task | None = None):
        fieldsets = list(self.fieldsets)
        if obj is None:
            return fieldsets
        if get_settings().TASK_LOGS or task_log_rows(obj):
            attempts = [name for name, _ in fieldsets].index("Attempts")
            fieldsets.insert(attempts + 1, self.logs_fieldset)
        if _has_waiting_work(obj):
            fieldsets.insert(1, self.waiting_fieldset)
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Task | None = None):
        fieldsets = (*self.fieldsets, self.waiting_fieldset, self.logs_fieldset)
        return [f for fieldset in fieldsets for f in fieldset[1]["fields"]]

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str):
        term = search_term.strip()
        if not term:
            return queryset, False
        # Exact matches only: the id through the primary key; the unique key as given.
        # Every task with a unique key is in pgqueue_task_unique_key (unique_key,
        # enqueued_at), finished ones too: one index lookup, here, and the page's own
        # queries then go by primary key.
        ids = list(
            Task.objects.using(queryset.db)
            .filter(unique_key=term)
            .values_list("pk", flat=True)[:1000]
        )
        number = task_id(term.removeprefix("#"))
        if number is not None:
            ids.append(number)
        return queryset.filter(pk__in=ids), False

    # -- columns and fields -----------------------------------------------------------
    @admin.display(description="state", ordering="state")
    def state_display(self, obj: Task) -> str:
        label = obj.state
        if obj.state == TaskState.SCHEDULED and obj.run_at and obj.run_at <= timezone.now():
            label = "scheduled (due)"
        if obj.cancel_requested and obj.state == TaskState.RUNNING:
            label = "running (cancel requested)"
        return _state_html(obj.state, label)

    @admin.display(description="task name", ordering="task_name")
    def name_display(self, obj: Task) -> str:
        return format_html(
            '<span class="pgqueue-name" title="{}">{}</span> <span class="quiet" '
            'title="handler version">v{}</span>',
            obj.task_name,
            short_name(obj.task_name),
            obj.handler_version,
        )

    @admin.display(description="state", ordering="state")
    def state_list_display(self, obj: Task) -> str:
        """The state, and for a waiting task what it waits for."""
        state = self.state_display(obj)
        if obj.state != TaskState.WAITING:
            return state
        if obj.wait_reason == "parents":
            why = f"its parents ({obj.parents_pending} not ended)"
        elif obj.wait_reason == "signal":
            why = f"the signal {obj.wait_signal}"
        elif obj.wait_reason == "child":
            why = f"{obj.parents_pending} task(s) it suspended on"
        elif obj.wait_reason == "sequence":
            why = f"its turn in the sequence {obj.sequence_key}"
        else:
            why = obj.wait_reason or "?"
        return format_html('{}<div class="pgqueue-why">waits for {}</div>', state, why)

    @admin.display(description="run at", ordering="run_at")
    def run_at_display(self, obj: Task) -> str:
        """run_at relative to now (the timestamp on hover), and the expiry if any."""
        run = relative_time(obj.run_at)
        if obj.expires_at is None:
            return run
        return format_html(
            '{}<div class="quiet">expires {}</div>', run, relative_time(obj.expires_at)
        )

    @admin.display(description="attempts")
    def attempts(self, obj: Task) -> str:
        return f"{obj.attempt}/{obj.max_attempts}"

    @admin.display(description="age", ordering="-enqueued_at")
    def age(self, obj: Task) -> str:
        if obj.enqueued_at is None:
            return EMPTY
        return humanize_seconds((timezone.now() - obj.enqueued_at).total_seconds())

    @admin.display(description="args")
    def args_display(self, obj: Task) -> str:
        return _payload(obj.args, obj, "args")

    @admin.display(description="kwargs")
    def kwargs_display(self, obj: Task) -> str:
        return _payload(obj.kwargs, obj, "kwargs")

    @admin.display(description="result")
    def result_display(self, obj: Task) -> str:
        return _payload(obj.result, obj, "result")

    @admin.display(description="retry policy")
    def retry_policy_display(self, obj: Task) -> str:
        return _pretty_json(obj.retry_policy)

    @admin.display(description="checkpoint")
    def checkpoint_display(self, obj: Task) -> str:
        return _payload(obj.checkpoint, obj, "checkpoint")

    @admin.display(description="progress")
    def progress_display(self, obj: Task) -> str:
        return _payload(obj.progress, obj, "progress")

    @admin.display(description="metadata")
    def metadata_display(self, obj: Task) -> str:
        return _pretty_json(obj.metadata)

    # -- waiting work (the "Waiting" fieldset) ----------------------------------------
    @admin.display(description="waits for")
    def wait_display(self, obj: Task) -> str:
        if obj.state != TaskState.WAITING:
            return EMPTY
        if obj.wait_reason == "parents":
            return format_html(
                "its parents: {} of {} not yet ended (listed below)",
                obj.parents_pending,
                task_edges(obj, "parents").total,
            )
        if obj.wait_reason == "signal":
            return format_html(
                "the signal <code>{}</code> (<code>django_pgqueue.signal</code>, "
                "<code>manage.py pgqueue_signal</code>, or Send signal above)",
                obj.wait_signal,
            )
        if obj.wait_reason == "child":
            return format_html(
                "{} task(s) it suspended on (<code>context.wait_for</code>) to end, listed below",
                obj.parents_pending,
            )
        if obj.wait_reason == "sequence":
            return format_html(
                "its turn in the sequence <code>{}</code>: the tasks of the sequence enqueued "
                "before it, one at a time", obj.sequence_key,
            )
        return obj.wait_reason or EMPTY

    @admin.display(description="times out")
    def wait_until_display(self, obj: Task) -> str:
        if obj.state != TaskState.WAITING:
            return EMPTY
        if obj.wait_until is None:
            return "never (no timeout)"
        left = (obj.wait_until - timezone.now()).total_seconds()
        # A row waiting for its parents waits until its expiry (expires_at) at most.
        end = "cancels it (expired)" if obj.wait_reason == "parents" else "wakes it"
        note = (
            f"in {humanize_seconds(left)}"
            if left >= 0
            else f"passed {humanize_seconds(-left)} ago: the next stage of its queue {end}"
        )
        return format_html("{} ({})", obj.wait_until.isoformat(timespec="seconds"), note)

    @admin.display(description="parents (the tasks it waits for)")
    def parents_display(self, obj: Task) -> str:
        return _edges_table(task_edges(obj, "parents"), "parent", "parents", self.admin_site.name)

    @admin.display(description="children (the tasks waiting for it)")
    def children_display(self, obj: Task) -> str:
        return _edges_table(task_edges(obj, "children"), "child", "children", self.admin_site.name)

    @admin.display(description="signals delivered")
    def signals_display(self, obj: Task) -> str:
        return _payload(obj.signals, obj, "signals") if obj.signals else EMPTY

    @admin.display(description="woken by")
    def wake_display(self, obj: Task) -> str:
        return _with_payloads(obj.wake, "payload", task=obj, column="wake")

    @admin.display(description="lease expires")
    def lease_expires_display(self, obj: Task) -> str:
        if obj.lease_expires_at is None:
            return EMPTY
        left = (obj.lease_expires_at - timezone.now()).total_seconds()
        note = (
            f"in {humanize_seconds(left)}"
            if left >= 0
            else f"expired {humanize_seconds(-left)} ago"
        )
        return format_html("{} ({})", obj.lease_expires_at.isoformat(timespec="seconds"), note)

    @admin.display(description="executions (every run)")
    def executions_display(self, obj: Task) -> str:
        """One row per run: settled, recovered by the lease sweep, or refused as late."""
        if not obj.executions:
            return EMPTY
        rows = [
            (
                entry.get("attempt", "?"),
                entry.get("worker") or "",
                entry.get("started") or "",
                entry.get("ended") or "",
                entry.get("outcome") or "",
                entry.get("state") or "",
                _EXECUTION_SOURCES.get(entry.get("source"), entry.get("source") or ""),
                (entry.get("token") or "")[:8],
            )
            for entry in obj.executions
        ]
        return format_html(
            '<table class="pgqueue-executions"><thead><tr><th>attempt</th><th>worker</th>'
            "<th>started</th><th>ended</th><th>outcome</th><th>state after</th>"
            "<th>recorded by</th><th>lease</th></tr></thead><tbody>{}</tbody></table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                "<td>{}</td><td><code>{}</code></td></tr>",
                rows,
            ),
        )

    @admin.display(description="log records (per attempt)")
    def logs_display(self, obj: Task) -> str:
        """Each attempt's kept records (TASK_LOGS): what the task's code logged, so
        hidden with ADMIN_SHOW_PAYLOADS = False, as the payloads are; their number and
        the dropped ones are shown either way."""
        rows = task_log_rows(obj)
        if not rows:
            return "none kept" if get_settings().TASK_LOGS else "none kept (TASK_LOGS is off)"
        shown = payloads_shown()
        parts = []
        for row in rows:
            dropped = (
                format_html(
                    '; <span class="pgqueue-log-dropped">{} earlier record(s) dropped '
                    "(TASK_LOG_RECORDS, TASK_LOG_BYTES)</span>",
                    row.dropped,
                )
                if row.dropped
                else ""
            )
            parts.append(
                format_html(
                    '<div class="pgqueue-log"><p><strong>Attempt {}</strong> <span '
                    'class="quiet">lease <code>{}</code>, settled {}</span>: {} record(s){}</p>'
                    "{}</div>",
                    row.attempt,
                    str(row.lease_token)[:8],
                    row.created_at.isoformat(timespec="seconds"),
                    len(row.records),
                    dropped,
                    _log_records_table(row.entries()) if shown else HIDDEN,
                )
            )
        return format_html_join("", "{}", ((part,) for part in parts))

    @admin.display(description="errors (the last 100)")
    def errors_display(self, obj: Task) -> str:
        if not obj.errors:
            return EMPTY
        items = []
        for error in obj.errors:
            traceback = error.get("traceback")
            details = (
                format_html(
                    '<details open><summary>Traceback</summary><pre class="pgqueue-traceback">'
                    "{}</pre></details>",
                    traceback,
                )
                if traceback
                else ""
            )
            items.append(
                (
                    error.get("attempt", "?"),
                    error.get("type", "error"),
                    error.get("outcome") or "failure",
                    error.get("at") or "",
                    error.get("worker_id") or "",
                    error.get("message", ""),
                    details,
                )
            )
        dropped = (
            format_html(
                '<p class="quiet">{} earlier error(s) dropped: a task keeps its last 100.</p>',
                obj.errors_dropped,
            )
            if obj.errors_dropped
            else ""
        )
        return format_html(
            '{}<ol class="pgqueue-errors">{}</ol>',
            dropped,
            format_html_join(
                "",
                '<li class="pgqueue-error"><strong>Attempt {}: {}</strong> ({}) '
                '<span class="quiet">{} {}</span><pre class="pgqueue-message">{}</pre>{}</li>',
                items,
            ),
        )

    # -- the detail page's operation buttons (its Delete is Django's, with a
    # confirmation page, through delete_model) ----------------------------------------
    def get_urls(self):
        urls = super().get_urls()
        operate = path(
            "<path:object_id>/operate/<str:operation>/",
            self.admin_site.admin_view(self.operate_view),
            name="django_pgqueue_task_operate",
        )
        send_signal = path(
            "<path:object_id>/signal/",
            self.admin_site.admin_view(self.signal_view),
            name="django_pgqueue_task_signal",
        )
        enqueue_task = path(
            "enqueue/",
            self.admin_site.admin_view(self.enqueue_view),
            name="django_pgqueue_task_enqueue",
        )
        return [enqueue_task, operate, send_signal, *urls]

    def enqueue_view(self, request: HttpRequest) -> HttpResponse:
        """Enqueue a registered task with JSON arguments (admin/enqueue.py). Needs
        ``enqueue_task``."""
        return enqueue_view(self, request)

    def signal_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Send signal: GET shows the form, POST sends it (``operations.signal``,
        state-checked in the database) and goes back to the task; a form with errors
        is shown again with them. Needs ``change_task``."""
        if not self.has_change_permission(request):
            raise PermissionDenied("Send signal: permission denied (needs change_task)")
        request.current_app = self.admin_site.name  # the template's {% url %}s: this site
        task = self.get_object(request, object_id)
        if task is None:
            raise Http404(f"no task with id {object_id!r}")
        database = request_database(request)
        change_url = with_database(_url(self, "task_change", task.pk), database)
        if request.method == "POST":
            form = SignalForm(request.POST)
            if form.is_valid():
                name, payload = form.cleaned_data["name"], form.cleaned_data["payload"]
                try:
                    outcome = operations.signal(task.pk, name, payload, database=database)
                except InvalidTaskError as exc:
                    form.add_error(None, str(exc))
                else:
                    self._report_signal(request, task, name, outcome)
                    return HttpResponseRedirect(change_url)
        else:
            form = SignalForm(initial={"name": task.wait_signal or ""})
        context = {
            **self.admin_site.each_context(request),
            "title": f"Send a signal to task {task.pk}",
            "opts": self.model._meta,
            "original": task,
            "form": form,
            "change_url": change_url,
            "waits_for_signal": task.wait_signal if task.state == TaskState.WAITING else None,
            "live": task.state in LIVE_STATES,
        }
        return TemplateResponse(request, "admin/django_pgqueue/task/signal_form.html", context)

    def _report_signal(
        self, request: HttpRequest, task: Task, name: str, outcome: str | None
    ) -> None:
        if outcome == "resumed":
            done = f"Sent signal {name!r}: task {task.pk} was waiting for it and is pending now."
            messages.success(
                request, f"{done} Its next attempt reads the payload in context.signals."
            )
        elif outcome == "stored":
            done = f"Sent signal {name!r}: stored; task {task.pk} was not waiting for it."
            waits = (
                f" (it waits for {task.wait_signal!r})"
                if task.state == TaskState.WAITING and task.wait_signal
                else ""
            )
            messages.success(
                request,
                f"{done}{waits} The signal is kept: when the task suspends on {name!r}, it "
                "resumes at once.",
            )
        else:
            now = (
                Task.objects.using(request_database(request))
                .filter(pk=task.pk)
                .values_list("state", flat=True)
                .first()
            )
            messages.error(
                request,
                f"Not sent: task {task.pk} has finished ({now or 'deleted'}); a finished task "
                "takes no signal.",
            )
            return
        self.log(request, [task.pk], CHANGE, done)

    def operate_view(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        op = OPERATIONS.get(operation)
        if op is None or op.name not in DETAIL_BUTTONS or request.method != "POST":
            raise PermissionDenied("unknown operation, or not a POST")
        if not self.has_change_permission(request):
            raise PermissionDenied(f"{op.label}: permission denied")
        database = request_database(request)
        task = get_object_or_404(Task.objects.using(database), pk=task_id_or_404(object_id))
        op.run(self, request, [task.pk])
        change_url = _url(self, "task_change", task.pk)
        return HttpResponseRedirect(with_database(change_url, database))

    def change_view(self, request, object_id, form_url="", extra_context=None):
        task = self.get_object(request, object_id)
        database = request_database(request)
        buttons, send_signal = [], None
        if task is not None and self.has_change_permission(request):
            for name in DETAIL_BUTTONS:
                op = OPERATIONS[name]
                if task.state in op.applies_to:
                    url = _url(self, "task_operate", task.pk, name)
                    url = with_database(url, database)
                    buttons.append({"label": op.label, "url": url, "name": name})
            if task.state in LIVE_STATES:
                send_signal = {
                    "url": with_database(_url(self, "task_signal", task.pk), database),
                    "form": SignalForm(initial={"name": task.wait_signal or ""}),
                }
        context = {
            **(extra_context or {}),
            "pgqueue_operations": buttons,
            "pgqueue_signal": send_signal,
            "pgqueue_read_database": _replica_of(request),
            "pgqueue_database": database if len(queue_databases()) > 1 else None,
        }
        return super().change_view(request, object_id, form_url, context)

    def changelist_view(self, request, extra_context=None):
        overview_url = _url(self, "queueoverview_changelist")
        context = {
            **(extra_context or {}),
            "pgqueue_overview_url": overview_url,
            "pgqueue_read_database": _replica_of(request),
            "pgqueue_enqueue_url": (
                with_database(_url(self, "task_enqueue"), request_database(request))
                if can_enqueue(request)
                else None
            ),
        }
        if request.method != "GET" or not searching(request):
            response = super().changelist_view(request, context)
            self._add_search_form(request, response)
            return response
        # A search by content reads a window of rows with no index: bounded in rows
        # (ADMIN_SEARCH_ROWS) and in time (ADMIN_SEARCH_TIMEOUT), on the read database.
        using = request_read_database(request)
        timeout_ms = int(get_settings().ADMIN_SEARCH_TIMEOUT * 1000)
        try:
            with transaction.atomic(using=using), connections[using].cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('statement_timeout', %s, true)", [str(timeout_ms)]
                )
                response = super().changelist_view(request, context)
                self._add_search_form(request, response)
                if hasattr(response, "render"):
                    response.render()
        except OperationalError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.QueryCanceled):
                raise
            messages.error(
                request,
                f"The search took longer than {get_settings().ADMIN_SEARCH_TIMEOUT:g} s "
                "(ADMIN_SEARCH_TIMEOUT) and was stopped. Narrow it: a state, a queue, a "
                "task name or a date, or a smaller ADMIN_SEARCH_ROWS.",
            )
            # The list again without the content search, so the page still opens.
            query = request.GET.copy()
            for name in SEARCH_PARAMETERS:
                query.pop(name, None)
            return HttpResponseRedirect(f"{request.path}?{query.urlencode()}")
        return response

    def _add_search_form(self, request: HttpRequest, response: HttpResponse) -> None:
        changelist = getattr(response, "context_data", {}).get("cl")
        if changelist is not None:
            response.context_data["pgqueue_search"] = search_context(request, changelist)

    # -- audit trail ------------------------------------------------------------------
    def log(self, request: HttpRequest, tasks: list, flag: int, message: str) -> None:
        """One admin LogEntry per task changed (ids, read on DATABASE, or Task objects)."""
        if not tasks:
            return
        if isinstance(tasks[0], Task):
            objects = tasks
        else:
            objects = list(Task.objects.using(request_database(request)).filter(pk__in=tasks))
        LogEntry.objects.log_actions(request.user.pk, objects, flag, message)
