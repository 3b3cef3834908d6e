"""A real PostgreSQL restart under running workers.

The server is a private cluster the test owns (tests/pgcluster.py): it is crashed
(``immediate``) or shut down cleanly (``fast``) and started again while workers drain the
queue. What the handlers did is read from the ledger (tests/ledger.py), a file outside
the database, and checked against the rows: every task succeeded, and no two runs of a
task overlapped unless the first one's lease had expired.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests import ledger
from tests.conftest import wait_until
from tests.pgcluster import ClusterUnavailable, PrivateCluster, django_shell

# start_worker's fixtures need the transactional database; restarts of a private cluster
# are slow.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    try:
        cluster = PrivateCluster.create()
    except ClusterUnavailable as exc:
        pytest.skip(f"no private PostgreSQL cluster: {exc}")
    try:
        cluster.create_database("pgqueue")
        yield cluster
    finally:
        cluster.destroy()


@dataclass
class PrivateQueue:
    cluster: PrivateCluster
    url: str
    ledger: Path

    def enqueue(self, calls: list[tuple]) -> list[int]:
        """ledger_run.enqueue_many(calls) in a Django process on the private database."""
        out = django_shell(self.url, (
            "import json; from tests.ledger_tasks import ledger_run; "
            f"print(json.dumps(ledger_run.enqueue_many({calls!r})))"
        ))
        return json.loads(out.splitlines()[-1])

    def ended(self) -> int:
        return sum(1 for e in ledger.read(self.ledger) if e["event"] == "end")

    def runs(self) -> list[ledger.Run]:
        """Every run so far, by start time."""
        runs = ledger.runs_of(ledger.read(self.ledger)).values()
        return sorted((run for task_runs in runs for run in task_runs), key=lambda r: r.start)

    def succeeded(self) -> int:
        """How many tasks succeeded; -1 while the server is unreachable."""
        try:
            with self.cluster.connect("pgqueue") as conn:
                return conn.execute(
                    "SELECT count(*) FROM pgqueue_task WHERE state = 'succeeded'"
                ).fetchone()[0]
        except psycopg.OperationalError:
            return -1

    def check(self, committed: list[int]) -> ledger.LedgerReport:
        with self.cluster.connect("pgqueue") as conn:
            rows = ledger.task_rows(conn.cursor())
        return ledger.check(ledger.read(self.ledger), rows, committed)


@pytest.fixture
def private_queue(cluster: PrivateCluster, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[PrivateQueue]:
    """The private database, emptied, and a fresh ledger for the workers to write."""
    if not cluster.is_running():  # an earlier test failed while the server was down
        cluster.start()
    with cluster.connect("pgqueue") as conn:
        conn.execute("TRUNCATE pgqueue_task, pgqueue_worker")
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(path))
    yield PrivateQueue(cluster, cluster.url("pgqueue"), path)
    if not cluster.is_running():
        cluster.start()
    cluster.reset_configuration()


@pytest.mark.parametrize("mode", ["immediate", "fast"])
def test_server_restarts_during_a_drain_lose_no_task_and_overlap_no_run(
    private_queue, start_worker, mode
):
    # Given 2,000 tasks (20-300 ms each, 1 s for every 100th) and two workers draining them
    total = 2000
    ids = private_queue.enqueue([(n,) for n in range(total)])
    workers = [start_worker("--concurrency", "10", database_url=private_queue.url)
               for _ in range(2)]

    # When the server is restarted twice, a fifth and a half of the way through
    for fraction in (0.2, 0.5):
        wait_until(lambda f=fraction: private_queue.ended() >= f * total, timeout=60,
                   interval=0.05, message=f"{fraction:.0%} of the tasks to run")
        private_queue.cluster.restart(mode)

    # Then every task succeeds, and no run of a task overlapped another
    with contextlib.suppress(AssertionError):  # what is missing, the check reports
        wait_until(lambda: private_queue.succeeded() == total, timeout=90, interval=0.2,
                   message="every task to succeed after the restarts")
    for worker in workers:
        worker.stop()
    private_queue.check(ids).assert_clean()
    for worker in workers:
        assert "database unavailable" in worker.log(), "the restart did not reach the worker"


def test_a_server_crash_forgets_no_claim_so_no_running_task_starts_again(
    private_queue, start_worker
):
    # Given WAL the server has not flushed stays unflushed for 10 s (an asynchronously
    # committed claim would sit in memory that long); two workers whose heartbeat (a
    # durable write, which would flush it) does not come round during the test, and
    # with free slots, so a claim the crash forgot would be taken again at once
    private_queue.cluster.configure(wal_writer_delay="10s")
    workers = [
        start_worker("--concurrency", "10", "--lease", "60", "--heartbeat", "20",
                     database_url=private_queue.url)
        for _ in range(2)
    ]
    # ... running 8 tasks of 4 s
    ids = private_queue.enqueue([(n, 4.0) for n in range(8)])
    wait_until(lambda: len(private_queue.runs()) == 8, timeout=30,
               message="the 8 tasks to start")

    # When the server crashes while they run
    crashed_at = time.time()
    private_queue.cluster.restart("immediate")

    # Then the runs that were going finish and succeed; nothing starts them again meanwhile
    with contextlib.suppress(AssertionError):  # what is missing, the check reports
        wait_until(lambda: private_queue.succeeded() == len(ids), timeout=60, interval=0.2,
                   message="the 8 tasks to succeed")
    for worker in workers:
        worker.stop()
    private_queue.check(ids).assert_clean()
    runs = private_queue.runs()
    assert all(run.start < crashed_at < run.until for run in runs[:8]), "crashed too late"
    assert len(runs) == len(ids), f"runs: {runs}"
