"""The task list's search by content: arguments, keyword arguments and metadata by JSON
containment (``{"order_id": 42}``), and text in the errors.

No index serves these (an index on args, kwargs or metadata would be written by every
enqueue; docs/decisions.md). So each search is bounded: it reads only a window of ids,
the newest ``ADMIN_SEARCH_ROWS`` tasks below ``search_below`` (the newest of all when
it is not given), through the primary key, and the page's reads run under a
``statement_timeout`` of ``ADMIN_SEARCH_TIMEOUT`` seconds. The page says which ids it
searched and links to the window before. Other filters (state, queue, task name, a
date) narrow the same window further.

The parameters are those of the list's URL, so they are kept in its links, its
pagination, its actions and their "select all" (the bulk actions act on what the
search found, in that window).

Arguments and keyword arguments are payloads (admin/common.py): with
``ADMIN_SHOW_PAYLOADS = False`` they are not searched (their fields are not drawn, and
a URL that gives them is refused and searches nothing), or a search could confirm a
value the pages hide. Encrypted tasks' arguments (encryption.py) are never searched:
a search by args or kwargs reads plain rows only. Metadata and errors are the queue's
record, shown and searched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast
from django.http import HttpRequest

from django_pgqueue.admin.common import PAYLOAD_FIELDS, payloads_shown
from django_pgqueue.admin.input import JSONInput, task_id
from django_pgqueue.core.conf import get_settings
from django_pgqueue.models import Task

# URL parameter -> (label, what it matches)
JSON_FIELDS = {
    "args": ("args contain", "args"),
    "kwargs": ("kwargs contain", "kwargs"),
    "metadata": ("metadata contain", "metadata"),
}
ERROR_PARAMETER = "error"
BELOW_PARAMETER = "search_below"
PARAMETERS = (*JSON_FIELDS, ERROR_PARAMETER, BELOW_PARAMETER)
ERROR_TEXT_MAX = 200


@dataclass
class Window:
    """The ids a search read: ``low <= id < below``; ``older`` is the next window's
    ``search_below`` (None when the window reached id 1)."""

    low: int
    below: int
    rows: int
    terms: dict[str, str] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)

    @property
    def older(self) -> int | None:
        return self.low if self.low > 1 else None


def searching(request: HttpRequest) -> bool:
    """Whether the list's URL asks for a content search."""
    return any(request.GET.get(name, "").strip() for name in (*JSON_FIELDS, ERROR_PARAMETER))


class ContentSearchFilter(admin.ListFilter):
    """Consumes the search's parameters (so that Django's list does not take them for
    field lookups) and applies them, bounded. Drawn above the list, not in the sidebar
    (``task/change_list.html``)."""

    title = "content"
    # Drawn above the list (the search form), not in the sidebar: an empty template.
    template = "admin/django_pgqueue/task/content_filter.html"
    parameters = PARAMETERS

    def __init__(self, request, params, model, model_admin):
        super().__init__(request, params, model, model_admin)
        self.request = request
        self.values: dict[str, str] = {}
        self.window: Window | None = None
        for name in PARAMETERS:
            if name in params:
                value = params.pop(name)
                value = value[-1] if isinstance(value, list) else value
                if value.strip():
                    self.values[name] = value.strip()

    def has_output(self) -> bool:
        return True  # else Django's list leaves the filter out, queryset() and all

    def choices(self, changelist):
        return []

    def expected_parameters(self) -> list[str]:
        return list(self.parameters)

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        terms = {k: v for k, v in self.values.items() if k != BELOW_PARAMETER}
        if not terms:
            return queryset
        refused: list[str] = []
        for name, (label, column) in JSON_FIELDS.items():
            if name not in terms:
                continue
            if column in PAYLOAD_FIELDS and not payloads_shown():
                refused.append(
                    f"{label}: not searched while payloads are hidden "
                    '(PGQUEUE["ADMIN_SHOW_PAYLOADS"] is False)'
                )
                continue
            try:
                value = JSONInput(where=label).clean(terms[name])
            except ValidationError as exc:
                refused.append(exc.messages[0])
                continue
            if value is None:
                refused.append(f"{label}: null matches nothing; give a JSON value")
                continue
            queryset = queryset.filter(**{f"{column}__contains": value})
            if column in PAYLOAD_FIELDS:
                # Plain rows only: an encrypted row's args are an object, and
                # args @> '[]' holds for an array alone.
                queryset = queryset.filter(args__contains=[])
        if ERROR_PARAMETER in terms:
            text = terms[ERROR_PARAMETER]
            if len(text) > ERROR_TEXT_MAX:
                refused.append(f"error text: longer than {ERROR_TEXT_MAX} characters")
            else:
                queryset = queryset.alias(pgqueue_errors_text=Cast("errors", TextField()))
                queryset = queryset.exclude(errors=[]).filter(pgqueue_errors_text__icontains=text)
        rows = get_settings().ADMIN_SEARCH_ROWS
        below = task_id(self.values.get(BELOW_PARAMETER, ""))
        if below is None:
            newest = (
                Task.objects.using(queryset.db).order_by("-pk").values_list("pk", flat=True)[:1]
            )
            below = (newest[0] if newest else 0) + 1
        low = max(1, below - rows)
        window = Window(low=low, below=below, rows=rows, terms=terms, refused=refused)
        request.pgqueue_search = window  # type: ignore[attr-defined]
        self.window = window
        for reason in refused:
            messages.error(request, f"Search: {reason}. Nothing was searched.")
        if refused:
            return queryset.none()
        return queryset.filter(pk__gte=low, pk__lt=below)


def search_context(request: HttpRequest, changelist: Any) -> dict[str, Any]:
    """What the search form above the list shows: the terms, and the window read."""
    window: Window | None = getattr(request, "pgqueue_search", None)
    context: dict[str, Any] = {
        "fields": [
            {"name": name, "label": label, "value": request.GET.get(name, "")}
            for name, (label, column) in JSON_FIELDS.items()
            if payloads_shown() or column not in PAYLOAD_FIELDS
        ],
        "payloads_hidden": not payloads_shown(),
        "error": request.GET.get(ERROR_PARAMETER, ""),
        "rows": get_settings().ADMIN_SEARCH_ROWS,
        "timeout": get_settings().ADMIN_SEARCH_TIMEOUT,
        "kept": [
            (key, value)
            for key, values in request.GET.lists()
            if key not in PARAMETERS and key not in ("p", "e")
            for value in values
        ],
        "window": window,
    }
    if window is not None and not window.refused:
        context["older_url"] = (
            changelist.get_query_string({BELOW_PARAMETER: window.older}, ["p"])
            if window.older
            else None
        )
        context["newest_url"] = (
            changelist.get_query_string({}, [BELOW_PARAMETER, "p"])
            if BELOW_PARAMETER in request.GET
            else None
        )
        context["clear_url"] = changelist.get_query_string({}, [*PARAMETERS, "p"])
    return context
