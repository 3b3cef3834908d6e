"""The ``--database`` flag of the commands that act on tasks by id (task ids are per
database: PGQUEUE['DATABASES'], docs/databases.md)."""

from __future__ import annotations

from django.core.management.base import CommandError, CommandParser

from django_pgqueue.core.conf import queue_databases


def add_database_argument(parser: CommandParser, what: str) -> None:
    parser.add_argument(
        "--database",
        metavar="ALIAS",
        help=f"the alias whose {what} (PGQUEUE['DATABASES']; default: PGQUEUE['DATABASE'])",
    )


def database_option(value: str | None) -> str | None:
    """The flag's alias, checked against the aliases that hold a task table."""
    if value is None:
        return None
    aliases = queue_databases()
    if value not in aliases:
        raise CommandError(
            f"--database {value!r} holds no task table: use one of {', '.join(aliases)}"
        )
    return value
