"""An execution ledger kept outside the database, and the checker that reads it.

The database is what the crash tests break, so what handlers actually did is recorded
elsewhere: a file (named by the PGQUEUE_TEST_LEDGER environment variable) that every
handler appends JSON lines to, one ``os.write`` per line on an O_APPEND descriptor, so
lines of concurrent processes never interleave and a line written is in the file even
if its process is SIGKILLed the next instant. Times are wall-clock ``time.time()``:
every writer is on this machine, and monotonic clocks are per process.

Events:
  start / end   a handler began / finished: task, attempt, token (the lease token), pid, t
  exit          the test killed a worker process: pid, t (taken after the process was reaped)

``check()`` holds the ledger against the task rows and states the guarantees:
  (a) every committed task succeeded, and the run whose success the row records
      reached its end (exact by attempt and token when the row has executions);
  (b) no task enqueued in a rolled-back transaction exists or ran;
  (c) two runs of one task overlap only if the older claim's lease (the lower attempt:
      usually the run that started first) expired and was recovered: the row's history
      names that run's lease as lost.

What a run's interval is: from its ``start`` to its ``end``. A run without an end was
cut short with its process: if the test recorded that process's ``exit``, the run ends
there (the handler thread cannot outlive its process; the exit time is taken after the
kill was reaped, so the interval is, if anything, too long). Otherwise nothing bounds it
and it is treated as running forever: every later run of the task overlaps it and
needs that run's lease to have been recovered. Both choices can only add overlaps,
never hide one.

How a recovered lease is recognised: by the row's ``executions`` entries when it has
any (an entry with outcome "lost" for the same attempt *and* lease token: exact). A row
without executions falls back on its ``errors``: a LeaseExpired error for the same
attempt whose worker_id names the run's pid. That fallback cannot tell two claims of the
same attempt by the same process apart (a claim lost in a crash, then re-claimed by the
same worker, whose new lease later expired), so it may excuse such an overlap; the
token in ``executions`` does not. Two overlapping runs with the same token (one lease
handed to two slots) are never excused.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LEDGER_ENV = "PGQUEUE_TEST_LEDGER"


def append(path: str | Path, event: Mapping[str, Any]) -> None:
    """Append one event as one line, in one write, to the ledger file."""
    line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def ledger_path() -> str:
    """The ledger file of this process, from PGQUEUE_TEST_LEDGER."""
    path = os.environ.get(LEDGER_ENV)
    if not path:
        raise RuntimeError(
            f"{LEDGER_ENV} is not set: the ledger tasks (tests/ledger_tasks.py) record each "
            "run in that file; set it in the worker's environment before starting it"
        )
    return path


def record_run(event: str, task_id: int, attempt: int, token: str) -> None:
    """A handler's ``start`` or ``end``."""
    append(ledger_path(), {
        "event": event, "task": task_id, "attempt": attempt, "token": token,
        "pid": os.getpid(), "t": time.time(),
    })


def record_exit(path: str | Path, pid: int) -> None:
    """The test killed process ``pid`` (call after it was reaped)."""
    append(path, {"event": "exit", "pid": pid, "t": time.time()})


def read(path: str | Path) -> list[dict[str, Any]]:
    """Every event of the ledger, in file order."""
    path = Path(path)
    if not path.exists():
        return []
    events = []
    text = path.read_text()
    lines = text.splitlines()
    if text and not text.endswith("\n"):
        lines.pop()  # a line a handler is writing right now: read it next time
    for number, line in enumerate(lines, 1):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise AssertionError(f"{path}:{number}: not a ledger line ({exc}): {line!r}") from exc
    return events


@dataclass
class Run:
    """One execution of a task as the ledger saw it."""

    task: int
    attempt: int
    token: str
    pid: int
    start: float
    end: float | None = None  # from the handler's own end event
    died: float | None = None  # its process's exit, when it has no end

    @property
    def finished(self) -> bool:
        return self.end is not None

    @property
    def until(self) -> float:
        """Until when it may have been running."""
        if self.end is not None:
            return self.end
        if self.died is not None:
            return self.died
        return math.inf


@dataclass
class TaskRow:
    """What the checker needs of a pgqueue_task row."""

    id: int
    state: str
    attempt: int
    errors: list[dict[str, Any]]
    executions: list[dict[str, Any]]


