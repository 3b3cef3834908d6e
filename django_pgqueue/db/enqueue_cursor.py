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

from datetime import UTC
from typing import Any

import psycopg
from django.core.signals import setting_changed
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.postgresql.psycopg_any import register_tzloader
from django.db.backends.utils import CursorWrapper
from psycopg.pq import Format
from psycopg.types.datetime import TimestamptzLoader

from django_pgqueue.core.conf import get_setting

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


class _KeptCursor(CursorWrapper):
    """Django's CursorWrapper around the connection's kept cursor: leaving its ``with``
    block frees it for the next enqueue instead of closing it."""

    def __init__(self, cursor: _ServerBoundCursor, db: BaseDatabaseWrapper, prepares: bool):
        super().__init__(cursor, db)
        self.raw = cursor.connection
        self.timezone = db.timezone
        self.generation = _generation
        self.prepares = prepares
        self.busy = False

    def __enter__(self) -> _KeptCursor:
        self.busy = True
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.busy = False


_generation = 0


def _settings_changed(**kwargs: Any) -> None:
    """override_settings (tests): decide again whether to prepare."""
    global _generation
    _generation += 1


setting_changed.connect(_settings_changed, dispatch_uid="django_pgqueue.enqueue_cursor")


def enqueue_cursor(connection: BaseDatabaseWrapper) -> CursorWrapper:
    """A cursor on the caller's ``connection`` that binds on the server (and prepares,
    where that is safe), wrapped by Django as ``connection.cursor()`` would be.

    One psycopg cursor is kept per Django connection and reused by the next enqueue
    on the same session (creating a cursor and Django's wrapper costs more than the
    Python of the row). A new one, closed at the end of the ``with`` block, is made
    when the kept one is in use, under Django's query log, or on a connection shared
    between threads."""
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    kept = connection.__dict__.get("_pgqueue_enqueue_cursor")
    if (
        kept is not None
        and kept.raw is connection.connection
        and not kept.busy
        and kept.generation == _generation
        and kept.timezone is connection.timezone
        and not connection.queries_logged
        and not connection.allow_thread_sharing
    ):
        connection.validate_thread_sharing()
        if kept.prepares and kept.raw.prepare_threshold is None:
            kept.raw.prepare_threshold = _NEVER  # set back by someone: prepare=True again
        return kept
    with connection.wrap_database_errors:
        raw = connection.connection
        cursor = _ServerBoundCursor(raw)
        # Under Django's query log (DEBUG, assertNumQueries) nothing is prepared: the
        # log reads the statement psycopg sent, which a prepared execution has none of.
        prepares = _prepares(connection)
        if not connection.queries_logged and prepares:
            if raw.prepare_threshold is None:
                raw.prepare_threshold = _NEVER
            cursor.prepare_statements = True
        # As Django's create_cursor: timestamps in the connection's time zone. In UTC
        # (USE_TZ's default) on a UTC session, psycopg's own loader (in C) gives the
        # same datetimes as Django's (Python, some 10 us a value).
        if connection.timezone is UTC and raw.info.timezone is UTC:
            cursor.adapters.register_loader(_TIMESTAMPTZ_OID, TimestamptzLoader)
        elif connection.timezone != raw.adapters.get_loader(
            _TIMESTAMPTZ_OID, Format.TEXT
        ).timezone:
            register_tzloader(connection.timezone, cursor)
        if connection.queries_logged or connection.allow_thread_sharing or (
            kept is not None and kept.busy and kept.raw is raw
        ):
            return connection._prepare_cursor(cursor)
        connection.validate_thread_sharing()
        kept = _KeptCursor(cursor, connection, prepares)
        connection.__dict__["_pgqueue_enqueue_cursor"] = kept
        return kept


def _prepares(connection: BaseDatabaseWrapper) -> bool:
    prepare = get_setting("PREPARE_ENQUEUE")
    if prepare is not None:
        return bool(prepare)
    if get_setting("TRANSACTION_POOLER") or not get_setting("PREPARED_STATEMENTS"):
        return False
    settings_dict = connection.settings_dict
    return bool(settings_dict.get("CONN_MAX_AGE") or settings_dict["OPTIONS"].get("pool"))
