"""The admin on several databases (``PGQUEUE['DATABASES']``, docs/databases.md).

Task ids, worker rows and schedules are per database: task 42 on ``default`` and task
42 on ``queue2`` are two tasks. So every admin page of those rows is about one alias,
named by the ``db`` parameter of its URL: ``?db=queue2`` on a list (a filter, so that
Django keeps it in the list's links, its actions and, through ``_changelist_filters``,
the detail pages opened from it), or on a detail page. Without it, a page is about
DATABASE. Reads go to that alias's read database (``READ_DATABASE`` for DATABASE), and
every change is made on the alias itself.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, QueryDict

from django_pgqueue.core.conf import database_of, queue_databases, read_database

__all__ = ["DatabaseFilter", "database_of", "request_database", "with_database"]

PARAMETER = "db"


def request_database(request: HttpRequest) -> str:
    """The alias the page is about: ``?db=``, or the list's ``db`` kept in
    ``_changelist_filters``, if it names an alias with a task table; else DATABASE."""
    aliases = queue_databases()
    alias = request.GET.get(PARAMETER)
    if alias is None and "_changelist_filters" in request.GET:
        alias = QueryDict(request.GET["_changelist_filters"]).get(PARAMETER)
    return alias if alias in aliases else aliases[0]


def request_read_database(request: HttpRequest) -> str:
    """Where the page's reads go: the read database of ``request_database``."""
    return read_database(request_database(request))


def with_database(url: str, alias: str | None) -> str:
    """``url`` about the rows of ``alias``: with ``?db=alias`` unless it is DATABASE."""
    if alias is None or alias == queue_databases()[0]:
        return url
    return f"{url}{'&' if '?' in url else '?'}{urlencode({PARAMETER: alias})}"


class DatabaseFilter(admin.SimpleListFilter):
    """The sidebar's choice of database, shown when there are several. The queryset
    is already on the chosen alias (the admins' ``get_queryset``): this filter only
    names the parameter, so that the list keeps it in its links."""

    title = "database"
    parameter_name = PARAMETER

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin):
        aliases = queue_databases()
        return [(alias, alias) for alias in aliases] if len(aliases) > 1 else []

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset

    def choices(self, changelist):
        current = self.value() or queue_databases()[0]
        for alias, title in self.lookup_choices:
            yield {
                "selected": alias == current,
                "query_string": changelist.get_query_string({PARAMETER: alias}),
                "display": title,
            }
