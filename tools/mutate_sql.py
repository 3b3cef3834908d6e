"""Mutation check of the SQL contract (the statements of django_pgqueue/db/sql/*.sql).

For every statement that fences or routes (COVERAGE below: the statement, and the tests
that pin it), each predicate of its WHERE, JOIN ... ON and FILTER (WHERE ...) conditions
is broken, one at a time:

* a conjunct (a term of a top-level AND) is removed (``TRUE``) and inverted
  (``NOT (...)``);
* a disjunct (a term of an OR, at the top of a condition or inside a parenthesised
  conjunct) is removed (``FALSE``);
* a literal of an ``IN ('a', 'b', ...)`` list is dropped (the states a statement takes).

Each mutant is written to a file of named statements that tests/settings.py loads over
the package's (PGQUEUE_TEST_QUERIES), in the test process and in every worker it
starts; then the statement's tests run. A mutant the tests pass is a survivor: either a
test is missing, or the mutant is equivalent (the predicate cannot change what the
statement does), and then tools/sql_mutants_explained.toml says why. The check fails
on a survivor that is not explained there, and on a mutant that is no valid SQL (a bug
of this parser).

    python tools/mutate_sql.py                 # every covered statement (long)
    python tools/mutate_sql.py --fence         # the fence predicates only (CI)
    python tools/mutate_sql.py --statement settle --list

Needs DATABASE_URL (the tests' server); the tests run with -n 0 and --reuse-db.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SQL_DIR = REPO / "django_pgqueue" / "db" / "sql"
# The queue doctor's reads of the catalogs fence and route nothing.
NOT_CONTRACT = {"doctor.sql"}
EXPLAINED = REPO / "tools" / "sql_mutants_explained.toml"

# Statement (fnmatch pattern over the contract's names) -> the tests that pin it:
# pytest arguments, files or node ids, with -k expressions where a file is large. A
# statement of the contract that no pattern names is not checked (--list shows which).
# The fast SQL-level tests come first: pytest stops at the first failure (-x).
FENCE_TESTS = ["tests/test_fencing.py"]
COVERAGE: dict[str, list[str]] = {
    "settle": [
        *FENCE_TESTS,
        "tests/test_executions.py",
        "tests/test_retry_rules.py",
        "tests/test_workflows.py",
    ],
    "settle_check": [*FENCE_TESTS, "tests/test_executions.py"],
    "heartbeat": FENCE_TESTS,
    "hold_lease": [*FENCE_TESTS, "tests/test_atomic.py"],
    "settle_atomic": [*FENCE_TESTS, "tests/test_atomic.py"],
    "save_checkpoint": FENCE_TESTS,
    "save_progress": FENCE_TESTS,
    "read_cancel_requested": [*FENCE_TESTS, "tests/test_worker.py", "-k", "cancel"],
    "wait_for_tasks": [*FENCE_TESTS, "tests/test_workflows.py"],
    "find_claimed": ["tests/test_faults.py", "-k", "claim"],
    "recover_expired_leases": [*FENCE_TESTS, "tests/test_crash.py"],
    # The routing statements end with the EXPLAIN tests: a predicate that only lets the
    # planner use a partial index (whose WHERE it repeats) changes no row, only the
    # plan, and those tests pin the plan.
    "claim": [
        "tests/test_claim.py",
        "tests/test_fair.py",
        "tests/test_routing.py",
        "tests/test_limits.py",
        "tests/test_key_rates.py",
        "tests/test_expiry.py",
        "tests/test_sizes.py",
        "tests/test_explain.py",
    ],
    "claim_plain": [
        "tests/test_claim.py",
        "tests/test_expiry.py",
        "tests/test_sizes.py",
        "tests/test_worker.py",
        "tests/test_explain.py",
    ],
    "claim_fair": ["tests/test_fair.py", "tests/test_claim.py", "tests/test_sizes.py",
                   "tests/test_explain.py"],
    "signal_task": ["tests/test_workflows.py", "tests/test_bad_input_signal.py"],
    "stage": ["tests/test_claim.py", "tests/test_fair.py", "tests/test_expiry.py",
              "tests/test_workflows.py", "tests/test_key_rates.py", "tests/test_explain.py"],
    "enqueue_unique": ["tests/test_unique.py"],
    "find_live_unique": ["tests/test_unique.py"],
    "find_unique": ["tests/test_unique.py"],
    "replace_unique": ["tests/test_unique.py"],
}

# The tests to run first for the mutants of a statement's CTE (statement/context ->
# test files, moved to the front of the statement's list): pytest stops at the first
# failure, so a mutant is killed sooner by the tests of what it breaks.
FIRST: dict[str, list[str]] = {
    **{f"claim/{c}": ["tests/test_limits.py", "tests/test_key_rates.py"]
       for c in ("limits", "room", "busy_keys", "rated", "keyed", "allowed", "key_rates",
                 "key_rated", "key_held")},
    "claim/fair_walk": ["tests/test_fair.py"],
    "stage/fair_flows": ["tests/test_fair.py"],
    "stage/fair_due": ["tests/test_fair.py"],
}


def first_tests(mutant_context: str, tests: list[str]) -> list[str]:
    """``tests`` with the files FIRST names for this statement/context moved to the
    front (only files already in the list, and only when no -k follows them)."""
    first = [t for t in FIRST.get(mutant_context, []) if t in tests]
    if not first or "-k" in tests:
        return tests
    return [*first, *(t for t in tests if t not in first)]


# --fence: the fence's own predicates (the lease token, the attempt, the running state)
# where the statements that write or read a claimed row match it with the lease held
# (statement/context, as in a mutant's key). Fast: their tests are the SQL-level
# fencing tests.
FENCE_CONTEXTS = (
    "settle/mine", "settle/settled", "heartbeat/mine", "hold_lease/main",
    "settle_atomic/settled",
    "save_checkpoint/main", "save_progress/main", "read_cancel_requested/main",
    "wait_for_tasks/me",
)
FENCE_PREDICATE = re.compile(r"token|\battempt\b|state = 'running'|lease_expires_at >")


# -- parsing -----------------------------------------------------------------------

_TOKEN = re.compile(
    r"""(?P<comment>--[^\n]*)
      | (?P<string>'(?:[^']|'')*')
      | (?P<quoted>"(?:[^"]|"")*")
      | (?P<param>%\(\w+\)s)
      | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
      | (?P<space>\s+)
      | (?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)
