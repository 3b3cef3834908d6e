"""What the explanation pages and the guides say about the code stays true to it.

- docs/decisions.md numbers its decisions 1..N, each with the anchor ``decision-N``, and
  a link that names a decision (``[decision 34](decisions.md#decision-34)``) points at
  that decision;
- the intervals at which a worker reads the schedules (docs/periodic.md) are the
  scheduler's.
"""

from __future__ import annotations

import re
from pathlib import Path

from django_pgqueue.worker import scheduler

DOCS = Path(__file__).resolve().parent.parent / "docs"

HEADING = re.compile(r"^### (\d+)\. .+ \{#decision-(\d+)\}$", re.M)
NAMED_LINK = re.compile(r"\[decision (\d+)\]\((?:decisions\.md)?#decision-(\d+)\)")


def test_each_decision_has_its_number_as_its_anchor_and_none_is_missing():
    numbers = [
        (int(number), int(anchor))
        for number, anchor in HEADING.findall((DOCS / "decisions.md").read_text())
    ]
    assert numbers, "docs/decisions.md has no '### N. ... {#decision-N}' headings"
    assert all(number == anchor for number, anchor in numbers), numbers
    assert [number for number, _ in numbers] == list(range(1, len(numbers) + 1))


def test_a_link_that_names_a_decision_points_at_it():
    wrong = [
        (page.name, match.group(0))
        for page in sorted(DOCS.glob("*.md"))
        for match in NAMED_LINK.finditer(page.read_text())
        if match.group(1) != match.group(2)
    ]
    assert not wrong, f"links that name one decision and point at another: {wrong}"


def test_the_schedule_read_intervals_in_the_docs_are_the_schedulers():
    text = " ".join((DOCS / "periodic.md").read_text().split())
    assert f"every {scheduler.REFRESH_NOTIFIED:g} seconds, in case a notification was lost" in text
    assert f"`POLL_INTERVAL`, at most every {scheduler.REFRESH:g} seconds" in text