def runs_of(events: Iterable[Mapping[str, Any]]) -> dict[int, list[Run]]:
    """The runs of each task, by start time. An end closes the open run of the same
    task, token and pid (a lease started twice gives two runs, not one)."""
    exits = {e["pid"]: e["t"] for e in events if e["event"] == "exit"}
    by_task: dict[int, list[Run]] = defaultdict(list)
    open_runs: dict[tuple[int, str, int], Run] = {}
    for e in events:
        key = (e.get("task"), e.get("token"), e["pid"])
        if e["event"] == "start":
            run = Run(e["task"], e["attempt"], e["token"], e["pid"], e["t"])
            by_task[run.task].append(run)
            open_runs[key] = run
        elif e["event"] == "end":
            run = open_runs.pop(key, None)
            if run is None:
                raise AssertionError(f"ledger: an end without a start: {e}")
            run.end = e["t"]
    for run in open_runs.values():
        run.died = exits.get(run.pid)
    for task_runs in by_task.values():
        task_runs.sort(key=lambda r: r.start)
    return dict(by_task)


def final_run_finished(row: TaskRow, runs: list[Run]) -> bool:
    """Did the run whose outcome the row records reach its end? Exact (attempt and
    token of the settled execution) when the row has executions, else by attempt."""
    settled = [e for e in row.executions if e.get("state") == row.state]
    if settled:
        final = settled[-1]
        return any(run.finished and run.attempt == final.get("attempt")
                   and run.token == final.get("token") for run in runs)
    return any(run.finished and run.attempt == row.attempt for run in runs)


def _worker_pid(worker_id: str | None) -> int | None:
    # Worker ids read "<host>-<pid>-<random>" (django_pgqueue/worker/worker.py).
    try:
        return int((worker_id or "").rsplit("-", 2)[-2])
    except (IndexError, ValueError):
        return None


def lease_recovered(row: TaskRow, run: Run) -> bool:
    """Does the row's history say ``run``'s lease expired and was recovered?"""
    if row.executions:
        return any(
            entry.get("outcome") == "lost"
            and entry.get("attempt") == run.attempt
            and entry.get("token") == run.token
            for entry in row.executions
        )
    return any(
        error.get("type") == "LeaseExpired"
        and error.get("attempt") == run.attempt
        and _worker_pid(error.get("worker_id")) == run.pid
        for error in row.errors
    )


@dataclass
class Overlap:
    earlier: Run
    later: Run
    row: TaskRow | None


@dataclass
class LedgerReport:
    """What ``check()`` found; ``assert_clean()`` fails with all of it."""

    committed: int
    runs: int
    not_done: list[tuple[int, str]] = field(default_factory=list)  # (task, state or "missing")
    unfinished: list[int] = field(default_factory=list)  # done, but no finished final run
    rolled_back_ran: list[int] = field(default_factory=list)
    rolled_back_exists: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)  # ran, yet neither committed nor rolled back
    overlaps: list[Overlap] = field(default_factory=list)  # unjustified
    justified_overlaps: int = 0
    origin: float = 0.0  # t of the first event, to print times relative to it

    @property
    def violations(self) -> int:
        return (len(self.not_done) + len(self.unfinished) + len(self.rolled_back_ran)
                + len(self.rolled_back_exists) + len(self.unknown) + len(self.overlaps))

    def summary(self) -> str:
        return (
            f"{self.committed} committed tasks, {self.runs} runs, "
            f"{self.justified_overlaps} overlaps justified by an expired lease; violations: "
            f"(a) {len(self.not_done)} not succeeded, {len(self.unfinished)} "
            f"settled without a finished run; (b) {len(self.rolled_back_ran)} rolled-back "
            f"tasks ran, {len(self.rolled_back_exists)} rolled-back rows exist; "
            f"{len(self.unknown)} unknown tasks ran; (c) {len(self.overlaps)} unjustified "
            "overlaps"
        )

    def describe(self, limit: int = 20) -> str:
        """The summary, then the first ``limit`` violations, one per line."""
        found = [f"(a) task {task} did not succeed: {state}" for task, state in self.not_done]
        found += [f"(a) task {task}: settled, but no run of its final attempt finished"
                  for task in self.unfinished]
        found += [f"(b) task {task} was enqueued in a rolled-back transaction, yet ran"
                  for task in self.rolled_back_ran]
        found += [f"(b) task {task} was enqueued in a rolled-back transaction, yet its row "
                  "exists" for task in self.rolled_back_exists]
        found += [f"task {task} ran but the test never enqueued it" for task in self.unknown]
        found += [self._overlap(overlap) for overlap in self.overlaps]
        more = [f"... and {len(found) - limit} more"] if len(found) > limit else []
        return "\n".join([self.summary(), *found[:limit], *more])

    def _overlap(self, overlap: Overlap) -> str:
        earlier, later, row = overlap.earlier, overlap.later, overlap.row
        if row is None:
            history = "row: missing"
        else:
            errors = [(e.get("attempt"), e.get("type"), e.get("worker_id")) for e in row.errors]
            history = (f"row: state={row.state} attempt={row.attempt} errors={errors} "
                       f"executions={row.executions}")
        seconds = min(earlier.until, later.until) - later.start
        return (f"(c) task {earlier.task}: {self._run(earlier)} overlaps {self._run(later)} "
                f"for {seconds:.3f}s, and the earlier run's lease was never recovered; "
                f"{history}")

    def _run(self, run: Run) -> str:
        if run.end is not None:
            until = f"{run.end - self.origin:.3f}"
        elif run.died is not None:
            until = f"(killed) {run.died - self.origin:.3f}"
        else:
            until = "(no end, process not known dead)"
        return (f"run[attempt {run.attempt}, token {run.token[:8]}, pid {run.pid}, "
                f"{run.start - self.origin:.3f}-{until}]")

    def assert_clean(self) -> None:
        if self.violations:
            raise AssertionError("ledger check failed: " + self.describe())