# Words that end a condition at its own depth.
_ENDS = {
    "ORDER", "GROUP", "LIMIT", "OFFSET", "RETURNING", "FOR", "WINDOW", "HAVING", "UNION",
    "EXCEPT", "INTERSECT", "DO", "JOIN", "LEFT", "RIGHT", "INNER", "CROSS", "FULL",
    "WHERE", "ON", "SET", "FETCH", "SELECT",
}


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    start: int
    end: int
    depth: int  # parentheses and CASE ... END around it

    @property
    def word(self) -> str:
        return self.text.upper() if self.kind == "word" else ""


def tokenize(sql: str) -> list[Token]:
    tokens, depth = [], 0
    for match in _TOKEN.finditer(sql):
        kind, text = match.lastgroup, match.group()
        if kind in ("comment", "space"):
            continue
        upper = text.upper() if kind == "word" else text
        if upper in (")", "END"):
            depth -= 1
        tokens.append(Token(kind, text, match.start(), match.end(), depth))
        if upper in ("(", "CASE"):
            depth += 1
    if depth != 0:
        raise ValueError("unbalanced parentheses or CASE ... END")
    return tokens


@dataclass(frozen=True)
class Mutant:
    statement: str
    context: str  # the CTE the predicate is in, or "main"
    op: str  # remove, negate, drop-or
    predicate: str  # normalised text
    start: int
    end: int
    replacement: str
    nth: int = 1  # occurrence of the same op and predicate in the same context

    @property
    def key(self) -> str:
        suffix = f" #{self.nth}" if self.nth > 1 else ""
        return f"{self.statement}/{self.context}: {self.op} {self.predicate}{suffix}"

    def apply(self, sql: str) -> str:
        return sql[: self.start] + self.replacement + sql[self.end :]


