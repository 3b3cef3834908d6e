"""Enqueue a registered task from the admin, with JSON arguments.

Only tasks registered in this process (``@task``, the registry) can be chosen: a name
typed into a form never reaches the table. The arguments are JSON, checked as
``enqueue()`` checks them (``JSONInput`` for the text, then the enqueue path itself:
JSON values, sizes, options), and must fit the function's signature. The
task's metadata records who enqueued it: ``{"enqueued_by": "admin:<username>"}``.

Permission: ``django_pgqueue.enqueue_task``, a permission of its own (models.Task):
the form runs any registered task with any arguments, queue and priority, more than
Django's ``add_task`` says where a group is given it. The task has no add form.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.contrib.admin.models import ADDITION, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from django_pgqueue.admin.common import _url
from django_pgqueue.admin.databases import with_database
from django_pgqueue.admin.input import JSONInput
from django_pgqueue.core.conf import database_for
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.models import Task
from django_pgqueue.tasking.registry import ContextTaskDefinition, TaskDefinition, registry

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin


def can_enqueue(request: HttpRequest) -> bool:
    return request.user.has_perm("django_pgqueue.enqueue_task")


def _choices() -> list[tuple[str, str]]:
    return [
        (f"{d.name}@{d.version}", f"{d.name} (v{d.version}, queue {d.queue})")
        for d in registry.all()
    ]


class EnqueueForm(forms.Form):
    task = forms.ChoiceField(help_text="A task registered in this process, at a handler version.")
    args = JSONInput(
        where="args",
        required=False,
        help_text='A JSON array of positional arguments, e.g. [42, "fr"]; empty for none.',
    )
    kwargs = JSONInput(
        where="kwargs",
        required=False,
        help_text='A JSON object of keyword arguments, e.g. {"order_id": 42}; empty for none.',
    )
    queue = forms.CharField(
        required=False, max_length=100, help_text="Empty: the task's own queue."
    )
    priority = forms.IntegerField(required=False, help_text="Empty: the task's priority.")
    delay = forms.FloatField(
        required=False, min_value=0, help_text="Seconds from now before it is due; empty: now."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["task"].choices = _choices()

    def clean_args(self) -> list[Any]:
        value = self.cleaned_data["args"]
        if value is None:
            return []
        if not isinstance(value, list):
            raise forms.ValidationError(f"args must be a JSON array, not {type(value).__name__}")
        return value

    def clean_kwargs(self) -> dict[str, Any]:
        value = self.cleaned_data["kwargs"]
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise forms.ValidationError(f"kwargs must be a JSON object, not {type(value).__name__}")
        return value

    def definition(self) -> TaskDefinition[..., Any]:
        name, _, version = self.cleaned_data["task"].rpartition("@")
        return registry.get(name, int(version))


def _check_signature(definition: TaskDefinition[..., Any], args: list[Any], kwargs: dict) -> None:
    """The arguments fit the function (a task taking a context gets it from the
    worker: its first parameter is not the caller's)."""
    try:
        signature = inspect.signature(definition.func)
    except (TypeError, ValueError):  # no signature to check
        return
    if isinstance(definition, ContextTaskDefinition):
        parameters = list(signature.parameters.values())[1:]
        signature = signature.replace(parameters=parameters)
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidTaskError(
            f"the arguments do not fit {definition.name}{signature}: {exc}"
        ) from None


def enqueue_view(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    if not can_enqueue(request):
        raise PermissionDenied("Enqueue a task: permission denied (needs enqueue_task)")
    request.current_app = model_admin.admin_site.name
    changelist_url = _url(model_admin, "task_changelist")
    if request.method == "POST":
        form = EnqueueForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            definition = form.definition()
            options: dict[str, Any] = {
                "metadata": {
                    **definition.options.metadata,
                    "enqueued_by": f"admin:{request.user.get_username()}",
                }
            }
            for option in ("queue", "priority", "delay"):
                if data[option] not in (None, ""):
                    options[option] = data[option]
            try:
                _check_signature(definition, data["args"], data["kwargs"])
                new_id = definition.using(**options).enqueue(*data["args"], **data["kwargs"])
            except InvalidTaskError as exc:
                form.add_error(None, str(exc))
            else:
                database = database_for(options.get("queue") or definition.queue)
                task = Task.objects.using(database).filter(pk=new_id).first()
                if task is not None:
                    LogEntry.objects.log_actions(
                        request.user.pk, [task], ADDITION, "Enqueued from the admin."
                    )
                messages.success(request, f"Enqueued {definition.name} as task #{new_id}.")
                change_url = _url(model_admin, "task_change", new_id)
                return HttpResponseRedirect(with_database(change_url, database))
    else:
        form = EnqueueForm()
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Enqueue a task",
        "opts": model_admin.model._meta,
        "form": form,
        "changelist_url": changelist_url,
    }
    return TemplateResponse(request, "admin/django_pgqueue/task/enqueue_form.html", context)
