"""The public API's types: mypy and pyright over tests/typecheck/api_usage.py, and the
typed declarations kept in step with what the code accepts at run time."""

from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import get_type_hints

import pytest

from django_pgqueue import TaskContext, TaskDefinition, queue_overview, task
from django_pgqueue.ops.operations import QueueOverviewRow
from django_pgqueue.tasking.registry import (
    OPTION_NAMES,
    ContextTaskDefinition,
    TaskOptions,
    UsingOptions,
    registry,
)
from tests.factories import TaskFactory

ROOT = Path(__file__).resolve().parent.parent
TYPECHECK = ROOT / "tests" / "typecheck"


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: pip install -e '.[dev]' installs it")
    # No version check against the package index: the run stays offline.
    env = {**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=TYPECHECK,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # mypy over the package and Django: CPU-bound, long without its cache
def test_mypy_accepts_the_correct_uses_and_refuses_each_incorrect_one():
    # given the usage file, each refusal marked with the error mypy must report
    # when mypy checks it (warn_unused_ignores: a refusal that stops is an error too)
    result = _run(
        "mypy", "--config-file", "mypy.ini", "--cache-dir", str(ROOT / ".mypy_cache"),
        "api_usage.py",
    )  # fmt: skip
    # then it reports nothing
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # pyright (Node.js) over the package and Django: CPU-bound
def test_pyright_accepts_the_correct_uses_and_refuses_each_incorrect_one():
    # given the same file, each refusal marked with pyright's rule
    # when pyright checks it (reportUnnecessaryTypeIgnoreComment)
    result = _run("pyright", "-p", "pyrightconfig.json", "--pythonpath", sys.executable)
    # then it reports nothing
    assert result.returncode == 0, result.stdout + result.stderr


def test_using_options_typed_for_checkers_are_the_options_using_accepts():
    # given the typed options of using() and the names it validates at run time
    # then they are the same names: an option added to one is added to the other
    assert set(UsingOptions.__annotations__) == set(OPTION_NAMES)


def test_task_options_typed_for_checkers_are_the_decorators_keyword_arguments():
    # given the keyword arguments of task() at run time
    parameters = inspect.signature(task).parameters
    keywords = {n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    # then the typed overloads declare each (takes_context separately)
    assert set(TaskOptions.__annotations__) | {"takes_context"} == keywords


def test_using_still_refuses_an_unknown_option_from_an_unchecked_caller():
    @task(name="typing.refuses_unknown")
    def refuses(order_id: int) -> None: ...

    try:
        # when an unchecked caller misspells an option
        with pytest.raises(TypeError, match=r"unknown enqueue option\(s\) \['priorty'\]"):
            refuses.using(priorty=1)  # type: ignore[call-arg]
    finally:
        registry.unregister("typing.refuses_unknown")


def test_a_context_task_is_called_directly_with_its_context_first():
    # given a task declared with takes_context=True
    @task(name="typing.context_first", takes_context=True)
    def report(context: TaskContext, report_id: int) -> tuple[TaskContext, int]:
        return context, report_id

    try:
        context = object()
        # then it is still a TaskDefinition (periodic, workflows and the worker take it)
        assert isinstance(report, ContextTaskDefinition)
        assert isinstance(report, TaskDefinition)
        # and a direct call passes the context first, as the worker does
        assert report(context, 7) == (context, 7)  # type: ignore[arg-type]
        # and using() keeps its kind
        assert isinstance(report.using(priority=1), ContextTaskDefinition)
    finally:
        registry.unregister("typing.context_first")


@pytest.mark.django_db
def test_queue_overview_rows_have_exactly_the_typed_keys():
    # given a task in the table
    TaskFactory()
    # when the overview is read
    [row] = queue_overview()
    # then its keys are the typed row's, each value of its declared type
    declared = get_type_hints(QueueOverviewRow)
    assert set(row) == set(declared)
    assert {k: type(v) for k, v in row.items() if not isinstance(v, declared[k])} == {}