def _normal(sql: str, start: int, end: int) -> str:
    return " ".join(sql[start:end].split())


def _cte_names(tokens: list[Token]) -> list[tuple[int, int, str]]:
    """(start, end, name) of each top-level ``name AS [NOT] [MATERIALIZED] ( ... )``."""
    spans = []
    for i, tok in enumerate(tokens):
        if tok.text != "(" or tok.depth != 0:
            continue
        j = i - 1
        while j >= 0 and tokens[j].word in ("MATERIALIZED", "NOT"):
            j -= 1
        if j >= 1 and tokens[j].word == "AS" and tokens[j - 1].kind == "word":
            close = next(t for t in tokens[i + 1 :] if t.text == ")" and t.depth == 0)
            spans.append((tok.start, close.end, tokens[j - 1].text))
    return spans


def _split(tokens: list[Token], depth: int, word: str) -> list[list[Token]]:
    parts: list[list[Token]] = [[]]
    for tok in tokens:
        if tok.depth == depth and tok.word == word:
            parts.append([])
        else:
            parts[-1].append(tok)
    return parts


def _conditions(tokens: list[Token]) -> list[list[Token]]:
    """The tokens of each WHERE / ON condition (not ON CONFLICT), at its own depth."""
    found = []
    for i, tok in enumerate(tokens):
        if tok.word not in ("WHERE", "ON"):
            continue
        if tok.word == "ON" and i + 1 < len(tokens) and tokens[i + 1].word == "CONFLICT":
            continue
        body = []
        for nxt in tokens[i + 1 :]:
            if nxt.depth < tok.depth or (
                nxt.depth == tok.depth and (nxt.word in _ENDS or nxt.text in (",", ";"))
            ):
                break
            body.append(nxt)
        if body:
            found.append(body)
    return found


def _predicates(sql: str, body: list[Token]) -> list[tuple[str, int, int]]:
    """(op, start, end) for each breakable predicate of a condition."""
    depth = body[0].depth
    out: list[tuple[str, int, int]] = []
    disjuncts = [d for d in _split(body, depth, "OR") if d]
    if len(disjuncts) > 1:
        return [("drop-or", d[0].start, d[-1].end) for d in disjuncts]
    for conjunct in _split(body, depth, "AND"):
        if not conjunct:
            continue
        out.append(("remove", conjunct[0].start, conjunct[-1].end))
        out.append(("negate", conjunct[0].start, conjunct[-1].end))
        out.extend(_in_lists(conjunct))
        wrapped = (
            conjunct[0].text == "("
            and conjunct[-1].text == ")"
            and conjunct[-1].depth == depth
            and all(t.depth > depth for t in conjunct[1:-1])
        )
        if wrapped and len(conjunct) > 2:
            out.extend(_predicates(sql, conjunct[1:-1]))
    return out


def _in_lists(conjunct: list[Token]) -> list[tuple[str, int, int]]:
    """("drop-in", start, end) for each literal of an ``IN ('a', 'b', ...)`` list: its
    span with the comma that joins it to the list."""
    out = []
    for i, tok in enumerate(conjunct[:-1]):
        if tok.word != "IN" or conjunct[i + 1].text != "(":
            continue
        close = next(
            (j for j in range(i + 2, len(conjunct)) if conjunct[j].text == ")"), None
        )
        items = conjunct[i + 2 : close]
        literals = items[::2]
        if (
            close is None
            or len(literals) < 2
            or any(t.kind != "string" for t in literals)
            or any(t.text != "," for t in items[1::2])
        ):
            continue
        for k, literal in enumerate(literals):
            if k == 0:
                out.append(("drop-in", literal.start, items[1].end))
            else:
                out.append(("drop-in", items[2 * k - 1].start, literal.end))
    return out


_REPLACEMENT = {"remove": "TRUE", "drop-or": "FALSE", "drop-in": ""}


