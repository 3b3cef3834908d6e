"""The cursor an enqueue writes through: the caller's connection, the server's binding.

A web view enqueues one task per request, so the client path of one INSERT is what
most users pay for. Django's psycopg backend binds parameters on the client: the
statement reaches the server as new text every call, to be parsed and planned again.
This cursor sends the same statement with its parameters apart (server-side binding),
and, where the session is the caller's own for more than one request, as a named
prepared statement, parsed and planned once per connection (about 1.5x the calls per
second of Django's cursor on the benchmark machine; docs/performance.md).

What stays as it was: the connection is ``connections[alias]``, so the statement runs
in the caller's transaction, with its ``on_commit`` semantics; the cursor is wrapped
by Django's ``CursorWrapper`` (``execute_wrappers``, the refusal inside a broken
``atomic()`` block, Django's error classes, the query log under ``DEBUG`` and
``assertNumQueries``); timestamps come back in the connection's time zone.

When a statement is prepared (``PGQUEUE["PREPARE_ENQUEUE"]``, docs/settings.md): by
default only on a connection that outlives a request (``CONN_MAX_AGE`` other than 0,
or Django's connection pool: preparing on a connection used once costs a round trip
more than it saves) and never with ``TRANSACTION_POOLER`` (a transaction-mode pooler
hands the next transaction another server session, where the statement does not
exist) or with ``PREPARED_STATEMENTS = False``. Unprepared server-side binding is safe
behind any pooler.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.postgresql.psycopg_any import register_tzloader
from django.db.backends.utils import CursorWrapper
from psycopg.pq import Format

from django_pgqueue.conf import get_settings

# Django opens its connections with prepare_threshold=None, under which psycopg ignores
# prepare=True. A threshold no statement reaches lets an explicit prepare=True through
# and prepares nothing else (no statement of the project is prepared behind its back).
_NEVER = 2**31 - 1
_TIMESTAMPTZ_OID = psycopg.adapters.types["timestamptz"].oid


class _ServerBoundCursor(psycopg.Cursor):
    """psycopg's server-binding cursor, preparing what it runs when told to."""

    prepare_statements: bool = False

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> _ServerBoundCursor:
        kwargs.setdefault("prepare", self.prepare_statements)
        return super().execute(query, params, **kwargs)


def enqueue_cursor(connection: BaseDatabaseWrapper) -> CursorWrapper:
    """A cursor on the caller's ``connection`` that binds on the server (and prepares,
    where that is safe), wrapped by Django as ``connection.cursor()`` would be."""
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = connection.connection
        cursor = _ServerBoundCursor(raw)
        # Under Django's query log (DEBUG, assertNumQueries) nothing is prepared: the
        # log reads the statement psycopg sent, which a prepared execution has none of.
        if not connection.queries_logged and _prepares(connection):
            if raw.prepare_threshold is None:
                raw.prepare_threshold = _NEVER
            cursor.prepare_statements = True
        # As Django's create_cursor: timestamps in the connection's time zone.
        loader = raw.adapters.get_loader(_TIMESTAMPTZ_OID, Format.TEXT)
        if connection.timezone != loader.timezone:
            register_tzloader(connection.timezone, cursor)
        return connection._prepare_cursor(cursor)


def _prepares(connection: BaseDatabaseWrapper) -> bool:
    conf = get_settings()
    if conf.PREPARE_ENQUEUE is not None:
        return conf.PREPARE_ENQUEUE
    if conf.TRANSACTION_POOLER or not conf.PREPARED_STATEMENTS:
        return False
    settings_dict = connection.settings_dict
    return bool(settings_dict.get("CONN_MAX_AGE") or settings_dict["OPTIONS"].get("pool"))
