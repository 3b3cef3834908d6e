"""The admin's list of periodic schedules (docs/periodic.md), read-only, with "run now".

A row exists for each schedule a worker has seen; what the schedule is (its task,
cron or interval, time zone, missed-tick policy, next tick) comes from the code of this
process. A row whose schedule is no longer declared shows "removed": it no longer
fires.

Permissions are Django's model permissions on Schedule, staff only: viewing needs
``view_schedule`` (or ``change_schedule``); "Run now" needs ``change_schedule``;
deleting the rows of removed schedules needs ``delete_schedule``.

The list reads from the read database (``READ_DATABASE`` when set); the actions
re-select the rows on ``DATABASE`` and write there.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from django_pgqueue.admin.databases import (
    DatabaseFilter,
    database_of,
    request_database,
    request_read_database,
    with_database,
)
from django_pgqueue.admin.input import ForgedInputMixin
from django_pgqueue.exceptions import InvalidTaskError
from django_pgqueue.models import Schedule
from django_pgqueue.periodic import ScheduleDefinition, next_tick, run_now, schedule_registry
from django_pgqueue.templatetags.pgqueue_admin import short_name

EMPTY = "-"


@admin.register(Schedule)
class ScheduleAdmin(ForgedInputMixin, admin.ModelAdmin):
    list_display = (
        "name",
        "task_display",
        "schedule_display",
        "timezone_display",
        "missed_display",
        "last_tick",
        "last_task_display",
        "next_tick_display",
        "declared_display",
    )
    list_display_links = None
    search_fields = ("name", "task_name")
    actions = ["run_now", "delete_removed"]

    list_filter = (DatabaseFilter,)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).using(request_read_database(request))

    # A schedule is declared in code, and its row is the workers' to write.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # No change form; the change permission (obj=None) is what "run now" requires.
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.name in schedule_registry:
            return False  # the workers would only create it again
        return super().has_delete_permission(request, obj)

    def get_actions(self, request: HttpRequest) -> dict:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # replaced by delete_removed
        return actions

    @staticmethod
    def _declared(obj: Schedule) -> ScheduleDefinition | None:
        return schedule_registry.find(obj.name)

    # -- columns ----------------------------------------------------------------------
    @admin.display(description="task", ordering="task_name")
    def task_display(self, obj: Schedule) -> str:
        declared = self._declared(obj)
        name = declared.task.name if declared else obj.task_name
        return format_html('<span title="{}">{}</span>', name, short_name(name))

    @admin.display(description="schedule")
    def schedule_display(self, obj: Schedule) -> str:
        declared = self._declared(obj)
        return format_html("<code>{}</code>", declared.spec if declared else obj.spec)

    @admin.display(description="time zone")
    def timezone_display(self, obj: Schedule) -> str:
        declared = self._declared(obj)
        return declared.timezone if declared else obj.timezone

    @admin.display(description="missed ticks")
    def missed_display(self, obj: Schedule) -> str:
        declared = self._declared(obj)
        if declared is None:
            return EMPTY
        if declared.missed == "all":
            return f"all (up to {declared.catch_up_limit})"
        return declared.missed

    @admin.display(description="last task")
    def last_task_display(self, obj: Schedule) -> str:
        if obj.last_task_id is None:
            return EMPTY
        url = with_database(
            reverse(
                "admin:django_pgqueue_task_change",
                args=[obj.last_task_id],
                current_app=self.admin_site.name,
            ),
            database_of(obj._state.db),
        )
        return format_html('<a href="{}">#{}</a>', url, obj.last_task_id)

    @admin.display(description="next tick")
    def next_tick_display(self, obj: Schedule) -> str:
        declared = self._declared(obj)
        if declared is None:
            return EMPTY
        upcoming = next_tick(declared, obj, timezone.now())
        return upcoming.isoformat(timespec="seconds") if upcoming else "never"

    @admin.display(description="in code")
    def declared_display(self, obj: Schedule) -> str:
        if self._declared(obj) is not None:
            return format_html('<span class="pgqueue-live" style="color:#2e7d32">{}</span>', "yes")
        return format_html(
            '<span class="pgqueue-removed" style="color:#ba2121;font-weight:bold">{}</span>',
            "removed",
        )

    # -- actions ----------------------------------------------------------------------
    @admin.action(
        description="Run now (enqueue the task once; the ticks go on)", permissions=["change"]
    )
    def run_now(self, request: HttpRequest, queryset: QuerySet) -> None:
        ran, removed, refused = [], [], []
        database = request_database(request)
        with transaction.atomic(using=database):
            for schedule in queryset.using(database):
                if schedule.name not in schedule_registry:
                    removed.append(schedule.name)
                    continue
                try:
                    task_id = run_now(schedule.name)
                except InvalidTaskError as exc:  # its queue is on another database now
                    refused.append(f"{schedule.name}: {exc}")
                    continue
                ran.append((schedule, task_id))
        for schedule, task_id in ran:
            LogEntry.objects.log_actions(
                request.user.pk, [schedule], CHANGE, f"Ran now as task #{task_id}."
            )
        if ran:
            ids = ", ".join(f"#{task_id}" for _, task_id in ran)
            messages.success(request, f"Enqueued {len(ran)} task(s) now: {ids}.")
        for reason in refused:
            messages.error(request, f"Skipped {reason}")
        if removed:
            messages.error(
                request,
                f"Skipped {', '.join(removed)}: no longer declared in the code, so there is "
                "no task to run.",
            )

    @admin.action(description="Delete the rows of removed schedules", permissions=["delete"])
    def delete_removed(self, request: HttpRequest, queryset: QuerySet) -> None:
        queryset = queryset.using(request_database(request))
        doomed = [s for s in queryset if s.name not in schedule_registry]
        kept = len(queryset) - len(doomed)
        if doomed:
            LogEntry.objects.log_actions(request.user.pk, doomed, DELETION, "")
            queryset.filter(pk__in=[s.pk for s in doomed]).delete()
            messages.success(request, f"Deleted {len(doomed)} row(s) of removed schedules.")
        if kept:
            messages.warning(
                request,
                f"Left {kept} schedule(s) alone: still declared in the code (the workers "
                "would create their rows again).",
            )

    def changelist_view(self, request: HttpRequest, extra_context=None) -> HttpResponse:
        seen = set(
            Schedule.objects.using(request_read_database(request)).values_list("name", flat=True)
        )
        unseen = [s.name for s in schedule_registry.all() if s.name not in seen]
        if unseen and request.method == "GET":
            messages.info(
                request,
                f"Declared in the code but not seen by a worker yet: {', '.join(unseen)}. "
                "A schedule fires once a worker serving its queue runs.",
            )
        return super().changelist_view(request, extra_context)
