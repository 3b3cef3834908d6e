"""The queue doctor (doctor.py, manage.py pgqueue_doctor): each finding made to happen for
real (a connection left idle in transaction, a replication slot, a table bloated with
autovacuum off, a claim index walked through dead entries, workers, queues) and seen
reported, with its evidence.

Tests run on their own databases, but slots and connections are the server's: other
tests' activity shows in the doctor's findings too, so each test looks only at the
evidence of what it made (its slot's name, its session's pid).
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest

from django_pgqueue import __version__
from django_pgqueue.checks import check_settings
from django_pgqueue.core.limits import parse_limits
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.models import Task
from django_pgqueue.ops import doctor
from django_pgqueue.ops.metrics import DoctorCollector
from django_pgqueue.tasking.runtime_schedules import add_schedule
from tests import tasks
from tests.conftest import REPO, wait_until
from tests.factories import TaskFactory
from tests.pgcluster import PrivateCluster, django_env
from tests.test_admin import staff_client  # noqa: F401 - a fixture
from tests.test_metrics import samples

pytestmark = pytest.mark.django_db(transaction=True)

OVERVIEW = reverse("admin:django_pgqueue_queueoverview_changelist")


def findings(*only: str, **thresholds) -> list[doctor.Finding]:
    return doctor.diagnose(thresholds=doctor.Thresholds(**thresholds), only=only)


def found(check: str, **evidence) -> list[doctor.Finding]:
    """The findings of ``check`` whose evidence includes these values."""
    return [
        f
        for f in findings(check)
        if f.check == check and all(f.evidence.get(k) == v for k, v in evidence.items())
    ]


@pytest.fixture
def session(db_url):
    """A plain connection of some application, beside the doctor's (autocommit: each
    test says where its transaction begins)."""
    conn = psycopg.connect(db_url, application_name="forgetful app", autocommit=True)
    yield conn
    conn.close()


def register_worker(pg, worker_id: str, *, concurrency: int = 4, version: str | None = None,
                    queues=("default",), routes=(("tests.tasks.noop", 1),)) -> None:  # fmt: skip
    pg.execute(
        QUERIES["register_worker"],
        {
            "id": worker_id,
            "hostname": "h",
            "pid": 1,
            "queues": json.dumps(list(queues)),
            "routes": json.dumps([list(r) for r in routes]),
            "concurrency": concurrency,
            "version": version,
        },
    )


# -- horizon ------------------------------------------------------------------------------


def test_a_connection_left_idle_in_transaction_is_reported_with_its_pid(session):
    session.execute("BEGIN")
    session.execute("SELECT txid_current(), 'forgotten here'")
    pid = session.info.backend_pid

    def reported(**thresholds) -> doctor.Finding | None:
        mine = [
            f for f in findings("horizon", **thresholds)
            if f.check == "horizon.transaction" and f.evidence["pid"] == pid
        ]  # fmt: skip
        return mine[0] if mine else None

    warning = wait_until(lambda: reported(transaction_seconds=0.3), message="a warning")
    problem = wait_until(lambda: reported(transaction_seconds=0.03), message="a problem")

    assert warning.severity == doctor.WARNING and problem.severity == doctor.PROBLEM
    assert warning.evidence["state"] == "idle in transaction"
    assert warning.evidence["application_name"] == "forgetful app"
    assert "forgotten here" in warning.evidence["query"]
    assert f"pg_terminate_backend({pid})" in warning.fix
    session.execute("ROLLBACK")
    assert reported(transaction_seconds=0.03) is None


def test_an_inactive_replication_slot_is_reported_with_the_wal_it_keeps(pg):
    wal_level, slots = pg.execute(
        "SELECT current_setting('wal_level'), current_setting('max_replication_slots')::int"
    ).fetchone()
    if wal_level == "minimal" or slots == 0:
        pytest.skip(f"this server cannot create slots (wal_level {wal_level}, {slots} slots)")
    name = f"pgqueue_doctor_test_{uuid.uuid4().hex[:12]}"
    # immediately_reserve: the slot keeps WAL from now on, as a standby's slot does.
    pg.execute("SELECT pg_create_physical_replication_slot(%s, true)", [name])
    try:
        [finding] = found("horizon.slot", slot=name)
    finally:
        pg.execute("SELECT pg_drop_replication_slot(%s)", [name])

    assert finding.severity == doctor.WARNING
    assert finding.evidence["active"] is False and finding.evidence["slot_type"] == "physical"
    assert finding.evidence["retained_wal_bytes"] >= 0
    assert f"pg_drop_replication_slot('{name}')" in finding.fix
    assert not found("horizon.slot", slot=name)


def test_a_forgotten_prepared_transaction_is_reported_with_its_gid(session, pg):
    (allowed,) = pg.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
    if allowed == 0:  # PREPARE TRANSACTION is refused here: the next test runs it for real
        return
    gid = f"pgqueue-doctor-{uuid.uuid4().hex[:8]}"
    session.execute("BEGIN")
    session.execute("SELECT txid_current()")
    session.execute(f"PREPARE TRANSACTION '{gid}'")
    try:
        finding = wait_until(
            lambda: [f for f in findings("horizon", transaction_seconds=0.2)
                     if f.evidence.get("gid") == gid],
            message="the prepared transaction reported",
        )[0]  # fmt: skip
    finally:
        pg.execute(f"ROLLBACK PREPARED '{gid}'")

    assert finding.check == "horizon.prepared" and f"ROLLBACK PREPARED '{gid}'" in finding.fix


@pytest.mark.slow  # starts a server of its own
def test_pgqueue_doctor_reports_a_prepared_transaction_on_a_server_that_allows_them():
    """The same finding through the command, on a private cluster that allows prepared
    transactions (a default server has max_prepared_transactions = 0, and refuses them)."""
    cluster = PrivateCluster.create(max_prepared_transactions="2")
    try:
        url = cluster.create_database("doctor")
        gid = "pgqueue-doctor-forgotten"
        with psycopg.connect(url, autocommit=True) as holder:
            holder.execute("BEGIN")
            holder.execute("SELECT txid_current()")
            holder.execute(f"PREPARE TRANSACTION '{gid}'")
        try:
            done = subprocess.run(
                [sys.executable, str(REPO / "manage.py"), "pgqueue_doctor", "--json",
                 "--only", "horizon", "--transaction-age", "0.001"],
                env=django_env(url), cwd=REPO, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
    finally:
        cluster.destroy()

    assert done.returncode in (1, 2), done.stderr
    report = json.loads(done.stdout)
    findings_ = report["findings"] if isinstance(report, dict) else report
    [finding] = [f for f in findings_ if f["check"] == "horizon.prepared"]
    assert finding["evidence"]["gid"] == gid and f"ROLLBACK PREPARED '{gid}'" in finding["fix"]


# -- vacuum, bloat, the claim index ---------------------------------------------------------


def fill(pg, rows: int, pad: int = 200) -> None:
    pg.execute(
        "INSERT INTO pgqueue_task (queue, task_name, args) "
        "SELECT 'default', 'tests.tasks.noop', jsonb_build_array(n, repeat('x', %s)) "
        "FROM generate_series(1, %s) AS n",
        [pad, rows],
    )
    # This session's counts reach the statistics before what follows (ANALYZE).
    pg.execute("SELECT pg_stat_force_next_flush()")


def settle_all_but(pg, left: int) -> None:
    """Claim and finish every pending task but the last ``left``, as workers would
    (oldest first: the dead entries lie in front of the route's head)."""
    pg.execute(
        "UPDATE pgqueue_task SET state = 'succeeded', attempt = 1, finished_at = now() "
        "WHERE id IN (SELECT id FROM pgqueue_task WHERE state = 'pending' ORDER BY id DESC "
        "OFFSET %s)",
        [left],
    )
    pg.execute("SELECT pg_stat_force_next_flush()")


@override_settings(PGQUEUE={"VACUUM_THRESHOLD": 1000})
def test_dead_tuples_and_bloat_of_a_table_without_autovacuum_are_reported(pg):
    pg.execute("ALTER TABLE pgqueue_task SET (autovacuum_enabled = false)")
    fill(pg, 20_000)
    pg.execute("ANALYZE pgqueue_task")
    settle_all_but(pg, 0)
    pg.execute("DELETE FROM pgqueue_task")
    pg.execute("SELECT pg_stat_force_next_flush()")

    def dead() -> doctor.Finding | None:
        [finding] = [f for f in findings("vacuum", "bloat", bloat_bytes=1_000_000)
                     if f.check == "vacuum.dead_tuples"]  # fmt: skip
        return finding if finding.evidence["dead_tuples"] >= 20_000 else None

    finding = wait_until(dead, message="the statistics to count the dead tuples")
    everything = findings("vacuum", "bloat", bloat_bytes=1_000_000)

    assert finding.severity == doctor.WARNING
    assert finding.evidence["warning_at"] == 5000  # 5 x VACUUM_THRESHOLD; 10 x that a problem
    assert "VACUUM (ANALYZE) pgqueue_task" in finding.fix
    [autovacuum] = [f for f in everything if f.check == "vacuum.autovacuum"]
    assert autovacuum.evidence["autovacuum_table"] is False
    [table] = [f for f in everything if f.check == "bloat.table"]
    assert table.severity == doctor.WARNING and table.evidence["bloat_ratio"] > 0.9
    indexes = {f.evidence["index"] for f in everything if f.check == "bloat.index"}
    assert "pgqueue_task_pkey" in indexes
    pg.execute("VACUUM pgqueue_task")
    pg.execute("SELECT pg_stat_force_next_flush()")
    wait_until(lambda: not dead(), message="VACUUM to be seen")


def test_the_claim_index_walked_through_dead_entries_kept_by_a_snapshot_is_reported(
    pg, session
):
    """A snapshot older than the claims keeps their dead entries: finding the route's
    head reads them all, on every claim, until the snapshot goes and VACUUM runs."""
    fill(pg, 20_000)
    pg.execute("VACUUM ANALYZE pgqueue_task")
    clean = findings("claim")[0]
    session.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    session.execute("SELECT count(*) FROM pgqueue_worker")  # its snapshot, from now on
    settle_all_but(pg, 10)
    pg.execute("VACUUM pgqueue_task")  # cannot remove what the snapshot may see

    [held] = findings("claim", claim_buffers=500)
    session.execute("ROLLBACK")
    pg.execute("VACUUM pgqueue_task")
    [after] = findings("claim", claim_buffers=500)

    assert clean.severity == doctor.INFO and clean.evidence["buffers"] < 20
    assert held.severity in (doctor.WARNING, doctor.PROBLEM)
    assert held.evidence["buffers"] > 50 * clean.evidence["buffers"]
    assert held.evidence["index"] == "pgqueue_task_claim"
    assert (held.evidence["queue"], held.evidence["task_name"]) == ("default", "tests.tasks.noop")
    assert after.severity == doctor.INFO and after.evidence["buffers"] < 20


# -- queues -------------------------------------------------------------------------------


@pytest.mark.slow
@override_settings(PGQUEUE={"QUEUE_LIMITS": {"default": {"latency_objective": 0.5}}})
def test_waits_past_a_queues_latency_objective_are_reported(start_worker):
    """Tasks due while no worker runs wait past the objective; once a worker has run
    them, their waits from due to start are over it."""
    ids = tasks.noop.enqueue_many([() for _ in range(5)])
    wait_until(
        lambda: Task.objects.filter(pk__in=ids, run_at__lt=timezone.now() - timedelta(seconds=1)),
        message="the tasks to be due for a second",
    )
    [waiting] = findings("queues.latency")
    start_worker("--burst").wait(30)

    [finding] = findings("queues.latency")

    assert waiting.evidence["oldest_due_seconds"] > 0.5 and waiting.evidence["started"] == 0
    assert finding.severity in (doctor.WARNING, doctor.PROBLEM)
    assert finding.evidence["queue"] == "default" and finding.evidence["started"] == 5
    assert finding.evidence["p95_seconds"] > finding.evidence["objective_seconds"] == 0.5


def test_a_growing_backlog_is_reported_with_its_trend():
    TaskFactory.create_batch(5, run_at=timezone.now() - timedelta(minutes=20))
    TaskFactory.create_batch(40, run_at=timezone.now() - timedelta(minutes=5))

    [finding] = findings("queues.backlog", backlog_growth=10)

    assert finding.severity == doctor.WARNING
    assert finding.evidence == {
        "queue": "default",
        "depth_now": 45,
        "depth_before": 5,
        "window_minutes": 15,
        "per_minute": round(40 / 15, 1),
    }


def test_due_tasks_of_a_queue_no_live_worker_serves_are_a_problem(pg):
    register_worker(pg, "w-default")
    tasks.other_queue.enqueue()

    [finding] = findings("queues.unserved")

    assert finding.severity == doctor.PROBLEM
    assert finding.evidence["queue"] == "other" and finding.evidence["due"] == 1
    assert "runtaskworker --queues other" in finding.fix


# -- workers --------------------------------------------------------------------------------


def test_the_workers_releases_handler_versions_and_routes_are_reported(start_worker, pg):
    worker = start_worker("--queues", "default")
    register_worker(pg, "old-1", version=None, routes=(("tests.versioned", 1),))
    TaskFactory(task_name="tests.versioned", handler_version=9)

    found_now = {f.check: f for f in findings("workers")}

    releases = found_now["workers.versions"].evidence["releases"]
    assert len(releases[__version__]) == 1 and releases["older than 0.2 (unknown)"] == ["old-1"]
    assert "rolling deploy" in found_now["workers.versions"].summary
    versions = found_now["workers.handler_versions"]
    assert versions.evidence["task_name"] == "tests.versioned"
    assert set(versions.evidence["versions"]) == {"1", "2"}
    unroutable = found_now["workers.unroutable"]
    assert (unroutable.evidence["task_name"], unroutable.evidence["handler_version"]) == (
        "tests.versioned",
        9,
    )
    assert ["tests.tasks.noop", 1] in found_now["workers.unused_routes"].evidence["routes"]
    worker.stop()


def test_workers_that_may_need_more_connections_than_the_server_allows_are_reported(pg):
    register_worker(pg, "big-1", concurrency=400)
    register_worker(pg, "big-2", concurrency=400)

    by_check = {f.check: f for f in findings("connections")}

    budget = by_check["connections.budget"]
    assert budget.severity == doctor.WARNING
    assert budget.evidence["budget"] == 2 * (400 + doctor.WORKER_OWN_CONNECTIONS)
    assert budget.evidence["budget"] > budget.evidence["available"]
    use = by_check["connections.use"]
    assert 1 <= use.evidence["this_database"] <= use.evidence["used"] <= use.evidence["available"]


# -- settings -------------------------------------------------------------------------------


@override_settings(
    PGQUEUE={
        "LEASE_SECONDS": 30.0,
        "HEARTBEAT_SECONDS": 10.0,
        "DEAD_CONNECTION_TIMEOUT": 25.0,
        "WORKER_STALE_AFTER": 15.0,
        "RESULT_TTL": 3600.0,
        "QUEUE_LIMITS": {"slow": {"rate": "1/m", "latency_objective": 5}},
    }
)
def test_settings_that_contradict_each_other_are_reported():
    add_schedule("weekly-report", "tests.tasks.noop", cron="0 7 * * mon")

    by_check = {f.check: f for f in findings("settings")}

    assert set(by_check) == {
        "settings.lease",
        "settings.stale_after",
        "settings.retention",
        "settings.latency_objective",
    }
    assert all(f.severity == doctor.WARNING for f in by_check.values())
    assert by_check["settings.retention"].evidence["schedule"] == "weekly-report"
    assert by_check["settings.retention"].evidence["period_seconds"] == 7 * 24 * 3600
    assert by_check["settings.latency_objective"].evidence["rate"] == "1/m"


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "10s", True])
def test_a_latency_objective_that_is_not_a_positive_number_is_refused(bad):
    with pytest.raises(ValueError, match=r"\['latency_objective'\] must be a number of seconds"):
        parse_limits({"emails": {"latency_objective": bad}})
    with override_settings(PGQUEUE={"QUEUE_LIMITS": {"emails": {"latency_objective": bad}}}):
        assert [m.id for m in check_settings(None)] == ["django_pgqueue.E020"]


