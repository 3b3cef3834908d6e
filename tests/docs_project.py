"""A newcomer's path: a project built by following the quickstart and the testing page
literally, step after step, and nothing else.

The pages' code blocks follow one convention (tests/test_docs_examples.py checks it):

- A ``python`` or ``ini`` block whose first line is ``# PATH`` (``# shop/tasks.py``,
  ``# mysite/settings.py``, ``# pytest.ini``; words may follow the path) is code to
  paste at the end of that file of the project.
- A ``python`` block whose first line is ``# python manage.py shell`` is typed into the
  project's shell.
- A ``sh`` block right after ``<!-- docs-example: run -->`` is run in the project's
  directory, in order; other ``sh`` blocks (a server that runs until stopped, this
  repository's own commands) are not.
- ``<!-- docs-example: optional -->`` before a block: an alternative the path does not
  take (the embedded database); ``<!-- docs-example: signature -->``: a function's
  signature, not code to run.

``build()`` applies every step of the pages in order, in an empty directory, with the
``python``, ``pip``, ``django-admin`` and ``pytest`` of one virtualenv first on PATH,
and fails at the first step that fails, naming its page and line. What it brings that
the pages leave to the reader: a PostgreSQL server (libpq's ``PG*`` environment
variables, as the quickstart's settings say) and an empty database. That database is
the run's own, so that runs in parallel do not share one: the settings' ``"NAME":
"shop"`` is the one thing of the pages it changes.

Run by .ci/newcomer-check with the virtualenv the wheel was installed into, and by
tests/test_docs_examples.py with this checkout's::

    python tests/docs_project.py DIRECTORY DATABASE_URL

Standard library only, but for psycopg (a dependency of django-pgqueue-tasks) to create the
database.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

REPO = Path(__file__).resolve().parent.parent
# The pages of the newcomer's path, in the order they are followed.
PATH_PAGES = ["docs/quickstart.md", "docs/testing.md"]
# The pages whose code blocks follow the convention.
PAGES = ["README.md", *PATH_PAGES]

MARKER = re.compile(r"<!--\s*docs-example:\s*(.*?)\s*-->")
MARKERS = {"run", "optional", "signature"}
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)
FILE_HEADING = re.compile(r"# ((?:[\w.-]+/)*[\w.-]+\.(?:py|ini))(?:\s.*)?")
SHELL_HEADING = "# python manage.py shell"
# What the quickstart's settings name the database, which a run replaces by its own.
DOCS_DATABASE_NAME = '"NAME": "shop"'
STEP_TIMEOUT = 600


@dataclass
class Block:
    page: str
    line: int
    language: str
    code: str
    marker: str | None

    @property
    def label(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def file(self) -> str | None:
        """The path the block is pasted into, from its first line."""
        match = FILE_HEADING.fullmatch(self.code.split("\n", 1)[0])
        return match.group(1) if match else None

    @property
    def is_shell(self) -> bool:
        return self.code.split("\n", 1)[0] == SHELL_HEADING


def blocks(page: str) -> list[Block]:
    """The fenced blocks of a page with a language, each with the docs-example comment
    right before it (if any)."""
    text = (REPO / page).read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.fullmatch(before.strip())
        found.append(
            Block(
                page=page,
                line=text.count("\n", 0, match.start()) + 1,
                language=match.group(1),
                code=match.group(2),
                marker=marker.group(1) if marker else None,
            )
        )
    return found


class StepFailed(Exception):
    pass


def build(project: Path, database_url: str, python: str = sys.executable) -> None:
    """Follow the pages in the empty directory ``project`` with the virtualenv of
    ``python``, on a new database of ``database_url``'s server named by its path."""
    project.mkdir(parents=True, exist_ok=True)
    if any(project.iterdir()):
        raise StepFailed(f"{project} is not empty")
    name = _create_database(database_url)
    env = _environment(database_url, python)
    renamed = 0
    for page in PATH_PAGES:
        for block in blocks(page):
            if block.marker in ("optional", "signature"):
                continue
            if block.language == "sh":
                if block.marker == "run":
                    _run(block, ["bash", "-euo", "pipefail", "-c", block.code], project, env)
            elif block.is_shell:
                _run(block, ["python", "manage.py", "shell", "-c", block.code], project, env)
            elif block.file is not None:
                renamed += _paste(block, project, name)
    if renamed != 1:
        raise StepFailed(
            f"the pages' settings name the database {DOCS_DATABASE_NAME} {renamed} times, "
            "not once: see this module's docstring"
        )


def _paste(block: Block, project: Path, database: str) -> int:
    """Append the block to its file (made if new, in a directory that must exist);
    returns how many times it named the docs' database."""
    path = project / block.file
    if not path.parent.is_dir():
        raise StepFailed(f"{block.label}: no step of the pages makes {path.parent.name}/")
    code = block.code.replace(DOCS_DATABASE_NAME, f'"NAME": "{database}"')
    existing = path.read_text() if path.exists() else ""
    path.write_text(existing + ("\n\n" if existing else "") + code)
    print(f"== {block.label}: pasted into {block.file}", flush=True)
    return block.code.count(DOCS_DATABASE_NAME)


def _run(block: Block, command: list[str], project: Path, env: dict[str, str]) -> None:
    print(f"== {block.label}: {block.code.strip()}", flush=True)
    done = subprocess.run(
        command, cwd=project, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT
    )
    print(done.stdout + done.stderr, end="", flush=True)
    if done.returncode != 0:
        raise StepFailed(f"{block.label}: the step failed (exit code {done.returncode})")


def _environment(database_url: str, python: str) -> dict[str, str]:
    """The environment of the steps: the virtualenv first on PATH, the server in libpq's
    variables, and nothing of this checkout or of the caller's Django."""
    url = urlsplit(database_url)
    socket_dir = parse_qs(url.query).get("host", [None])[0]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PG", "DJANGO_", "PYTHONPATH", "VIRTUAL_ENV"))
        and k not in ("DATABASE_URL",)
    }
    env["PATH"] = f"{Path(python).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PGHOST"] = socket_dir or url.hostname or "localhost"
    if url.port:
        env["PGPORT"] = str(url.port)
    if url.username:
        env["PGUSER"] = unquote(url.username)
    if url.password:
        env["PGPASSWORD"] = unquote(url.password)
    return env


def _create_database(database_url: str) -> str:
    """Drop and create the database ``database_url`` names; returns its name."""
    import psycopg

    url = urlsplit(database_url)
    name = unquote(url.path.lstrip("/"))
    with psycopg.connect(url._replace(path="/postgres").geturl(), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'DROP DATABASE IF EXISTS "test_{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_database(database_url: str) -> None:
    """Drop the database of a run (and the test database its tests left, if any)."""
    import psycopg

    url = urlsplit(database_url)
    name = unquote(url.path.lstrip("/"))
    with psycopg.connect(url._replace(path="/postgres").geturl(), autocommit=True) as admin:
        for doomed in (name, f"test_{name}"):
            admin.execute(f'DROP DATABASE IF EXISTS "{doomed}" WITH (FORCE)')


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} DIRECTORY DATABASE_URL")
    try:
        build(Path(sys.argv[1]), sys.argv[2])
    except StepFailed as exc:
        sys.exit(f"newcomer's path: {exc}")
    print("newcomer's path: every step of the quickstart and the testing page passed")
