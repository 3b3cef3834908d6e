"""The admin's answers to input no form checks (query strings and selections), and the
one field every admin form reads JSON with.

A list's filters, search and date drill-down come from the URL, and an action's
selection from the POST: anyone can forge them. A value PostgreSQL cannot take (a NUL
character), or one that is no id of the model, must not reach a query, where it would
raise a database error (a server error page) instead of the admin's own answers:
"?e=1" for a list's bad parameters, a message for a bad selection, 404 for a page.

JSON typed into the admin (the enqueue form's arguments, Send signal's payload, a
runtime schedule's arguments and metadata, the task list's search by content) is read
by ``payload.parse_json`` and nothing else, through ``JSONInput`` in the forms: text
nested thousands deep, a number of 5,000 digits, NaN, a NUL or a lone surrogate is the
same clear error everywhere, never a server error.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict

from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.payload import parse_json

TASK_ID_MAX = 2**63 - 1  # the id column is a bigint


class JSONInput(forms.CharField):
    """A JSON value typed into a textarea, read by ``payload.parse_json`` (as the API
    checks values: depth, numbers, NaN, NUL, surrogates); empty text is None. ``where``
    names the value in its errors ("args: nested deeper than 100 levels")."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 60})

    def __init__(self, *, where: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.where = where

    def to_python(self, value: Any) -> Any:
        try:
            return parse_json(super().to_python(value), self.where)
        except InvalidTaskError as exc:
            raise forms.ValidationError(str(exc)) from None

    def prepare_value(self, value: Any) -> Any:
        """Text as typed (a form shown again with its errors), a stored value as JSON."""
        if isinstance(value, str) or value is None:
            return value
        return json.dumps(value, ensure_ascii=False)


def has_nul(query: QueryDict) -> bool:
    """Whether a parameter's name or value holds a NUL, which PostgreSQL text refuses."""
    return any("\x00" in key or any("\x00" in v for v in values) for key, values in query.lists())


def task_id(text: str) -> int | None:
    """A task id written in ASCII digits ("123", "#123" is the caller's to strip), or
    None: ``isdigit()`` alone also takes "²", which ``int()`` refuses."""
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    number = int(text)
    return number if 1 <= number <= TASK_ID_MAX else None


def task_id_or_404(object_id: str) -> int:
    """The task id of a page's URL, or 404."""
    number = task_id(object_id)
    if number is None:
        raise Http404(f"{object_id!r} is not a task id")
    return number


def refresh_seconds(text: str) -> int | None:
    """The overview's ``?refresh=N``: whole seconds from 2 to a day; anything else is
    no refresh."""
    if not (text.isascii() and text.isdigit()) or len(text) > 5:
        return None
    seconds = int(text)
    return seconds if 2 <= seconds <= 24 * 3600 else None


class ForgedInputMixin:
    """For a ModelAdmin: a list's query string with a NUL is a bad lookup (Django's
    "?e=1" answer), and an action's selection that holds no id of the model is refused
    with a message, before either reaches a query.

    A list filters only by the parameters of its own filters and date drill-down.
    Django's admin also takes any lookup on the model's own fields from the URL
    (``?kwargs__email=ann@example.com``, ``?result__icontains=a``): on the task list,
    that would filter by a payload the pages hide (``ADMIN_SHOW_PAYLOADS``), letter by
    letter, and read the whole table with no bound. Such a URL is refused (Django's
    answer: 400)."""

    model: Any
    list_filter: Any
    date_hierarchy: str | None

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        return lookup in self.list_parameters()

    def list_parameters(self) -> set[str]:
        """The URL parameters the list's filters and date drill-down read: a filter
        class's ``parameters`` (or its ``parameter_name``); a field's filter, by name,
        reads ``<field>__exact`` and ``<field>__isnull``."""
        names: set[str] = set()
        for spec in self.list_filter:
            if isinstance(spec, str):
                names.update((f"{spec}__exact", f"{spec}__isnull"))
            else:
                names.update(getattr(spec, "parameters", None) or (spec.parameter_name,))
        if self.date_hierarchy:
            names.update(f"{self.date_hierarchy}__{part}" for part in ("year", "month", "day"))
        return names

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        if has_nul(request.GET):
            raise IncorrectLookupParameters("a parameter of the list holds a NUL character")
        return super().get_changelist_instance(request)  # type: ignore[misc]

    def response_action(
        self, request: HttpRequest, queryset: QuerySet, *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        # *args, **kwargs: Django 6.1 passes the action's location (change list or form).
        field = self.model._meta.pk
        for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            try:
                if "\x00" in value:
                    raise ValidationError("NUL")
                field.to_python(value)
            except ValidationError:
                messages.error(
                    request,
                    f"No action was run: the selection holds {value[:40]!r}, which is not "
                    f"the {field.name} of a {self.model._meta.verbose_name}.",
                )
                return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset, *args, **kwargs)  # type: ignore[misc]
