"""``manage.py check``: tasks on a queue no worker serves by default, and hints that
point to the documentation by URL."""

import re
import tomllib
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_pgqueue.checks import DOCS_URL, check_settings, check_task_queues
from django_pgqueue.tasking.registry import autodiscover, registry
from tests import tasks

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def every_registered_queue() -> list[str]:
    return sorted({definition.queue for definition in registry.all()})


def test_a_task_on_a_queue_missing_from_queues_is_a_warning_naming_the_queue_and_task():
    # given: QUEUES without the queue of tests.tasks.other_queue
    with override_settings(PGQUEUE={"QUEUES": ["default"]}):
        # when: the checks run
        messages = check_task_queues(None)

    # then: one W003 per unserved queue; the one for "other" names the task
    by_queue = {m.msg.split("'")[1]: m for m in messages}
    assert {m.id for m in messages} == {"django_pgqueue.W003"}
    assert "other" in by_queue
    assert tasks.other_queue.name in by_queue["other"].msg
    assert "default" not in by_queue
    assert "runtaskworker without --queues will not run them" in by_queue["other"].msg


def test_no_warning_when_queues_lists_every_queue_of_the_registered_tasks():
    with override_settings(PGQUEUE={"QUEUES": every_registered_queue()}):
        assert check_task_queues(None) == []


def test_manage_py_check_prints_the_warning_unless_it_is_silenced():
    # given: the test settings, with nothing silenced
    with override_settings(SILENCED_SYSTEM_CHECKS=[], PGQUEUE={"QUEUES": ["default"]}):
        out, err = StringIO(), StringIO()
        # when: manage.py check runs
        call_command("check", stdout=out, stderr=err)
    # then: the warning is shown (and check still succeeds: it is a warning)
    assert "django_pgqueue.W003" in err.getvalue()

    # given: the test suite's own settings, which silence it
    out, err = StringIO(), StringIO()
    call_command("check", stdout=out, stderr=err)
    assert "W003" not in err.getvalue() + out.getvalue()


def test_the_hints_name_the_documentation_url_of_the_package_metadata():
    urls = tomllib.loads(PYPROJECT.read_text())["project"]["urls"]
    assert urls["Documentation"] == DOCS_URL

    with override_settings(PGQUEUE={"LEASE_SECONDS": "30", "NOT_A_KEY": 1}):
        messages = check_settings(None)
    hints = [m.hint for m in messages]
    assert len(hints) == 2
    assert all(f"{DOCS_URL}/settings.md" in hint for hint in hints)
    assert not any(" docs/" in hint for hint in hints)


# -- settings keyed by queue: a key that is no queue ----------------------------------


def check_output(**pgqueue) -> str:
    """What ``manage.py check`` prints with these PGQUEUE keys, nothing silenced."""
    out, err = StringIO(), StringIO()
    with override_settings(SILENCED_SYSTEM_CHECKS=[], PGQUEUE=pgqueue):
        call_command("check", stdout=out, stderr=err)
    return err.getvalue() + out.getvalue()


def test_a_queue_limit_for_a_misspelt_queue_is_a_warning_naming_the_setting_and_key():
    # given: a limit for "emials", a queue nothing knows ("emails" is a task's queue)
    output = check_output(
        QUEUES=["default"],
        QUEUE_LIMITS={"emials": {"rate": "4/s"}, "emails": {"concurrency": 2}},
    )

    # then: one W004, for the misspelt key only, naming the known queues
    [line] = [line for line in output.splitlines() if "(django_pgqueue.W004)" in line]
    assert "PGQUEUE['QUEUE_LIMITS'] has an entry for queue 'emials'" in line
    assert "it applies to nothing" in line
    assert "Known queues: default, emails, other" in output


def test_a_database_routing_for_a_misspelt_queue_is_a_warning_naming_the_setting_and_key():
    # given: DATABASES routes "emials" (a typo) and "default" (a queue of QUEUES)
    output = check_output(QUEUES=["default"], DATABASES={"emials": "default", "default": "default"})

    # then: one W005, for the misspelt key only
    [line] = [line for line in output.splitlines() if "(django_pgqueue.W005)" in line]
    assert "PGQUEUE['DATABASES'] has an entry for queue 'emials'" in line


def test_keys_that_are_queues_of_queues_tasks_or_the_tasks_framework_are_not_warned_about():
    # given: limits and routes for a queue of QUEUES, a task's queue ("other") and a
    # queue of a Tasks framework backend ("framework_only")
    keys = {"default": {"concurrency": 1}, "other": {"concurrency": 1},
            "framework_only": {"concurrency": 1}}  # fmt: skip
    tasks_setting = {"default": {"BACKEND": "django_pgqueue.backends.PgQueueBackend",
                                 "QUEUES": ["default", "framework_only"]}}  # fmt: skip
    with override_settings(TASKS=tasks_setting):
        output = check_output(
            QUEUES=["default"],
            QUEUE_LIMITS=keys,
            DATABASES={queue: "default" for queue in keys},
        )

    # then: neither warning
    assert "W004" not in output and "W005" not in output


# -- TASK_MODULES: a module that does not exist ---------------------------------------


def test_a_task_module_that_does_not_exist_is_a_warning_naming_the_setting_and_module():
    output = check_output(TASK_MODULES=["tests.tasks", "tests.taks", "nowhere.tasks"])

    lines = [line for line in output.splitlines() if "(django_pgqueue.W006)" in line]
    assert len(lines) == 2, output
    assert any(
        "PGQUEUE['TASK_MODULES'] lists 'tests.taks', which cannot be imported "
        "(No module named 'tests.taks')" in line
        for line in lines
    )
    assert any("'nowhere.tasks'" in line and "No module named 'nowhere'" in line for line in lines)


def test_autodiscover_leaves_out_a_missing_task_module_but_raises_a_broken_one(
    tmp_path, monkeypatch
):
    # given: a module that exists and imports one that does not
    (tmp_path / "broken_tasks_module.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    # when: autodiscover imports a misspelt module: nothing is raised (checks report it)
    with override_settings(PGQUEUE={"TASK_MODULES": ["tests.taks"]}):
        autodiscover()

    # when: it imports the broken module: its own error propagates, as any project code's
    with (
        override_settings(PGQUEUE={"TASK_MODULES": ["broken_tasks_module"]}),
        pytest.raises(ModuleNotFoundError, match="no_such_dependency"),
    ):
        autodiscover()


def test_every_check_id_is_in_the_check_reference():
    source = (PYPROJECT.parent / "django_pgqueue" / "checks.py").read_text()
    reference = (PYPROJECT.parent / "docs" / "checks.md").read_text()
    ids = set(re.findall(r"django_pgqueue\.[EW]\d{3}", source))
    assert {"django_pgqueue.W004", "django_pgqueue.W007"} <= ids
    assert [i for i in sorted(ids) if f"| `{i}` |" not in reference] == []
