"""The releases of django_pgqueue, and a previous release installed for a test.

``RELEASES`` records every release: its version and the commit it was built from (the
tag ``v<version>`` points at the same commit; a clone without tags still has the
commit). Cutting a release adds a line here (CONTRIBUTING.md).

``install_release()`` builds a release from that commit (``git archive``) into a venv of
its own, for tests/test_upgrade.py to run its worker and its enqueue code beside
today's. What is installed and what is shared:

- the package ``django_pgqueue`` is built and installed from the release's source, with
  pip, into the venv's own site-packages: it is the only ``django_pgqueue`` the venv can
  import;
- its dependencies (Django, psycopg, ...) are not downloaded again: a ``.pth`` file puts
  the test environment's site-packages after the venv's own, and the release's declared
  requirements are checked against the versions found there. A rolling deploy changes
  our package; which Django runs beside it is not what these tests vary;
- the release's project files (``manage.py`` and ``tests/``: its settings and its task
  modules) are copied to a directory without ``django_pgqueue/``, and its processes run
  there, as the previous deploy of an application would.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent

# version -> the commit the release was built from (git rev-parse v<version>^{commit}).
RELEASES: dict[str, str] = {
    "0.1.0": "7939eb7c49d51e07b05f7bd92045f1c76ee1fb79",
}


def rolling_upgrade_sources(current: str, releases: dict[str, str] = RELEASES) -> list[str]:
    """The releases whose processes may still run beside ``current`` during a rolling
    deploy (docs/upgrading.md): the newest release of the previous minor series, and the
    newest earlier release of ``current``'s own series (a patch upgrade). Oldest first."""
    now = Version(current)
    earlier = sorted((Version(v) for v in releases if Version(v) < now), reverse=True)
    sources = []
    previous_series = [v for v in earlier if v.release[:2] < now.release[:2]]
    if previous_series:
        newest = previous_series[0]
        sources.append(newest)
    same_series = [v for v in earlier if v.release[:2] == now.release[:2]]
    if same_series:
        sources.append(same_series[0])
    return [str(v) for v in sorted(sources)]


class ReleaseUnavailable(Exception):
    """The release's commit is not in this clone, and could not be fetched."""


def ensure_commit(commit: str) -> None:
    """Make sure the commit's objects are here: a shallow clone may lack them, and is
    then deepened from origin (the commit is on the main branch's history)."""
    if _git("cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0:
        return
    fetched = _git("fetch", "--quiet", "origin", commit, check=False)
    if fetched.returncode != 0 or _git(
        "cat-file", "-e", f"{commit}^{{commit}}", check=False
    ).returncode != 0:
        raise ReleaseUnavailable(
            f"commit {commit} is not in this clone and `git fetch origin {commit}` failed "
            f"({fetched.stderr.strip()}); fetch the history (git fetch --unshallow --tags)"
        )


def migration_names_at(commit: str) -> list[str]:
    """The names of django_pgqueue's migrations at ``commit``, sorted."""
    listing = _git("ls-tree", "--name-only", f"{commit}:django_pgqueue/migrations").stdout
    return sorted(
        name.removesuffix(".py")
        for name in listing.split()
        if name.endswith(".py") and name[:4].isdigit()
    )


def version_at(commit: str) -> str:
    """``__version__`` as the commit's django_pgqueue/__init__.py declares it."""
    source = _git("show", f"{commit}:django_pgqueue/__init__.py").stdout
    for line in source.splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise AssertionError(f"no __version__ in django_pgqueue/__init__.py at {commit}")


@dataclass(frozen=True)
class InstalledRelease:
    version: str
    commit: str
    python: Path  # the venv's interpreter
    project: Path  # the release's manage.py and tests/, without django_pgqueue/
    migrations: list[str]

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` for a process of this release: nothing of today's checkout on its path."""
        env = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        return {**env, "PYTHONPATH": str(self.project)}


def install_release(version: str, workdir: Path) -> InstalledRelease:
    """Build release ``version`` into a venv under ``workdir`` (see the module docstring)."""
    commit = RELEASES[version]
    ensure_commit(commit)
    source = workdir / "source"
    source.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4+
            tar.extractall(source, filter="data")
        else:
            tar.extractall(source)
    project = workdir / "project"
    project.mkdir()
    shutil.copy2(source / "manage.py", project / "manage.py")
    shutil.copytree(source / "tests", project / "tests")

    venv = workdir / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site_packages = Path(_run([str(python), "-c",
                               "import sysconfig; print(sysconfig.get_paths()['purelib'])"]))
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
          "--no-deps", str(source)])  # fmt: skip
    shared = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site_packages / "_pgqueue_shared_dependencies.pth").write_text(
        "".join(f"{path}\n" for path in sorted(shared))
    )

    release = InstalledRelease(version, commit, python, project, migration_names_at(commit))
    found = json.loads(_run([str(python), "-c", _CHECK_INSTALL], cwd=project,
                            env=release.env({"PATH": "/usr/bin:/bin"})))
    if found["version"] != version or not found["file"].startswith(str(venv)):
        raise AssertionError(f"the venv of release {version} imports {found}")
    if found["unmet"]:
        raise AssertionError(
            f"release {version} requires {found['unmet']}, which the test environment "
            "does not satisfy"
        )
    return release


# Run by the release's interpreter: which django_pgqueue it imports, and which of the
# release's requirements the shared site-packages do not satisfy.
_CHECK_INSTALL = """
import json
from importlib import metadata
from pathlib import Path
from packaging.requirements import Requirement
import django_pgqueue

# The installed distribution whose files hold the django_pgqueue imported here (releases
# up to 0.1.0 were built as django-pgqueue, later ones as django-pgqueue-tasks).
[distribution] = [
    dist for dist in metadata.distributions()
    if any(str(f) == "django_pgqueue/__init__.py"
           and Path(dist.locate_file(f)).resolve() == Path(django_pgqueue.__file__).resolve()
           for f in dist.files or [])
][:1]
unmet = []
for text in distribution.requires or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        have = None
    if have is None or not req.specifier.contains(have, prereleases=True):
        unmet.append(f"{text} (found {have})")
print(json.dumps({"version": django_pgqueue.__version__, "file": django_pgqueue.__file__,
                  "unmet": unmet}))
"""


def _git(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=check)


def _run(args: list[str], **kwargs) -> str:
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout.strip()
