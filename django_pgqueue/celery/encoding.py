"""Celery's ``json`` serializer on top of the row's JSON: the values kombu's encoder
carries beyond plain JSON (datetime, date, time, Decimal, UUID, bytes, Django's lazy
strings) are written as kombu writes them, ``{"__type__": "datetime", "__value__":
"2026-05-01T12:00:00+00:00"}``, and read back as those types by the worker (a task's
arguments) and by ``AsyncResult`` (its result). Anything else that is not JSON is
refused at the call, as ``enqueue()`` refuses it. Never pickle.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from django.utils.functional import Promise

_ENCODERS: list[tuple[type, str, Callable[[Any], Any]]] = [
    # datetime before date: a datetime is a date too.
    (datetime, "datetime", datetime.isoformat),
    (date, "date", date.isoformat),
    (time, "time", time.isoformat),
    (Decimal, "decimal", str),
    (uuid.UUID, "uuid", lambda value: {"hex": value.hex}),
]
_DECODERS: dict[str, Callable[[Any], Any]] = {
    "datetime": datetime.fromisoformat,
    "date": lambda text: datetime.fromisoformat(text).date(),
    "time": time.fromisoformat,
    "decimal": Decimal,
    "uuid": lambda value: uuid.UUID(**value),
    "bytes": lambda text: text.encode("utf-8"),
    "base64": lambda text: base64.b64decode(text.encode("utf-8")),
}
_PLAIN = (str, int, float, bool, type(None))


def encode(value: Any) -> Any:
    """``value`` with kombu's extra types written as its markers; tuples as lists. Any
    other value is returned as it is, for the enqueue's check to refuse by its path."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, list | tuple):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    if isinstance(value, Promise):
        return str(value)
    for kind, marker, encoder in _ENCODERS:
        if isinstance(value, kind):
            return {"__type__": marker, "__value__": encoder(value)}
    if isinstance(value, bytes):
        try:
            return {"__type__": "bytes", "__value__": value.decode("utf-8")}
        except UnicodeDecodeError:
            return {"__type__": "base64", "__value__": base64.b64encode(value).decode()}
    return value


def decode(value: Any) -> Any:
    """The values ``encode`` wrote, back as their types; a marker of an unknown type is
    left as the dict it is."""
    if isinstance(value, list):
        return [decode(item) for item in value]
    if isinstance(value, dict):
        if value.keys() == {"__type__", "__value__"} and value["__type__"] in _DECODERS:
            try:
                return _DECODERS[value["__type__"]](value["__value__"])
            except (TypeError, ValueError):
                return value
        return {key: decode(item) for key, item in value.items()}
    return value
