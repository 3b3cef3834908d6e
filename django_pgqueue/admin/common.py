"""What the admin's pages share: permissions, links, and how a state or a payload is shown."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from django_pgqueue.admin.databases import (
    request_database,
)
from django_pgqueue.core.conf import get_settings, queue_databases
from django_pgqueue.core.exceptions import EncryptionError
from django_pgqueue.db import encryption
from django_pgqueue.models import (
    Task,
    TaskState,
)
from django_pgqueue.ops.overview import humanize_seconds

JSON_DISPLAY_LIMIT = 100_000  # characters of a payload shown on the detail page
EMPTY = "-"

# A task row's JSON columns are each a payload or the queue's own record. A payload is
# what the task's code, or whoever enqueued or signalled the task, put in the row: shown
# as JSON, or hidden with PGQUEUE["ADMIN_SHOW_PAYLOADS"] = False, on every page (through
# _payload and _with_payloads) and from the search by content (admin/search.py). The
# record is always shown and searchable: operators need it to see why a task failed
# (docs/security.md says to keep personal data out of exception messages and metadata).
# ``wake`` is the queue's record of what woke a task, holding a signal's payload. The
# payloads are what an encrypted task encrypts (encryption.py): such a task's are shown
# in clear to a user with django_pgqueue.decrypt_task only, and never searched. A
# task's log records (TASK_LOGS, in pgqueue_task_log, shown on its page) are what its
# code wrote: payloads too, hidden through ``payloads_shown`` (never encrypted).
PAYLOAD_FIELDS = frozenset(encryption.PAYLOAD_COLUMNS)
RECORD_FIELDS = frozenset({"errors", "executions", "retry_policy", "metadata"})
HIDDEN = mark_safe(
    '<span class="pgqueue-hidden quiet">hidden (PGQUEUE["ADMIN_SHOW_PAYLOADS"] is False)</span>'
)
ENCRYPTED = mark_safe(
    '<span class="pgqueue-hidden pgqueue-encrypted quiet">encrypted (seeing it needs the '
    "permission django_pgqueue.decrypt_task)</span>"
)
# Set by the task admin on the row a page shows: whether the page's user holds
# decrypt_task (TaskAdmin.get_object).
MAY_DECRYPT = "pgqueue_may_decrypt"

STATE_COLOURS = {
    TaskState.SCHEDULED: "#5b7f95",
    TaskState.PENDING: "#417690",
    TaskState.RUNNING: "#b8860b",
    TaskState.WAITING: "#6f42c1",
    TaskState.SUCCEEDED: "#2e7d32",
    TaskState.FAILED: "#ba2121",
    TaskState.CANCELLED: "#666",
}


class WithoutDeleteSelected:
    """An admin without Django's "delete selected" action (each says why, and what it
    offers instead)."""

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict:
        # Django 6.1 passes where the actions are shown (its ActionLocation); 5.2 does not.
        located = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **located)  # type: ignore[misc]
        actions.pop("delete_selected", None)
        return actions


def can_view_tasks(request: HttpRequest) -> bool:
    return request.user.has_perm("django_pgqueue.view_task") or request.user.has_perm(
        "django_pgqueue.change_task"
    )


def can_pause_queues(request: HttpRequest) -> bool:
    return request.user.has_perm("django_pgqueue.pause_queue")


def can_decrypt_tasks(request: HttpRequest) -> bool:
    return request.user.has_perm("django_pgqueue.decrypt_task")


def _pretty_json(value: Any) -> str:
    if value is None:
        return EMPTY
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    if len(text) > JSON_DISPLAY_LIMIT:
        text = text[:JSON_DISPLAY_LIMIT] + f"\n… ({len(text) - JSON_DISPLAY_LIMIT} more characters)"
    return format_html('<pre class="pgqueue-json">{}</pre>', text)


def payloads_shown() -> bool:
    """Whether the admin shows payloads (PAYLOAD_FIELDS) and searches them."""
    return get_settings().ADMIN_SHOW_PAYLOADS


def _withheld(task: Task | None) -> str | None:
    """What a page shows in place of payloads, or None when it shows them: hidden with
    PGQUEUE['ADMIN_SHOW_PAYLOADS'] = False; an encrypted task's, unless the page's user
    holds decrypt_task (set on the row by TaskAdmin.get_object)."""
    if not payloads_shown():
        return HIDDEN
    if task is not None and task.encrypted and not getattr(task, MAY_DECRYPT, False):
        return ENCRYPTED
    return None


def _payload(value: Any, task: Task | None = None, column: str = "") -> str:
    """A payload (PAYLOAD_FIELDS of a task, or a runtime schedule's arguments): shown as
    JSON, or withheld (``_withheld``). ``task`` and ``column``: the row and column it
    was read from, decrypted here when the task is encrypted. The one path by which
    the admin shows a payload."""
    withheld = _withheld(task)
    if withheld is ENCRYPTED and value is None:
        return EMPTY  # an encrypted task's empty column holds nothing to withhold
    if withheld is not None:
        return withheld
    opened = _opened(value, task, column)
    if isinstance(opened, EncryptionError):
        return format_html('<span class="pgqueue-undecryptable">{}</span>', str(opened))
    return _pretty_json(opened)


def _opened(value: Any, task: Task | None, column: str) -> Any:
    """``value`` decrypted if it is a column of an encrypted task; the error instead of
    it when no key of ENCRYPTION_KEYS decrypts it."""
    if task is None or not task.encrypted:
        return value
    try:
        return encryption.open_column(column, value, f"task {task.pk}'s {column}")
    except EncryptionError as exc:
        return exc


def _with_payloads(record: Any, *keys: str, task: Task | None = None, column: str = "") -> str:
    """A JSON object of the queue's own that holds payloads under ``keys`` (a wake-up's
    signal payload, a runtime schedule's arguments): shown whole, or with those values
    withheld (``_withheld``). Anything but an object is withheld whole. ``task`` and
    ``column``: as for ``_payload``."""
    if not isinstance(record, dict):
        return _payload(record, task, column)
    held = [key for key in keys if key in record]
    withheld = _withheld(task) if held else None
    if withheld is None:
        return _payload(record, task, column) if held else _pretty_json(record)
    rest = {name: value for name, value in record.items() if name not in held}
    return format_html(
        "{}{}",
        _pretty_json(rest),
        format_html_join(
            "", '<div class="pgqueue-hidden-key">{}: {}</div>', ((k, withheld) for k in held)
        ),
    )


def _url(model_admin: admin.ModelAdmin, name: str, *args: Any) -> str:
    """The admin URL ``django_pgqueue_<name>`` on the site ``model_admin`` is registered
    on: ``admin.site``, or a project's own AdminSite (``register``)."""
    return reverse(
        f"admin:django_pgqueue_{name}", args=args, current_app=model_admin.admin_site.name
    )


def _state_html(state: str, label: str | None = None) -> str:
    return format_html(
        '<span class="pgqueue-state pgqueue-state-{}" style="color:{};font-weight:bold">{}</span>',
        state,
        STATE_COLOURS.get(state, "inherit"),
        label or state,
    )


def _replica_of(request: HttpRequest) -> str | None:
    """READ_DATABASE, when the page's reads go there (its database is DATABASE)."""
    if request_database(request) != queue_databases()[0]:
        return None
    return get_settings().READ_DATABASE


def relative_time(moment: datetime | None) -> str:
    """``in 4m 10s`` or ``3m 05s ago``, with the timestamp as its title."""
    if moment is None:
        return EMPTY
    seconds = (moment - timezone.now()).total_seconds()
    ago = humanize_seconds(abs(seconds))
    words = f"in {ago}" if seconds >= 0 else f"{ago} ago"
    return format_html('<span title="{}">{}</span>', moment.isoformat(timespec="seconds"), words)
