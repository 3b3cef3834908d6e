"""The package's layers and the absence of import cycles (docs/architecture.md): the
contracts in pyproject.toml's [tool.importlinter], checked by import-linter."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_import_goes_down_the_layers_and_no_modules_import_each_other_in_a_circle():
    # given the contracts of pyproject.toml
    # when import-linter checks the imports of django_pgqueue and benchmarks
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint_imports), "--no-cache", "--no-logo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # then every contract is kept (and no ignored import is left over from a fix)
    assert result.returncode == 0, result.stdout + result.stderr
