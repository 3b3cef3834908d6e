"""Every `pip install` line that installs this project names the distribution that
pyproject.toml builds (`[project] name`, the wheel .ci/package-check builds), and every
extra it asks for exists in `[project.optional-dependencies]`.

Read: README.md, CONTRIBUTING.md, every docs/*.md page, and the package's own messages
that tell a user what to install (django_pgqueue/**/*.py). A requirement names this
project when its name starts with "django-pgqueue" (`django-pgqueue-tasks[otel]`, in
any spelling), or when it is the checkout itself (`-e ".[dev]"`, `.`): then only its
extras are checked. Other packages (`pytest-django`, `"psycopg[pool]"`, the peer
`pgqueuer`) and paths to a built wheel are left alone.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
NAME = PYPROJECT["project"]["name"]
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])

SOURCES = sorted(
    [REPO / "README.md", REPO / "CONTRIBUTING.md", *(REPO / "docs").glob("*.md"),
     *(REPO / "django_pgqueue").rglob("*.py")]
)  # fmt: skip
# "pip install" and its arguments, up to the end of the command: a backtick (inline
# code), a shell operator, a comment, a closing parenthesis or quote of prose, or the
# line's end.
# Prose may break the line inside inline code, after "pip" or "install".
COMMAND = re.compile(r"pip\s+install\s+([^`\n&;#)]*)")
REQUIREMENT = re.compile(r"(?P<name>\.|[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[(?P<extras>[^\]]*)\])?")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def install_lines() -> list[tuple[str, str, str | None]]:
    """(where, requirement's name, its extras) for each requirement of this project."""
    found = []
    for path in SOURCES:
        text = path.read_text()
        for command in COMMAND.finditer(text):
            where = f"{path.relative_to(REPO)}:{text.count(chr(10), 0, command.start()) + 1}"
            try:
                words = shlex.split(command.group(1).strip().rstrip("'\"`.,:"))
            except ValueError:  # an unbalanced quote in prose: take the words as they are
                words = command.group(1).split()
            for word in words:
                match = REQUIREMENT.fullmatch(word.rstrip(",;:").strip("'\""))
                if word.startswith("-") or not match:
                    continue
                name = match.group("name")
                if name == "." or normalize(name).startswith("django-pgqueue"):
                    found.append((where, name, match.group("extras")))
    return found


LINES = install_lines()


def test_the_readme_and_the_quickstart_say_how_to_install_the_project():
    places = {where.split(":")[0] for where, name, _ in LINES if name != "."}
    assert {"README.md", "docs/quickstart.md"} <= places


@pytest.mark.parametrize(("where", "name", "extras"), LINES, ids=[line[0] for line in LINES])
def test_an_install_line_names_the_distribution_and_extras_pyproject_declares(
    where: str, name: str, extras: str | None
):
    if name != ".":
        assert normalize(name) == normalize(NAME), (
            f"{where}: `pip install {name}` installs another distribution than "
            f"pyproject.toml's name, {NAME!r}"
        )
    asked = {extra.strip() for extra in (extras or "").split(",") if extra.strip()}
    assert asked <= EXTRAS, (
        f"{where}: the extras {sorted(asked - EXTRAS)} are not in "
        f"[project.optional-dependencies] ({sorted(EXTRAS)})"
    )
