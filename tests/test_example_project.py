"""The example project's own tests (example_project/shop/test_orders.py, written with
django_pgqueue.testing) pass under the example's settings.

They run in a subprocess: the example has its own settings module (its apps, its
tasks, its URLs), which this test run's settings must not take in (its periodic task
and queue limits would reach the workers other tests start). Its test database is
named after this run's, with "_example" appended, on the same server."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db import connections

from tests.conftest import REPO, database_url


@pytest.mark.slow  # a second pytest run: its own test database, migrations and workers
def test_the_example_projects_tests_pass(django_db_modify_db_settings: None) -> None:
    settings_dict = connections["default"].settings_dict
    url = database_url({**settings_dict, "NAME": f"{settings_dict['NAME']}_example"})
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": url,
        "PYTHONPATH": str(REPO),
    }
    command = [
        sys.executable, "-m", "pytest", "example_project", "--ds", "example_project.settings",
        "-p", "no:cacheprovider", "-q", "-n", "0",
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 passed" in done.stdout, done.stdout
