"""The package's layers and the absence of import cycles (docs/architecture.md): the
contracts in pyproject.toml's [tool.importlinter], checked by import-linter."""

import shutil
import subprocess
import sys
from pathlib import Path

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
