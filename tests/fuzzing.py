"""What the property-based tests (tests/test_bad_input_*.py) share: the Hypothesis
profile, strategies of hostile values, and the model of the JSON round trip.

The profile is deterministic (``derandomize``: the same examples on every run, in CI
too) and keeps no database of examples in the repository. A failure Hypothesis once
found is pinned with ``@example`` beside its property.
"""

from __future__ import annotations

import math
import os
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

settings.register_profile(
    "pgqueue",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # pytest-django's db: one transaction
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
settings.load_profile("pgqueue")

# How many examples each property gets: its full count (the numbers in its @settings)
# when PGQUEUE_FUZZ=full, as .ci/run sets for its run against the machine's server, and
# a quarter of it (at least 10) otherwise, so the README's test command stays quick for
# a newcomer. derandomize makes the quarter the first examples of the full run.
FULL = os.environ.get("PGQUEUE_FUZZ") == "full"


def examples(count: int) -> int:
    """The max_examples for a property whose full run tries ``count``."""
    return count if FULL else max(10, count // 4)

INT_DIGITS_MAX = 1000  # django_pgqueue.core.payload
MAX_DEPTH = 100

# -- strategies ---------------------------------------------------------------------
# Text as hostile as Python allows: NUL, lone surrogates (category Cs), non-ASCII.
hostile_text = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=12),
    st.sampled_from(["", "\x00", "a\x00b", "\ud800", "caf\udce9", "é", "²", "٣", " ", "#1"]),
)
big_ints = st.one_of(
    st.integers(),
    st.sampled_from([2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**308, 10**400]),
    st.integers(min_value=10**INT_DIGITS_MAX - 3, max_value=10**INT_DIGITS_MAX + 3),
    st.integers(max_value=-(10**INT_DIGITS_MAX) + 3, min_value=-(10**INT_DIGITS_MAX) - 3),
)
any_floats = st.one_of(
    st.floats(),  # NaN and infinities included
    st.sampled_from([0.0, -0.0, 1e16, -1.5e16, 1e308, 5e-324, 1e-7, 2.0**63]),
)
not_json = st.one_of(
    st.binary(max_size=4),
    st.sets(st.integers(), max_size=2),
    st.frozensets(st.text(max_size=2), max_size=2),
    st.datetimes(),
    st.dates(),
    st.decimals(allow_nan=True),
    st.complex_numbers(),
    st.just(object()),
    st.just(Exception),
)
scalars = st.one_of(st.none(), st.booleans(), big_ints, any_floats, hostile_text)
dict_keys = st.one_of(hostile_text, st.integers(), st.none(), st.tuples(st.integers()))

json_ish = st.recursive(
    st.one_of(scalars, not_json),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(hostile_text, inner, max_size=4),
        st.dictionaries(dict_keys, inner, max_size=3),
    ),
    max_leaves=12,
)


def nested(depth: int, leaf: Any = 1, as_dict: bool = False) -> Any:
    """``depth`` containers, one inside the other."""
    value = leaf
    for _ in range(depth):
        value = {"k": value} if as_dict else [value]
    return value


# -- the model: what enqueue promises --------------------------------------------------
class Refused(Exception):
    """The model's refusal: ``path`` names the first bad value ("args[0]['k']")."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def stored(value: Any, path: str, depth: int = 0) -> Any:
    """What a JSON value becomes once stored (jsonb) and read back, or Refused(path).

    The rule, as docs/tasks.md states it: JSON values round-trip, with tuples as
    lists, and numbers by value (PostgreSQL keeps a number's value, not its spelling):
    a float of magnitude 1e16 or more comes back as an int (the number its shortest
    text names: float() of it is the float sent), and
    -0.0 as 0.0. Refused: NaN and infinities, ints of more than 1,000 digits, text
    with NUL or a lone surrogate, dict keys that are not text, anything else that is
    not JSON, and containers nested 100 deep.
    """
    if isinstance(value, str):
        if "\x00" in value or _has_surrogate(value):
            raise Refused(path)
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) >= 10**INT_DIGITS_MAX:
            raise Refused(path)
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Refused(path)
        if abs(value) >= 1e16:
            return int(Decimal(repr(value)))  # the number its JSON text names
        return value + 0.0  # -0.0 -> 0.0
    if depth >= MAX_DEPTH:
        raise Refused(path)
    if isinstance(value, list | tuple):
        return [stored(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict):
        result = {}
        for key, item in value.items():
            if not isinstance(key, str) or "\x00" in key or _has_surrogate(key):
                raise Refused(path)
            result[key] = stored(item, f"{path}[{key!r}]", depth + 1)
        return result
    raise Refused(path)


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same JSON kinds all the way down (1 == 1.0 == True, but an int
    is not a float and a bool is neither)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


# -- moments ---------------------------------------------------------------------------
offsets = st.builds(
    lambda minutes: timezone(timedelta(minutes=minutes)),
    st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59),
)
moments = st.one_of(
    st.datetimes(),  # naive
    st.datetimes(timezones=st.just(UTC)),
    st.datetimes(timezones=offsets),
    st.sampled_from(
        [
            datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-23))),
            datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=23))),
            datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=16))),
        ]
    ),
)
