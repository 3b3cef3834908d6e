"""The named SQL statements, loaded once from every ``*.sql`` file of this folder: the
queue's own (the database contract), one file a concern (``enqueue.sql``,
``claim.sql``, ``settle.sql``, ...; ``contract.sql`` holds no statement, only the
context they share: indexes, states, wake-ups), and ``doctor.sql``, the queue doctor's
reads of PostgreSQL's catalogs.

``QUERIES["claim"]`` is the text of the statement headed ``-- name: claim``, wherever
it is. Every place the code names a statement, and the dict of parameters it passes, is
checked against these files by tests/test_statements.py.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _load(path: Path) -> dict[str, str]:
    text = path.read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


def _load_all(paths: Iterable[Path]) -> dict[str, str]:
    queries: dict[str, str] = {}
    defined_in: dict[str, str] = {}
    for path in paths:
        loaded = _load(path)
        if twice := sorted(loaded.keys() & queries.keys()):
            where = ", ".join(f"{name} (first in {defined_in[name]})" for name in twice)
            raise ValueError(f"{path.name}: statements named again: {where}")
        queries.update(loaded)
        defined_in.update(dict.fromkeys(loaded, path.name))
    return queries


# Sorted, so that the order of QUERIES does not depend on the file system's.
QUERIES: dict[str, str] = _load_all(sorted(Path(__file__).parent.glob("*.sql")))


@dataclass(frozen=True)
class Positional:
    """A statement of QUERIES with PostgreSQL's own placeholders ($1, $2, ...) and the
    names of its parameters in their order, for psycopg's ``RawCursor``.

    psycopg turns a statement's ``%(name)s`` placeholders into ``$n`` on every
    execution, and remembers the conversion only for statements of up to 4 KB; the
    claim is three times that, so each claim would scan it again (some 50 us of the
    worker's CPU per claim, on the path of every idle worker's wake-up). The worker's
    hot statements are converted once, here, instead. A name used twice is one
    parameter, as psycopg makes it."""

    text: str
    names: tuple[str, ...]

    def params(self, values: Mapping[str, Any]) -> list[Any]:
        return [values[name] for name in self.names]


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%|%")


@functools.cache
def positional(name: str) -> Positional:
    names: list[str] = []

    def convert(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        if match.group(1) is None:
            raise ValueError(f"statement {name!r}: a % that is no placeholder (write %%)")
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return Positional(_PLACEHOLDER.sub(convert, QUERIES[name]), tuple(names))


def execute(
    conn: psycopg.Connection, name: str, params: Mapping[str, Any], row_factory: Any = None
) -> psycopg.Cursor[Any]:
    """Run the statement ``name`` with ``params`` (a mapping, as for ``%(name)s``) on a
    ``RawCursor`` of ``conn``, converted once (``positional``): for the statements a
    worker runs for every batch of tasks."""
    statement = positional(name)
    cursor = psycopg.RawCursor(conn, row_factory=row_factory or conn.row_factory)
    return cursor.execute(statement.text, statement.params(params))
