"""Logging for the worker process when Django's LOGGING does not configure it."""

from __future__ import annotations

import logging


def configure_logging(level: str) -> None:
    logger = logging.getLogger("django_pgqueue")
    logger.setLevel(level.upper())
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname)s [%(processName)s %(threadName)s] %(message)s"
            )
        )
        logger.addHandler(handler)
