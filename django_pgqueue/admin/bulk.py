"""Bulk actions: retry, cancel, requeue or delete every task a filter matches.

When the list's "Select all N" is used, an action does not run at once: a page shows
how many of the matching tasks the action applies to (and how many it leaves alone),
and the operator confirms. The confirmation names the newest id counted
(``pgqueue_upto``): tasks enqueued after the count are never touched.

The work is then done in batches of ``BATCH_SIZE`` ids, newest first (keyset over the
primary key), each batch one transaction through the same state-checked statements as
the single actions (``operations``): a task a worker claimed since the count is
skipped, never retried, deleted or requeued under it. A request cut short leaves every
finished batch done and the rest untouched; running the action again finishes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from django_pgqueue.admin.databases import request_database
from django_pgqueue.admin.input import task_id
from django_pgqueue.models import Task
from django_pgqueue.ops import operations

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

    from django_pgqueue.admin.operation import Operation

BATCH_SIZE = 1000
CONFIRM = "pgqueue_confirm"
UPTO = "pgqueue_upto"


def retry_batch(database: str, ids: list[int]) -> tuple[list[int], list[int]]:
    return operations.retry_now(ids, database=database), []


def cancel_batch(database: str, ids: list[int], hard: bool = False) -> tuple[list[int], list[int]]:
    cancelled, requested = [], []
    for one in ids:
        outcome = operations.cancel(one, hard=hard, database=database)
        if outcome == "cancelled":
            cancelled.append(one)
        elif outcome == "cancel_requested":
            requested.append(one)
    return cancelled, requested


def cancel_hard_batch(database: str, ids: list[int]) -> tuple[list[int], list[int]]:
    return cancel_batch(database, ids, hard=True)


def requeue_batch(database: str, ids: list[int]) -> tuple[list[int], list[int]]:
    return operations.requeue_dead(ids, database=database), []


def delete_batch(database: str, ids: list[int]) -> tuple[list[int], list[int]]:
    return operations.delete_finished(ids, database=database), []


def bulk_action(
    model_admin: ModelAdmin, request: HttpRequest, queryset: QuerySet, op: Operation
) -> HttpResponse | None:
    """ "Select all" of a list: the confirmation page (with the counts), or, confirmed,
    the work in batches. ``queryset`` is the list's, on DATABASE."""
    eligible = queryset.filter(state__in=op.applies_to)
    if request.POST.get(CONFIRM) != "yes":
        return _confirmation(model_admin, request, queryset, eligible, op)
    upto = task_id(request.POST.get(UPTO, ""))
    if upto is None:
        messages.error(request, "Nothing was done: the confirmation named no task id.")
        return None
    _run_batches(model_admin, request, eligible.filter(pk__lte=upto), op)
    return None


def _confirmation(
    model_admin: ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet,
    eligible: QuerySet,
    op: Operation,
) -> HttpResponse | None:
    newest = eligible.order_by("-pk").values_list("pk", flat=True)[:1]
    upto = newest[0] if newest else None
    count = eligible.count() if upto is not None else 0
    if not count:
        messages.error(
            request,
            f"Nothing to do: none of the matching tasks is {' or '.join(op.applies_to)}, "
            f"and {op.label.lower()} applies to those only.",
        )
        return None
    others = queryset.count() - count
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"{op.label}: {count} task{'s' if count != 1 else ''}",
        "opts": model_admin.model._meta,
        "op": op,
        "count": count,
        "others": others,
        "upto": upto,
        "batch": BATCH_SIZE,
        "batches": -(-count // BATCH_SIZE),
        "applies_to": ", ".join(op.applies_to),
        "filters": [
            (key, value)
            for key, value in request.GET.items()
            if key not in ("p", "o", "e", "_changelist_filters")
        ],
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "action": op.name,
        "confirm": CONFIRM,
        "upto_name": UPTO,
        "back_url": request.get_full_path(),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/django_pgqueue/task/bulk_confirm.html", context)


def _run_batches(
    model_admin: ModelAdmin, request: HttpRequest, eligible: QuerySet, op: Operation
) -> None:
    run, words = op.batch, op.history
    database = request_database(request)
    done = requested = asked = batches = 0
    kept: dict[int, str] = {}
    below: int | None = None
    while True:
        page = eligible if below is None else eligible.filter(pk__lt=below)
        ids = list(page.order_by("-pk").values_list("pk", flat=True)[:BATCH_SIZE])
        if not ids:
            break
        below = ids[-1]
        with transaction.atomic(using=database):
            if op.deletes:  # the history needs the rows before they go
                doomed = list(
                    Task.objects.using(database).filter(pk__in=ids).only("pk", "task_name", "state")
                )
            changed, cancel_requested = run(database, ids)
            if isinstance(changed, operations.Revived):
                kept.update(changed.skipped)
            if op.deletes:
                gone = set(changed)
                _log(request, [t for t in doomed if t.pk in gone], DELETION, words)
            else:
                _log_ids(request, database, changed, words)
                _log_ids(request, database, cancel_requested, "Cancel requested (bulk).")
        done += len(changed)
        requested += len(cancel_requested)
        asked += len(ids)
        batches += 1
    noun = "task" if done == 1 else "tasks"
    summary = f"{op.label}: {done} {noun} done in {batches} batch{'es' if batches != 1 else ''}"
    summary += f" of up to {BATCH_SIZE}"
    if requested:
        summary += f"; cancellation requested of {requested} running"
    messages.success(request, summary + ".")
    if kept:
        messages.warning(request, kept_message(kept))
    skipped = asked - done - requested - len(kept)
    if skipped:
        messages.warning(
            request,
            f"Skipped {skipped}: their state changed since the count (a worker claimed "
            f"them, or they ended), and {op.label.lower()} applies to "
            f"{', '.join(op.applies_to)} tasks only.",
        )


def _log_ids(request: HttpRequest, database: str, ids: list[int], message: str) -> None:
    if ids:
        _log(
            request,
            list(Task.objects.using(database).filter(pk__in=ids).only("pk")),
            CHANGE,
            message,
        )


def _log(request: HttpRequest, objects: list[Any], flag: int, message: str) -> None:
    if objects:
        LogEntry.objects.log_actions(request.user.pk, objects, flag, message)


def kept_message(kept: dict[int, str], shown: int = 10) -> str:
    """The dead letters a retry or requeue left dead for their unique key, and why
    (``operations.Revived.skipped``)."""
    reasons = "; ".join(f"task {task_id}: {why}" for task_id, why in sorted(kept.items())[:shown])
    more = f"; and {len(kept) - shown} more" if len(kept) > shown else ""
    return f"Left {len(kept)} dead letter(s) dead for their unique key: {reasons}{more}."
