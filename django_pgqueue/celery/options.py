"""Celery's task and call options, translated into this queue's (docs/celery.md has
the table): priorities, rate limits, time limits, countdown / eta / expires, routes,
serializers.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from django_pgqueue.celery.exceptions import Unsupported
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.options import PRIORITY_MAX, PRIORITY_MIN
from django_pgqueue.core.reprs import short_repr

# Celery's priorities: with Redis (and the other virtual transports) 0 is the highest
# of 0..9 and a task without one counts as 0; with RabbitMQ 0 is the lowest of
# 0..x-max-priority (255 at most) and a task without one counts as 0. Here a priority
# is -100..100, higher first, default 0 (docs/tasks.md).
REDIS, RABBITMQ = "redis", "rabbitmq"
PRIORITY_STYLES = (REDIS, RABBITMQ)
_RABBITMQ_SCHEMES = ("amqp", "amqps", "pyamqp", "librabbitmq")
REDIS_MAX = 9
RABBITMQ_MAX = 255
# RabbitMQ's priorities are usually 0..10 (x-max-priority 10): one step is 10 here.
RABBITMQ_STEP = 10


def priority_style(conf: Mapping[str, Any]) -> str:
    """How this project's Celery priorities read: CELERY_PGQUEUE_PRIORITY if set, else
    from the broker the project used (CELERY_BROKER_URL), else Redis's."""
    style = conf.get("pgqueue_priority")
    if style is not None:
        if style not in PRIORITY_STYLES:
            raise InvalidTaskError(
                f"CELERY_PGQUEUE_PRIORITY must be 'redis' (0 is the highest of 0..9) or "
                f"'rabbitmq' (0 is the lowest), not {short_repr(style)}"
            )
        return style
    broker = conf.get("broker_url") or ""
    scheme = broker.split("://", 1)[0].split("+")[0] if isinstance(broker, str) else ""
    return RABBITMQ if scheme in _RABBITMQ_SCHEMES else REDIS


