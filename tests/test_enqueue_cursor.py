"""The cursor enqueue writes through (django_pgqueue/db/enqueue_cursor.py): the caller's
connection and transaction, parameters bound on the server, and a prepared statement
only where the session is the caller's own beyond one request."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_pgqueue.models import Task
from tests.settings import PGQUEUE
from tests.tasks import noop

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def conn_max_age() -> Iterator[None]:
    """The default connection as a persistent one (CONN_MAX_AGE = 60), on a new session."""
    connection.close()
    saved = connection.settings_dict["CONN_MAX_AGE"]
    connection.settings_dict["CONN_MAX_AGE"] = 60
    yield
    connection.settings_dict["CONN_MAX_AGE"] = saved
    connection.close()


def prepared_statements() -> list[str]:
    """The statements prepared in the default connection's session."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def enqueues_prepared() -> int:
    return sum("INSERT INTO pgqueue_task" in text for text in prepared_statements())


def test_a_persistent_connection_prepares_the_enqueue_once(conn_max_age) -> None:
    # Given a connection that outlives a request
    # When tasks are enqueued on it, with different values each time
    ids = [noop.using(priority=p).enqueue(p) for p in (0, 5, 100, -100, 5)]
    # Then each is a row as usual, and the statement is prepared in that session
    assert [t.args for t in Task.objects.filter(id__in=ids).order_by("id")] == [
        [0], [5], [100], [-100], [5],
    ]  # fmt: skip
    assert enqueues_prepared() >= 1


def test_a_connection_used_once_sends_the_enqueue_unprepared() -> None:
    # Given Django's default CONN_MAX_AGE = 0 (a connection per request)
    connection.close()
    assert connection.settings_dict["CONN_MAX_AGE"] == 0
    # When a task is enqueued
    noop.enqueue(1)
    # Then nothing was prepared: preparing would cost a round trip more than it saves
    assert enqueues_prepared() == 0


@pytest.mark.parametrize(
    "setting",
    [{"TRANSACTION_POOLER": True}, {"PREPARED_STATEMENTS": False}, {"PREPARE_ENQUEUE": False}],
)
def test_no_statement_is_prepared_when_a_setting_rules_it_out(conn_max_age, setting) -> None:
    with override_settings(PGQUEUE={**PGQUEUE, **setting}):
        noop.enqueue(1)
        noop.enqueue(2)
    assert enqueues_prepared() == 0
    assert Task.objects.count() == 2


def test_prepare_enqueue_true_prepares_on_any_connection() -> None:
    connection.close()
    with override_settings(PGQUEUE={**PGQUEUE, "PREPARE_ENQUEUE": True}):
        noop.enqueue(1)
    assert enqueues_prepared() == 1


def test_the_projects_own_queries_are_never_prepared(conn_max_age) -> None:
    # Given the enqueue prepared on the connection
    noop.enqueue(1)
    # When the project runs its own queries, many times, on the same connection
    for _ in range(20):
        Task.objects.filter(id__gt=0).count()
        with connection.cursor() as cursor:
            cursor.execute("SELECT %s::int", [1])
    # Then only the enqueue's statement is prepared
    assert [text for text in prepared_statements() if "pgqueue_task" not in text or
            "INSERT" not in text] == []  # fmt: skip


def test_the_enqueue_is_in_the_callers_transaction_and_in_djangos_query_log(
    conn_max_age,
) -> None:
    # When a task is enqueued in a block that rolls back, with Django's query log on
    with (
        CaptureQueriesContext(connection) as queries,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        noop.enqueue(1)
        assert Task.objects.count() == 1  # seen inside the transaction
        raise RuntimeError
    # Then the task went with the transaction, and Django logged the statement
    assert Task.objects.count() == 0
    assert any("INSERT INTO pgqueue_task" in q["sql"] for q in queries.captured_queries)


def test_an_enqueue_in_an_aborted_transaction_fails_as_any_django_query_does(
    conn_max_age,
) -> None:
    from django.db import DataError, InternalError

    with transaction.atomic():
        # Given a transaction aborted by an error the code caught (no savepoint)
        with pytest.raises(DataError), connection.cursor() as cursor:
            cursor.execute("SELECT 1/0")
        # Then an enqueue fails with Django's error class, as an ORM query does
        with pytest.raises(InternalError):
            Task.objects.count()
        with pytest.raises(InternalError):
            noop.enqueue(1)
        transaction.set_rollback(True)
    assert Task.objects.count() == 0


def test_enqueue_many_and_dependents_take_the_same_path(conn_max_age) -> None:
    # Given a persistent connection
    # When a batch, a batch of one and a dependent task are enqueued
    ids = noop.enqueue_many([1, 2, 3])
    (one,) = noop.enqueue_many([4])
    child = noop.using(after=[one]).enqueue(5)
    # Then they are rows as usual, and their statements are prepared in the session
    assert list(Task.objects.filter(id__in=[*ids, one]).order_by("id").values_list(
        "args", flat=True)) == [[1], [2], [3], [4]]  # fmt: skip
    assert Task.objects.get(id=child).state == "waiting"
    assert enqueues_prepared() >= 2


def test_execute_wrappers_see_every_enqueue_on_a_session_that_already_enqueued(
    conn_max_age,
) -> None:
    # Given a session whose enqueue cursor exists already
    noop.enqueue(0)
    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    # When tasks are enqueued under an execute wrapper (instrumentation, as Sentry's)
    with connection.execute_wrapper(wrapper):
        noop.enqueue(1)
        noop.enqueue(2)
        noop.enqueue_many([3])
    # Then the wrapper saw each statement, and Django's query log sees the next one
    assert sum("INSERT INTO pgqueue_task" in sql for sql in seen) == 3
    with CaptureQueriesContext(connection) as queries:
        noop.enqueue(4)
    assert any("INSERT INTO pgqueue_task" in q["sql"] for q in queries.captured_queries)
    assert Task.objects.count() == 5


def test_a_session_closed_between_enqueues_is_replaced(conn_max_age) -> None:
    # Given a task enqueued (and its statement prepared) on one session
    noop.enqueue(1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        first_pid = cursor.fetchone()[0]
    # When Django closes the connection (end of its CONN_MAX_AGE) and opens another
    connection.close()
    noop.enqueue(2)
    # Then the enqueue went through the new session, prepared there again
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != first_pid
    assert enqueues_prepared() >= 1
    assert Task.objects.count() == 2
