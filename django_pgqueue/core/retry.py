"""Retry policy: exponential backoff, capped, with jitter, and which exceptions retry;
frozen on the row at enqueue (the ``retry_policy`` column), beside a call's own
``atomic`` choice."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from django_pgqueue.core.reprs import short_repr

# The longest delay, backoff or timeout the queue stores: 10 years. PostgreSQL's
# interval and timestamptz hold far more, but a bound keeps `now() + delay` inside
# them and turns a typo (1e300) into a clear error instead of a database one.
MAX_SECONDS = 10 * 365 * 24 * 3600.0


@dataclass(frozen=True)
class RetryPolicy:
    """``delay(n) = min(cap, base * factor ** (n - 1))``, then +/- ``jitter`` of itself.

    ``n`` is the attempt that just failed (1 for the first run).
    """

    base: float = 5.0
    factor: float = 2.0
    cap: float = 600.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        # Written as ranges so NaN (never in range), infinities and huge ints all fail.
        if not (0 <= self.base <= MAX_SECONDS and 0 <= self.cap <= MAX_SECONDS):
            raise ValueError(
                f"backoff base and cap must be seconds between 0 and {MAX_SECONDS:.0f} "
                f"(10 years), not base={short_repr(self.base)}, cap={short_repr(self.cap)}"
            )
        if not 1 <= self.factor < math.inf:
            raise ValueError(
                f"backoff factor must be a finite number >= 1, not {short_repr(self.factor)}"
            )
        if not 0 <= self.jitter <= 1:
            raise ValueError(
                f"backoff jitter must be between 0 and 1, not {short_repr(self.jitter)}"
            )

    @classmethod
    def from_value(cls, value: Any) -> RetryPolicy:
        """Accept a RetryPolicy, a dict of its fields, or a number (constant delay)."""
        if isinstance(value, RetryPolicy):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = _number(value, "backoff")
            return cls(base=seconds, factor=1.0, cap=seconds, jitter=0.0)
        if isinstance(value, dict):
            unknown = set(value) - {"base", "factor", "cap", "jitter"}
            if unknown:
                raise ValueError(
                    f"unknown backoff option(s) {sorted(unknown, key=repr)}; "
                    "valid: base, factor, cap, jitter"
                )
            return cls(**{k: _number(v, f"backoff {k}") for k, v in value.items()})
        raise TypeError(
            f"backoff must be a RetryPolicy, a dict or a number of seconds, not {value!r}"
        )

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        try:
            grown = self.base * self.factor ** max(attempt - 1, 0)
        except OverflowError:  # factor ** n outgrew a float: far past any cap
            grown = math.inf if self.base else 0.0
        raw = min(self.cap, grown)
        if not self.jitter:
            return raw
        spread = raw * self.jitter
        return max(0.0, raw + (rng or random).uniform(-spread, spread))


def _number(value: Any, name: str) -> float:
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} {short_repr(value)} is too large") from None


# Exception rules (``@task(retry_on=..., discard_on=...)``) are stored beside the backoff
# in the row's retry_policy, as lists of exception names (``module.qualname``). A worker
# compares them with the names of the raised exception's classes (its MRO): a row never
# makes a worker import anything.
RULE_KEYS = ("retry_on", "discard_on")
# A call's own ``using(atomic=...)`` is frozen there too (present only when the call
# chose; otherwise the task's @task(atomic=...) decides when it runs: worker/atomic.py).
ATOMIC_KEY = "atomic"
_NOT_BACKOFF = (*RULE_KEYS, ATOMIC_KEY)


def exception_name(cls: type[BaseException]) -> str:
    """``module.qualname``: how a rule names an exception class (and an error its type)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def exception_names(value: Any, option: str) -> tuple[str, ...]:
    """The names of an exception class or a tuple (or list) of them, in order, without
    repeats; ValueError for anything else."""
    classes = value if isinstance(value, tuple | list) else (value,)
    names: list[str] = []
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise ValueError(
                f"{option} must be an exception class or a tuple of them "
                f"(e.g. {option}=(ConnectionError, TimeoutError)), not {short_repr(value)}"
            )
        if exception_name(cls) not in names:
            names.append(exception_name(cls))
    return tuple(names)


def backoff_fields(stored: Any) -> Any:
    """A stored retry_policy without its exception rules (and atomic): what RetryPolicy
    reads."""
    if not isinstance(stored, Mapping):
        return stored  # RetryPolicy.from_value says what is wrong with it
    return {k: v for k, v in stored.items() if k not in _NOT_BACKOFF}


def exception_rule(
    stored: Any, exc_type: type[BaseException], *, timeout: bool = False
) -> str | None:
    """Which frozen rule fails an exception of ``exc_type`` at once, whatever attempts
    remain: ``"discard_on"`` (one of its classes is listed there; it wins over
    retry_on), ``"retry_on"`` (a retry_on list is stored and lists none of its classes);
    None: the attempt retries as usual. For a timeout (``timeout=True``, judged as a
    TimeoutError) only discard_on counts: a timed-out attempt is retried whether or not
    retry_on names TimeoutError."""
    if not isinstance(stored, Mapping):
        return None
    names = {exception_name(cls) for cls in exc_type.__mro__ if cls is not object}
    if names & _stored_names(stored.get("discard_on")):
        return "discard_on"
    retry_on = stored.get("retry_on")
    # A retry_on that is not a list (a row written by hand) restricts nothing.
    if not timeout and isinstance(retry_on, list) and not names & _stored_names(retry_on):
        return "retry_on"
    return None


def _stored_names(value: Any) -> frozenset[str]:
    """A stored list of names; anything else names nothing."""
    if not isinstance(value, list):
        return frozenset()
    return frozenset(v for v in value if isinstance(v, str))
