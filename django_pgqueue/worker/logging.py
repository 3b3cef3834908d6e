"""Logging for the worker process: every line says which execution it is about.

While a handler runs, ``current_lease`` holds its claimed task (its lease names the
execution: task id, attempt, lease token). ``ExecutionFilter`` copies it onto every log
record emitted meanwhile, from the worker or from the handler's own code, as
``record.pgqueue_execution`` (``-`` outside a task) and as the structured fields
``task_id``, ``task_name``, ``queue`` and ``attempt``. Add the filter to your own LOGGING
handlers to get them in your format::

    "filters": {"pgqueue": {"()": "django_pgqueue.worker.logging.ExecutionFilter"}},
    "handlers": {"console": {..., "filters": ["pgqueue"]}},
    # format: "%(asctime)s %(levelname)s [%(pgqueue_execution)s] %(message)s"

The worker's own records about a task carry those fields as ``extra`` (``task_fields``),
with ``outcome``, ``state``, ``duration``, ``worker`` and ``database`` where they apply.
``JsonFormatter`` writes a record as one JSON object per line (``--log-format json``).
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # LOGGING may load this module before the apps are ready
    from django_pgqueue.worker.claimed import ClaimedTask

current_lease: ContextVar[ClaimedTask | None] = ContextVar("pgqueue_current_lease", default=None)

TEXT_FORMAT = (
    "%(asctime)s %(levelname)s [%(processName)s %(threadName)s] "
    "[%(pgqueue_execution)s] %(message)s"
)
# What configure_logging was given and did, for the worker's own child processes.
_configured: dict[str, str | None] = {"level": None, "format": "text"}


def task_fields(task: ClaimedTask, **more: Any) -> dict[str, Any]:
    """The ``extra`` of a worker log record about ``task``: its id, name, queue and
    attempt, and ``more`` (outcome, state, duration, worker, database)."""
    return {
        "task_id": task.id,
        "task_name": task.task_name,
        "queue": task.queue,
        "attempt": task.attempt,
        **more,
    }


class ExecutionFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        task = current_lease.get()
        if task is None:
            record.pgqueue_execution = "-"
            return True
        record.pgqueue_execution = str(task.lease)
        if not hasattr(record, "task_id"):  # the worker's own records carry them already
            record.task_id = task.id
            record.task_name = task.task_name
            record.queue = task.queue
            record.attempt = task.attempt
        return True


# Attributes every LogRecord has: the rest of a record's attributes are its extra fields.
_RECORD_ATTRIBUTES = frozenset(
    [
        *vars(logging.LogRecord("", 0, "", 0, "", None, None)),
        "message",
        "asctime",
        "taskName",
        "pgqueue_execution",
    ]
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``timestamp`` (UTC, ISO 8601), ``level``,
    ``logger``, ``message``, ``process``, ``thread``, the record's extra fields (the task's
    fields on the worker's records), and ``exception`` (the formatted traceback) when the
    record carries one. Values JSON cannot hold are written as their ``str()``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.processName,
            "thread": record.threadName,
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str | None = None, fmt: str = "text") -> None:
    """Set the worker process's logging up, around the project's LOGGING.

    ``level`` (``--log-level``, when given) is the level of the ``django_pgqueue``
    loggers, over any the project set. Without it, a level the project set on
    ``django_pgqueue`` is left alone; if it set none, ``INFO``.

    If the project's LOGGING gives neither ``django_pgqueue`` nor the root logger a
    handler, one is added to the root logger (so the handlers' own records get the same
    treatment), writing to stderr in ``fmt``: ``text`` or ``json``. If it does, the
    project's handlers and formats stay (use ``JsonFormatter`` in LOGGING for JSON).
    """
    _configured["level"] = level
    pgqueue = logging.getLogger("django_pgqueue")
    if level is not None:
        pgqueue.setLevel(level.upper())
        for name, other in list(logging.root.manager.loggerDict.items()):
            if name.startswith("django_pgqueue.") and isinstance(other, logging.Logger):
                other.setLevel(logging.NOTSET)  # the flag decides for the whole tree
    elif pgqueue.level == logging.NOTSET:
        pgqueue.setLevel(logging.INFO)
    root = logging.getLogger()
    if pgqueue.handlers or root.handlers:
        if fmt == "json":
            logging.getLogger("django_pgqueue.worker").warning(
                "--log-format json (LOG_FORMAT) applies only when LOGGING configures no "
                "handler for django_pgqueue or the root logger; yours does, so its format "
                "is kept: use the formatter django_pgqueue.worker.logging.JsonFormatter "
                "in LOGGING"
            )
        _configured["format"] = "text"
        return
    _configured["format"] = fmt
    handler = logging.StreamHandler()
    handler.addFilter(ExecutionFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)


def configured_level() -> str | None:
    """The ``--log-level`` given to ``configure_logging`` in this process, if any: what
    the worker's own child processes are given."""
    return _configured["level"]


def configured_format() -> str:
    """The format of the handler ``configure_logging`` added in this process ("text" if
    it added none): what the worker's own child processes use."""
    return _configured["format"] or "text"
