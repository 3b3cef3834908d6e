"""Reads from a replica (READ_DATABASE): the overview, pgqueue_status, the queue gauges
and the admin's pages read from a real streaming replica; every write goes to DATABASE.

The queue lives on a private primary (tests/pgcluster.py) with a hot standby made by
``pg_basebackup --write-recovery-conf``, each under a Django alias this module adds for
the test: DATABASE = "queue_primary", READ_DATABASE = "queue_replica". The admin's users
and its history stay in the test database ("default"). The standby refuses every write
("cannot execute UPDATE in a read-only transaction"), so an admin action that passes
here wrote to the primary. Pausing the standby's replay (``pg_wal_replay_pause()``)
keeps it behind on purpose: what it shows then is the primary's past.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.db import connections
from django.db.utils import load_backend
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from django_pgqueue.models import Queue, Schedule, Task
from django_pgqueue.ops import operations
from django_pgqueue.ops.metrics import QueueCollector
from django_pgqueue.ops.operations import ReplicaLag
from django_pgqueue.ops.overview import build_overview
from django_pgqueue.tasking.periodic import periodic, schedule_registry
from tests import periodic_tasks, tasks
from tests.conftest import wait_until
from tests.factories import TaskFactory
from tests.pgcluster import ClusterUnavailable, PrivateCluster

PRIMARY, REPLICA = "queue_primary", "queue_replica"
TASKS = reverse("admin:django_pgqueue_task_changelist")
OVERVIEW = reverse("admin:django_pgqueue_queueoverview_changelist")
SCHEDULES = reverse("admin:django_pgqueue_schedule_changelist")


class PrimaryTaskFactory(TaskFactory):
    """Task rows written on the primary (the replica gets them by replication)."""

    class Meta:
        database = PRIMARY


@dataclass
class Replication:
    primary: PrivateCluster
    standby: PrivateCluster

    def primary_sql(self, sql: str, params: list | None = None) -> list[tuple]:
        with self.primary.connect("pgqueue") as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def replayed(self) -> None:
        """Wait until the standby has replayed everything the primary has committed."""
        [(lsn,)] = self.primary_sql("SELECT pg_current_wal_lsn()")
        with self.standby.connect("pgqueue") as conn:
            wait_until(
                lambda: conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn]
                ).fetchone()[0],
                timeout=10,
                message=f"the standby to replay the primary's WAL up to {lsn}",
            )

    @contextlib.contextmanager
    def replay_paused(self) -> Iterator[None]:
        """The standby stops replaying (it keeps receiving WAL) until the block ends."""
        self.replayed()
        with self.standby.connect() as conn:
            conn.execute("SELECT pg_wal_replay_pause()")
            try:
                wait_until(
                    lambda: (
                        conn.execute("SELECT pg_get_wal_replay_pause_state()").fetchone()[0]
                        == "paused"
                    ),
                    timeout=10,
                    message="the standby's replay to pause",
                )
                yield
            finally:
                conn.execute("SELECT pg_wal_replay_resume()")


@pytest.fixture(scope="module")
def replication() -> Iterator[Replication]:
    try:
        # PostgreSQL's defaults stream WAL: wal_level = replica, max_wal_senders = 10.
        primary = PrivateCluster.create()
    except ClusterUnavailable as exc:
        pytest.skip(f"no private PostgreSQL cluster: {exc}")
    try:
        primary.create_database("pgqueue")
        try:
            standby = primary.create_standby()
        except ClusterUnavailable as exc:
            pytest.skip(f"no streaming replica: {exc}")
        try:
            yield Replication(primary, standby)
        finally:
            standby.destroy()
    finally:
        primary.destroy()


def alias_settings(cluster: PrivateCluster) -> dict:
    """A Django database of the private cluster, complete like the test database's."""
    settings_dict = copy.deepcopy(connections["default"].settings_dict)
    settings_dict.update(
        NAME="pgqueue", HOST="127.0.0.1", PORT=str(cluster.port), USER="postgres",
        PASSWORD="", OPTIONS={},
    )  # fmt: skip
    return settings_dict


