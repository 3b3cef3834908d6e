"""The mistakes of a first setup get a message that says what to do: a database that
has not applied the migrations, a misspelt module in PGQUEUE['TASK_MODULES'].

Each runs ``manage.py`` in a subprocess, as a newcomer would, except the enqueue
errors, which hide the task table inside the test's transaction."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import ProgrammingError, connection, connections, transaction
from django.test import override_settings

from tests import tasks
from tests.conftest import REPO, database_url
from tests.test_migrations import migration_names


def manage(*args: str, database_url: str, **env: str) -> subprocess.CompletedProcess:
    """``python manage.py ARGS`` with the test settings, on ``database_url``."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
             "DATABASE_URL": database_url, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip


@pytest.fixture
def empty_database(django_db_modify_db_settings: None) -> Iterator[str]:
    """The URL of an empty database on the test server (no migration applied)."""
    settings_dict = connections["default"].settings_dict
    name = f"{settings_dict['NAME']}_empty"
    admin_url = database_url({**settings_dict, "NAME": "postgres"})
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    yield database_url({**settings_dict, "NAME": name})
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- a database without the migrations ------------------------------------------------


@pytest.mark.slow
def test_runtaskworker_on_an_unmigrated_database_refuses_in_one_line_naming_the_migrations(
    empty_database: str,
):
    # when: a worker starts on a database that has applied none of the migrations
    refused = manage("runtaskworker", "--burst", database_url=empty_database)

    # then: it exits with one line that names every migration and the command to run
    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr
    [line] = refused.stderr.strip().splitlines()
    names = migration_names()
    assert line == (
        f"CommandError: database 'default' lacks {len(names)} migration(s) of django_pgqueue "
        f"({', '.join(names)}): run python manage.py migrate, then start the worker"
    )

    # given: the first migration only
    migrated = manage("migrate", "django_pgqueue", names[0], database_url=empty_database)
    assert migrated.returncode == 0, migrated.stderr
    # then: the line names the others
    refused = manage("runtaskworker", "--burst", database_url=empty_database)
    assert refused.returncode == 1
    assert f"lacks {len(names) - 1} migration(s) of django_pgqueue ({names[1]}, " in refused.stderr


def test_check_with_the_database_tag_reports_unapplied_migrations(empty_database: str):
    # given: a database where Django's apps are migrated, but not django_pgqueue
    migrated = manage("migrate", "contenttypes", database_url=empty_database)
    assert migrated.returncode == 0, migrated.stderr

    # when: manage.py check --database runs
    checked = manage("check", "--database", "default", database_url=empty_database)

    # then: a warning (check itself succeeds) that names the migrations and the fix
    assert checked.returncode == 0, checked.stderr
    names = ", ".join(migration_names())
    assert f"(django_pgqueue.W007) database 'default' lacks {len(migration_names())} " in (
        checked.stderr
    )
    assert f"of django_pgqueue ({names})" in checked.stderr
    assert "HINT: Run python manage.py migrate" in checked.stderr


@pytest.mark.slow
def test_the_first_migrate_of_a_new_database_does_not_warn_about_what_it_does(
    empty_database: str,
):
    # when: a project migrates a new database (migrate runs the database checks first)
    migrated = manage("migrate", database_url=empty_database)

    # then: no warning about the migrations it is about to apply
    assert migrated.returncode == 0, migrated.stderr
    assert "W007" not in migrated.stdout + migrated.stderr


@pytest.mark.django_db
def test_check_with_the_database_tag_is_quiet_on_a_migrated_database():
    out, err = StringIO(), StringIO()
    with override_settings(SILENCED_SYSTEM_CHECKS=[]):
        call_command("check", databases=["default"], stdout=out, stderr=err)
    assert "W007" not in out.getvalue() + err.getvalue()


@pytest.fixture
def task_table_hidden(db: None) -> None:
    """The task table and its id sequence renamed inside the test's transaction, as if
    the migrations had not been applied (rolled back with the test)."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE pgqueue_task RENAME TO pgqueue_task_hidden")
        cursor.execute("ALTER SEQUENCE pgqueue_task_id_seq RENAME TO pgqueue_task_hidden_seq")


@pytest.mark.usefixtures("task_table_hidden")
@pytest.mark.parametrize(
    ("how", "missing"),
    [
        (lambda: tasks.noop.enqueue(1), "pgqueue_task"),
        (lambda: tasks.noop.enqueue_many([1, 2]), "pgqueue_task"),
        (lambda: tasks.noop.enqueue_on_commit(1), "pgqueue_task_id_seq"),
    ],
    ids=["enqueue", "enqueue_many", "enqueue_on_commit"],
)
def test_enqueue_without_the_task_table_says_to_run_migrate(how, missing):
    with pytest.raises(ProgrammingError) as raised, transaction.atomic():
        how()
    assert str(raised.value) == (
        f'relation "{missing}" does not exist: database \'default\' lacks migrations of '
        "django_pgqueue; run python manage.py migrate. Nothing was enqueued."
    )


# -- a misspelt module in TASK_MODULES ------------------------------------------------


@pytest.mark.slow
def test_a_misspelt_task_module_stops_the_worker_but_no_other_command(db_url: str):
    typo = {"PGQUEUE_TEST_MISSING_TASK_MODULE": "tests.taks"}

    # then: check succeeds, and warns with the setting and the module
    checked = manage("check", database_url=db_url, **typo)
    assert checked.returncode == 0, checked.stderr
    assert (
        "(django_pgqueue.W006) PGQUEUE['TASK_MODULES'] lists 'tests.taks', which cannot be "
        "imported (No module named 'tests.taks')"
    ) in checked.stderr

    # then: migrate and shell work
    migrated = manage("migrate", database_url=db_url, **typo)
    assert migrated.returncode == 0, migrated.stderr
    shell = manage("shell", "-c", "print('shell ok')", database_url=db_url, **typo)
    assert (shell.returncode, shell.stdout.splitlines()[-1]) == (0, "shell ok"), shell.stderr

    # then: the worker refuses to start, in one line that names the setting and module
    refused = manage("runtaskworker", "--burst", database_url=db_url, **typo)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        "CommandError: PGQUEUE['TASK_MODULES'] lists what cannot be imported: 'tests.taks' "
        "(No module named 'tests.taks'); correct it to start a worker"
    )
