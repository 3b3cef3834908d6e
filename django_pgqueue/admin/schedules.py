"""The admin's list of periodic schedules (docs/periodic.md), with "run now", and the
forms of runtime schedules.

A row exists for each schedule a worker has seen, and for each runtime schedule; what a
schedule from code is (its task, cron or interval, time zone, missed-tick policy, next
tick) comes from the code of this process, a runtime schedule's from its row. A row
whose schedule is no longer declared shows "removed": it no longer fires.

Permissions are Django's model permissions on Schedule, staff only: viewing needs
``view_schedule`` (or ``change_schedule``); "Run now", "Pause" and "Resume" need
``change_schedule``; adding a runtime schedule needs ``add_schedule``, changing one
``change_schedule``; deleting runtime schedules and the rows of removed schedules needs
``delete_schedule``. A schedule from code is never changed nor deleted here, only
paused and resumed. Every write goes through runtime_schedules.py, validated as the API.

A runtime schedule's args and kwargs are the payloads of every task it enqueues: with
``ADMIN_SHOW_PAYLOADS = False`` its page hides them, and its change form neither shows
them nor changes them unless new JSON is typed in.

The list reads from the read database (``READ_DATABASE`` when set); the actions
re-select the rows on ``DATABASE`` and write there.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html

from django_pgqueue.admin.common import (
    WithoutDeleteSelected,
    _url,
    _with_payloads,
    payloads_shown,
)
from django_pgqueue.admin.databases import (
    DatabaseFilter,
    database_of,
    request_database,
    request_read_database,
    with_database,
)
from django_pgqueue.admin.input import ForgedInputMixin, JSONInput
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.models import Schedule
from django_pgqueue.tasking.periodic import (
    ScheduleDefinition,
    next_tick,
    run_now,
    schedule_registry,
)
from django_pgqueue.tasking.registry import registry
from django_pgqueue.tasking.runtime_schedules import (
    InvalidScheduleError,
    ScheduleDoesNotExist,
    add_schedule,
    check_schedule,
    pause_schedule,
    resume_schedule,
    runtime_definition,
    update_schedule,
)
from django_pgqueue.templatetags.pgqueue_admin import short_name

EMPTY = "-"
MISSED_CHOICES = [("once", "once"), ("skip", "skip"), ("all", "all")]
PAYLOADS = ("args", "kwargs")  # a runtime schedule's: its tasks' arguments
KEPT_HELP = (
    'hidden (PGQUEUE["ADMIN_SHOW_PAYLOADS"] is False): empty keeps the stored value; '
    "JSON replaces it"
)


class RuntimeScheduleForm(forms.ModelForm):
    """A runtime schedule: add_schedule's arguments, validated as the API validates
    them (runtime_schedules._stored) before anything is written."""

    name = forms.CharField(max_length=255)
    task = forms.ChoiceField(choices=())
    cron = forms.CharField(required=False, help_text="five fields, e.g. 0 7 * * mon")
    every = forms.FloatField(required=False, help_text="seconds (>= 1); or a cron")
    timezone = forms.CharField(initial="UTC", help_text="IANA time zone, for cron")
    args = JSONInput(where="args", required=False, initial="[]", help_text="JSON list")
    kwargs = JSONInput(where="kwargs", required=False, initial="{}", help_text="JSON object")
    missed = forms.ChoiceField(choices=MISSED_CHOICES, initial="once")
    catch_up_limit = forms.IntegerField(initial=10, help_text='with missed "all"')
    queue = forms.CharField(required=False, help_text="default: the task's")
    priority = forms.IntegerField(required=False, help_text="default: the task's")
    max_attempts = forms.IntegerField(required=False, help_text="default: the task's")
    timeout = forms.FloatField(required=False, help_text="seconds; default: the task's")
    metadata = JSONInput(
        where="metadata", required=False, help_text="JSON object, added to the task's"
    )

    FIELDS = ("task", "cron", "every", "timezone", "args", "kwargs", "missed",
              "catch_up_limit", "queue", "priority", "max_attempts", "timeout",
              "metadata")  # fmt: skip

    class Meta:
        model = Schedule
        fields = ("name",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["task"].choices = [(t.name, t.name) for t in _registered()]
        data = self.instance.definition if self.instance.pk else None
        # Payloads hidden: the stored arguments are neither shown nor, left empty, changed.
        self.kept = {f: data.get(f) for f in PAYLOADS} if isinstance(data, dict) else {}
        if payloads_shown():
            self.kept = {}
        if isinstance(data, dict):
            for field in self.FIELDS:
                if field in self.kept:
                    self.initial[field] = ""
                    self.fields[field].help_text = KEPT_HELP
                elif data.get(field) is not None:
                    self.initial[field] = data[field]

    def schedule_fields(self) -> dict[str, Any]:
        fields = {f: self.cleaned_data.get(f) for f in self.FIELDS}
        for field, stored in self.kept.items():
            if fields[field] is None:
                fields[field] = stored
        fields["args"] = [] if fields["args"] is None else fields["args"]
        fields["every"] = _whole(fields["every"])
        fields["cron"] = fields["cron"] or None
        fields["queue"] = fields["queue"] or None
        return fields

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if self.errors:
            return cleaned
        name = self.instance.name if self.instance.pk else cleaned.get("name")
        if not self.instance.pk and name in schedule_registry:
            raise forms.ValidationError(f"schedule {name!r} is declared in the code")
        try:
            check_schedule(name, self.schedule_fields())
        except InvalidScheduleError as exc:
            raise forms.ValidationError(str(exc)) from None
        return cleaned


def _registered() -> list[Any]:
    return sorted({d.name: d for d in registry.all()}.values(), key=lambda d: d.name)


def _whole(value: float | None) -> float | int | None:
    """2.0 -> 2 (as the API is called with), 2.5 stays."""
    return int(value) if value is not None and value == int(value) else value


@admin.register(Schedule)
# Without Django's "delete selected": replaced by delete_removed.
class ScheduleAdmin(WithoutDeleteSelected, ForgedInputMixin, admin.ModelAdmin):
    form = RuntimeScheduleForm
    list_display = (
        "name_display",
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
    actions = ["run_now", "pause", "resume", "delete_removed"]

    list_filter = (DatabaseFilter,)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).using(request_read_database(request))

    # A schedule from code is the code's: only runtime schedules are added, changed
    # (the change permission with obj=None is also what "run now" and pausing require)
    # and deleted here; the rows of schedules removed from the code are deleted too.
    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.definition is None:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.name in schedule_registry:
            return False  # the workers would only create it again
        return super().has_delete_permission(request, obj)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is not None and not self.has_change_permission(request, obj):
            return [  # viewing only: the row as stored
                "name", "task_name", "spec", "timezone", "definition_display", "created_at",
                "paused_at", "resumed_at", "last_tick", "last_task_id",
            ]  # fmt: skip
        return ["name", *RuntimeScheduleForm.FIELDS]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("name",) if obj is not None else ()

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        fields = form.schedule_fields()
        if change:
            update_schedule(obj.name, using=request_database(request), **fields)
        else:
            task = fields.pop("task")
            add_schedule(obj.name, task, **fields)

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        Schedule.objects.using(request_database(request)).filter(pk=obj.pk).delete()

    @staticmethod
    def _declared(obj: Schedule) -> ScheduleDefinition | None:
        """The schedule as this process knows it: from code, or a runtime row's (None
        when its task is not registered here)."""
        if obj.definition is not None:
            key = json.dumps(obj.definition, sort_keys=True)
            cached = getattr(obj, "_pgqueue_definition", None)
            if cached is None or cached[0] != key:
                cached = (key, runtime_definition(obj.name, obj.definition))
                obj._pgqueue_definition = cached
            return cached[1]
        return schedule_registry.find(obj.name)

    @admin.display(description="definition")
    def definition_display(self, obj: Schedule) -> str:
        """A runtime schedule as stored; its arguments are payloads (hidden or not)."""
        return _with_payloads(obj.definition, *PAYLOADS) if obj.definition else EMPTY

    @admin.display(description="name", ordering="name")
    def name_display(self, obj: Schedule) -> str:
        if obj.definition is None:
            return obj.name
        url = with_database(_url(self, "schedule_change", obj.pk), database_of(obj._state.db))
        return format_html('<a href="{}">{}</a>', url, obj.name)

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
            _url(self, "task_change", obj.last_task_id), database_of(obj._state.db)
        )
        return format_html('<a href="{}">#{}</a>', url, obj.last_task_id)

    @admin.display(description="next tick")
    def next_tick_display(self, obj: Schedule) -> str:
        if obj.paused_at is not None:
            return format_html(
                '<span class="pgqueue-paused" title="since {}">{}</span>',
                obj.paused_at.isoformat(timespec="seconds"),
                "paused",
            )
        declared = self._declared(obj)
        if declared is None:
            return EMPTY
        upcoming = next_tick(declared, obj, timezone.now())
        return upcoming.isoformat(timespec="seconds") if upcoming else "never"

    @admin.display(description="from")
    def declared_display(self, obj: Schedule) -> str:
        if obj.definition is not None:
            if self._declared(obj) is None:
                return format_html(
                    '<span class="pgqueue-unregistered" style="color:#ba2121" title="{}">{}</span>',
                    "its task is not registered in this process: workers without it skip it",
                    "runtime (task not registered)",
                )
            return format_html('<span class="pgqueue-runtime">{}</span>', "runtime")
        if obj.name in schedule_registry:
            return format_html('<span class="pgqueue-live" style="color:#2e7d32">{}</span>', "code")
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
                if schedule.name not in schedule_registry and self._declared(schedule) is None:
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
                f"Skipped {', '.join(removed)}: no longer declared in the code (or a runtime "
                "schedule whose task is not registered here), so there is no task to run.",
            )

    @admin.action(description="Pause (no tick until resumed)", permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._switch(request, queryset, "pause")

    @admin.action(description="Resume (from the next tick on)", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._switch(request, queryset, "resume")

    def _switch(self, request: HttpRequest, queryset: QuerySet, action: str) -> None:
        database = request_database(request)
        done, skipped = [], []
        with transaction.atomic(using=database):
            for schedule in queryset.using(database):
                try:
                    if action == "pause":
                        pause_schedule(schedule.name, using=database)
                    elif not resume_schedule(schedule.name, using=database):
                        skipped.append(f"{schedule.name} (not paused)")
                        continue
                except (InvalidScheduleError, ScheduleDoesNotExist) as exc:
                    skipped.append(str(exc))
                    continue
                done.append(schedule)
        for schedule in done:
            LogEntry.objects.log_actions(request.user.pk, [schedule], CHANGE, f"{action.title()}d.")
        if done:
            names = ", ".join(s.name for s in done)
            messages.success(request, f"{action.title()}d {len(done)} schedule(s): {names}.")
        if skipped:
            messages.warning(request, f"Skipped: {'; '.join(skipped)}.")

    @admin.action(
        description="Delete runtime schedules and the rows of removed schedules",
        permissions=["delete"],
    )
    def delete_removed(self, request: HttpRequest, queryset: QuerySet) -> None:
        queryset = queryset.using(request_database(request))
        doomed = [s for s in queryset if s.name not in schedule_registry]
        kept = len(queryset) - len(doomed)
        if doomed:
            LogEntry.objects.log_actions(request.user.pk, doomed, DELETION, "")
            queryset.filter(pk__in=[s.pk for s in doomed]).delete()
            messages.success(request, f"Deleted {len(doomed)} schedule(s).")
        if kept:
            messages.warning(
                request,
                f"Left {kept} schedule(s) alone: declared in the code, which only the code "
                "can remove (pause them instead).",
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
