"""The shape of the documentation (mkdocs.yml's nav, docs/index.md, README.md).

- every page in the nav is linked from docs/index.md or README.md, and every docs/*.md
  page is in the nav (mkdocs.yml ``validation: omitted_files`` warns too; this says
  which page);
- the tutorial (docs/quickstart.md) is under 1,200 words, and no page of the nav's
  "How-to guides" section is over 3,000;
- no page reads like a diary of how its figures came about;
- the glossary defines the terms the pages link to, each under a heading whose slug
  is its anchor (the same on the site and on GitHub).

Words are counted as ``wc -w`` counts them: runs of characters between whitespace,
prose, code blocks and tables alike.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"

TUTORIAL_LIMIT = 1200
HOW_TO_LIMIT = 3000
# How-to pages let over HOW_TO_LIMIT while they are split into shorter guides (none
# today); a page in it that is no longer long fails the test below, so it is emptied.
KNOWN_LONG: set[str] = set()
# Phrases of a diary (how the figures came about), not of a page a user reads.
DIARY = ("load average", "re-judged", "reads as before", "what moved the figures")
# Pages let keep one while they are rewritten (none today). Same rule as KNOWN_LONG.
KNOWN_DIARY: set[str] = set()

NAV_ENTRY = re.compile(r"^(?P<indent> *)- (?:(?P<title>[^:]+):\s*)?(?P<page>[\w./-]+\.md)?\s*$")


def nav() -> list[tuple[str, str]]:
    """(section, page) for each page of mkdocs.yml's nav, in order; a top-level page is
    its own section (its title)."""
    text = (REPO / "mkdocs.yml").read_text()
    lines = text.split("\nnav:\n", 1)[1].splitlines()
    found, section = [], ""
    for line in lines:
        if line and not line.startswith(" "):
            break  # the next top-level key
        match = NAV_ENTRY.match(line)
        if not match:
            continue
        title, page = (match.group("title") or "").strip(), match.group("page")
        if len(match.group("indent")) <= 2:
            section = title
        if page:
            found.append((section, page))
    return found


NAV = nav()
PAGES = sorted(path.name for path in DOCS.glob("*.md"))


def words(page: str) -> int:
    return len((DOCS / page).read_text().split())


def how_to_pages() -> list[str]:
    return [page for section, page in NAV if section == "How-to guides"]


def test_the_nav_has_the_four_kinds_of_page_and_the_glossary():
    sections = list(dict.fromkeys(section for section, _ in NAV))
    assert sections == [
        "Home", "Tutorial", "How-to guides", "Reference", "Explanation", "Glossary"
    ]  # fmt: skip
    assert [page for section, page in NAV if section == "Tutorial"] == ["quickstart.md"]


@pytest.mark.parametrize("page", [page for _, page in NAV if page != "index.md"])
def test_every_page_in_the_nav_is_linked_from_the_index_or_the_readme(page: str):
    index = (DOCS / "index.md").read_text()
    readme = (REPO / "README.md").read_text()
    assert f"]({page})" in index or f"]({page}#" in index or f"/docs/{page})" in readme, (
        f"{page} is in mkdocs.yml's nav but neither docs/index.md nor README.md links it"
    )


@pytest.mark.parametrize("page", PAGES)
def test_every_page_is_in_the_nav(page: str):
    assert page in {p for _, p in NAV}, f"docs/{page} is not in mkdocs.yml's nav"


def test_the_tutorial_takes_five_minutes_to_read():
    assert words("quickstart.md") < TUTORIAL_LIMIT


@pytest.mark.parametrize("page", how_to_pages())
def test_a_how_to_guide_is_short(page: str):
    if page in KNOWN_LONG:
        assert words(page) > HOW_TO_LIMIT, f"{page} is short now: drop it from KNOWN_LONG"
    else:
        assert words(page) <= HOW_TO_LIMIT, (
            f"{page} has {words(page)} words, over {HOW_TO_LIMIT}: split it"
        )


def test_the_known_long_pages_are_how_to_guides():
    assert set(KNOWN_LONG) <= set(how_to_pages())


@pytest.mark.parametrize("page", PAGES)
def test_no_page_is_a_diary(page: str):
    text = " ".join((DOCS / page).read_text().lower().split())
    found = [phrase for phrase in DIARY if phrase in text]
    if page in KNOWN_DIARY:
        assert found, f"{page} has no diary phrase now: drop it from KNOWN_DIARY"
    else:
        assert not found, f"{page} reads like a diary: {found}"


# The anchors the pages link to (glossary.md#lease).
GLOSSARY_ANCHORS = [
    "lease", "lease-token", "fence", "settle", "attempt", "claim", "slot", "lane", "stager",
    "heartbeat", "sweep", "write-off", "park", "dead-letter", "revive", "unique-key",
    "snooze", "checkpoint", "waiting-task", "chord", "fair-share", "sequence",
    "batch-handler", "burst", "backlog", "drain", "workloads", "the-soak", "evalplanqual",
    "process-mode", "atomic-task", "doctor",
]  # fmt: skip


def slug(heading: str) -> str:
    """The anchor of a heading, as mkdocs's toc and GitHub make it for plain words."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def glossary_anchors() -> set[str]:
    headings = re.findall(r"^#{2,3} (.+)$", (DOCS / "glossary.md").read_text(), re.M)
    return {slug(heading) for heading in headings}


def test_the_glossary_defines_every_term_the_pages_link_to():
    assert set(GLOSSARY_ANCHORS) <= glossary_anchors()


def test_every_link_into_the_glossary_names_one_of_its_terms():
    defined = glossary_anchors()
    links = {
        (page, anchor)
        for page in PAGES
        for anchor in re.findall(r"glossary\.md#([\w-]+)", (DOCS / page).read_text())
    }
    unknown = sorted(link for link in links if link[1] not in defined)
    assert not unknown, f"links to terms the glossary does not define: {unknown}"
