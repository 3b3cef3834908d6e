"""Sentry in the worker subprocesses of tests/test_logging.py: the real sentry-sdk, set
up as a project would (``sentry_sdk.init`` in its settings, default integrations, so
the logging integration turns ERROR records into events), with a transport that appends
each event to a file instead of sending it anywhere.

tests/settings.py calls ``init`` when ``SENTRY_EVENTS_ENV`` names that file; the worker
and, in process mode, each of its handler processes load the settings, so each has it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

SENTRY_EVENTS_ENV = "PGQUEUE_TEST_SENTRY_EVENTS"


class FileTransport(Transport):
    """Appends each event of an envelope to the file, one JSON object per line."""

    def capture_envelope(self, envelope: Envelope) -> None:
        events = [item.payload.json for item in envelope.items if item.type == "event"]
        if events:
            with open(os.environ[SENTRY_EVENTS_ENV], "a") as out:
                out.writelines(json.dumps(e, default=str) + "\n" for e in events)

    def flush(self, timeout: float, callback: Any = None) -> None:
        return None


def init() -> None:
    sentry_sdk.init(dsn="https://key@sentry.invalid/1", transport=FileTransport)


def read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]
