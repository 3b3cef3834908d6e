"""Every place the package names an SQL statement names one that exists, and passes it
exactly the parameters it takes (docs/architecture.md, "The statements' names and
parameters"): read from the source with ``ast``, so a wrong name or parameter fails
here even on a path no other test runs.

A statement is named where the code indexes ``QUERIES``, calls ``sql.execute`` or
``sql.positional``, or calls a helper that passes one of its own arguments on to those
(``_fetchall("cancel_task", {...})``, the worker session's ``fetchall``): helpers are
found by following the arguments, so a new one needs no list. A name is read where it
is a string literal, either branch of a conditional expression of literals, a local
variable assigned only such values, or the call of a function of the module that
returns only such values (``claim_statement``). Parameters are checked where they are
a dict literal: its keys must be parameters of the statement and, without a ``**``
spread, all of them. A name the check cannot read fails it, unless ``DYNAMIC`` says
where the names come from instead.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from django_pgqueue.db.sql import QUERIES, _load, _load_all, positional

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_pgqueue"

# (module, function) whose statement names are read from data rather than written,
# and where the names written come from.
DYNAMIC = {
    # Replays the checkpoint and progress writes _fenced held for an atomic attempt:
    # the names are those of _fenced's callers, checked there.
    ("tasking/context.py", "_write_held"),
}
# (module, function, parameter): a parameter that is a function running a statement
# by name, as the worker session's fetchall does; its calls name statements, and a
# lambda passed for it may take the name as an argument.
RUNNERS = {
    ("ops/retention.py", "prune", "fetchall"),
}

Names = tuple[str, ...]


@dataclass(frozen=True)
class Use:
    """One place a statement is named: where, which names it may be, and the
    parameters passed, when they are written at that place."""

    where: str
    names: Names
    params: ast.expr | None


@dataclass(frozen=True)
class Problem:
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass(frozen=True)
class Helper:
    """A function that passes its argument ``name`` (at ``position``) on as a statement
    name, and its argument ``params``, if any, as the statement's parameters."""

    name: str
    position: int
    params: tuple[int, str] | None


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The module's functions and methods, not those nested in them: a nested function
    or lambda belongs to its enclosing one, whose parameters it sees."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node)


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Positional parameter names, as a call of the bound method sees them."""
    names = [a.arg for a in function.args.posonlyargs + function.args.args]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _is_queries(node: ast.AST) -> bool:
    return isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "QUERIES"


def _argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    return call.args[position] if position < len(call.args) else None


@dataclass
class Function:
    """What the check needs of one function or method, read once."""

    path: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    parameters: list[str]
    # (node, name, params) of each QUERIES[...], sql.execute, positional and runner call
    direct: list[tuple[ast.AST, ast.expr | None, ast.expr | None]] = field(default_factory=list)
    calls: list[ast.Call] = field(default_factory=list)
    local: dict[str, Names] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.node.name

    @classmethod
    def read(cls, path: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> Function:
        function = cls(path, node, _parameters(node))
        runners = {p for m, f, p in RUNNERS if (m, f) == (path, node.name)}
        passed: set[int] = set()
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            func = call.func
            is_sql = isinstance(func, ast.Attribute) and getattr(func.value, "id", None) == "sql"
            if is_sql and func.attr == "execute" and len(call.args) >= 2:
                params = call.args[2] if len(call.args) > 2 else None
                function.direct.append((call, call.args[1], params))
            elif (is_sql and func.attr == "positional") or _is_name(func, "positional"):
                function.direct.append((call, _argument(call, 0, "name"), None))
            elif isinstance(func, ast.Name) and func.id in runners:
                params = call.args[1] if len(call.args) > 1 else None
                function.direct.append((call, _argument(call, 0, "query"), params))
            elif call.args and _is_queries(call.args[0]):
                # x.execute(QUERIES[n], params): the statement and its parameters
                first = call.args[0]
                params = call.args[1] if len(call.args) > 1 else None
                function.direct.append((first, first.slice, params))
                passed.add(id(first))
            else:
                function.calls.append(call)
        for sub in ast.walk(node):
            if _is_queries(sub) and isinstance(sub.ctx, ast.Load) and id(sub) not in passed:
                function.direct.append((sub, sub.slice, None))
        return function


class Package:
    """The functions of a set of modules, the helpers among them, and what the names
    at their call sites may be."""

    def __init__(self, trees: dict[str, ast.AST]) -> None:
        self.functions = [
            Function.read(path, node)
            for path, tree in trees.items()
            # sql.execute and positional themselves: their calls are read as direct uses
            if path != "db/sql/__init__.py"
            for node in _functions(tree)
        ]
        self.by_key = {(f.path, f.name): f for f in self.functions}
        self.defined: dict[str, set[str]] = {}
        for function in self.functions:
            self.defined.setdefault(function.name, set()).add(function.path)
        self.returns: dict[tuple[str, str], Names] = {}
        self.returns = self._returns()
        for function in self.functions:
            function.local = self._local_names(function)
        self.helpers = self._helpers()

    def callee(self, call: ast.Call, path: str) -> tuple[str, str] | None:
        """(module, function) a call may reach: a function of the caller's module
        (``f()``, ``self.f()``), of a module named by its last part (``retention.f()``),
        or the package's only function of that name (``ctx.rows()``); else None."""
        func = call.func
        if isinstance(func, ast.Name):
            return path, func.id
        if not isinstance(func, ast.Attribute):
            return None
        owner = getattr(func.value, "id", None)
        if owner in ("self", "cls"):
            return path, func.attr
        for module in self.defined.get(func.attr, ()):
            if Path(module).stem == owner:
                return module, func.attr
        if len(self.defined.get(func.attr, ())) == 1:
            return next(iter(self.defined[func.attr])), func.attr
        return None

    def names(self, node: ast.expr | None, function: Function) -> Names | None:
        """The statement names ``node`` may evaluate to, or None if not readable."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return (node.value,)
        if isinstance(node, ast.IfExp):
            body, orelse = self.names(node.body, function), self.names(node.orelse, function)
            return None if body is None or orelse is None else body + orelse
        if isinstance(node, ast.Name):
            return function.local.get(node.id)
        if isinstance(node, ast.Call):
            return self.returns.get(self.callee(node, function.path) or ("", ""))
        return None

    def _returns(self) -> dict[tuple[str, str], Names]:
        """Functions whose every return is a literal name (or a conditional of them)."""
        found = {}
        for function in self.functions:
            values = [
                self.names(r.value, function)
                for r in ast.walk(function.node)
                if isinstance(r, ast.Return)
            ]
            if values and all(v is not None for v in values):
                found[(function.path, function.name)] = tuple(n for v in values for n in v)
        return found

    def _local_names(self, function: Function) -> dict[str, Names]:
        """Local variables assigned only readable names."""
        found: dict[str, Names | None] = {}
        for node in ast.walk(function.node):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    names = self.names(node.value, function)
                    before = found.get(target.id, ())
                    found[target.id] = None if names is None or before is None else before + names
        return {k: v for k, v in found.items() if v is not None}

    def helper_calls(
        self, function: Function
    ) -> Iterator[tuple[ast.Call, ast.expr, ast.expr | None]]:
        """(call, name, params) of each call of a helper in ``function``."""
        for call in function.calls:
            for helper in self.helpers.get(self.helper_callee(call, function.path), []):
                name = _argument(call, helper.position, helper.name)
                if name is not None:  # else a call without it (a cursor's fetchall())
                    params = _argument(call, *helper.params) if helper.params else None
                    yield call, name, params

    def helper_callee(self, call: ast.Call, path: str) -> tuple[str, str]:
        """The helper a call may reach: as ``callee`` says, or else, for ``x.f()``, the
        package's only helper named ``f`` (``self.session.fetchall()``)."""
        callee = self.callee(call, path)
        if callee is None and isinstance(call.func, ast.Attribute):
            named = [key for key in self.helpers if key[1] == call.func.attr]
            callee = named[0] if len(named) == 1 else None
        return callee or ("", "")

    def _helpers(self) -> dict[tuple[str, str], list[Helper]]:
        """Every function whose parameter reaches a statement name, followed through
        helpers calling helpers until none is added."""
        self.helpers: dict[tuple[str, str], list[Helper]] = {}
        changed = True
        while changed:
            changed = False
            for function in self.functions:
                parameters = function.parameters
                for _, name, params in [*function.direct, *self.helper_calls(function)]:
                    if not (isinstance(name, ast.Name) and name.id in parameters):
                        continue
                    params_at = None
                    if isinstance(params, ast.Name) and params.id in parameters:
                        params_at = (parameters.index(params.id), params.id)
                    helper = Helper(name.id, parameters.index(name.id), params_at)
                    known = self.helpers.setdefault((function.path, function.name), [])
                    if helper not in known:
                        known.append(helper)
                        changed = True
        return self.helpers

    def runner_lambda_parameters(self, function: Function) -> set[str]:
        """The parameters of lambdas ``function`` passes for a RUNNERS parameter."""
        found = set()
        for call in function.calls:
            callee = self.callee(call, function.path)
            target = self.by_key.get(callee) if callee else None
            if target is None:
                continue
            for module, name, parameter in RUNNERS:
                if (module, name) == callee and parameter in target.parameters:
                    at = target.parameters.index(parameter)
                    value = _argument(call, at, parameter)
                    if isinstance(value, ast.Lambda):
                        found |= {a.arg for a in value.args.args}
        return found

    def uses(self) -> tuple[list[Use], list[Problem]]:
        """Every readable use of a statement name, and a problem for each use whose
        name cannot be read."""
        uses: list[Use] = []
        problems: list[Problem] = []
        for function in self.functions:
            for node, name, params in [*function.direct, *self.helper_calls(function)]:
                where = f"{function.path}:{getattr(node, 'lineno', '?')}"
                names = self.names(name, function)
                if names is not None:
                    uses.append(Use(where, names, params))
                elif isinstance(name, ast.Name) and (
                    name.id in function.parameters
                    or name.id in self.runner_lambda_parameters(function)
                ):
                    pass  # a helper's own parameter: checked where the helper is called
                elif (function.path, function.name) not in DYNAMIC:
                    shown = ast.unparse(name) if name is not None else "?"
                    what = f"a statement name the check cannot read ({shown})"
                    problems.append(Problem(where, what))
        return uses, problems


