"""Per-task logs: the log records a handler emits during an attempt, kept with it.

With ``TASK_LOGS`` set to a level, each process that runs handlers (a worker process in
thread mode, each handler process in process mode) attaches one ``TaskLogHandler`` to
the root logger, once. A record that reaches it while a handler runs belongs to the
execution ``current_lease`` names (worker/logging.py; set around the handler's call, by
the slot in thread mode and in a handler process, by the coroutine itself for an
``async def`` handler), and goes into that attempt's ``AttemptLog``; any other record
is ignored. A record from a thread the handler started is kept only if that thread runs
in a copy of the handler's context (``contextvars.copy_context().run``,
``asyncio.to_thread``, asgiref's ``sync_to_async``); a plain ``threading.Thread`` or a
``ThreadPoolExecutor`` starts with an empty context, and its records are not kept.

A record is reduced to what is stored at once: time, level, logger, message, and the
exception's traceback when it carries one. Text is cut to ``MESSAGE_BYTES`` (its
beginning) and ``EXCEPTION_BYTES`` (its end, where the exception is), NUL written as
``\\x00`` and anything that is not UTF-8 as a backslash escape, so the row always
stores. An attempt keeps its newest ``TASK_LOG_RECORDS`` records within
``TASK_LOG_BYTES``: the older ones are dropped, and counted.

An attempt's log is made at its first record: an attempt that logs nothing (at
TASK_LOGS and above) costs nothing. When the attempt ends, ``take`` closes its log
(records that come later are ignored) and the outcome carries what it kept to the
settlement: ``store`` writes it to pgqueue_task_log in the settlement's transaction,
for the attempts whose settlement was written (sql: store_task_logs).
"""

from __future__ import annotations

import json
import logging
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django_pgqueue.conf import get_settings
from django_pgqueue.sql import QUERIES
from django_pgqueue.worker.logging import current_lease

if TYPE_CHECKING:
    from django_pgqueue.worker.claimed import ClaimedTask
    from django_pgqueue.worker.outcomes import Outcome

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
            kept: tuple[dict[str, Any], int] | None = _entry(record)
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


class TaskLogHandler(logging.Handler):
    """Routes each record at ``keep_level`` or above to the log of the attempt running
    in its context, if any.

    ``handle`` is overridden to take no lock of the handler's own: every slot logs
    through this one handler, and each attempt's log has its lock.

    Python writes a record that finds no handler at all to stderr (``logging.lastResort``,
    WARNING and above). This handler on the root logger counts as one, whatever its
    level: for such a record it calls ``lastResort`` itself, so that keeping task logs
    does not silence the warnings of a project whose LOGGING gives the root logger no
    handler. (So its own level stays NOTSET, and ``keep_level`` is TASK_LOGS.)"""

    def __init__(self, keep_level: int, limits: Limits) -> None:
        super().__init__()
        self.keep_level = keep_level
        self.limits = limits

    def handle(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.keep_level:
            task = current_lease.get()
            if task is not None:
                _log_of(task, self.limits).add(record)
        last_resort = logging.lastResort
        if last_resort is not None and record.levelno >= last_resort.level and self._alone(record):
            last_resort.handle(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)

    def _alone(self, record: logging.LogRecord) -> bool:
        """Whether this is the only handler on the record's way to the root logger."""
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(handler is not self for handler in logger.handlers):
                return False
            logger = logger.parent
        return True


_handler: TaskLogHandler | None = None


def install(level: str | None, records: int, max_bytes: int, task_bytes: int | None) -> None:
    """Keep the handlers' records in this process from now on, at ``level`` and above
    (``TASK_LOGS``; None: keep none). Attaches the handler to the root logger once."""
    global _handler
    if level is None:
        if _handler is not None:
            logging.getLogger().removeHandler(_handler)
            _handler = None
        return
    keep_level, limits = logging.getLevelName(level), Limits(records, max_bytes, task_bytes)
    if _handler is None:
        _handler = TaskLogHandler(keep_level, limits)
        logging.getLogger().addHandler(_handler)
    _handler.keep_level, _handler.limits = keep_level, limits


def install_from_settings() -> None:
    """``install`` with the TASK_LOGS settings."""
    conf = get_settings()
    install(conf.TASK_LOGS, conf.TASK_LOG_RECORDS, conf.TASK_LOG_BYTES, conf.TASK_LOG_TASK_BYTES)


# Taken to give an attempt its log, at its first record: once per attempt that logs.
_new_log = threading.Lock()


def _log_of(task: ClaimedTask, limits: Limits) -> AttemptLog:
    """The attempt's log, made at its first record (an attempt that logs nothing
    costs nothing)."""
    log = task.logs
    if log is None:
        with _new_log:
            log = task.logs
            if log is None:
                log = task.logs = AttemptLog(limits)
    return log


def take(task: ClaimedTask) -> dict[str, Any] | None:
    """The attempt's log, closed (records that come later are ignored): records,
    dropped, bytes and task_bytes for the outcome; None if it kept nothing."""
    if task.logs is None:
        return None
    return task.logs.take()


def _entry(record: logging.LogRecord) -> tuple[dict[str, Any], int]:
    """The stored form of a record, and its size in bytes (about its JSON's)."""
    try:
        message = record.getMessage()
    except Exception as exc:  # arguments that do not fit the format
        message = f"{record.msg!s} [its arguments did not format: {type(exc).__name__}: {exc}]"
    message, size = _clean(message, MESSAGE_BYTES, keep_end=False)
    logger, logger_size = _clean(record.name, LOGGER_BYTES, keep_end=False)
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
        entry["exception"], exception_size = _clean(text.rstrip("\n"), EXCEPTION_BYTES, True)
        size += exception_size
    elif record.exc_text:
        entry["exception"], exception_size = _clean(record.exc_text, EXCEPTION_BYTES, True)
        size += exception_size
    return entry, size


def _clean(text: str, limit: int, keep_end: bool) -> tuple[str, int]:
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


def store(execute: Callable[[str, dict[str, Any]], Any], logged: Iterable[Outcome]) -> None:
    """Store the records of the ``logged`` outcomes, with ``execute`` (a cursor's), in
    the transaction of their settlement, right after it: they commit with it, or
    neither does. The statement stores only those whose settlement it finds written
    (sql: store_task_logs)."""
    entries = [
        {"id": o.task.id, "attempt": o.task.attempt, "token": o.task.lease_token, **o.logs}
        for o in logged
        if o.logs is not None
    ]
    if entries:
        execute(QUERIES["store_task_logs"], {"logs": _encode(entries)})


_encode = json.JSONEncoder(separators=(",", ":")).encode
