"""The archive before pruning: every row retention deletes is first written, durably, to
gzip JSON Lines, one file per day and database; nothing whose write failed is
deleted; ``pgqueue_requeue --from-archive`` brings an archived task back."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from django_pgqueue.models import Task
from django_pgqueue.ops import retention
from django_pgqueue.ops.archive import Archive, ArchiveError
from django_pgqueue.ops.operations import prune_expired
from django_pgqueue.worker.pruner import Pruner
from django_pgqueue.worker.stats import WorkerStats
from tests.conftest import wait_until
from tests.factories import TaskFactory
from tests.test_retention import lock_waits

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = 3600.0


def finished(state: str, at: datetime, **kwargs) -> Task:
    return TaskFactory(state=state, finished_at=at, **{"attempt": 1, **kwargs})


def days_ago(days: float) -> datetime:
    return timezone.now() - timedelta(days=days)


def day_of(moment: datetime) -> str:
    return moment.astimezone(UTC).date().isoformat()


def archived(path: Path) -> list[dict]:
    """The rows of an archive file, as standard gzip reads them (every member)."""
    unpacked = subprocess.run(["gzip", "-dc", str(path)], capture_output=True, check=True)
    return [json.loads(line) for line in unpacked.stdout.splitlines()]


def remaining() -> set[int]:
    return set(Task.objects.values_list("pk", flat=True))


def prune(directory: Path, **kwargs) -> int:
    return prune_expired(
        result_ttl=HOUR, dead_ttl=HOUR, batch=100, archive_dir=str(directory), **kwargs
    )


def test_every_row_pruned_is_in_the_archive_first_whole(tmp_path):
    at = days_ago(2)
    expired = [
        finished("succeeded", at, args=[1, "x"], kwargs={"k": "v"}, metadata={"m": 1}),
        finished("cancelled", at),
        finished("failed", at, errors=[{"attempt": 1, "type": "ValueError", "message": "no"}]),
    ]
    young = finished("succeeded", timezone.now())

    deleted = prune(tmp_path)

    assert deleted == 3
    assert remaining() == {young.pk}
    [path] = tmp_path.iterdir()
    assert path.name == f"pgqueue-default-{day_of(at)}.jsonl.gz"
    rows = {row["id"]: row for row in archived(path)}
    assert set(rows) == {t.pk for t in expired}
    first = rows[expired[0].pk]
    assert (first["args"], first["kwargs"], first["metadata"]) == ([1, "x"], {"k": "v"}, {"m": 1})
    assert (first["state"], first["task_name"], first["queue"]) == (
        "succeeded",
        "tests.tasks.noop",
        "default",
    )
    assert datetime.fromisoformat(first["finished_at"]) == expired[0].finished_at
    assert rows[expired[2].pk]["errors"][0]["message"] == "no"


def test_one_file_per_day_the_tasks_finished_and_appends_keep_every_batch(tmp_path):
    monday, tuesday = days_ago(3), days_ago(2)
    first = [finished("succeeded", monday), finished("succeeded", tuesday)]
    prune(tmp_path)
    second = [finished("failed", monday)]

    prune(tmp_path)

    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(
        f"pgqueue-default-{day_of(d)}.jsonl.gz" for d in (monday, tuesday)
    )
    monday_file = tmp_path / f"pgqueue-default-{day_of(monday)}.jsonl.gz"
    assert [r["id"] for r in archived(monday_file)] == [first[0].pk, second[0].pk]


def test_a_batch_whose_archive_write_fails_deletes_nothing(tmp_path):
    """Two days in one batch: the second day's file cannot be written (its name is
    taken by a directory), so the batch's transaction deletes no row, not even those
    whose day was written."""
    ok_day, bad_day = days_ago(3), days_ago(2)
    rows = [finished("succeeded", ok_day), finished("succeeded", bad_day)]
    (tmp_path / f"pgqueue-default-{day_of(bad_day)}.jsonl.gz").mkdir()

    with pytest.raises(ArchiveError, match="the rows of this batch were not deleted"):
        prune(tmp_path)

    assert remaining() == {t.pk for t in rows}


def test_a_missing_archive_directory_is_refused_and_nothing_is_deleted(tmp_path):
    row = finished("succeeded", days_ago(2))

    with pytest.raises(CommandError, match=r"does not exist .* create it"):
        call_command("pgqueue_prune", "--archive", str(tmp_path / "unmounted"))

    assert remaining() == {row.pk}


def test_pgqueue_prune_archives_into_the_directory_it_is_given(tmp_path, capsys):
    rows = [finished("succeeded", days_ago(2)) for _ in range(3)]

    call_command("pgqueue_prune", "--archive", str(tmp_path), "--result-ttl", "3600")

    assert f"deleted 3 task(s), archived in {tmp_path}" in capsys.readouterr().out
    [path] = tmp_path.iterdir()
    assert {r["id"] for r in archived(path)} == {t.pk for t in rows}


def test_a_member_cut_short_by_a_crash_is_cut_off_before_the_next_append(tmp_path):
    """A crash in the middle of an append leaves half a gzip member at the end (its rows
    were not deleted); the next append cuts it off first, so the file stays readable
    by gzip, with every row it was given whole."""
    at = days_ago(2)
    kept = finished("succeeded", at)
    prune(tmp_path)
    path = tmp_path / f"pgqueue-default-{day_of(at)}.jsonl.gz"
    half = gzip.compress(b'{"id": 999999, "state": "succeeded"}\n' * 50, mtime=0)
    with open(path, "ab") as file:
        file.write(half[: len(half) // 2])
    later = finished("failed", at)

    prune(tmp_path)

    assert [r["id"] for r in archived(path)] == [kept.pk, later.pk]


def test_large_rows_are_archived_in_batches_bounded_in_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(retention, "ARCHIVE_BATCH_BYTES", 50_000)
    # Hex of random bytes: PostgreSQL's compression barely shrinks it.
    rows = [finished("succeeded", days_ago(2), args=[os.urandom(10_000).hex()]) for _ in range(10)]
    statements: list[int] = []
    original = Archive.write

    def counting(self, lines):
        statements.append(len(lines))
        return original(self, lines)

    monkeypatch.setattr(Archive, "write", counting)

    assert prune(tmp_path) == 10

    assert len(statements) > 1 and max(statements) < 10
    [path] = tmp_path.iterdir()
    assert sorted(r["id"] for r in archived(path)) == sorted(t.pk for t in rows)
    assert not remaining()


def test_a_row_another_pruner_holds_is_neither_archived_nor_deleted(tmp_path, pg):
    """SKIP LOCKED: two pruners archive different rows, never one row twice."""
    held, free = finished("succeeded", days_ago(2)), finished("succeeded", days_ago(2))
    pg.execute("BEGIN")
    pg.execute("SELECT 1 FROM pgqueue_task WHERE id = %s FOR UPDATE", [held.pk])
    try:
        assert prune(tmp_path) == 1
    finally:
        pg.execute("ROLLBACK")

    assert remaining() == {held.pk}
    [path] = tmp_path.iterdir()
    assert [r["id"] for r in archived(path)] == [free.pk]


def test_a_dead_letter_retried_while_it_is_archived_stays_in_the_table(tmp_path, pg):
    """The archive's pick re-checks a row it waited for: one made pending meanwhile is
    neither written nor deleted."""
    dead = finished("failed", days_ago(2))
    pg.execute("BEGIN")
    pg.execute("UPDATE pgqueue_task SET state = 'pending', finished_at = NULL WHERE id = %s",
               [dead.pk])  # fmt: skip
    result: list[int] = []

    def run() -> None:
        try:
            result.append(prune(tmp_path))
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    # The pick skips a locked row rather than wait: the prune finishes at once.
    thread.join(10)
    pg.execute("COMMIT")

    assert result == [0]
    assert Task.objects.get(pk=dead.pk).state == "pending"
    assert list(tmp_path.iterdir()) == []
    assert lock_waits("WITH doomed AS") == 0


def test_the_worker_pruner_archives_with_prune_archive_dir(tmp_path):
    rows = [finished("succeeded", days_ago(2)) for _ in range(4)]
    stats = WorkerStats()
    pruner = Pruner(
        "default", interval=0.05, result_ttl=HOUR, dead_ttl=HOUR, batch=3, stats=stats,
        archive_dir=str(tmp_path),
    )  # fmt: skip

    pruner.start()
    try:
        wait_until(lambda: stats.get("pruned") == 4, timeout=10, message="the prune")
    finally:
        pruner.stop()

    [path] = tmp_path.iterdir()
    assert sorted(r["id"] for r in archived(path)) == sorted(t.pk for t in rows)
    assert not remaining()


# -- bringing an archived task back ------------------------------------------------------


def archive_of(*rows: Task, directory: Path) -> Path:
    prune(directory)
    [path] = directory.iterdir()
    assert not remaining() & {t.pk for t in rows}
    return path


def test_an_archived_task_is_brought_back_under_its_own_id_and_runs(tmp_path, start_worker):
    dead = finished(
        "failed", days_ago(2), task_name="tests.tasks.record", args=["again"], attempt=3,
        errors=[{"attempt": 3, "type": "ValueError", "message": "boom"}],
    )  # fmt: skip
    path = archive_of(dead, directory=tmp_path)

    call_command("pgqueue_requeue", "--from-archive", str(path), "--id", str(dead.pk))

    row = Task.objects.get(pk=dead.pk)
    assert (row.state, row.attempt, row.args, row.finished_at) == ("pending", 0, ["again"], None)
    assert row.errors[0]["message"] == "boom"
    start_worker("--burst").wait(30)
    assert Task.objects.get(pk=dead.pk).state == "succeeded"


def test_bringing_back_a_task_whose_id_is_in_the_table_changes_nothing(tmp_path, capsys):
    done = finished("succeeded", days_ago(2), result={"v": 1})
    path = archive_of(done, directory=tmp_path)
    call_command("pgqueue_requeue", "--from-archive", str(path), "--id", str(done.pk))
    Task.objects.filter(pk=done.pk).update(state="succeeded", result={"v": 2})

    with pytest.raises(CommandError, match="1 of 1 task"):
        call_command("pgqueue_requeue", "--from-archive", str(path), "--id", str(done.pk))

    assert "a task with this id is in the table" in capsys.readouterr().out
    assert Task.objects.get(pk=done.pk).result == {"v": 2}


def test_an_id_not_in_the_archive_and_a_live_unique_key_are_reported(tmp_path, capsys):
    keyed = finished("succeeded", days_ago(2), unique_key="report-7")
    path = archive_of(keyed, directory=tmp_path)
    live = TaskFactory(unique_key="report-7")

    with pytest.raises(CommandError, match="2 of 2 task"):
        call_command(
            "pgqueue_requeue", "--from-archive", str(path), "--id", str(keyed.pk), "--id", "424242"
        )

    out = capsys.readouterr().out
    assert f"task 424242: not in {path}" in out
    assert f"task {keyed.pk}: not brought back: a live task holds its unique_key" in out
    assert remaining() == {live.pk}


def test_from_archive_needs_ids():
    with pytest.raises(CommandError, match=r"--from-archive needs .* --id"):
        call_command("pgqueue_requeue", "--from-archive", "x.jsonl.gz")