def test_a_latency_objective_alone_sets_no_limit_on_the_claim():
    [limit] = parse_limits({"emails": {"latency_objective": 2}}).values()

    assert (limit.concurrency, limit.rate, limit.latency_objective) == (None, None, 2.0)


# -- what runs the checks -------------------------------------------------------------------


def test_a_check_that_cannot_run_is_a_finding_and_the_others_still_run(session):
    """The task table locked by a migration-like session: the checks that read it time
    out and say so; the horizon check still names the session."""
    session.execute("BEGIN")
    session.execute("LOCK TABLE pgqueue_task IN ACCESS EXCLUSIVE MODE")
    session.execute("SELECT pg_current_xact_id()")  # as a migration's DDL would take

    found_now = findings("horizon", "vacuum", statement_timeout=0.3, transaction_seconds=0)

    [error] = [f for f in found_now if f.check == "doctor.error"]
    assert error.evidence == {"group": "vacuum"} and "statement timeout" in error.summary
    assert session.info.backend_pid in [
        f.evidence.get("pid") for f in found_now if f.check == "horizon.transaction"
    ]


def test_the_command_exits_0_healthy_1_warnings_2_problems(pg, capsys):
    call_command("pgqueue_doctor", "--only", "settings")
    assert "pgqueue_doctor: healthy" in capsys.readouterr().out

    name = f"pgqueue_doctor_test_{uuid.uuid4().hex[:12]}"
    pg.execute("SELECT pg_create_physical_replication_slot(%s, true)", [name])
    try:
        with pytest.raises(SystemExit) as exit_1:
            call_command("pgqueue_doctor", "--only", "horizon.slot")
    finally:
        pg.execute("SELECT pg_drop_replication_slot(%s)", [name])
    assert exit_1.value.code == 1
    assert f"WARNING horizon.slot [default]: replication slot {name!r}" in capsys.readouterr().out

    tasks.other_queue.enqueue()
    with pytest.raises(SystemExit) as exit_2:
        call_command("pgqueue_doctor", "--only", "queues", "--json")
    assert exit_2.value.code == 2
    document = json.loads(capsys.readouterr().out)
    assert document["status"] == "problems"
    [unserved] = [f for f in document["findings"] if f["check"] == "queues.unserved"]
    assert set(unserved) == {"check", "severity", "summary", "fix", "evidence", "database"}
    assert unserved["evidence"]["queue"] == "other" and unserved["database"] == "default"