def mutants(name: str, sql: str) -> list[Mutant]:
    tokens = tokenize(sql)
    ctes = _cte_names(tokens)
    seen: dict[tuple[str, str, str], int] = {}
    result = []
    for body in _conditions(tokens):
        for op, start, end in _predicates(sql, body):
            context = next((n for s, e, n in ctes if s <= start and end <= e), "main")
            text = _normal(sql, start, end).strip(", ")
            nth = seen[(context, op, text)] = seen.get((context, op, text), 0) + 1
            replacement = _REPLACEMENT.get(op, f"NOT ({sql[start:end]})")
            result.append(Mutant(name, context, op, text, start, end, replacement, nth))
    return result


def load_statements() -> dict[str, str]:
    sys.path.insert(0, str(REPO))
    from django_pgqueue.db.sql import _load_all

    return _load_all(sorted(p for p in SQL_DIR.glob("*.sql") if p.name not in NOT_CONTRACT))


def covered(name: str) -> list[str] | None:
    for pattern, tests in COVERAGE.items():
        if fnmatch.fnmatchcase(name, pattern):
            return tests
    return None


def explained() -> dict[str, str]:
    if not EXPLAINED.exists():
        return {}
    data = tomllib.loads(EXPLAINED.read_text(encoding="utf-8"))
    return {entry["mutant"]: entry["why"] for entry in data.get("equivalent", [])}


# -- running -----------------------------------------------------------------------


