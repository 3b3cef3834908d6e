"""Logging for the worker process: every line says which execution it is about.

While a handler runs, ``current_lease`` names its execution (task id, attempt, lease
token). ``ExecutionFilter`` copies it onto every log record emitted meanwhile, from the
worker or from the handler's own code, as ``record.pgqueue_execution`` (``-`` outside a
task). Add the filter to your own LOGGING handlers to get it in your format::

    "filters": {"pgqueue": {"()": "django_pgqueue.worker.logging.ExecutionFilter"}},
    "handlers": {"console": {..., "filters": ["pgqueue"]}},
    # format: "%(asctime)s %(levelname)s [%(pgqueue_execution)s] %(message)s"
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # LOGGING may load this module before the apps are ready
    from django_pgqueue.worker.claimed import Lease

current_lease: ContextVar[Lease | None] = ContextVar("pgqueue_current_lease", default=None)


class ExecutionFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        lease = current_lease.get()
        record.pgqueue_execution = "-" if lease is None else str(lease)
        return True


def configure_logging(level: str) -> None:
    logger = logging.getLogger("django_pgqueue")
    logger.setLevel(level.upper())
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.addFilter(ExecutionFilter())
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname)s [%(processName)s %(threadName)s] "
                "[%(pgqueue_execution)s] %(message)s"
            )
        )
        logger.addHandler(handler)
