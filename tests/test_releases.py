"""The record of releases (tests/releases.py) against the repository: each release's
commit declares its version, its migrations are still today's first ones unchanged,
the changelog has its section, and the version in the repository is newer.

tests/test_upgrade.py builds the previous release from that record; these checks keep
the record honest without building anything.
"""

from __future__ import annotations

import re
import subprocess

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


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_a_releases_migrations_are_todays_first_ones_unchanged(version):
    commit = RELEASES[version]
    require_commit(commit)
    released = migration_names_at(commit)

    assert migration_names()[: len(released)] == released
    changed = git("diff", "--name-only", commit, "--", *(
        f"django_pgqueue/migrations/{name}.py" for name in released))
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout.split() == [], "a released migration was edited"