def priority(value: Any, style: str) -> int | None:
    """A Celery priority as this queue's (None for None).

    Redis: 0 -> 0, 9 -> -100 (0 is Celery's highest, and a task without a priority is a
    0 there too). RabbitMQ: 0 -> 0, 10 -> 100 (x 10, at most 100).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidTaskError(
            f"priority {short_repr(value)} is not a Celery priority: an int from 0 "
            f"({'the highest' if style == REDIS else 'the lowest'}) to "
            f"{REDIS_MAX if style == REDIS else RABBITMQ_MAX}"
        )
    if style == REDIS:
        return -round(min(value, REDIS_MAX) * PRIORITY_MAX / REDIS_MAX)
    return max(PRIORITY_MIN, min(PRIORITY_MAX, min(value, RABBITMQ_MAX) * RABBITMQ_STEP))


_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:/\s*([smh]))?\s*")
_UNITS = {"s": 1, "m": 60, "h": 3600}


def rate_limit(value: Any) -> str | None:
    """Celery's rate_limit (``"10/m"``, ``"100/s"``, ``"5/h"``, or a number of tasks a
    second) as a key_rate string (``"10/m"``); None for no limit (None or 0)."""
    if value is None:
        return None
    text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    match = _RATE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidTaskError(
            f"rate_limit {short_repr(value)} is not a Celery rate: write '10/s', '10/m', "
            "'10/h' or a number of tasks a second"
        )
    count, unit = float(match[1]), match[2] or "s"
    if count == 0:
        return None
    if count == int(count):
        return f"{int(count)}/{unit}"
    # 0.5/s: one task every 2 s.
    return f"1/{_UNITS[unit] / count:g}s"


def time_limit(hard: Any, soft: Any) -> float | None:
    """The attempt's timeout from Celery's time limits: the hard one, else the soft one
    (this queue raises nothing at a soft limit), else None (the task's default)."""
    for name, value in (("time_limit", hard), ("soft_time_limit", soft)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
        ):
            raise InvalidTaskError(
                f"{name} must be a number of seconds > 0, not {short_repr(value)}"
            )
    limit = hard if hard is not None else soft
    return None if limit is None else float(limit)


def when(countdown: Any, eta: Any) -> dict[str, Any]:
    """``countdown`` (seconds) or ``eta`` (a datetime; a naive one is UTC, as Celery's
    enable_utc reads it) as using()'s ``delay`` or ``run_at``."""
    if countdown is not None and eta is not None:
        raise InvalidTaskError("pass either countdown or eta, not both")
    if countdown is not None:
        if isinstance(countdown, bool) or not isinstance(countdown, int | float):
            raise InvalidTaskError(f"countdown must be seconds, not {short_repr(countdown)}")
        # A negative countdown is due now (Celery runs it at once too).
        return {"delay": max(0.0, float(countdown))} if countdown > 0 else {}
    if eta is not None:
        if isinstance(eta, str):
            try:
                eta = datetime.fromisoformat(eta)
            except ValueError:
                raise InvalidTaskError(f"eta {short_repr(eta)} is not an ISO 8601 time") from None
        if not isinstance(eta, datetime):
            raise InvalidTaskError(f"eta must be a datetime, not {short_repr(eta)}")
        return {"run_at": eta.replace(tzinfo=UTC) if timezone.is_naive(eta) else eta}
    return {}


def expires(value: Any) -> float | datetime | None:
    """Celery's expires: seconds (a number or timedelta) after the call, or a datetime
    (naive: UTC)."""
    if value is None or isinstance(value, timedelta):
        return value.total_seconds() if value is not None else None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidTaskError(f"expires {short_repr(value)} is not an ISO 8601 time") from None
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if timezone.is_naive(value) else value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidTaskError(
            f"expires must be seconds, a timedelta or a datetime, not {short_repr(value)}"
        )
    return float(value)


JSON_SERIALIZERS = ("json", "application/json", None)


def check_serializer(value: Any, what: str) -> None:
    """Only JSON: a row must never be able to run code."""
    if value in JSON_SERIALIZERS:
        return
    if value in ("pickle", "application/x-python-serialize"):
        raise Unsupported(
            f"{what}={value!r} is refused: django_pgqueue stores arguments and results as "
            "JSON only (a row must never be able to run code). Pass JSON values (ids, "
            "strings, numbers; datetime, Decimal and UUID are encoded as Celery's json "
            f"serializer encodes them) and leave {what} out or set it to 'json'"
        )
    raise Unsupported(
        f"{what}={value!r} is refused: django_pgqueue stores arguments and results as "
        "JSON only; use 'json'"
    )


def route(
    routes: Any, name: str, args: Any, kwargs: Any, options: dict[str, Any], task: Any
) -> dict[str, Any]:
    """The first of Celery's task_routes that matches the task: a dict of name or glob
    -> {"queue": ...} (or a queue name), a list of such dicts and router functions
    ``(name, args, kwargs, options, task=None, **kw)``. Returns ``{"queue": ...}``
    and/or ``{"priority": ...}`` (Celery's), or {}."""
    if not routes:
        return {}
    for router in routes if isinstance(routes, list | tuple) else [routes]:
        if callable(router):
            found = router(name, args, kwargs, options, task=task)
        elif isinstance(router, Mapping):
            found = _match(router, name)
        else:
            raise InvalidTaskError(
                f"task_routes: {short_repr(router)} is not a dict of task name -> route, "
                "nor a router function"
            )
        if found:
            found = {"queue": found} if isinstance(found, str) else dict(found)
            return {k: found[k] for k in ("queue", "priority") if found.get(k) is not None}
    return {}


def _match(routes: Mapping[str, Any], name: str) -> Any:
    if name in routes:
        return routes[name]
    for pattern, found in routes.items():
        if isinstance(pattern, re.Pattern):
            if pattern.match(name):
                return found
        elif "*" in pattern and fnmatch.fnmatchcase(name, pattern):
            return found
    return None
