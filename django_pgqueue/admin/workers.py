"""The live workers: their heartbeats, queues and routes; removing stale rows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from django_pgqueue.admin.common import (
    WithoutDeleteSelected,
    _url,
    can_view_tasks,
    relative_time,
)
from django_pgqueue.admin.databases import (
    DatabaseFilter,
    request_database,
    request_read_database,
)
from django_pgqueue.admin.input import (
    ForgedInputMixin,
)
from django_pgqueue.core.conf import get_settings
from django_pgqueue.models import (
    Worker,
)
from django_pgqueue.ops.overview import humanize_seconds
from django_pgqueue.templatetags.pgqueue_admin import short_name


@admin.register(Worker)
# Without Django's "delete selected": a live worker would only register again.
class WorkerAdmin(WithoutDeleteSelected, ForgedInputMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "status",
        "hostname",
        "pid",
        "queues_display",
        "routes_display",
        "slots_display",
        "in_flight",
        "heartbeat_display",
        "started_display",
    )
    list_display_links = None
    list_filter = (DatabaseFilter,)
    ordering = ("hostname", "pid")
    change_list_template = "admin/django_pgqueue/worker/change_list.html"
    actions = ["remove_stale"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).using(request_read_database(request))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return can_view_tasks(request) or super().has_view_permission(request, obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a worker writes its own row

    def _stale_after(self) -> timedelta:
        return timedelta(seconds=get_settings().WORKER_STALE_AFTER)

    @admin.display(description="status")
    def status(self, obj: Worker) -> str:
        silent = (timezone.now() - obj.last_heartbeat_at).total_seconds()
        if silent > self._stale_after().total_seconds():
            return format_html(
                '<span class="pgqueue-stale" style="color:#ba2121;font-weight:bold">'
                "stale</span> (no heartbeat for {})",
                humanize_seconds(silent),
            )
        return mark_safe('<span class="pgqueue-live" style="color:#2e7d32">live</span>')

    @admin.display(description="queues")
    def queues_display(self, obj: Worker) -> str:
        return ", ".join(obj.queues or [])

    @admin.display(description="tasks (versions)")
    def routes_display(self, obj: Worker) -> str:
        # A long dotted name is shortened, in full on hover.
        return mark_safe(
            ", ".join(
                format_html("<code>{}@{}</code>", name, version)
                if short_name(name) == name
                else format_html('<code title="{}">{}@{}</code>', name, short_name(name), version)
                for name, version in obj.routes or []
            )
        )

    @admin.display(description="slots", ordering="concurrency")
    def slots_display(self, obj: Worker) -> int:
        return obj.concurrency  # --concurrency

    @admin.display(description="heartbeat", ordering="last_heartbeat_at")
    def heartbeat_display(self, obj: Worker) -> str:
        return relative_time(obj.last_heartbeat_at)

    @admin.display(description="started", ordering="started_at")
    def started_display(self, obj: Worker) -> str:
        return relative_time(obj.started_at)

    @admin.action(description="Remove selected workers that are stale", permissions=["delete"])
    def remove_stale(self, request: HttpRequest, queryset: QuerySet) -> None:
        # The database's clock decides what is stale; a live worker's row is left alone.
        # Decided on the list's database itself: a replica's heartbeats may be behind.
        queryset = queryset.using(request_database(request))
        stale = queryset.filter(last_heartbeat_at__lt=Now() - self._stale_after())
        removed, _ = stale.delete()
        if removed:
            messages.success(request, f"Removed {removed} stale worker row(s).")
        if queryset.count():
            messages.warning(
                request, f"Left {queryset.count()} live worker(s) alone: they are heartbeating."
            )

    def changelist_view(self, request: HttpRequest, extra_context=None) -> HttpResponse:
        stale_before = timezone.now() - self._stale_after()
        workers = list(Worker.objects.using(request_read_database(request)))
        live = [w for w in workers if w.last_heartbeat_at >= stale_before]
        context = {
            **(extra_context or {}),
            "pgqueue_summary": {
                "live": len(live),
                "stale": len(workers) - len(live),
                "slots": sum(w.concurrency for w in live),
                "in_flight": sum(w.in_flight for w in live),
                "stale_after": humanize_seconds(self._stale_after().total_seconds()),
            },
            "pgqueue_overview_url": _url(self, "queueoverview_changelist"),
        }
        return super().changelist_view(request, context)
