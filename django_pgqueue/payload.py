"""JSON payloads: what may go into args, kwargs, results and checkpoints.

Only JSON, never pickle: a row must not be able to make a worker run code. The check
is stricter than ``json.dumps``: it refuses what PostgreSQL's jsonb would reject or
silently change, so the caller gets a clear error at enqueue instead of a surprise
later: NaN and infinities, NUL characters, non-string dict keys (json.dumps would turn
``{1: x}`` into ``{"1": x}``), and any type JSON has no word for.
"""

from __future__ import annotations

import json
import math
from typing import Any

from django_pgqueue.exceptions import InvalidTaskError

_MAX_DEPTH = 100


def check_json(value: Any, where: str) -> Any:
    """Return ``value`` with tuples turned into lists, or raise InvalidTaskError.

    ``where`` names the value in the error ("args[0]", "kwargs['when']", "result").
    """
    return _check(value, where, 0)


def _check(value: Any, path: str, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise InvalidTaskError(f"{path}: nested deeper than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidTaskError(
                f"{path}: {value!r} is not valid JSON (jsonb has no NaN or Infinity)"
            )
        return value
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidTaskError(
                f"{path}: strings must not contain NUL characters (\\u0000); "
                "PostgreSQL's jsonb cannot store them"
            )
        return value
    if isinstance(value, list | tuple):
        return [_check(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict):
        checked = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidTaskError(
                    f"{path}: dict key {key!r} is a {type(key).__name__}; JSON object keys "
                    "must be strings (convert it yourself so the round trip is explicit)"
                )
            checked[_check(key, f"{path} key", depth + 1)] = _check(
                item, f"{path}[{key!r}]", depth + 1
            )
        return checked
    raise InvalidTaskError(
        f"{path}: {type(value).__name__} {_short(value)} is not JSON serializable; pass "
        "plain JSON values (str, int, float, bool, None, list, dict), e.g. an id or an "
        "ISO-8601 string instead of a model instance or a datetime"
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def dumps(value: Any) -> str:
    """Serialise an already-checked value."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
