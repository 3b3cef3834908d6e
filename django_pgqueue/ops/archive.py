"""The archive of pruned tasks: gzip JSON Lines, one file per day and database.

With ``PRUNE_ARCHIVE_DIR`` (or ``pgqueue_prune --archive DIR``) retention writes every
row it is about to delete to ``DIR/pgqueue-<alias>-<YYYY-MM-DD>.jsonl.gz``, the day
being the one the task finished (UTC), one JSON object per line: the row as
PostgreSQL's ``to_jsonb`` gives it (every column, timestamps in ISO 8601). Read it
with ``zcat``, ``jq``, or ``pgqueue_requeue --from-archive FILE --id ID``.

Appending is safe with several writers (the pruners of a fleet sharing a directory):

- each batch is one gzip member, compressed in memory and appended with one ``write``
  under an exclusive ``flock`` of the file; a gzip file is the concatenation of its
  members, so ``zcat`` reads them all;
- the file is ``fsync``-ed (and, when the write created it, its directory) before the
  caller deletes a row (retention.py): a row is only ever deleted once its line is on
  disk. A write that fails is cut off the file again, and the caller deletes nothing;
- a member cut short by a crash (the process killed, the machine down mid-write, so
  its rows were not deleted either) is cut off by the next append, under the lock,
  before it writes: later members never follow a broken one. The cut is made only
  after a complete member, found by reading it back.

A row may be in the archive twice (its batch was written, then its transaction could
not commit): readers take the last one.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import json
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# How every member this module writes begins (gzip.compress(..., mtime=0): deflate, no
# flags, no mtime), so that a member's start can be looked for.
_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00"
# How far back from the end the last member is looked for: a batch's member is small
# as a rule, never larger than the last window (retention.ARCHIVE_BATCH_BYTES of rows,
# compressed, and a last row).
_WINDOWS = (1024 * 1024, 64 * 1024 * 1024)
# to_jsonb puts the shortest keys first: "id" leads every line.
_LEADING_ID = re.compile(rb'^\{"id": (\d+),')


class ArchiveError(OSError):
    """The archive could not be written or read: what, where, and what to do."""


class Archive:
    """The archive files of the tasks of one database (its alias) in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], database: str) -> None:
        self.directory = Path(directory)
        self.database = database

    def path(self, day: str) -> Path:
        return self.directory / f"pgqueue-{self.database}-{day}.jsonl.gz"

    def write(self, rows: Iterable[tuple[str, str]]) -> None:
        """Append each ``(day, line)`` to its day's file, on disk when this returns.
        Raises ArchiveError when a write fails (the files are left as they were)."""
        if not self.directory.is_dir():
            raise ArchiveError(
                f"the archive directory {self.directory} does not exist (or is not a "
                "directory): create it, or mount its volume; the rows of this batch were "
                "not deleted"
            )
        by_day: dict[str, list[str]] = {}
        for day, line in rows:
            by_day.setdefault(day, []).append(line)
        for day, lines in sorted(by_day.items()):
            data = ("\n".join(lines) + "\n").encode()
            member = gzip.compress(data, compresslevel=6, mtime=0)
            try:
                _append(self.path(day), member)
            except OSError as exc:
                raise ArchiveError(
                    f"could not write the archive {self.path(day)}: {exc}; the rows of this "
                    "batch were not deleted"
                ) from exc


def _append(path: Path, member: bytes) -> None:
    """Append one gzip member to ``path`` under an exclusive lock, durably."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = _cut_broken_tail(path, fd)
        try:
            view = memoryview(member)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)  # and the lock
    if size == 0:
        # A new file: its directory entry must be on disk too.
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def _cut_broken_tail(path: Path, fd: int) -> int:
    """The file's size once a member cut short at its end, if any, is cut off."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    with open(path, "rb") as file:
        for window in _WINDOWS:
            start = max(0, size - window)
            file.seek(start)
            tail = file.read()
            end = _last_whole_member_end(tail)
            if end is not None:
                break
    if end is None:
        raise ArchiveError(
            f"{path} does not end with a whole gzip member of django_pgqueue's archive "
            "(a foreign file, or damaged beyond its last batch): move it away; nothing "
            "was written to it"
        )
    if start + end < size:
        os.ftruncate(fd, start + end)
        os.fsync(fd)
    return start + end


def _last_whole_member_end(data: bytes) -> int | None:
    """Where in ``data`` the last whole member this module wrote ends: len(data) when
    the data ends with one, less when a member cut short follows it, None when no
    header in ``data`` starts a whole member. Candidates are tried from the last one
    back, so a header's bytes that happen to occur inside compressed data cost a try."""
    view = memoryview(data)
    position = len(data)
    while (position := data.rfind(_HEADER, 0, position)) >= 0:
        decompressor = zlib.decompressobj(wbits=31)
        try:
            decompressor.decompress(view[position:])
        except zlib.error:
            continue
        if decompressor.eof:
            return len(data) - len(decompressor.unused_data)
    return None


def read(path: str | os.PathLike[str]) -> Iterator[bytes]:
    """The lines of an archive file, in order. A member cut short at the end (a crash
    while archiving; its rows were not deleted) ends the lines without an error."""
    with gzip.open(path, "rb") as file:
        try:
            for line in file:
                if line.endswith(b"\n"):
                    yield line
        except (EOFError, zlib.error, gzip.BadGzipFile):
            return


def find(path: str | os.PathLike[str], ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """The archived rows of these task ids in ``path``, by id (the last line of each:
    a row archived twice was archived by a batch whose deletion did not commit)."""
    wanted = set(ids)
    found: dict[int, dict[str, Any]] = {}
    for line in read(path):
        match = _LEADING_ID.match(line)
        if match is not None and int(match[1]) not in wanted:
            continue
        row = json.loads(line)
        if row.get("id") in wanted:
            found[row["id"]] = row
    return found
