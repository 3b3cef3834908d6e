"""Fair share by key: the weights, from ``PGQUEUE["FAIR_WEIGHTS"]``, parsed once.

::

    PGQUEUE = {"FAIR_WEIGHTS": {"customer:42": 5, "customer:vip-*": 3}}

A key's weight is its entry's, or else the longest prefix entry (ending with ``*``)
that it starts with, or else 1. A key with weight w gets w times the slots of a key of
weight 1 while both have due work (docs/tenants.md). A weight set at runtime
(``operations.set_fair_weight``, table ``pgqueue_fair_weight``) wins over these for the
keys it matches; that lookup is SQL's (``enqueue_keyed`` in enqueue.sql, ``stage`` in
stage.sql).

How fair share works, in short: each due task of a fair task is given a place in its
key's flow, its virtual start time (``fair_tag``): one step of ``1 / weight`` after the
last due task of its key, and never before the head of its task's line. The claim
walks due tasks by priority, then by that time, so keys take turns in proportion to
their weights whatever their backlogs, without any state shared between claims.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django_pgqueue.core.conf import get_setting
from django_pgqueue.core.reprs import short_repr

# The weights a key may have (the same range as the pgqueue_fair_weight_range check).
WEIGHT_MIN_EXCLUSIVE, WEIGHT_MAX = 0.0, 1_000_000.0
KEY_MAX_LENGTH = 255  # the fair_key column; a pattern may add its "*"


def validate_weight(value: Any, where: str = "weight") -> float:
    """A weight: a number > 0 and at most 1,000,000; ValueError otherwise."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not WEIGHT_MIN_EXCLUSIVE < value <= WEIGHT_MAX
    ):
        raise ValueError(
            f"{where} must be a number > 0 and at most {WEIGHT_MAX:,.0f}, not {short_repr(value)}"
        )
    return float(value)


def validate_pattern(value: Any, where: str = "key") -> str:
    """A key, or a prefix of keys ending with ``*``: 1-255 characters before the ``*``."""
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a string (a key, or a prefix ending with '*'), "
                         f"not {short_repr(value)}")  # fmt: skip
    stem = value.removesuffix("*")
    if not 1 <= len(stem) <= KEY_MAX_LENGTH or "*" in stem or "\x00" in value:
        raise ValueError(
            f"{where} {short_repr(value)} is not a key or a prefix: use 1-{KEY_MAX_LENGTH} "
            "characters, with one '*' at the end for a prefix (e.g. 'customer:vip-*')"
        )
    return value


@dataclass(frozen=True)
class Weights:
    """FAIR_WEIGHTS, parsed: exact keys, and prefixes longest first."""

    exact: Mapping[str, float]
    prefixes: tuple[tuple[str, float], ...]

    def of(self, key: str) -> float:
        """The weight of ``key`` by these settings (1 when none matches)."""
        weight = self.exact.get(key)
        if weight is not None:
            return weight
        for prefix, weight in self.prefixes:
            if key.startswith(prefix):
                return weight
        return 1.0

    @property
    def patterns(self) -> list[str]:
        """Every entry as written (prefixes with their ``*``), for SQL (``stage``)."""
        return [*self.exact, *(f"{prefix}*" for prefix, _ in self.prefixes)]

    @property
    def values(self) -> list[float]:
        return [*self.exact.values(), *(weight for _, weight in self.prefixes)]


def parse_weights(value: Any) -> Weights:
    """FAIR_WEIGHTS -> Weights; ValueError naming the entry at fault."""
    if not isinstance(value, dict):
        raise ValueError(
            f"FAIR_WEIGHTS must be a dict of key (or 'prefix*') -> weight, not {short_repr(value)}"
        )
    exact: dict[str, float] = {}
    prefixes: list[tuple[str, float]] = []
    for pattern, weight in value.items():
        validate_pattern(pattern, "FAIR_WEIGHTS: a key")
        weight = validate_weight(weight, f"FAIR_WEIGHTS[{pattern!r}]")
        if pattern.endswith("*"):
            prefixes.append((pattern[:-1], weight))
        else:
            exact[pattern] = weight
    prefixes.sort(key=lambda entry: -len(entry[0]))
    return Weights(exact, tuple(prefixes))


@functools.lru_cache(maxsize=8)
def _parsed(items: tuple[tuple[str, Any], ...]) -> Weights:
    return parse_weights(dict(items))


def fair_weights() -> Weights:
    """The effective FAIR_WEIGHTS (checked by ``manage.py check``; raises if invalid).
    Read on every call, so that override_settings works; parsed once per value."""
    value = get_setting("FAIR_WEIGHTS")
    if not isinstance(value, dict):
        return parse_weights(value)  # raises, naming the setting
    try:
        return _parsed(tuple(value.items()))
    except TypeError:  # an unhashable weight: parse it unhashed (it raises)
        return parse_weights(value)

