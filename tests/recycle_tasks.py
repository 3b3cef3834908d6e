"""Tasks for tests/test_recycle.py: a handler that leaks memory, as real ones do."""

from __future__ import annotations

import os
import time

from django_pgqueue import task
from django_pgqueue.worker.recycle import resident_kib

# What the handler leaked: kept for the life of its process.
_KEPT: list[bytes] = []


@task(queue="recycle")
def leak(mebibytes: int = 0, sleep: float = 0.0) -> dict:
    """Keep ``mebibytes`` more of memory for good (written, so it is resident), and
    say which process ran it and how big that process is now."""
    if mebibytes:
        _KEPT.append(b"\x01" * (mebibytes * 1024 * 1024))
    if sleep:
        time.sleep(sleep)
    return {"pid": os.getpid(), "rss": resident_kib()}
