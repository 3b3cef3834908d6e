"""Queues on several databases (PGQUEUE['DATABASES'], docs/databases.md).

Two real databases on the test server: ``default`` and ``queue2`` (tests/settings.py),
each migrated by pytest-django. Queues "q2" and "q2b" are on queue2, every other queue
on default. What a user relies on: a task goes to its queue's database and nowhere
else; a transactional enqueue from a transaction on the other database is refused
with nothing written; one ``runtaskworker`` serves the queues of both; the admin, the
gauges and pgqueue_status show both, and task ids (which collide across databases) are
always read on the right one.
"""

from __future__ import annotations

import json
from io import StringIO

import psycopg
import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connections, transaction
from django.test import override_settings
from django.urls import reverse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from django_pgqueue.core.exceptions import InvalidTaskError, TransactionDatabaseError
from django_pgqueue.models import Task, Worker
from django_pgqueue.ops import operations
from django_pgqueue.ops.metrics import QueueCollector
from django_pgqueue.tasking import workflows
from tests import tasks
from tests.conftest import database_url, wait_until
from tests.settings import TEST_DATABASES

BOTH = ["default", "queue2"]
pytestmark = pytest.mark.django_db(transaction=True, databases=BOTH)


@pytest.fixture(autouse=True)
def two_databases():
    with override_settings(PGQUEUE={**settings.PGQUEUE, "DATABASES": TEST_DATABASES}):
        yield


def count(alias: str, **filters) -> int:
    return Task.objects.using(alias).filter(**filters).count()


def align_ids() -> None:
    """The next task id is the same on both databases (as on two fresh ones)."""
    for alias in BOTH:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT setval(pg_get_serial_sequence('pgqueue_task', 'id'), 1000)")


def on_q2(definition=tasks.noop, queue="q2"):
    return definition.using(queue=queue)


# -- enqueue --------------------------------------------------------------------------
def test_a_task_goes_to_its_queues_database_and_nowhere_else():
    here = tasks.noop.enqueue(1)
    there = on_q2().enqueue(2)
    many = on_q2().enqueue_many([3, 4, 5])
    assert count("default") == 1 and count("queue2") == 4
    assert Task.objects.using("default").get().pk == here
    assert sorted(Task.objects.using("queue2").values_list("pk", flat=True)) == sorted(
        [there, *many]
    )
    # Ids are per database: the same number can name a task on each.
    assert operations.get_task(there, database="queue2").queue == "q2"
    assert operations.get_task(here).queue == "default"


def test_an_enqueue_inside_a_transaction_on_the_other_database_is_refused_and_writes_nothing():
    with transaction.atomic():  # the business data's database: default
        tasks.noop.enqueue(1)  # same database: part of the transaction
        with pytest.raises(TransactionDatabaseError) as refused:
            on_q2().enqueue(2)
        with pytest.raises(TransactionDatabaseError):
            on_q2().enqueue_many([3, 4])
        with pytest.raises(TransactionDatabaseError):
            on_q2().enqueue_on_commit(5)
    message = str(refused.value)
    assert "'q2' on database 'queue2'" in message
    assert "inside a transaction on 'default'" in message
    assert "commit_alias='default'" in message and "nothing was enqueued" in message
    assert count("queue2") == 0 and count("default") == 1


def test_enqueue_on_commit_of_the_callers_database_writes_once_it_commits_and_not_on_rollback():
    with transaction.atomic():
        task_id = on_q2().using(commit_alias="default").enqueue_on_commit(1)
        assert count("queue2") == 0  # not before the commit
    assert list(Task.objects.using("queue2").values_list("pk", flat=True)) == [task_id]

    with pytest.raises(RuntimeError), transaction.atomic():
        on_q2().using(commit_alias="default").enqueue_on_commit(2)
        raise RuntimeError("the view failed")
    assert count("queue2") == 1


def test_a_transaction_on_the_queues_database_takes_the_enqueue():
    with pytest.raises(RuntimeError), transaction.atomic(using="queue2"):
        on_q2().enqueue(1)
        raise RuntimeError("rolled back")
    assert count("queue2") == 0
    # Both open: the caller asked for two commits, and gets them.
    with transaction.atomic(), transaction.atomic(using="queue2"):
        on_q2().enqueue(2)
    assert count("queue2") == 1


