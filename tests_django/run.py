"""Run Django's own Tasks tests (its tests/tasks) against PgQueueBackend.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/pgqueue_django \\
        python tests_django/run.py [-v 2] [--failfast] [test labels]

Run it with Django 6 and this package installed (``pip install -e .``): ``tox -e
django-tasks`` does both. Django's test code is not part of this repository: the source
distribution of the installed Django version is downloaded with pip, once (kept in
``$DJANGO_TESTS_CACHE``, by default under the system's temporary directory), and its
tests/tasks package is extracted from it. tests_django/test_django_tasks.py says which of
Django's tests run as they are, which are adapted and which are skipped, and why.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("labels", nargs="*", default=["tests_django"])
    parser.add_argument("-v", "--verbosity", type=int, default=1)
    parser.add_argument("--failfast", action="store_true")
    options = parser.parse_args(argv)

    import django

    if django.VERSION < (6, 0):
        sys.exit(
            f"Django's Tasks tests need Django 6 (django.tasks); this interpreter has "
            f"Django {django.__version__}. Run them with tox -e django-tasks, or in a "
            "Python 3.12+ venv with pip install 'Django>=6.0,<6.1' -e ."
        )
    if not os.environ.get("DATABASE_URL"):
        sys.exit(
            "set DATABASE_URL to a PostgreSQL server, e.g. "
            "postgres://postgres@127.0.0.1:5432/pgqueue_django (the test database is "
            "created next to the one it names)"
        )
    sys.path[:0] = [str(django_tests(django.__version__)), str(REPO)]
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests_django.settings"
    django.setup()

    from django.test.runner import DiscoverRunner

    runner = DiscoverRunner(verbosity=options.verbosity, failfast=options.failfast)
    return 1 if runner.run_tests(options.labels) else 0


def django_tests(version: str) -> Path:
    """A directory holding the ``tasks`` package of Django ``version``'s tests."""
    cache = Path(
        os.environ.get("DJANGO_TESTS_CACHE")
        or Path(tempfile.gettempdir()) / "django-pgqueue-django-tests"
    )
    root = cache / version
    package = root / "tasks"
    if (package / "__init__.py").exists():
        return root
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                "--no-binary", ":all:", f"Django=={version}", "--dest", download,
            ],
            check=True,
        )  # fmt: skip
        sdists = list(Path(download).glob("*.tar.gz"))
        if len(sdists) != 1:
            sys.exit(f"pip download of Django=={version} gave {sdists}, not one sdist")
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=root))  # renamed into place once complete
        with tarfile.open(sdists[0]) as archive:
            for member in archive.getmembers():
                parts = Path(member.name).parts
                # django-X.Y.Z/tests/tasks/<file>: the package is flat.
                if member.isfile() and parts[1:3] == ("tests", "tasks") and len(parts) == 4:
                    source = archive.extractfile(member)
                    assert source is not None
                    (staging / parts[3]).write_bytes(source.read())
    if not (staging / "__init__.py").exists():
        sys.exit(f"Django {version}'s source distribution has no tests/tasks package")
    staging.replace(package)
    return root


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
