"""The record of releases (tests/releases.py) against the repository: each release's
commit declares its version, its migrations are still today's first ones unchanged,
the changelog has its section, and the version in the repository is newer.

tests/test_upgrade.py builds the previous release from that record; these checks keep
the record honest without building anything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

import django_pgqueue
from tests.releases import (
    RELEASES,
    REPO,
    migration_names_at,
    rolling_upgrade_sources,
    version_at,
)
from tests.test_migrations import migration_names


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)


def require_commit(commit: str) -> None:
    if git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout")
    if git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        pytest.skip(f"commit {commit} is not in this clone (shallow?)")


def test_the_releases_a_rolling_deploy_starts_from():
    releases = dict.fromkeys(["0.1.0", "0.1.1", "0.2.0", "0.2.1", "0.3.0"], "")

    # The newest of the previous minor series, and the previous patch of the same one
    assert rolling_upgrade_sources("0.3.0.dev0", releases) == ["0.2.1"]
    assert rolling_upgrade_sources("0.3.1", releases) == ["0.2.1", "0.3.0"]
    assert rolling_upgrade_sources("0.2.1", releases) == ["0.1.1", "0.2.0"]
    assert rolling_upgrade_sources("1.0.0rc1", releases) == ["0.3.0"]
    assert rolling_upgrade_sources("0.1.0", releases) == []


def test_todays_version_is_newer_than_every_release_and_has_one_to_upgrade_from():
    version = Version(django_pgqueue.__version__)

    assert all(version > Version(released) for released in RELEASES)
    assert rolling_upgrade_sources(django_pgqueue.__version__), (
        "tests/test_upgrade.py would have no previous release to run"
    )


def test_the_changelog_has_a_section_per_release_under_unreleased():
    headings = re.findall(r"^## (.+)$", (REPO / "CHANGELOG.md").read_text(), re.MULTILINE)

    assert headings[0] == "Unreleased"
    released = [Version(h) for h in headings[1:]]
    assert released == sorted(released, reverse=True), "newest release first"
    assert {str(v) for v in released} == set(RELEASES)


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_a_releases_commit_declares_its_version_and_its_tag_points_at_it(version):
    commit = RELEASES[version]
    require_commit(commit)

    assert version_at(commit) == version
    tag = git("rev-parse", "--verify", "--quiet", f"v{version}^{{commit}}")
    if tag.returncode == 0:  # a clone may not carry tags
        assert tag.stdout.strip() == commit


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_a_releases_migrations_are_todays_first_ones_forward_unchanged(version, db_url, tmp_path):
    """A released migration is never changed forward: a database that applied it must
    be in the schema today's code expects. It may gain a way back (a reverse it lacked,
    CONTRIBUTING.md): what ``sqlmigrate`` prints forward is the same for the released
    file and today's."""
    commit = RELEASES[version]
    require_commit(commit)
    released = migration_names_at(commit)

    assert migration_names()[: len(released)] == released
    changed = git("diff", "--name-only", commit, "--", *(
        f"django_pgqueue/migrations/{name}.py" for name in released))
    assert changed.returncode == 0, changed.stderr
    for path in changed.stdout.split():
        name = Path(path).stem
        old = tmp_path / name
        shutil.copytree(REPO / "django_pgqueue", old / "django_pgqueue")
        (old / path).write_text(git("show", f"{commit}:{path}").stdout)

        assert forward_sql(name, old, db_url) == forward_sql(name, REPO, db_url), (
            f"{path} was edited forward since {version}"
        )


def forward_sql(migration: str, package_root: Path, db_url: str) -> list[str]:
    """The statements ``sqlmigrate`` prints for ``migration`` forward, with the
    django_pgqueue package found in ``package_root``: comments, blank lines and
    trailing semicolons left out."""
    done = subprocess.run(
        [sys.executable, "-c", (
            "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; import django; "
            "django.setup(); from django.core.management import call_command; "
            "call_command('sqlmigrate', 'django_pgqueue', sys.argv[3])"
        ), str(package_root), str(REPO), migration],
        capture_output=True, text=True, cwd=package_root,
        env={**os.environ, "DATABASE_URL": db_url, "DJANGO_SETTINGS_MODULE": "tests.settings"},
    )
    assert done.returncode == 0, done.stderr
    lines = (line.strip().rstrip(";") for line in done.stdout.splitlines())
    return [line for line in lines if line and not line.startswith("--")]
