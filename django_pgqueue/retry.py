"""Retry policy: exponential backoff, capped, with jitter; frozen on the row at enqueue."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any

from django_pgqueue.payload import short_repr

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
                    f"unknown backoff option(s) {sorted(unknown)}; valid: base, factor, cap, jitter"
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
