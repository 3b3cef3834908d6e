"""The package's layers and the absence of import cycles (docs/architecture.md): the
contracts in pyproject.toml's [tool.importlinter], checked by import-linter."""

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_import_goes_down_the_layers_and_no_modules_import_each_other_in_a_circle():
    # given the contracts of pyproject.toml, and import-linter (a dev dependency)
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    lint_imports = lint_imports or shutil.which("lint-imports")
    assert lint_imports, "lint-imports is not installed: pip install -e '.[dev]' installs it"
    # when it checks the imports of django_pgqueue and benchmarks
    result = subprocess.run(
        [lint_imports, "--no-cache", "--no-logo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # then every contract is kept (and no ignored import is left over from a fix)
    assert result.returncode == 0, result.stdout + result.stderr


# The documented import paths kept at the top of the package, and the module of a layer
# that holds each one's code (docs/architecture.md, "The public paths").
PUBLIC_PATHS = {
    "exceptions": "core.exceptions",
    "signals": "core.signals",
    "embedded": "core.embedded",
    "registry": "tasking.registry",
    "middleware": "tasking.middleware",
    "workflows": "tasking.workflows",
    "periodic": "tasking.periodic",
    "operations": "ops.operations",
    "metrics": "ops.metrics",
    "doctor": "ops.doctor",
}


@pytest.mark.parametrize(("public", "home"), sorted(PUBLIC_PATHS.items()))
def test_a_public_path_names_the_objects_of_the_module_that_holds_its_code(public, home):
    # given the public module and the module of its layer
    facade = importlib.import_module(f"django_pgqueue.{public}")
    module = importlib.import_module(f"django_pgqueue.{home}")
    # then each name of its __all__ is the object the layer's module defines, and its
    # docstring says where that is
    assert facade.__all__
    assert [n for n in facade.__all__ if getattr(facade, n) is not getattr(module, n)] == []
    assert f"django_pgqueue/{home.replace('.', '/')}" in facade.__doc__


def test_the_packages_periodic_stays_the_function_once_its_module_is_imported():
    # given a fresh interpreter, so the package is imported for the first time
    code = (
        "import django_pgqueue.periodic\n"
        "from django_pgqueue.periodic import run_now\n"
        "from django_pgqueue import periodic\n"
        "print(type(periodic).__name__, periodic.__module__)\n"
    )
    # when it imports the module django_pgqueue.periodic, then the name periodic
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    # then the name is the function the guides declare schedules with
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["function", "django_pgqueue.tasking.periodic"]


def test_the_exceptions_are_named_by_their_public_path():
    # given the exception classes, which rows name by module and class
    from django_pgqueue.core import exceptions
    from django_pgqueue.core.retry import exception_name

    # then each names the module a project imports it from
    classes = [
        v for v in vars(exceptions).values() if isinstance(v, type) and issubclass(v, Exception)
    ]
    assert classes
    assert {exception_name(c).rpartition(".")[0] for c in classes} == {
        "django_pgqueue.exceptions"
    }
