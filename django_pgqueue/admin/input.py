"""The admin's answers to input no form checks: query strings and selections.

A list's filters, search and date drill-down come from the URL, and an action's
selection from the POST: anyone can forge them. A value PostgreSQL cannot take (a NUL
character), or one that is no id of the model, must not reach a query, where it would
raise a database error (a server error page) instead of the admin's own answers:
"?e=1" for a list's bad parameters, a message for a bad selection, 404 for a page.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict

TASK_ID_MAX = 2**63 - 1  # the id column is a bigint


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
    with a message, before either reaches a query."""

    model: Any

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