def test_a_workflow_must_be_on_one_database_and_writes_nothing_otherwise():
    with pytest.raises(InvalidTaskError, match="must be on one database"):
        workflows.chain(tasks.noop.step(1), on_q2().step(2))
    with pytest.raises(InvalidTaskError, match="must be on one database"):
        workflows.chord([on_q2().step(1)], tasks.noop.step(2))
    assert count("default") == 0 and count("queue2") == 0
    ids = workflows.chain(on_q2().step(1), on_q2(queue="q2b").step(2))
    assert count("queue2") == 2 and count("queue2", pk=ids[1], state="waiting") == 1


def test_pause_and_cancel_act_on_the_queues_database():
    on_q2().enqueue(1)
    operations.pause("q2")
    assert operations.pauses(using="queue2")["q2"]["paused"] is True
    assert "q2" not in operations.pauses(using="default")
    assert operations.resume("q2") is True
    victim = on_q2().enqueue(2)
    assert operations.cancel(victim) is None  # no such task on default
    assert operations.cancel(victim, database="queue2") == "cancelled"
    assert count("queue2", pk=victim, state="cancelled") == 1


# -- the worker -----------------------------------------------------------------------
@pytest.mark.slow
def test_one_runtaskworker_serves_the_queues_of_both_databases(start_worker, tmp_path):
    here = tasks.record.enqueue("default-side")
    there = on_q2(tasks.record).enqueue("queue2-side")
    worker = start_worker(
        "--queues",
        "default,q2",
        "--concurrency",
        "2",
        wait=False,
        env={"PGQUEUE_TEST_DATABASES": "1"},
    )
    wait_until(
        lambda: count("default", pk=here, state="succeeded") == 1
        and count("queue2", pk=there, state="succeeded") == 1,
        timeout=30,
        message="both tasks done",
    )
    # One worker process per database, each registered where its queues are.
    assert [w.queues for w in Worker.objects.using("default")] == [["default"]]
    assert [w.queues for w in Worker.objects.using("queue2")] == [["q2"]]
    log = worker.log()
    assert "for database queue2" in log and "for database default" in log
    worker.stop()


def test_a_worker_for_one_database_with_database_flag(start_worker):
    there = on_q2(tasks.record).enqueue("only queue2")
    here = tasks.record.enqueue("not served")
    worker = start_worker(
        "--queues", "default,q2", "--database", "queue2", env={"PGQUEUE_TEST_DATABASES": "1"}
    )
    wait_until(lambda: count("queue2", pk=there, state="succeeded") == 1, timeout=20)
    assert count("default", pk=here, state="pending") == 1
    assert Worker.objects.using("default").count() == 0
    worker.stop()


def test_runtaskworker_refuses_a_database_that_holds_none_of_its_queues():
    with pytest.raises(Exception, match="none of the queues is on database 'queue2'"):
        call_command("runtaskworker", "--queues", "default", "--database", "queue2")
    with pytest.raises(Exception, match="holds no task table"):
        call_command("runtaskworker", "--queues", "default", "--database", "nowhere")
    with pytest.raises(Exception, match="pass --database"):
        call_command("runtaskworker", "--queues", "default,q2", "--burst")


# -- what operators see ---------------------------------------------------------------
def test_the_overview_and_the_task_pages_show_each_database(admin_client):
    align_ids()
    here = tasks.noop.enqueue(1)
    there = on_q2().enqueue(2)
    assert here == there  # ids collide: the pages must say which database
    on_q2(tasks.record).enqueue("also")
    page = admin_client.get(reverse("admin:django_pgqueue_queueoverview_changelist"))
    html = page.content.decode()
    def queue_row(queue: str) -> str:
        return html.split(f'class="pgqueue-queue" data-queue="{queue}">', 1)[1].split("</tr>")[0]

    assert 'data-database="queue2"' in queue_row("q2")
    assert 'data-database="default"' in queue_row("default")
    assert "?db=queue2&amp;queue=q2" in html  # its task links open queue2's list

    tasks_url = reverse("admin:django_pgqueue_task_changelist")
    default_list = admin_client.get(tasks_url)
    queue2_list = admin_client.get(tasks_url + "?db=queue2")
    assert [t.queue for t in default_list.context["cl"].result_list] == ["default"]
    assert sorted(t.queue for t in queue2_list.context["cl"].result_list) == ["q2", "q2"]

    change = reverse("admin:django_pgqueue_task_change", args=[there])
    assert admin_client.get(change).context["original"].queue == "default"
    page = admin_client.get(change + "?db=queue2")
    assert page.context["original"].queue == "q2"
    assert 'id="pgqueue-database"' in page.content.decode()
    # From the list, the detail page keeps the list's database.
    kept = admin_client.get(change + "?_changelist_filters=db%3Dqueue2")
    assert kept.context["original"].queue == "q2"