def run_tests(
    tests: list[str], queries_file: Path | None, timeout: float, fresh: bool, url: str
) -> tuple[str, str]:
    """("passed" | "failed" | "invalid" | "timeout", output). The test database is kept
    between runs (--reuse-db), and made anew (``fresh``) after a run that was killed:
    its transactional tests had no teardown to empty the tables."""
    env = dict(os.environ, DATABASE_URL=url)
    env.pop("PGQUEUE_TEST_QUERIES", None)
    if queries_file is not None:
        env["PGQUEUE_TEST_QUERIES"] = str(queries_file)
    command = [
        sys.executable, "-m", "pytest", *tests, "-x", "-q", "-n", "0",
        "--create-db" if fresh else "--reuse-db",
        "-p", "no:cacheprovider", "-o", "addopts=", "-m", "not slow and not soak",
    ]
    try:
        proc = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        return "timeout", str(exc.stdout or "")
    output = proc.stdout + proc.stderr
    if proc.returncode == 0:
        return "passed", output
    if "psycopg.errors.SyntaxError" in output or "UndefinedColumn" in output:
        return "invalid", output
    return "failed", output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--statement", action="append", default=[],
                        help="only this statement (a name or fnmatch pattern; repeatable)")
    parser.add_argument("--fence", action="store_true",
                        help="only the fence predicates (lease_token, attempt, "
                             "state = 'running') of the statements that write a claimed "
                             "row, against the fencing tests only")
    parser.add_argument("--match", default="",
                        help="only the mutants whose key contains this text")
    parser.add_argument("--tests", nargs=argparse.REMAINDER,
                        help="run these pytest arguments instead of the statement's tests "
                             "(the last option)")
    parser.add_argument("--skip-explained", action="store_true",
                        help="do not run the mutants explained as equivalent (they survive "
                             "by definition; running them only finds explanations gone stale)")
    parser.add_argument("--keys", type=Path,
                        help="only the mutants whose keys this file lists, one a line (the "
                             "survivors of a quicker run with --tests, say)")
    parser.add_argument("--start", type=int, default=1,
                        help="begin at this mutant of the selection (1-based: resume a run)")
    parser.add_argument("--list", action="store_true",
                        help="list the mutants and the statements not checked; run nothing")
    parser.add_argument("--jobs", type=int, default=1,
                        help="run this many mutants at once, each job on a database of "
                             "its own (DATABASE_URL's name with _j<n> added)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds one mutant's tests may take (default 600)")
    args = parser.parse_args(argv)

    statements = load_statements()
    reasons = explained()
    selected = []
    for name, sql in statements.items():
        tests = covered(name)
        if tests is None:
            continue
        if args.statement and not any(fnmatch.fnmatchcase(name, p) for p in args.statement):
            continue
        for mutant in mutants(name, sql):
            if args.match not in mutant.key:
                continue
            if args.skip_explained and mutant.key in reasons:
                continue
            if args.fence and not (
                f"{mutant.statement}/{mutant.context}" in FENCE_CONTEXTS
                and FENCE_PREDICATE.search(mutant.predicate)
            ):
                continue
            chosen = args.tests or (FENCE_TESTS if args.fence else tests)
            selected.append((mutant, first_tests(f"{mutant.statement}/{mutant.context}", chosen)))

    if args.keys is not None:
        wanted = set(args.keys.read_text(encoding="utf-8").splitlines())
        selected = [(m, t) for m, t in selected if m.key in wanted]
    selected = selected[args.start - 1 :]
    if args.list:
        for mutant, _tests in selected:
            print(mutant.key)
        unchecked = [n for n in statements if covered(n) is None]
        print(f"\n{len(selected)} mutants; statements not checked: {', '.join(unchecked)}")
        return 0
    if not os.environ.get("DATABASE_URL"):
        parser.error("set DATABASE_URL (the tests' PostgreSQL server)")

    base_url = os.environ["DATABASE_URL"]
    jobs = max(1, args.jobs)
    lock = threading.Lock()
    survivors, invalid, stale = [], [], []
    done = [0]

    def job(index: int, share: list[tuple[Mutant, list[str]]]) -> int:
        """Run ``share`` in order against a database of this job's own (its tests'
        database is made from it), one mutant at a time."""
        url = base_url if jobs == 1 else f"{base_url}_j{index}"
        baselines: dict[tuple[str, ...], float] = {}
        killed_last = False  # the last run was killed at its timeout
        with tempfile.TemporaryDirectory(prefix="pgqueue-mutants-") as tmp:
            queries_file = Path(tmp) / "mutant.sql"
            for mutant, tests in share:
                same = tuple(sorted(tests))  # the same tests in another order: one baseline
                if same not in baselines:
                    began = time.monotonic()
                    status, output = run_tests(tests, None, args.timeout, True, url)
                    if status != "passed":
                        with lock:
                            print(output[-5000:])
                            print(f"the tests of {mutant.statement} fail unmutated: "
                                  f"{' '.join(tests)}")
                        return 2
                    baselines[same] = time.monotonic() - began
                mutated = mutant.apply(statements[mutant.statement])
                queries_file.write_text(f"-- name: {mutant.statement}\n{mutated};\n")
                timeout = min(args.timeout, 3 * baselines[same] + 30)
                began = time.monotonic()
                status, output = run_tests(tests, queries_file, timeout, killed_last, url)
                killed_last = status == "timeout"
                took = time.monotonic() - began
                verdict = {"passed": "SURVIVED", "failed": "killed"}.get(status, status)
                with lock:
                    if status == "passed":
                        if mutant.key in reasons:
                            verdict = "equivalent"
                        else:
                            survivors.append(mutant)
                    elif mutant.key in reasons:
                        stale.append(mutant)
                    if status == "invalid":
                        invalid.append((mutant, output))
                    done[0] += 1
                    print(f"[{done[0]}/{len(selected)}] {verdict:10} {took:5.1f}s  "
                          f"{mutant.key}", flush=True)
        return 0

    shares = [selected[i::jobs] for i in range(jobs)]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        codes = list(pool.map(job, range(jobs), shares))
    if any(codes):
        return 2

    print()
    for mutant, output in invalid:
        print(f"INVALID SQL (a bug of tools/mutate_sql.py): {mutant.key}\n{output[-2000:]}")
    for mutant in stale:
        print(f"explained but killed (drop it from {EXPLAINED.name}): {mutant.key}")
    for mutant in survivors:
        print(f"SURVIVOR, not explained in {EXPLAINED.name}: {mutant.key}")
    print(f"{len(selected)} mutants, {len(survivors)} unexplained survivors, "
          f"{len(invalid)} invalid")
    return 1 if survivors or invalid else 0


if __name__ == "__main__":
    sys.exit(main())