@pytest.fixture
def replica(replication: Replication, transactional_db: None, settings) -> Iterator[Replication]:
    """The queue on the private primary, read from its standby: DATABASE and
    READ_DATABASE for this test, the queue's tables empty on both. No transaction
    around the test on ``default``: an enqueue (on the primary) from inside one on
    another database is refused (docs/databases.md)."""
    replication.primary_sql(
        "TRUNCATE pgqueue_task, pgqueue_dependency, pgqueue_worker, pgqueue_queue, pgqueue_schedule"
    )
    replication.replayed()
    # Connections made for the test, not aliases of DATABASES: Django's test case
    # leaves such connections alone (no transaction around the test, no flush, no
    # "not allowed in this test"), and they end with it.
    for alias, cluster in ((PRIMARY, replication.primary), (REPLICA, replication.standby)):
        settings_dict = alias_settings(cluster)
        backend = load_backend(settings_dict["ENGINE"])
        connections[alias] = backend.DatabaseWrapper(settings_dict, alias)
    settings.PGQUEUE = {**settings.PGQUEUE, "DATABASE": PRIMARY, "READ_DATABASE": REPLICA}
    try:
        yield replication
    finally:
        for alias in (PRIMARY, REPLICA):
            connections[alias].close()
            del connections[alias]


def primary_state(task_id: int) -> str | None:
    return Task.objects.using(PRIMARY).filter(pk=task_id).values_list("state", flat=True).first()


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def due_on_overview() -> int:
    totals = build_overview()["totals"]
    return totals["pending_routable"] + totals["pending_unroutable"]


