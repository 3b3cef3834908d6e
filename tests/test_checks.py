"""``manage.py check``: tasks on a queue no worker serves by default, and hints that
point to the documentation by URL."""

import tomllib
from io import StringIO
from pathlib import Path

from django.core.management import call_command
from django.test import override_settings

from django_pgqueue.checks import DOCS_URL, check_settings, check_task_queues
from django_pgqueue.registry import registry
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
