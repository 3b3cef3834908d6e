"""The survivors of the last ``mutmut run`` that tools/mutmut_explained.toml does not
explain (CONTRIBUTING.md, "Mutation testing"); exit status 1 if there is one.

mutmut numbers a function's mutants in the order it makes them, so a number changes
when the function does. An explanation names the function (mutmut's name without the
``__mutmut_N`` suffix) and a piece of the mutated line (a ``+`` line of ``mutmut show``),
and covers every surviving mutant of that function whose change contains it. A mutant
that no test reached (``no tests``) counts as a survivor: the tests mutmut runs
([tool.mutmut] in pyproject.toml) must reach every function it mutates.

    python tools/mutmut_survivors.py
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPLAINED = REPO / "tools" / "mutmut_explained.toml"
MUTMUT = shutil.which("mutmut", path=str(Path(sys.executable).parent)) or "mutmut"
RESULT = re.compile(r"^\s*(?P<name>\S+): (?P<status>.+)$")


def mutmut(*args: str) -> str:
    done = subprocess.run([MUTMUT, *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"mutmut {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def change(name: str) -> str:
    """The mutated lines of a mutant, as one string."""
    lines = mutmut("show", name).splitlines()
    return "\n".join(ln[1:] for ln in lines if ln.startswith("+") and not ln.startswith("+++"))


def main() -> int:
    entries = tomllib.loads(EXPLAINED.read_text(encoding="utf-8")).get("equivalent", [])
    used = set()
    unexplained = []
    counts: dict[str, int] = {}
    for line in mutmut("results", "--all", "true").splitlines():
        match = RESULT.match(line)
        if match is None:
            continue
        status = match["status"].strip()
        counts[status] = counts.get(status, 0) + 1
        if status not in ("survived", "no tests"):
            continue
        name = match["name"]
        function = name.rsplit("__mutmut_", 1)[0]
        mutated = change(name)
        found = [
            i for i, e in enumerate(entries)
            if e["function"] == function and e["change"] in mutated
        ]  # fmt: skip
        if found:
            used.update(found)
        else:
            unexplained.append(f"{name} ({status}):\n    {mutated.strip()}")
    print(", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    for i, entry in enumerate(entries):
        if i not in used:
            print(f"explained but not surviving (drop it): {entry['function']}: {entry['change']}")
    for survivor in unexplained:
        print(f"SURVIVOR, not explained in {EXPLAINED.name}: {survivor}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