def test_the_command_names_the_session_it_reports_in_json(session, capsys):
    session.execute("BEGIN")
    session.execute("SELECT txid_current()")
    pid = session.info.backend_pid

    def reported() -> list[dict]:
        with contextlib.suppress(SystemExit):
            call_command(
                "pgqueue_doctor", "--only", "horizon", "--json", "--transaction-age", "0.2"
            )
        document = json.loads(capsys.readouterr().out)
        return [f for f in document["findings"] if f["evidence"].get("pid") == pid]

    [finding] = wait_until(reported, message="the session to be reported")

    assert finding["check"] == "horizon.transaction"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--only", "nonsense"], "no check 'nonsense'"),
        (["--ignore", "vacuuum.autovacuum"], "no check 'vacuuum.autovacuum'"),
        (["--transaction-age", "0"], "--transaction-age must be seconds greater than 0"),
        (["--database", "nope"], "--database 'nope' holds no task table"),
    ],
)
def test_the_command_refuses_what_it_cannot_check(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("pgqueue_doctor", *args)


def test_ignored_checks_are_left_out():
    tasks.other_queue.enqueue()

    kept = doctor.diagnose(ignore=["queues.unserved"])

    assert "queues.unserved" not in {f.check for f in kept}
    assert "queues.backlog" in {f.check for f in kept}


def test_the_doctor_gauge_counts_findings_by_check_and_severity(pg):
    tasks.other_queue.enqueue()
    registry = CollectorRegistry()
    registry.register(DoctorCollector(ttl=0))

    values = samples(generate_latest(registry).decode())

    key = ("pgqueue_doctor_findings", ("check", "queues.unserved"), ("severity", "problem"))
    assert values[key] == 1
    assert values[
        ("pgqueue_doctor_findings", ("check", "horizon.prepared"), ("severity", "problem"))
    ] == 0
    assert values[("pgqueue_doctor_up",)] == 1


def test_the_overview_page_shows_the_doctors_warnings_and_problems(staff_client):  # noqa: F811
    tasks.other_queue.enqueue()

    html = staff_client("view_task").get(OVERVIEW).content.decode()

    panel = html.split('id="pgqueue-health"', 1)[1].split('<div class="module pgqueue-chart">')[0]
    assert 'data-status="problems"' in html
    assert 'data-check="queues.unserved" data-severity="problem"' in panel
    assert "runtaskworker --queues other" in panel


def test_every_check_id_is_documented():
    operations = (REPO / "docs" / "operations.md").read_text()

    assert [c for c in doctor.CHECK_IDS if f"`{c}`" not in operations] == []
