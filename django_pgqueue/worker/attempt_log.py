"""One attempt's log: the records its handler emitted, reduced to what is stored, the
newest kept within the limits (task_logs.py says when records reach it and where it
goes)."""

from __future__ import annotations

import logging
import threading
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any

# One record's text: a message keeps its first MESSAGE_BYTES, a traceback its last
# EXCEPTION_BYTES, a logger's name its first LOGGER_BYTES (UTF-8). TASK_LOG_BYTES is at
# least 16 KiB (conf.SETTINGS): the newest record always fits, whatever its size.
MESSAGE_BYTES = 4096
EXCEPTION_BYTES = 8192
LOGGER_BYTES = 1024

# What a record costs beside its text: its keys, its time and its level, as stored.
RECORD_OVERHEAD = 80


@dataclass(frozen=True)
class Limits:
    """TASK_LOG_RECORDS and TASK_LOG_BYTES (per attempt), TASK_LOG_TASK_BYTES (per
    task, applied by the settlement; None: no limit)."""

    records: int
    bytes: int
    task_bytes: int | None


class AttemptLog:
    """The records kept of one attempt so far: the newest, within the limits."""

    __slots__ = ("_bytes", "_dropped", "_limits", "_lock", "_records", "_taken")

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._lock = threading.Lock()
        self._records: deque[tuple[dict[str, Any], int]] = deque()
        self._bytes = 0
        self._dropped = 0
        self._taken: dict[str, Any] | None = None

    def add(self, record: logging.LogRecord) -> None:
        try:
            kept: tuple[dict[str, Any], int] | None = entry_of(record)
        except Exception:  # a record that cannot be read must not fail the logging call
            kept = None
        with self._lock:
            if self._taken is not None:
                return  # the attempt has ended: its log is settled, or on its way
            if kept is None:
                self._dropped += 1
                return
            entry, size = kept
            self._records.append((entry, size))
            self._bytes += size
            limits = self._limits
            while len(self._records) > limits.records or self._bytes > limits.bytes:
                _, dropped = self._records.popleft()
                self._bytes -= dropped
                self._dropped += 1

    def take(self) -> dict[str, Any] | None:
        """Close the log; what it kept, for the outcome (None: nothing was logged).
        Called again, returns the same."""
        with self._lock:
            if self._taken is None:
                self._taken = {
                    "records": [entry for entry, _ in self._records],
                    "dropped": self._dropped,
                    "bytes": self._bytes,
                    "task_bytes": self._limits.task_bytes,
                }
                self._records.clear()
            taken = self._taken
        return taken if taken["records"] or taken["dropped"] else None


def entry_of(record: logging.LogRecord) -> tuple[dict[str, Any], int]:
    """The stored form of a record, and its size in bytes (about its JSON's)."""
    try:
        message = record.getMessage()
    except Exception as exc:  # arguments that do not fit the format
        message = f"{record.msg!s} [its arguments did not format: {type(exc).__name__}: {exc}]"
    message, size = clean_text(message, MESSAGE_BYTES, keep_end=False)
    logger, logger_size = clean_text(record.name, LOGGER_BYTES, keep_end=False)
    entry: dict[str, Any] = {
        "time": round(record.created, 6),  # seconds since the epoch: no formatting here
        "level": record.levelname,
        "logger": logger,
        "message": message,
    }
    size += logger_size + RECORD_OVERHEAD
    if record.exc_info and record.exc_info[0] is not None:
        try:
            text = "".join(traceback.format_exception(*record.exc_info))
        except Exception as exc:
            text = f"[the exception could not be formatted: {type(exc).__name__}]"
        entry["exception"], exception_size = clean_text(text.rstrip("\n"), EXCEPTION_BYTES, True)
        size += exception_size
    elif record.exc_text:
        entry["exception"], exception_size = clean_text(record.exc_text, EXCEPTION_BYTES, True)
        size += exception_size
    return entry, size


def clean_text(text: str, limit: int, keep_end: bool) -> tuple[str, int]:
    """``text`` as jsonb stores it: NUL escaped, lone surrogates (bytes that were not
    UTF-8) backslash-escaped, at most ``limit`` bytes of UTF-8 with a note of the cut.
    Returns the text and its size in bytes."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "backslashreplace")
        text = data.decode("utf-8")
    if len(data) <= limit:
        return text, len(data)
    cut = len(data) - limit
    if keep_end:
        text = f"[{cut} bytes cut] " + data[cut:].decode("utf-8", "ignore")
    else:
        text = data[:limit].decode("utf-8", "ignore") + f" [{cut} bytes cut]"
    return text, limit + 24
