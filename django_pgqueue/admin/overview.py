"""The queue overview: one page of every queue's counts, pauses and wait reasons, and
the queue doctor's findings (its health panel)."""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path

from django_pgqueue.admin.common import (
    _url,
    can_pause_queues,
    can_view_tasks,
)
from django_pgqueue.admin.input import (
    refresh_seconds,
)
from django_pgqueue.core.conf import database_for, get_settings, queue_databases
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.models import (
    Queue,
    QueueOverview,
    Task,
)
from django_pgqueue.ops import doctor, operations
from django_pgqueue.ops.overview import build_overview, humanize_seconds, row_key

logger = logging.getLogger("django_pgqueue.admin")


@admin.register(QueueOverview)
class QueueOverviewAdmin(admin.ModelAdmin):
    """Not a list of rows: the model only puts "Queue overview" on the admin index."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_view_tasks(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self):
        pause = path(
            "pause/",
            self.admin_site.admin_view(self.pause_view),
            name="django_pgqueue_queueoverview_pause",
        )
        data = path(
            "data/",
            self.admin_site.admin_view(self.data_view),
            name="django_pgqueue_queueoverview_data",
        )
        release = path(
            "release/",
            self.admin_site.admin_view(self.release_view),
            name="django_pgqueue_queueoverview_release",
        )
        return [pause, data, release, *super().get_urls()]

    def release_view(self, request: HttpRequest) -> HttpResponse:
        """The overview's Release buttons of held sequences: POST queue and key; needs
        ``change_task`` (a release starts a task, as a retry does)."""
        if request.method != "POST":
            raise PermissionDenied("release a sequence with a POST")
        if not request.user.has_perm("django_pgqueue.change_task"):
            raise PermissionDenied("releasing a sequence needs django_pgqueue.change_task")
        queue, key = request.POST.get("queue", ""), request.POST.get("key", "")
        overview_url = _url(self, "queueoverview_changelist")
        try:
            started = operations.release_sequence(queue, key)
        except (InvalidTaskError, ValueError) as exc:
            messages.error(request, f"Not released: {exc}")
            return HttpResponseRedirect(overview_url)
        if started is None:
            messages.warning(
                request, f"{key} in queue {queue} was not held, or has no task waiting."
            )
        else:
            messages.success(request, f"Released {key} in queue {queue}: task {started} starts.")
            started_tasks = list(Task.objects.using(database_for(queue)).filter(pk=started))
            LogEntry.objects.log_actions(
                request.user.pk, started_tasks, CHANGE, f"Released sequence {key}"
            )
        return HttpResponseRedirect(overview_url)

    def data_view(self, request: HttpRequest) -> JsonResponse:
        """The overview's numbers as JSON, for the page to refresh itself in place:
        the cards' totals, each queue's totals and each row's counts, keyed as the
        page's rows are (``data-key``). The same reads as the page, without the chart;
        the same permission (``view_task``)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        return JsonResponse(overview_data(), json_dumps_params={"separators": (",", ":")})

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        """The overview's Pause / Resume buttons: POST queue, task_name (optional) and
        action ("pause" or "resume"); needs ``pause_queue``."""
        action = request.POST.get("action")
        if request.method != "POST" or action not in ("pause", "resume"):
            raise PermissionDenied("pause or resume a queue with a POST")
        if not can_pause_queues(request):
            raise PermissionDenied("pausing and resuming queues needs django_pgqueue.pause_queue")
        queue = request.POST.get("queue", "")
        task_name = request.POST.get("task_name") or None
        what = f"task {task_name} in queue {queue}" if task_name else f"queue {queue}"
        overview_url = _url(self, "queueoverview_changelist")
        try:
            if action == "pause":
                operations.pause(queue, task_name)
                done = f"Paused {what}."
                messages.success(
                    request, f"{done} Every worker's next claim skips it; running tasks finish."
                )
            elif operations.resume(queue, task_name):
                done = f"Resumed {what}."
                messages.success(request, done)
            else:
                messages.warning(request, f"Queue {queue} was never paused: nothing to resume.")
                return HttpResponseRedirect(overview_url)
        except InvalidTaskError as exc:
            messages.error(request, f"Not {action}d: {exc}")
            return HttpResponseRedirect(overview_url)
        # only(): last_escape_at may be -infinity, which Python's datetime cannot hold.
        queues = list(Queue.objects.using(database_for(queue)).only("name").filter(pk=queue))
        LogEntry.objects.log_actions(request.user.pk, queues, CHANGE, done)
        return HttpResponseRedirect(overview_url)

    def changelist_view(self, request: HttpRequest, extra_context=None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        request.current_app = self.admin_site.name  # the template's {% url %}s: this site
        refresh = request.GET.get("refresh", "")
        overview = build_overview()
        tasks_url = _url(self, "task_changelist")
        for queue in overview["queues"]:
            for row in queue.rows:
                base = {
                    **({"db": queue.database} if queue.database != queue_databases()[0] else {}),
                    "queue": queue.name,
                    "task_name": row["task_name"],
                    "handler_version": row["handler_version"],
                }
                row["links"] = {
                    name: f"{tasks_url}?{urlencode({**base, **filters})}"
                    for name, filters in {
                        "all": {},
                        "due": {"due": "due"},
                        "scheduled": {"due": "scheduled"},
                        "running": {"state__exact": "running"},
                        "waiting": {"state__exact": "waiting"},
                        "failed": {"state__exact": "failed"},
                    }.items()
                }
        context = {
            **self.admin_site.each_context(request),
            **overview,
            "health": health_panel(),
            **tenants_context(request.GET.get("key", "")),
            "data_url": _url(self, "queueoverview_data"),
            "title": "Queue overview",
            "opts": self.model._meta,
            "refresh": refresh_seconds(refresh),
            "tasks_url": tasks_url,
            "workers_url": _url(self, "worker_changelist"),
            "can_pause": can_pause_queues(request),
            "pause_url": _url(self, "queueoverview_pause"),
            "release_url": _url(self, "queueoverview_release"),
            "can_release": request.user.has_perm("django_pgqueue.change_task"),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_pgqueue/overview.html", context)


def health_panel() -> dict[str, Any]:
    """The doctor's findings for the page's health panel (doctor.diagnose): the
    warnings and problems, worst first, and the notes apart. A session's last query is
    left out when ADMIN_SHOW_PAYLOADS is off (it may hold what a task's row holds)."""
    started = time.perf_counter()
    try:
        findings = doctor.diagnose()
    except Exception as exc:  # the page's counts do not depend on the doctor
        logger.exception("the queue overview's health panel: the doctor could not run")
        findings = [
            doctor.Finding("doctor.error", doctor.WARNING, f"the doctor could not run: {exc}")
        ]
    shown = get_settings().ADMIN_SHOW_PAYLOADS
    rows = [
        {
            **finding.as_json(),
            "evidence": {
                k: v for k, v in finding.as_json()["evidence"].items() if shown or k != "query"
            },
        }
        for finding in findings
    ]
    status = doctor.exit_status(findings)
    return {
        "status": ("healthy", "warnings", "problems")[status],
        "findings": [row for row in rows if row["severity"] != doctor.INFO],
        "notes": [row for row in rows if row["severity"] == doctor.INFO],
        "counts": {s: sum(1 for f in findings if f.severity == s) for s in doctor.SEVERITIES},
        "read_ms": round((time.perf_counter() - started) * 1000, 1),
    }


# Keys the overview's "Many tenants" section shows, and the window of its "started".
TOP_KEYS = 20
SHARE_SECONDS = 60.0


def tenants_context(search: str) -> dict[str, Any]:
    """The overview's section on keys (docs/tenants.md): the fair keys that started the
    most in the last minute, with their share of those starts, and the sequences a
    failed task holds (or, for both, the keys that contain ``search``); nothing when
    there are none."""
    search = search.strip()[:255]
    shares = operations.fair_shares(search=search or None, limit=TOP_KEYS, seconds=SHARE_SECONDS)
    started = sum(row["started"] for row in shares)
    for row in shares:
        row["share"] = round(100 * row["started"] / started) if started else 0
    held = operations.held_sequences(search=search or None, limit=TOP_KEYS)
    return {"key_search": search, "fair_shares": shares, "share_seconds": int(SHARE_SECONDS),
            "held_sequences": held}  # fmt: skip


# The counts a row of the page shows (its td[data-count]), refreshed in place.
ROW_COUNTS = (
    "pending_routable",
    "pending_unroutable",
    "throttled",
    "scheduled",
    "running",
    "waiting",
    "failed",
    "completed_5m",
    "completed_1h",
    "failed_5m",
    "failed_1h",
)
TOTALS = ("pending_routable", "pending_unroutable", "throttled", "running", "waiting", "failed")


def overview_data() -> dict[str, Any]:
    """What ``data_view`` sends: small, numbers only (a few hundred bytes a row)."""
    overview = build_overview(chart=False)
    rows, queues = {}, {}
    for queue in overview["queues"]:
        queues[row_key(queue.database, queue.name)] = {
            **{name: queue.totals[name] for name in ROW_COUNTS},
            "oldest_due": humanize_seconds(queue.totals["oldest_due_seconds"]),
            "paused": queue.paused,
            "held_by": queue.held_by,
        }
        for row in queue.rows:
            key = row_key(queue.database, queue.name, row["task_name"], row["handler_version"])
            rows[key] = {
                **{name: row[name] for name in ROW_COUNTS},
                "oldest_due": humanize_seconds(row["oldest_due_seconds"]),
                "paused": row["paused"],
                "why": row["why"],
            }
    totals = overview["totals"]
    return {
        "generated_at": overview["generated_at"].isoformat(timespec="seconds"),
        "read_ms": overview["read_ms"],
        "totals": {
            "due": totals["pending_routable"] + totals["pending_unroutable"],
            **{name: totals[name] for name in TOTALS},
            "oldest_due": humanize_seconds(totals["oldest_due_seconds"]),
            "workers": totals["workers"],
            "slots": totals["slots"],
        },
        "queues": queues,
        "rows": rows,
    }
