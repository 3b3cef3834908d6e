"""The reference pages name every item the code has, read from the code itself: a new
check id, command flag, metric, permission or public name fails here until its page
says what it is; a page that names one the code no longer has fails too."""

from __future__ import annotations

import re

from tests.conftest import REPO

DOCS = REPO / "docs"
PACKAGE = REPO / "django_pgqueue"


def page(name: str) -> str:
    return (DOCS / name).read_text()


def table_rows(text: str, first_column: str) -> dict[str, list[str]]:
    """{first cell without backticks: cells} of the Markdown tables of ``text`` whose
    header's first cell is ``first_column``."""
    rows: dict[str, list[str]] = {}
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if header is None:
            header = cells
        elif header[0] == first_column and set(cells) != {"---"}:
            rows[cells[0].strip("`")] = cells
    return rows


# -- system checks (docs/checks.md) ---------------------------------------------------


def check_ids_in_source() -> set[str]:
    """Every check id the package's source gives a message, whatever module it is in."""
    ids: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        ids |= set(re.findall(r"django_pgqueue\.[EW]\d{3}\b", path.read_text()))
    return ids


def test_every_check_id_of_the_source_is_in_the_checks_reference_and_no_other():
    documented = {i for i in table_rows(page("checks.md"), "id") if i.startswith("django_")}
    source = check_ids_in_source()

    assert {"django_pgqueue.W101", "django_pgqueue.E101", "django_pgqueue.W001"} <= source
    assert sorted(source - documented) == [], "in the source, not in docs/checks.md"
    assert sorted(documented - source) == [], "in docs/checks.md, not in the source"


def test_each_check_is_documented_at_its_level():
    for check_id, cells in table_rows(page("checks.md"), "id").items():
        level = {"E": "error", "W": "warning"}[check_id.rsplit(".", 1)[1][0]]
        assert cells[1] == level, check_id
