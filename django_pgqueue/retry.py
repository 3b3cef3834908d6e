"""Retry policy: exponential backoff, capped, with jitter; frozen on the row at enqueue."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any


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
        if self.base < 0 or self.cap < 0:
            raise ValueError("backoff base and cap must be >= 0 seconds")
        if self.factor < 1:
            raise ValueError("backoff factor must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("backoff jitter must be between 0 and 1")

    @classmethod
    def from_value(cls, value: Any) -> RetryPolicy:
        """Accept a RetryPolicy, a dict of its fields, or a number (constant delay)."""
        if isinstance(value, RetryPolicy):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return cls(base=float(value), factor=1.0, cap=float(value), jitter=0.0)
        if isinstance(value, dict):
            unknown = set(value) - {"base", "factor", "cap", "jitter"}
            if unknown:
                raise ValueError(
                    f"unknown backoff option(s) {sorted(unknown)}; valid: base, factor, cap, jitter"
                )
            return cls(**{k: float(v) for k, v in value.items()})
        raise TypeError(
            f"backoff must be a RetryPolicy, a dict or a number of seconds, not {value!r}"
        )

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        raw = min(self.cap, self.base * self.factor ** max(attempt - 1, 0))
        if not self.jitter:
            return raw
        spread = raw * self.jitter
        return max(0.0, raw + (rng or random).uniform(-spread, spread))
