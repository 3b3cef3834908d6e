"""OpenTelemetry in the worker subprocesses of tests/test_tracing.py: the real SDK, set
up as a project would (a global TracerProvider in its settings), with an exporter that
appends each ended span to a file, one JSON object per line.

tests/settings.py calls ``init`` when ``SPANS_ENV`` names that file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

SPANS_ENV = "PGQUEUE_TEST_SPANS"


class FileExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(os.environ[SPANS_ENV], "a") as out:
            out.writelines(json.dumps(json.loads(span.to_json())) + "\n" for span in spans)
        return SpanExportResult.SUCCESS


def init() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(provider)


def read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]
