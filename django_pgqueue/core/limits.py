"""Fleet-wide limits: what ``PGQUEUE["QUEUE_LIMITS"]`` says, parsed once.

::

    PGQUEUE = {"QUEUE_LIMITS": {"emails": {"concurrency": 3, "rate": "100/m"}}}
    PGQUEUE = {"QUEUE_LIMITS": {"shopify": {"key_rate": "100/m"}}}

* ``concurrency``: at most N tasks of the queue running at once, across every worker.
* ``rate``: at most N starts per period (``"100/m"``, ``"10/s"``, ``"5/30s"``, ``"1000/h"``),
  across every worker, spread over the period rather than burst at its boundary.
* ``key_rate``: the same, per concurrency key, for every keyed task of the queue that
  declares no ``key_rate`` of its own.
* ``latency_objective``: seconds a task of the queue should wait at most from due to
  start. Not a limit: nothing enforces it; the queue doctor (doctor.py) reports the
  queue's waits against it.

Per-key concurrency and rate are declared on the task (``@task(concurrency_key=...,
key_concurrency=..., key_rate=...)``); see registry.py. The claim enforces all of
them (sql: claim, docs/limits.md).

The rate limit is a generic cell rate algorithm (GCRA) kept in ``pgqueue_queue.rate_tat``:
one start costs ``interval`` seconds of the queue's budget, and at most ``burst`` starts
may be taken at once after an idle spell. The interval is chosen so that no window of
one period ever holds more than N starts: with burst b, a sustained backlog gets
``N - b + 1`` starts per period, evenly spaced, and b at once after a pause. A key's
rate is the same algorithm, its state a row of ``pgqueue_key_rate`` per (queue, key).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from django_pgqueue.core.conf import get_setting
from django_pgqueue.core.options import validate_queue
from django_pgqueue.core.reprs import short_repr

_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*(s|sec|second|m|min|minute|h|hour|d|day)\s*")
_UNIT_SECONDS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60,
                 "h": 3600, "hour": 3600, "d": 86400, "day": 86400}  # fmt: skip
# The burst is this fraction of N (at least 1): enough for a busy worker's claims to
# take several starts each, small enough to keep starts spread over the period.
BURST_FRACTION = 0.05


@dataclass(frozen=True)
class Rate:
    """N starts per ``seconds``."""

    count: int
    seconds: float

    @property
    def burst(self) -> int:
        return max(1, int(self.count * BURST_FRACTION))

    @property
    def interval(self) -> float:
        """Seconds of budget one start costs (see the module doc)."""
        return self.seconds / (self.count - self.burst + 1)

    def __str__(self) -> str:
        return f"{self.count}/{self.seconds:g}s"

    @property
    def label(self) -> str:
        """As an operator would write it: ``100/m``, ``10/s``, ``5/30s``."""
        for unit, seconds in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
            if self.seconds == seconds:
                return f"{self.count}/{unit}"
        return f"{self.count}/{self.seconds:g}s"


@dataclass(frozen=True)
class QueueLimit:
    queue: str
    concurrency: int | None = None
    rate: Rate | None = None
    # The rate of each concurrency key of the queue, for keyed tasks without their own.
    key_rate: Rate | None = None
    # Seconds from due to start the queue's tasks should stay under (the doctor's).
    latency_objective: float | None = None


def parse_rate(value: Any) -> Rate:
    """``"100/m"`` -> Rate(100, 60.0); ValueError with what to write instead."""
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f"rate {short_repr(value)} is not a rate: write N/period, e.g. '100/m', '10/s', "
            "'5/30s', '1000/h' or '50000/d'"
        )
    count, multiple, unit = int(match[1]), float(match[2] or 1), match[3]
    seconds = multiple * _UNIT_SECONDS[unit]
    if count < 1 or seconds <= 0:
        raise ValueError(f"rate {value!r} must allow at least 1 start in a period longer than 0")
    return Rate(count, seconds)


def parse_limits(value: Any) -> dict[str, QueueLimit]:
    """QUEUE_LIMITS -> {queue: QueueLimit}; ValueError naming the entry at fault."""
    if not isinstance(value, dict):
        raise ValueError(f"QUEUE_LIMITS must be a dict of queue -> limits, not {short_repr(value)}")
    limits = {}
    for queue, entry in value.items():
        try:
            validate_queue(queue)
        except Exception as exc:
            raise ValueError(f"QUEUE_LIMITS: {exc}") from None
        if (
            not isinstance(entry, dict)
            or not entry
            or set(entry) - {"concurrency", "rate", "key_rate", "latency_objective"}
        ):
            raise ValueError(
                f"QUEUE_LIMITS[{queue!r}] must be a dict with 'concurrency' (an int >= 1), "
                "'rate' and/or 'key_rate' (e.g. '100/m'), and/or 'latency_objective' "
                f"(seconds), not {short_repr(entry)}"
            )
        concurrency = entry.get("concurrency")
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise ValueError(
                f"QUEUE_LIMITS[{queue!r}]['concurrency'] must be an int >= 1, "
                f"not {short_repr(concurrency)}"
            )
        try:
            rate = None if entry.get("rate") is None else parse_rate(entry["rate"])
            key_rate = None if entry.get("key_rate") is None else parse_rate(entry["key_rate"])
        except ValueError as exc:
            raise ValueError(f"QUEUE_LIMITS[{queue!r}]: {exc}") from None
        objective = entry.get("latency_objective")
        # Written as "not (in range)" so that NaN, which compares false, is refused.
        if objective is not None and (
            isinstance(objective, bool)
            or not isinstance(objective, int | float)
            or not 0 < objective < math.inf
        ):
            raise ValueError(
                f"QUEUE_LIMITS[{queue!r}]['latency_objective'] must be a number of seconds "
                f"greater than 0, not {short_repr(objective)}"
            )
        limits[queue] = QueueLimit(
            queue,
            concurrency,
            rate,
            key_rate,
            None if objective is None else float(objective),
        )
    return limits


def queue_limits() -> dict[str, QueueLimit]:
    """The effective QUEUE_LIMITS (checked by ``manage.py check``; raises if invalid)."""
    return parse_limits(get_setting("QUEUE_LIMITS"))