def check(uses: list[Use], statements: dict[str, Names]) -> list[Problem]:
    """The names that are no statement, and the dict literals whose keys are not the
    statement's parameters."""
    problems = []
    for use in uses:
        for name in use.names:
            if name not in statements:
                problems.append(Problem(use.where, f"no statement named {name!r}"))
                continue
            if not isinstance(use.params, ast.Dict):
                continue
            keys = {k.value for k in use.params.keys if isinstance(k, ast.Constant)}
            spread = any(k is None for k in use.params.keys)
            takes = set(statements[name])
            if unknown := sorted(keys - takes):
                problems.append(Problem(use.where, f"{name!r} takes no {unknown}"))
            if not spread and (missing := sorted(takes - keys)):
                problems.append(Problem(use.where, f"{name!r} needs {missing} too"))
    return problems


def parse(root: Path) -> dict[str, ast.AST]:
    return {
        str(path.relative_to(root)): ast.parse(path.read_text(), str(path))
        for path in sorted(root.rglob("*.py"))
        if "migrations" not in path.parts
    }


def statements() -> dict[str, Names]:
    """{name: its %(parameter)s names} of every statement of db/sql/."""
    return {name: positional(name).names for name in QUERIES}


@pytest.fixture(scope="module")
def package() -> Package:
    return Package(parse(PACKAGE))