def gauges() -> dict[tuple, float]:
    registry = CollectorRegistry()
    registry.register(QueueCollector(ttl=0))
    return {
        (s.name, *sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }


def status_json() -> dict:
    out = StringIO()
    call_command("pgqueue_status", "--json", stdout=out)
    return json.loads(out.getvalue())


# -- the reads ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_replica_is_a_hot_standby_that_refuses_writes(replica):
    with replica.standby.connect("pgqueue") as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is True
        with pytest.raises(Exception, match="read-only transaction"):
            conn.execute("DELETE FROM pgqueue_task")


@pytest.mark.slow
def test_the_overview_shows_tasks_enqueued_on_the_primary_once_the_replica_replays_them(
    replica,
):
    # Given the replica's replay paused, and three tasks enqueued (on DATABASE)
    with replica.replay_paused():
        ids = [tasks.noop.enqueue() for _ in range(3)]
        assert [primary_state(i) for i in ids] == ["pending"] * 3

        # Then the overview, read from the replica, does not have them yet
        assert due_on_overview() == 0

    # When the replica replays them, the overview shows them
    wait_until(lambda: due_on_overview() == 3, timeout=10, message="three due tasks")


@pytest.mark.slow
def test_the_overview_reads_nothing_from_the_primary(replica):
    tasks.noop.enqueue()
    replica.replayed()

    with (
        CaptureQueriesContext(connections[PRIMARY]) as on_primary,
        CaptureQueriesContext(connections[REPLICA]) as on_replica,
    ):
        overview = build_overview()

    assert on_primary.captured_queries == []
    assert len(on_replica.captured_queries) >= 5  # lag, overview, capacity, pauses, history
    assert overview["read_database"] == REPLICA


def test_the_overview_page_shows_how_far_behind_the_replica_is(replica, admin_client):
    # Given a replica whose replay stopped at a commit, then a second and more went by
    tasks.noop.enqueue()
    with replica.replay_paused():
        time.sleep(1.2)
        tasks.noop.enqueue()  # received by the standby, not replayed

        # When an operator opens the overview
        page = admin_client.get(OVERVIEW).content.decode()

    # Then its lag card says how far behind it reads, at least that second
    card = re.search(r'id="pgqueue-replica-lag" data-replica="yes".*?</div>\s*</div>', page, re.S)
    assert card, page
    assert "is behind the primary" in card.group(0)
    value = re.search(r'<div class="value[^"]*">([\d.]+)s</div>', card.group(0))
    assert value and float(value.group(1)) >= 1.0, card.group(0)
    assert f"Read from the database {REPLICA} (READ_DATABASE)" in page


def test_pgqueue_status_reads_the_replica_and_gives_its_lag(replica):
    tasks.noop.enqueue()
    replica.replayed()

    document = status_json()

    assert document["read_database"] == REPLICA
    assert document["read_database_is_replica"] is True
    assert 0 <= document["replica_lag_seconds"] < 30
    [row] = document["tasks"]
    assert row["pending_unroutable"] == 1


def test_the_queue_gauges_are_read_from_the_replica_with_its_lag(replica):
    tasks.noop.enqueue()
    with replica.replay_paused():
        time.sleep(1.2)
        tasks.noop.enqueue()  # not replayed: the gauges do not count it

        values = gauges()

    assert values[("pgqueue_queue_metrics_up",)] == 1
    pending = ("pgqueue_tasks_pending", ("queue", "default"), ("task_name", "tests.tasks.noop"))
    assert values[pending] == 1
    assert values[("pgqueue_read_replica_lag_seconds",)] >= 1.0


def test_a_read_database_that_is_not_a_replica_reads_with_no_lag(replica, admin_client, settings):
    # Given READ_DATABASE naming the primary itself, under another alias
    settings.PGQUEUE = {**settings.PGQUEUE, "READ_DATABASE": PRIMARY}

    page = admin_client.get(OVERVIEW).content.decode()
    document = status_json()
    values = gauges()

    assert 'id="pgqueue-replica-lag" data-replica="no"' in page
    assert "not a replica (no lag)" in page
    assert (document["read_database_is_replica"], document["replica_lag_seconds"]) == (False, None)
    assert values[("pgqueue_read_replica_lag_seconds",)] == 0


def test_the_task_list_and_page_read_from_the_replica(replica, admin_client):
    task_id = tasks.noop.enqueue()
    replica.replayed()

    with CaptureQueriesContext(connections[PRIMARY]) as on_primary:
        listing = admin_client.get(TASKS)
        page = admin_client.get(reverse("admin:django_pgqueue_task_change", args=[task_id]))

    assert on_primary.captured_queries == []
    assert [t.pk for t in listing.context["cl"].result_list] == [task_id]
    assert listing.context["cl"].queryset.db == REPLICA
    assert page.context["original"].pk == task_id
    assert "(READ_DATABASE); actions write to the primary" in page.content.decode()


@pytest.mark.django_db
def test_a_standby_that_has_replayed_nothing_yet_shows_an_unknown_lag_not_zero(
    admin_client, monkeypatch
):
    # Given a standby just started: pg_last_xact_replay_timestamp() is still NULL
    monkeypatch.setattr(operations, "replica_lag", lambda: ReplicaLag(REPLICA, True, None))

    page = admin_client.get(OVERVIEW).content.decode()
    document = status_json()
    values = gauges()

    assert "no transaction replayed yet" in page
    assert (document["read_database_is_replica"], document["replica_lag_seconds"]) == (True, None)
    assert ("pgqueue_read_replica_lag_seconds",) not in values
    assert values[("pgqueue_queue_metrics_up",)] == 1


@pytest.mark.django_db
def test_without_read_database_no_lag_is_read_nor_shown(admin_client):
    with CaptureQueriesContext(connections["default"]) as queries:
        page = admin_client.get(OVERVIEW).content.decode()
    document = status_json()
    values = gauges()

    assert operations.replica_lag() is None
    assert not any("pg_last_xact_replay_timestamp" in q["sql"] for q in queries.captured_queries)
    assert "pgqueue-replica-lag" not in page
    assert (document["read_database"], document["replica_lag_seconds"]) == (None, None)
    assert ("pgqueue_read_replica_lag_seconds",) not in values


# -- the writes ------------------------------------------------------------------------
# Each test acts while the replica's replay is paused: the rows to act on are on it,
# what the action writes is not. A write sent to the replica fails (read-only), and a
# read of what was just written, sent there, finds the old rows: the test would fail.


def test_an_action_on_the_list_read_from_the_replica_writes_to_the_primary(replica, admin_client):
    ids = [tasks.noop.enqueue() for _ in range(2)]
    with replica.replay_paused():
        response = admin_client.post(
            TASKS, {"action": "cancel", "_selected_action": ids}, follow=True
        )

        assert "Cancelled 2 task(s)." in messages_of(response)
        assert [primary_state(i) for i in ids] == ["cancelled", "cancelled"]
        assert LogEntry.objects.filter(object_id__in=[str(i) for i in ids]).count() == 2

    replica.replayed()
    assert set(Task.objects.using(REPLICA).values_list("state", flat=True)) == {"cancelled"}


def test_an_action_on_all_rows_of_a_filter_selects_them_again_on_the_primary(replica, admin_client):
    # Given three dead letters, one of which the replica does not have yet
    dead = {"state": "failed", "attempt": 3, "finished_at": timezone.now()}
    ids = [PrimaryTaskFactory(**dead).pk for _ in range(2)]
    with replica.replay_paused():
        ids.append(PrimaryTaskFactory(**dead).pk)

        # When an operator retries "all" of the list filtered on failed, and confirms
        select_all = {"action": "retry_now", "select_across": "1", "index": "0",
                      "_selected_action": ids[:1]}  # fmt: skip
        count = admin_client.post(f"{TASKS}?state__exact=failed", select_all)
        response = admin_client.post(
            f"{TASKS}?state__exact=failed",
            {**select_all, "pgqueue_confirm": "yes", "pgqueue_upto": count.context["upto"]},
            follow=True,
        )

        # Then "all" is every dead letter on the primary, the third too: counted, and done
        assert count.context["count"] == 3
        assert "Retry now: 3 tasks done in 1 batch of up to 1000." in messages_of(response)
        assert [primary_state(i) for i in ids] == ["pending"] * 3


def test_an_action_acts_on_the_rows_as_the_primary_has_them_not_the_replicas_copy(
    replica, admin_client
):
    # Given a task the replica still shows pending, which has succeeded on the primary
    task_id = tasks.noop.enqueue()
    with replica.replay_paused():
        replica.primary_sql(
            "UPDATE pgqueue_task SET state = 'succeeded', finished_at = now() WHERE id = %s",
            [task_id],
        )
        assert Task.objects.using(REPLICA).get(pk=task_id).state == "pending"

        # When an operator selects it on the list and cancels it
        response = admin_client.post(
            TASKS, {"action": "cancel", "_selected_action": [task_id]}, follow=True
        )

    # Then the selection was taken again on the primary: nothing to cancel
    assert messages_of(response) == [
        "Nothing to do: cancel applies to scheduled, pending, waiting, running tasks only."
    ]
    assert primary_state(task_id) == "succeeded"


def test_a_detail_page_button_writes_to_the_primary(replica, admin_client):
    task_id = PrimaryTaskFactory(state="failed", attempt=3, finished_at=timezone.now()).pk
    operate = reverse("admin:django_pgqueue_task_operate", args=[task_id, "requeue"])

    with replica.replay_paused():
        response = admin_client.post(operate, follow=True)

        assert "Requeued 1 task with a fresh attempt budget." in messages_of(response)
        assert primary_state(task_id) == "pending"


def test_delete_from_the_detail_page_deletes_on_the_primary(replica, admin_client):
    task_id = PrimaryTaskFactory(state="succeeded", finished_at=timezone.now()).pk
    delete = reverse("admin:django_pgqueue_task_delete", args=[task_id])

    with replica.replay_paused():
        response = admin_client.post(delete, {"post": "yes"}, follow=True)

        assert response.status_code == 200
        assert primary_state(task_id) is None


def test_send_signal_writes_to_the_primary(replica, admin_client):
    task_id = PrimaryTaskFactory(state="waiting", wait_reason="signal", wait_signal="approved").pk
    send = reverse("admin:django_pgqueue_task_signal", args=[task_id])

    with replica.replay_paused():
        response = admin_client.post(
            send, {"name": "approved", "payload": '{"by": "ops"}'}, follow=True
        )

        assert any("is pending now" in m for m in messages_of(response)), messages_of(response)
        assert primary_state(task_id) == "pending"


def test_pause_and_resume_from_the_overview_write_to_the_primary(replica, admin_client):
    pause_url = reverse("admin:django_pgqueue_queueoverview_pause")

    def paused_on_primary() -> bool:
        # values_list: last_escape_at may be -infinity, which a datetime cannot hold.
        return Queue.objects.using(PRIMARY).values_list("paused", flat=True).get(pk="default")

    with replica.replay_paused():
        admin_client.post(pause_url, {"queue": "default", "action": "pause"})
        paused = paused_on_primary()
        admin_client.post(pause_url, {"queue": "default", "action": "resume"})

        assert paused is True
        assert paused_on_primary() is False
        # Each history entry is on the queue's row, read back on the primary at once.
        assert list(
            LogEntry.objects.filter(object_id="default").values_list("change_message", flat=True)
        ) == ["Resumed queue default.", "Paused queue default."]


def test_run_now_of_a_schedule_enqueues_on_the_primary(replica, admin_client):
    schedule = periodic(periodic_tasks.beat, every=1, name="replica_run_now")
    try:
        Schedule.objects.using(PRIMARY).create(
            name=schedule.name, task_name=schedule.task.name, spec=schedule.spec, timezone="UTC"
        )
        with replica.replay_paused():
            response = admin_client.post(
                SCHEDULES, {"action": "run_now", "_selected_action": [schedule.name]}, follow=True
            )

            assert any(m.startswith("Enqueued 1 task(s) now") for m in messages_of(response))
            assert Task.objects.using(PRIMARY).filter(task_name=schedule.task.name).count() == 1
    finally:
        schedule_registry.unregister(schedule.name)