def check(
    events: list[Mapping[str, Any]],
    rows: Iterable[TaskRow],
    committed: Iterable[int],
    rolled_back: Iterable[int] = (),
) -> LedgerReport:
    """Hold the ledger against the final task rows (see the module docstring)."""
    by_id = {row.id: row for row in rows}
    committed = set(committed)
    rolled_back = set(rolled_back)
    by_task = runs_of(events)
    report = LedgerReport(
        committed=len(committed),
        runs=sum(len(r) for r in by_task.values()),
        origin=min((e["t"] for e in events), default=0.0),
    )
    for task in sorted(committed):
        row = by_id.get(task)
        if row is None or row.state != "succeeded":
            report.not_done.append((task, row.state if row else "missing"))
        elif not final_run_finished(row, by_task.get(task, [])):
            report.unfinished.append(task)
    report.rolled_back_ran = sorted(rolled_back & by_task.keys())
    report.rolled_back_exists = sorted(rolled_back & by_id.keys())
    report.unknown = sorted(by_task.keys() - committed - rolled_back)
    for task, task_runs in sorted(by_task.items()):
        for i, earlier in enumerate(task_runs):
            for later in task_runs[i + 1:]:
                if later.start >= earlier.until:
                    continue
                row = by_id.get(task)
                # One lease run twice at once is never justified: a recovered lease
                # is gone, and the next run has a token of its own. The run that must
                # have lost its lease is the older claim (the lower attempt): it may
                # have started last, if its process stalled before starting it.
                stale = earlier if earlier.attempt <= later.attempt else later
                if (row is not None and later.token != earlier.token
                        and lease_recovered(row, stale)):
                    report.justified_overlaps += 1
                else:
                    report.overlaps.append(Overlap(earlier, later, row))
    return report


def most_at_once(runs: Iterable[Run]) -> int:
    """The largest number of runs in progress at one instant (a run that ends as another
    starts does not overlap it). Runs without an end count until their process died, or
    forever."""
    edges = sorted([(run.start, 1) for run in runs] + [(run.until, -1) for run in runs],
                   key=lambda edge: (edge[0], edge[1]))
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def most_starts_within(runs: Iterable[Run], seconds: float) -> int:
    """The largest number of runs that started within any window of ``seconds``."""
    starts = sorted(run.start for run in runs)
    most = first = 0
    for last, t in enumerate(starts):
        while t - starts[first] >= seconds:
            first += 1
        most = max(most, last - first + 1)
    return most


TASK_COLUMNS = "id, state, attempt, errors, executions"


def task_rows(cursor: Any) -> list[TaskRow]:
    """Every task row, from a DB-API cursor (psycopg or Django) on the task table."""
    cursor.execute(f"SELECT {TASK_COLUMNS} FROM pgqueue_task")
    return [TaskRow(id, state, attempt, _json(errors), _json(executions))
            for id, state, attempt, errors, executions in cursor.fetchall()]


def _json(value: Any) -> Any:
    # psycopg loads jsonb as Python objects; Django's cursor hands it over as text.
    return json.loads(value) if isinstance(value, str) else value
