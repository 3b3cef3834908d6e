"""Per-task logs: the log records a handler emits during an attempt, kept with it.

With ``TASK_LOGS`` set to a level, each process that runs handlers (a worker process in
thread mode, each handler process in process mode) attaches one ``TaskLogHandler`` to
the root logger, once. A record that reaches it while a handler runs belongs to the
execution ``current_lease`` names (worker/logging.py; set around the handler's call, by
the slot in thread mode and in a handler process, by the coroutine itself for an
``async def`` handler), and goes into that attempt's ``AttemptLog`` (attempt_log.py);
any other record is ignored. A record from a thread the handler started is kept only
if that thread runs in a copy of the handler's context (``contextvars.copy_context().run``,
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
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from django_pgqueue.core.conf import get_settings
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.worker.attempt_log import AttemptLog, Limits
from django_pgqueue.worker.logging import current_lease

if TYPE_CHECKING:
    from django_pgqueue.worker.claimed import ClaimedTask
    from django_pgqueue.worker.outcomes import Outcome


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
