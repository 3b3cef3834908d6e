"""Retention: terminal rows past their time to live are deleted in small batches, or
written to an archive first.

Succeeded and cancelled rows go after RESULT_TTL, dead letters (failed) after
DEAD_TTL; rows under a lease are never touched (terminal rows have none). The worker's
pruner (worker/pruner.py) and ``pgqueue_prune`` (operations.prune_expired) run the
same loops: ``prune``, one statement per batch, or, with an archive
(``PRUNE_ARCHIVE_DIR``, ``pgqueue_prune --archive``), ``prune_to_archive``: per batch,
one transaction that locks the rows, writes them to the archive (archive.py) durably,
and deletes only the rows written. A batch whose write fails deletes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from django_pgqueue.db.sql import QUERIES
from django_pgqueue.ops.archive import Archive

T = TypeVar("T")
# The most stored bytes of rows one archived batch reads (prune_archive_batch): a batch
# of PRUNE_BATCH large rows is cut, and the rest waits for the next batch.
ARCHIVE_BATCH_BYTES = 16 * 1024 * 1024


class Cursor(Protocol):
    """A DB-API cursor (psycopg's or Django's) that takes ``%(name)s`` parameters."""

    def execute(self, query: str, params: Any = ...) -> Any: ...

    def fetchall(self) -> list[Any]: ...


# Runs a function with a cursor inside one transaction, committed when it returns.
InTransaction = Callable[[Callable[[Cursor], T]], T]


def prune(
    fetchall: Callable[[str, dict[str, Any]], list[tuple]],
    result_ttl: float,
    dead_ttl: float,
    batch: int,
    max_batches: int = 1000,
) -> int:
    """Delete expired terminal rows batch by batch; returns how many were deleted."""
    total = 0
    for _ in range(max_batches):
        rows = fetchall("prune", {"result_ttl": result_ttl, "dead_ttl": dead_ttl, "batch": batch})
        total += len(rows)
        if len(rows) < batch:
            break
    return total


def prune_to_archive(
    in_transaction: InTransaction,
    archive: Archive,
    result_ttl: float,
    dead_ttl: float,
    batch: int,
    max_batches: int = 1000,
) -> int:
    """Archive, then delete, expired terminal rows batch by batch; returns how many were
    deleted. Raises what the archive's write raised (OSError), after the batches
    before it: the failed batch deleted nothing."""
    params = {
        "result_ttl": result_ttl,
        "dead_ttl": dead_ttl,
        "batch": batch,
        "max_bytes": ARCHIVE_BATCH_BYTES,
    }
    total = 0
    for _ in range(max_batches):
        deleted, more = in_transaction(lambda cursor: _archive_batch(cursor, archive, params))
        total += deleted
        if not more:
            break
    return total


def _archive_batch(cursor: Cursor, archive: Archive, params: dict[str, Any]) -> tuple[int, bool]:
    """One batch: lock and read, write to the archive (durably), delete what was
    written. Returns (rows deleted, whether more may be waiting)."""
    cursor.execute(QUERIES["prune_archive_batch"], params)
    rows = cursor.fetchall()
    if not rows:
        return 0, False
    archive.write([(day, body) for _id, day, body, _locked in rows])
    cursor.execute(QUERIES["prune_archived"], {"ids": [row[0] for row in rows]})
    deleted = len(cursor.fetchall())
    locked = rows[0][3]
    return deleted, locked > len(rows) or locked >= params["batch"]
