"""JSON payloads: what may go into args, kwargs, results and checkpoints.

Only JSON, never pickle: a row must not be able to make a worker run code. The check
is stricter than ``json.dumps``: it refuses what PostgreSQL would reject or silently
change, so the caller gets a clear error before any SQL runs instead of a database
error (which, inside ``atomic()``, would also break the caller's transaction):

- NaN and infinities (jsonb has no word for them);
- strings with a NUL character or a lone surrogate (neither can be stored as UTF-8);
- ints of more than ``INT_DIGITS_MAX`` digits (Python refuses to print ints past
  ~4,300 digits, and such numbers are data, better stored as strings);
- non-string dict keys (json.dumps would turn ``{1: x}`` into ``{"1": x}``);
- anything JSON has no word for.

The common case (a few ints and strings) must stay cheap: enqueue checks every call.
So the path of a bad value ("args[0]['when']") is built only when one is found.

Sizes are bounded too (``check_size``): the arguments, metadata, result, checkpoint
and signal payload each have a limit in bytes of their JSON text (UTF-8), a setting
of conf.SETTINGS ("Limits on sizes" in docs/settings.md). The text measured is the
one that is written, so a value is encoded once.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from django_pgqueue.core.conf import get_setting
from django_pgqueue.core.exceptions import InvalidTaskError, PayloadTooLarge
from django_pgqueue.core.reprs import short_repr

_MAX_DEPTH = 100
INT_DIGITS_MAX = 1000
_INT_BOUND = 10**INT_DIGITS_MAX
_SEQUENCES = (list, tuple)


def check_json(value: Any, where: str) -> Any:
    """Return ``value`` with tuples turned into lists, or raise InvalidTaskError.

    ``where`` names the value in the error ("args", "kwargs", "result").
    """
    if type(value) in _SEQUENCES and _all_plain(value):  # the common case, first
        return list(value)
    try:
        return _check(value, 0)
    except _Refused as exc:
        path = where + "".join(reversed(exc.steps))
        raise InvalidTaskError(f"{path}: {exc.reason}") from None


def parse_json(text: str, where: str) -> Any:
    """A JSON value typed by a person (the admin's forms, a command's option), checked
    as ``check_json`` checks values; an empty text is null. Raises InvalidTaskError
    saying where the text stops being JSON."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidTaskError(
            f"{where} is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno} "
            '(a string needs double quotes: "yes"; an object: {"by": "ops"})'
        ) from None
    except RecursionError:
        raise InvalidTaskError(f"{where}: nested deeper than {_MAX_DEPTH} levels") from None
    except ValueError:  # a number past Python's int-from-text limit (4,300 digits)
        raise InvalidTaskError(
            f"{where}: a number is longer than {INT_DIGITS_MAX} digits; pass numbers that "
            "large as strings"
        ) from None
    return check_json(value, where)


def check_text(value: str, where: str) -> str:
    """Return ``value`` if PostgreSQL can store it as text, or raise InvalidTaskError."""
    problem = _text_problem(value)
    if problem is not None:
        raise InvalidTaskError(f"{where}: {problem}")
    return value


def check_stored_call(args: Any, kwargs: Any) -> str | None:
    """Why a stored row's ``args`` / ``kwargs`` cannot be spread into a call, or None.

    Enqueue always writes a JSON array and a JSON object; anything else was written by
    hand or by an old version. The worker fails such a row at once, without retry:
    running it again cannot help.
    """
    if not isinstance(args, list):
        return (
            f"the stored args are a JSON {_json_kind(args)}, not an array: this row was "
            "written by hand or by an old version; it cannot be run"
        )
    if not isinstance(kwargs, dict):
        return (
            f"the stored kwargs are a JSON {_json_kind(kwargs)}, not an object: this row "
            "was written by hand or by an old version; it cannot be run"
        )
    for key in kwargs:
        if not isinstance(key, str):
            return (
                f"the stored kwargs have the key {short_repr(key)}, which is not a string: "
                "this row cannot be run"
            )
    return None