def test_an_admin_action_changes_the_task_of_the_lists_database(admin_client):
    align_ids()
    here, other_here = tasks.noop.enqueue_many([1, 2])
    there, other_there = on_q2().enqueue_many([1, 2])
    assert (here, other_here) == (there, other_there)
    url = reverse("admin:django_pgqueue_task_changelist") + "?db=queue2"
    admin_client.post(url, {"action": "cancel", "_selected_action": [there]})
    assert count("queue2", pk=there, state="cancelled") == 1
    # The detail page's button, opened on queue2, acts on queue2 and comes back there.
    operate = reverse("admin:django_pgqueue_task_operate", args=[other_there, "cancel"])
    response = admin_client.post(operate + "?db=queue2")
    assert count("queue2", pk=other_there, state="cancelled") == 1
    assert response["Location"].endswith(f"/{other_there}/change/?db=queue2")
    # default's tasks with the same ids are untouched.
    assert count("default", state="pending") == 2


def test_a_framework_task_on_the_other_database_has_a_result_id_naming_it():
    from django_pgqueue.core.compat import task_backends
    from tests import framework_tasks

    backends = {
        "default": {
            "BACKEND": "django_pgqueue.backends.PgQueueBackend",
            "QUEUES": ["default", "q2"],
        }
    }
    with override_settings(TASKS=backends):
        result = framework_tasks.add.using(queue_name="q2").enqueue(2, 3)
        assert result.id.startswith("queue2:")
        assert count("queue2") == 1 and count("default") == 0
        again = task_backends["default"].get_result(result.id)
        assert again.id == result.id and again.task.queue_name == "q2"
        # The same refusal inside a transaction on default, with its kind kept.
        with transaction.atomic(), pytest.raises(TransactionDatabaseError):
            framework_tasks.add.using(queue_name="q2").enqueue(1, 1)
        assert count("queue2") == 1


def test_the_gauges_and_pgqueue_status_cover_both_databases():
    tasks.noop.enqueue(1)
    on_q2().enqueue_many([1, 2, 3])
    registry = CollectorRegistry()
    registry.register(QueueCollector(ttl=0))
    pending = {
        sample.labels["queue"]: sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
        if sample.name == "pgqueue_tasks_pending"
    }
    assert pending == {"default": 1.0, "q2": 3.0}

    out = StringIO()
    call_command("pgqueue_status", "--json", stdout=out)
    status = json.loads(out.getvalue())
    assert status["databases"] == BOTH
    by_queue = {q["queue"]: q["database"] for q in status["queues"]}
    assert by_queue == {"default": "default", "q2": "queue2"}
    table = StringIO()
    call_command("pgqueue_status", stdout=table)
    assert "q2 (queue2)" in table.getvalue()


def test_prune_and_cancel_commands_take_the_database():
    victim = on_q2().enqueue(1)
    out = StringIO()
    call_command("pgqueue_cancel", str(victim), "--database", "queue2", stdout=out)
    assert count("queue2", pk=victim, state="cancelled") == 1
    out = StringIO()
    call_command("pgqueue_prune", "--result-ttl", "0", stdout=out)
    assert "on default" in out.getvalue() and "on queue2" in out.getvalue()
    assert count("queue2") == 0


def test_checks_refuse_an_unknown_alias_and_the_replica():
    with override_settings(PGQUEUE={**settings.PGQUEUE, "DATABASES": {"q2": "nowhere"}}):
        errors = [e for e in run_checks() if e.id.startswith("django_pgqueue.E")]
        unknown = "PGQUEUE['DATABASES']['q2'] is 'nowhere', which is not in DATABASES"
        assert [(e.id, e.msg) for e in errors] == [("django_pgqueue.E001", unknown)]
    replica = {**settings.PGQUEUE, "READ_DATABASE": "queue2", "DATABASES": {"q2": "queue2"}}
    with override_settings(PGQUEUE=replica):
        errors = [e for e in run_checks() if e.id.startswith("django_pgqueue.E")]
        assert [e.id for e in errors] == ["django_pgqueue.E021"]
        assert "a replica cannot hold a queue" in errors[0].msg


def test_both_databases_hold_their_own_migrated_table():
    for alias in BOTH:
        url = database_url(connections[alias].settings_dict)
        with psycopg.connect(url) as conn:
            name = conn.execute("SELECT current_database()").fetchone()[0]
            applied = conn.execute(
                "SELECT count(*) FROM django_migrations WHERE app = 'django_pgqueue'"
            ).fetchone()[0]
        assert name.endswith("_queue2") == (alias == "queue2")
        assert applied >= 8
