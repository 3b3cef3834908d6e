"""Chaos: workers SIGKILLed and SIGSTOPped at random while they drain the queue.

Three workers with a 2 s lease run tasks that arrive steadily. For CHAOS_SECONDS a
random worker is SIGKILLed (and replaced) every 2-5 s, and another is SIGSTOPped,
alternately for less than the lease (0.5-1.5 s) and for more (3-4.5 s: those runs are
taken over, and their overlap with the next run is justified by the expired lease); some
enqueues happen in transactions that roll back. Then the ledger (tests/ledger.py) is
checked against the rows: every committed task succeeded, nothing rolled back ran, and
no two runs of a task overlapped unless the first one's lease had expired.

PGQUEUE_CHAOS_SEED replays the same sequence of decisions (the timing still varies);
PGQUEUE_CHAOS_SECONDS makes the run longer (``tox -e chaos``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection, transaction

from django_pgqueue.models import Task
from tests import ledger
from tests.conftest import WorkerProcess, wait_until
from tests.ledger_tasks import ledger_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST_LEASE = ("--lease", "2", "--heartbeat", "0.5", "--sweep-interval", "0.25")
CHAOS_SECONDS = float(os.environ.get("PGQUEUE_CHAOS_SECONDS", "40"))
# Tasks arrive steadily, a batch every half second, a little slower than the workers run
# them: a recovered task goes back to the end of the queue, and behind a backlog it
# would only run again long after the pause that lost it was over.
BATCH_EVERY = 0.5
BATCH_SIZE = 20


class Rollback(Exception):
    """Raised to roll an atomic block back."""


class Monkey:
    """Kills and pauses the workers; restarts the killed ones; keeps count."""

    def __init__(self, start: Callable[[], WorkerProcess], ledger_path: Path,
                 rng: random.Random, workers: int) -> None:
        self.start = start
        self.ledger_path = ledger_path
        self.rng = rng
        self.live = [start() for _ in range(workers)]
        self.paused: dict[WorkerProcess, float] = {}  # worker -> when to resume it
        self.kills = 0
        self.pauses: list[float] = []

    def kill_one(self) -> None:
        victim = self.rng.choice(self.live)
        victim.kill()
        ledger.record_exit(self.ledger_path, victim.pid)
        self.paused.pop(victim, None)
        self.live.remove(victim)
        self.live.append(self.start())
        self.kills += 1

    def pause_one(self, now: float) -> None:
        running = [w for w in self.live if w not in self.paused and w.proc.poll() is None]
        if not running:
            return
        worker = self.rng.choice(running)
        longer_than_lease = len(self.pauses) % 2 == 0
        seconds = self.rng.uniform(3.0, 4.5) if longer_than_lease else self.rng.uniform(0.5, 1.5)
        worker.signal(signal.SIGSTOP)
        self.paused[worker] = now + seconds
        self.pauses.append(seconds)

    def resume_due(self, now: float) -> None:
        for worker, until in list(self.paused.items()):
            if until <= now:
                worker.signal(signal.SIGCONT)
                del self.paused[worker]

    def resume_all(self) -> None:
        self.resume_due(float("inf"))


def enqueue_batch(first: int, committed: list[int], rolled_back: list[int]) -> None:
    """BATCH_SIZE committed tasks, and a few whose enqueue is rolled back with a savepoint
    (the batch's own transaction commits) or with a whole transaction."""
    with transaction.atomic():
        committed.extend(ledger_run.enqueue_many([(n,) for n in range(first, first + BATCH_SIZE)]))
        with contextlib.suppress(Rollback), transaction.atomic():
            rolled_back.append(ledger_run.enqueue(-1))
            rolled_back.append(ledger_run.enqueue_on_commit(-2))
            raise Rollback
    with contextlib.suppress(Rollback), transaction.atomic():
        rolled_back.extend(ledger_run.enqueue_many([(-3,), (-4,)]))
        rolled_back.append(ledger_run.enqueue_on_commit(-5))
        raise Rollback


def test_killed_and_paused_workers_run_every_committed_task_and_overlap_only_after_lease_expiry(
    start_worker, tmp_path, monkeypatch
):
    seed = int(os.environ.get("PGQUEUE_CHAOS_SEED", time.time_ns() % 1_000_000))
    print(f"chaos seed {seed} (PGQUEUE_CHAOS_SEED={seed} replays it)")
    rng = random.Random(seed)
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    committed: list[int] = []
    rolled_back: list[int] = []

    # Given three workers with a 2 s lease
    monkey = Monkey(lambda: start_worker(*FAST_LEASE, "--concurrency", "6", wait=False),
                    path, rng, workers=3)
    for worker in monkey.live:
        worker.wait_started()

    # When tasks arrive while workers are killed and paused
    began = time.monotonic()
    next_batch = next_kill = next_pause = 0.0
    try:
        while (now := time.monotonic() - began) < CHAOS_SECONDS:
            if now >= next_batch and next_batch <= CHAOS_SECONDS - 5:
                enqueue_batch(len(committed), committed, rolled_back)
                next_batch += BATCH_EVERY
            if now >= next_kill and now > 1:
                monkey.kill_one()
                next_kill = now + rng.uniform(2, 5)
            monkey.resume_due(now)
            if now >= next_pause and not monkey.paused:
                monkey.pause_one(now)
                next_pause = now + rng.uniform(0.5, 2)
            time.sleep(0.05)
    finally:
        monkey.resume_all()

    # Then, once the survivors have drained the queue:
    with contextlib.suppress(AssertionError):  # what is missing, the check reports
        wait_until(
            lambda: not Task.objects.filter(pk__in=committed, state__in=["pending", "running"])
            .exists(),
            timeout=60, interval=0.25, message="the queue to drain",
        )
    for worker in monkey.live:
        worker.stop()
    report = ledger.check(ledger.read(path), ledger.task_rows(connection.cursor()),
                          committed, rolled_back)
    print(report.summary())
    report.assert_clean()
    # ... and the chaos did happen
    assert monkey.kills >= CHAOS_SECONDS / 8
    assert sum(1 for seconds in monkey.pauses if seconds > 3) >= CHAOS_SECONDS / 10
    assert report.justified_overlaps > 0, "no pause outlived a lease while a task ran"
