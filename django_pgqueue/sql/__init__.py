"""The named SQL statements of ``queries.sql``, loaded once.

``QUERIES["claim"]`` is the text of the statement headed ``-- name: claim``.
"""

from __future__ import annotations

import re
from pathlib import Path

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _load(path: Path) -> dict[str, str]:
    text = path.read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


QUERIES: dict[str, str] = _load(Path(__file__).with_name("queries.sql"))
