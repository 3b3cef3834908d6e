"""Template tags and filters of the admin pages."""

from __future__ import annotations

import datetime
from typing import Any

from django import template
from django.utils import formats, timezone
from django.utils.text import capfirst

from django_pgqueue.ops.overview import HOLDS, WAIT_REASONS, humanize_seconds

register = template.Library()


@register.filter
def pgqueue_age(seconds: float | None) -> str:
    """Seconds as ``4m 10s``; ``-`` for None."""
    return humanize_seconds(seconds)


@register.filter
def pgqueue_holds(keys: list[str]) -> str:
    """What holds tasks back (keys of overview.HOLDS), in words."""
    return ", ".join(HOLDS[key] for key in keys)


@register.filter
def pgqueue_waiting_by(counts: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(reason, in words, count) for each wait reason with waiting tasks, from an
    overview row or a queue's totals (their ``waiting_<reason>`` counts)."""
    return [
        (reason, words, counts[f"waiting_{reason}"])
        for reason, words in WAIT_REASONS.items()
        if counts.get(f"waiting_{reason}")
    ]


@register.inclusion_tag("admin/date_hierarchy.html")
def pgqueue_date_hierarchy(cl: Any) -> dict[str, Any]:
    """The task list's date hierarchy (enqueued_at), drawn without reading the table.

    Django's own runs ``SELECT DISTINCT date_trunc(...)`` and ``min``/``max`` over every
    row the list shows: a scan of the whole history per page view. Here the range comes
    from the first and last rows by id (primary key; ids follow enqueue order) and the
    links cover every day, month or year in that range, even one without tasks.
    """
    field = cl.date_hierarchy
    params = {part: cl.params.get(f"{field}__{part}") for part in ("year", "month", "day")}
    year, month, day = (int(v) if v and str(v).isdigit() else None for v in params.values())

    def link(**lookups: int) -> str:
        return cl.get_query_string({f"{field}__{k}": v for k, v in lookups.items()}, [f"{field}__"])

    if year and month and day:
        date = datetime.date(year, month, day)
        return {
            "show": True,
            "back": {
                "link": link(year=year, month=month),
                "title": capfirst(formats.date_format(date, "YEAR_MONTH_FORMAT")),
            },
            "choices": [{"title": capfirst(formats.date_format(date, "MONTH_DAY_FORMAT"))}],
        }
    rows = cl.queryset
    window = next((s.window for s in cl.filter_specs if getattr(s, "window", None)), None)
    if window is not None:
        # A content search: the matches may be few, far apart or none, and finding the
        # first and last would read the window twice more. Its ids' dates, by the key.
        rows = cl.root_queryset.filter(pk__gte=window.low, pk__lt=window.below)
    first = rows.order_by("pk").values_list(field, flat=True).first()
    last = rows.order_by("-pk").values_list(field, flat=True).first()
    if first is None or last is None:
        return {"show": False}
    first, last = sorted((timezone.localdate(first), timezone.localdate(last)))
    if not year and first.year == last.year:
        year = first.year
        if first.month == last.month:
            month = first.month
    if year and month:
        days = _range(first, last, lambda d: d + datetime.timedelta(days=1))
        return {
            "show": True,
            "back": {"link": link(year=year), "title": str(year)},
            "choices": [
                {
                    "link": link(year=year, month=month, day=d.day),
                    "title": capfirst(formats.date_format(d, "MONTH_DAY_FORMAT")),
                }
                for d in days
                if (d.year, d.month) == (year, month)
            ],
        }
    if year:
        months = _range(first.replace(day=1), last.replace(day=1), _next_month)
        return {
            "show": True,
            "back": {"link": link(), "title": "All dates"},
            "choices": [
                {
                    "link": link(year=year, month=m.month),
                    "title": capfirst(formats.date_format(m, "YEAR_MONTH_FORMAT")),
                }
                for m in months
                if m.year == year
            ],
        }
    return {
        "show": True,
        "back": None,
        "choices": [
            {"link": link(year=y), "title": str(y)} for y in range(first.year, last.year + 1)
        ],
    }


def _next_month(d: datetime.date) -> datetime.date:
    return d.replace(year=d.year + d.month // 12, month=d.month % 12 + 1)


def _range(first: datetime.date, last: datetime.date, step) -> list[datetime.date]:
    values, current = [], first
    while current <= last and len(values) < 400:
        values.append(current)
        current = step(current)
    return values


SHORT_NAME_MAX = 28


def short_name(name: str, limit: int = SHORT_NAME_MAX) -> str:
    """A long dotted task name cut from the left at a dot, ``…tasks.sync_order``; the
    last part is always kept whole."""
    if len(name) <= limit or "." not in name:
        return name
    parts = name.split(".")
    kept = parts[-1]
    for part in reversed(parts[:-1]):
        if len(part) + 1 + len(kept) + 1 > limit:
            break
        kept = f"{part}.{kept}"
    return f"…{kept}"


@register.filter
def pgqueue_short_name(name: str) -> str:
    """``short_name`` for templates (the full name goes in a title)."""
    return short_name(name)
