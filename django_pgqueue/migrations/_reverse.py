"""Migrating back: a reverse that would leave rows the older schema cannot mean
refuses, before it changes anything.

A migration whose reverse drops what some rows need (the columns that say what a
waiting task waits for, a runtime schedule's definition) ends with ``refuse_back``: the
last operation of a migration is the first one undone, so the check runs before any of
the migration's own reverse, which, in a migration with ``atomic = False``, could not
be rolled back. The message says what holds it and what to do.

Django skips this module when it looks for migrations (its name starts with "_").
"""

from collections.abc import Callable

from django.core.management.base import CommandError
from django.db import migrations


def refuse_back(
    migration: str, count_sql: str, held_by: Callable[[int], str]
) -> migrations.RunPython:
    """An operation that does nothing forward and, backward, refuses while
    ``count_sql`` (one count) finds rows: ``held_by(count)`` says what they are and
    what to do."""

    def check(apps, schema_editor) -> None:
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(count_sql)
            (count,) = cursor.fetchone()
        if count:
            raise CommandError(
                f"cannot migrate django_pgqueue back past {migration}: {held_by(count)}. "
                "Nothing was changed by this migration."
            )

    return migrations.RunPython(migrations.RunPython.noop, reverse_code=check)