# -- the package ---------------------------------------------------------------------


def test_every_statement_the_package_names_exists_and_gets_its_parameters(package):
    # given every place the package names a statement
    uses, unreadable = package.uses()
    # when each is checked against the statements of db/sql/
    problems = check(uses, statements())
    # then every name could be read, is a statement, and every dict literal passed is
    # that statement's parameters
    assert [str(p) for p in unreadable + problems] == []


def test_the_check_reads_names_directly_through_helpers_and_variables(package):
    # given the uses found in the package
    uses, _ = package.uses()
    named = {name for use in uses for name in use.names}
    # then they include statements named in QUERIES[...] (cancel_task), through
    # sql.execute (settle), a function returning names (claim_plain, claim_fair), a
    # helper of a module (pause_queue: _fetchall), the worker session's fetchall
    # (prune_key_rates), a runner's lambda (prune), the doctor's rows (doctor_*): every
    # statement of db/sql/
    assert {
        "cancel_task", "settle", "claim_plain", "claim_fair", "pause_queue",
        "prune_key_rates", "prune", "doctor_claim_probe",
    } <= named
    assert named == set(QUERIES)
    assert not [u for u in uses if u.where.startswith("db/sql/")]


def test_every_dynamic_site_and_runner_the_check_lists_is_in_the_package(package):
    functions = set(package.by_key)

    assert functions >= DYNAMIC
    assert {(module, name) for module, name, _ in RUNNERS} <= functions