class _Refused(Exception):
    """A bad value deep inside a payload; each level adds its step to the path on the
    way out, so a good payload never pays for formatting paths."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.steps: list[str] = []


def _check(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        problem = _text_problem(value)
        if problem is not None:
            raise _Refused(problem)
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if -_INT_BOUND < value < _INT_BOUND:
            return value
        raise _Refused(
            f"an int of {value.bit_length()} bits is longer than {INT_DIGITS_MAX} digits; "
            "pass numbers that large as strings"
        )
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Refused(f"{value!r} is not valid JSON (jsonb has no NaN or Infinity)")
        return value
    if depth >= _MAX_DEPTH:
        raise _Refused(f"nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, list | tuple):
        if _all_plain(value):
            return list(value)
        checked_items = []
        for index, item in enumerate(value):
            try:
                checked_items.append(_check(item, depth + 1))
            except _Refused as exc:
                exc.steps.append(f"[{index}]")
                raise
        return checked_items
    if isinstance(value, dict):
        checked = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Refused(
                    f"dict key {short_repr(key)} is a {type(key).__name__}; JSON object keys "
                    "must be strings (convert it yourself so the round trip is explicit)"
                )
            problem = _text_problem(key)
            if problem is not None:
                raise _Refused(f"dict key {short_repr(key)}: {problem}")
            try:
                checked[key] = _check(item, depth + 1)
            except _Refused as exc:
                exc.steps.append(f"[{key!r}]")
                raise
        return checked
    # "Unsupported type: <class ...>": the words of Django's normalize_json, which
    # Django's own tests and users' log searches look for.
    raise _Refused(
        f"Unsupported type: {type(value)}: {short_repr(value)} is not JSON serializable; pass "
        "plain JSON values (str, int, float, bool, None, list, dict), e.g. an id or an "
        "ISO-8601 string instead of a model instance or a datetime"
    )


def _all_plain(items: list[Any] | tuple[Any, ...]) -> bool:
    """True when every item is None, a bool, an int in range or ASCII text without NUL:
    the common case, checked without a call per item."""
    for item in items:
        kind = type(item)
        if kind is str:
            if not item.isascii() or "\x00" in item:
                return False
        elif kind is int:
            if not -_INT_BOUND < item < _INT_BOUND:
                return False
        elif item is not None and kind is not bool:
            return False
    return True


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "strings must not contain NUL characters (\\u0000); PostgreSQL cannot store them"
    if not text.isascii():  # isascii() is O(1); only non-ASCII text can hold a surrogate
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return (
                f"the string has a lone surrogate {text[exc.start]!r} at index {exc.start}, "
                "which is not valid UTF-8 and cannot be stored; decode the source bytes "
                "with a real encoding (not errors='surrogateescape')"
            )
    return None


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def dumps(value: Any) -> str:
    """Serialise an already-checked value."""
    return _encode(value)


# One encoder for every call: json.dumps with options builds a new one each time.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


class SizeLimit(NamedTuple):
    """A limit on the JSON of one kind of value: its setting, how the error names the
    value, and what the error advises."""

    setting: str
    what: str
    advice: str


ARGS_LIMIT = SizeLimit(
    "MAX_ARGS_BYTES",
    "the arguments (args and kwargs together)",
    "pass a reference to large data instead (a primary key, a file or object-storage "
    "path), or raise the limit; nothing was enqueued",
)
METADATA_LIMIT = SizeLimit(
    "MAX_METADATA_BYTES",
    "the metadata",
    "keep metadata to small labels and ids, or raise the limit; nothing was enqueued",
)
RESULT_LIMIT = SizeLimit(
    "MAX_RESULT_BYTES",
    "the task's result",
    "store a large result elsewhere (a model, a file, object storage) and return a "
    "reference to it, or raise the limit; the result was not stored",
)
CHECKPOINT_LIMIT = SizeLimit(
    "MAX_CHECKPOINT_BYTES",
    "the checkpoint",
    "keep a checkpoint to what resuming needs (an offset, a cursor, ids), or raise the "
    "limit; nothing was saved",
)
PROGRESS_LIMIT = CHECKPOINT_LIMIT._replace(what="the progress value")
SIGNAL_LIMIT = SizeLimit(
    "MAX_SIGNAL_BYTES",
    "the signal payload",
    "send a reference to large data instead, or raise the limit; nothing was sent",
)


def json_bytes(text: str) -> int:
    """The size of a JSON text as PostgreSQL receives it: its UTF-8 bytes."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def check_size(limit: SizeLimit, *texts: str, where: str = "") -> None:
    """Raise PayloadTooLarge when the JSON ``texts`` together take more bytes than
    ``PGQUEUE[limit.setting]`` allows (None: no limit). ``where`` prefixes the error
    (enqueue_many's "item 3: ")."""
    size, allowed = _measure(limit, texts)
    if size is not None and allowed is not None and size > allowed:
        raise PayloadTooLarge(
            f"{where}{limit.what}: {size:,} bytes as JSON, more than the limit of "
            f"{allowed:,} bytes (PGQUEUE['{limit.setting}']): {limit.advice}"
        )


def fits(limit: SizeLimit, *texts: str) -> bool:
    """Whether the JSON ``texts`` together are within ``PGQUEUE[limit.setting]``."""
    size, allowed = _measure(limit, texts)
    return size is None or allowed is None or size <= allowed


def _measure(limit: SizeLimit, texts: tuple[str, ...]) -> tuple[int | None, int | None]:
    """(bytes of ``texts``, the limit); the bytes are None when they are within it
    without counting (no limit, or few characters)."""
    allowed = get_setting(limit.setting)
    if allowed is None:
        return None, None
    if sum(len(text) for text in texts) <= allowed // 4:  # a character is <= 4 bytes
        return None, allowed
    return sum(json_bytes(text) for text in texts), allowed


def check_value_size(limit: SizeLimit, value: Any) -> None:
    """``check_size`` for a value ``check_json`` returned, not yet encoded (a result, a
    checkpoint at the worker). A number, a bool or None is never encoded for it: each
    limit is at least 1024 bytes, more than any of them takes (an int has at most
    ``INT_DIGITS_MAX`` digits)."""
    if value is None or type(value) in (bool, int, float):
        return
    check_size(limit, dumps(value))