# -- the files ------------------------------------------------------------------------


def test_every_statement_of_every_sql_file_of_the_folder_is_loaded():
    # given the files of db/sql/, one a concern
    files = sorted((PACKAGE / "db" / "sql").glob("*.sql"))
    # then each statement of each is in QUERIES as its file has it: a file added to the
    # folder needs no list
    for path in files:
        assert _load(path).items() <= QUERIES.items(), path.name
    assert sum(len(_load(path)) for path in files) == len(QUERIES)


def test_a_statement_named_in_two_files_is_refused(tmp_path):
    # given two files that both define "claim"
    (tmp_path / "a.sql").write_text("-- name: claim\nSELECT 1;\n")
    (tmp_path / "b.sql").write_text("-- name: claim\nSELECT 2;\n")
    # when they are loaded together, then neither silently wins
    refused = r"b\.sql: statements named again: claim \(first in a\.sql\)"
    with pytest.raises(ValueError, match=refused):
        _load_all(sorted(tmp_path.glob("*.sql")))


# -- the check itself, on code written to be wrong -----------------------------------


def problems_of(source: str) -> list[str]:
    uses, unreadable = Package({"m.py": ast.parse(source)}).uses()
    known = {"claim": ("queues", "limit"), "cancel_task": ("id", "hard")}
    return [str(p) for p in unreadable + check(uses, known)]


HELPER = "def run(query, params):\n    c.execute(QUERIES[query], params)\n"


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("def f(c):\n    c.execute(QUERIES['clam'], {})\n", "no statement named 'clam'"),
        ("def f(c):\n    sql.execute(c, 'cancel', {})\n", "no statement named 'cancel'"),
        (
            "def f(c):\n    c.execute(QUERIES['cancel_task'], {'id': 1, 'hardd': 1})\n",
            "'cancel_task' takes no ['hardd']",
        ),
        (
            "def f(c):\n    c.execute(QUERIES['cancel_task'], {'id': 1})\n",
            "'cancel_task' needs ['hard'] too",
        ),
        (
            HELPER + "def g():\n    run('claimm', {'queues': 1, 'limit': 2})\n",
            "no statement named 'claimm'",
        ),
        (HELPER + "def g():\n    run('claim', {'queues': 1})\n", "'claim' needs ['limit'] too"),
        (
            "def f(c, flag):\n    q = 'claim' if flag else 'cancel'\n    c.execute(QUERIES[q])\n",
            "no statement named 'cancel'",
        ),
        (
            "def pick(p):\n    return 'claim' if p else 'clain'\n"
            "def f(c, p):\n    sql.execute(c, pick(p), p)\n",
            "no statement named 'clain'",
        ),
        ("def f(c, x):\n    y = x.name\n    c.execute(QUERIES[y])\n", "cannot read (y)"),
        (
            "class Session:\n    def fetchall(self, query, params=None):\n"
            "        return c.execute(QUERIES[query], params)\n"
            "def f(self):\n    self.session.fetchall('cancel_task', {'id': 1})\n",
            "'cancel_task' needs ['hard'] too",
        ),
    ],
)
def test_the_check_reports_a_wrong_name_or_parameter(source, problem):
    assert any(problem in p for p in problems_of(source)), problems_of(source)


def test_the_check_accepts_a_right_name_with_a_spread_of_the_rest():
    source = "def f(c, p):\n    c.execute(QUERIES['cancel_task'], {**p, 'hard': True})\n"

    assert problems_of(source) == []
