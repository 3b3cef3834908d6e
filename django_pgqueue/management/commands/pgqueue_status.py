"""``manage.py pgqueue_status``: the queue overview in a terminal (or as JSON), or one
task with ``--task ID`` (and the log records its attempts kept, with ``--logs``)."""

from __future__ import annotations

import json
import signal
import threading
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from django_pgqueue.core.conf import queue_databases
from django_pgqueue.core.exceptions import TaskDoesNotExist
from django_pgqueue.management.commands._database import add_database_argument, database_option
from django_pgqueue.ops import operations
from django_pgqueue.ops.overview import (
    HOLDS,
    WAIT_REASONS,
    QueueGroup,
    all_groups,
    humanize_seconds,
)
from django_pgqueue.tasking.periodic import schedules

COLUMNS = (
    ("due", "pending_routable"),
    ("unroutable", "pending_unroutable"),
    ("scheduled", "scheduled"),
    ("running", "running"),
    ("waiting", "waiting"),
    ("dead", "failed"),
    ("oldest due", "oldest_due_seconds"),
    ("oldest running", "oldest_running_seconds"),
    ("done 5m", "completed_5m"),
    ("done 1h", "completed_1h"),
    ("failed 5m", "failed_5m"),
    ("failed 1h", "failed_1h"),
    ("throttled", "throttled"),
)
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: --watch redraws in place


class Command(BaseCommand):
    help = (
        "Show per queue and task name: due (routable / unroutable), scheduled, running, "
        "waiting, dead letters, oldest due age, what finished in the last 5 minutes and "
        "hour, and what is throttled; per queue: live workers, pause, limits, and what its "
        "waiting tasks wait for."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
        parser.add_argument(
            "--watch",
            type=float,
            nargs="?",
            const=2.0,
            metavar="SECONDS",
            help="refresh in place every SECONDS (default 2) until Ctrl-C; with --json, "
            "print one JSON document per line",
        )
        parser.add_argument(
            "--task",
            type=int,
            metavar="ID",
            help="show this task instead: its state, attempts, executions and last error",
        )
        parser.add_argument(
            "--logs",
            action="store_true",
            help="with --task: also the log records each attempt kept (TASK_LOGS)",
        )
        add_database_argument(parser, "task --task names")

    def handle(self, *args, **opts):
        if opts["task"] is not None:
            return self._show_task(opts)
        if opts["logs"] or opts["database"]:
            raise CommandError("--logs and --database go with --task ID")
        interval = opts["watch"]
        # A range, so NaN (never in range) and infinity fail too: the wait refuses them.
        if interval is not None and not 0 < interval <= 24 * 3600:
            raise CommandError(
                f"--watch needs a positive number of seconds, at most a day, not {interval:g}"
            )
        # --watch: Ctrl-C ends the loop between two reads, not inside one (a
        # KeyboardInterrupt raised in the middle of a database call may be swallowed on
        # its way out, and the loop would go on); a second Ctrl-C interrupts at once.
        stop = threading.Event()

        def on_interrupt(signum: int, frame: object) -> None:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            stop.set()

        previous = signal.signal(signal.SIGINT, on_interrupt) if interval is not None else None
        try:
            while not stop.is_set():
                snapshot = read_status()
                if opts["json"]:
                    indent = None if interval is not None else 2
                    self.stdout.write(json.dumps(snapshot, indent=indent, default=str))
                else:
                    if interval is not None:
                        self.stdout.write(CLEAR, ending="")
                    self.stdout.write(render_table(snapshot))
                    if interval is not None:
                        self.stdout.write(f"\nrefreshing every {interval:g}s; Ctrl-C to stop")
                self.stdout.flush()
                if interval is None:
                    return
                stop.wait(interval)
            self.stdout.write("")
        except KeyboardInterrupt:
            self.stdout.write("")
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)


    def _show_task(self, opts: dict[str, Any]) -> None:
        if opts["watch"] is not None:
            raise CommandError("--watch refreshes the overview; drop it with --task")
        database = database_option(opts["database"])
        try:
            shown = read_task(opts["task"], database, logs=opts["logs"])
        except TaskDoesNotExist as exc:
            raise CommandError(f"{exc} (on {database or 'DATABASE'})") from None
        if opts["json"]:
            self.stdout.write(json.dumps(shown, indent=2, default=str))
        else:
            self.stdout.write(render_task(shown))


def read_task(task_id: int, database: str | None, logs: bool) -> dict[str, Any]:
    """One task as ``--task`` shows it: ``task`` (its routing, state, attempts, times,
    executions and errors; not its arguments nor its result) and, with ``logs``,
    ``logs``: the records each attempt kept (``operations.task_logs``), oldest first."""
    row = operations.get_task(task_id, database=database)
    shown: dict[str, Any] = {
        "task": {
            "id": row.pk,
            "task_name": row.task_name,
            "handler_version": row.handler_version,
            "queue": row.queue,
            "state": row.state,
            "attempt": row.attempt,
            "max_attempts": row.max_attempts,
            "enqueued_at": row.enqueued_at,
            "run_at": row.run_at,
            "started_at": row.started_at,
            "finished_at": row.finished_at,
            "worker_id": row.worker_id,
            "executions": row.executions,
            "errors": row.errors,
        }
    }
    if logs:
        shown["logs"] = [asdict(attempt) for attempt in operations.task_logs(task_id, database)]
    return shown


def render_task(shown: dict[str, Any]) -> str:
    task = shown["task"]
    out = [
        f"task {task['id']}: {task['task_name']}@{task['handler_version']} "
        f"on queue {task['queue']}",
        f"state: {task['state']} (attempt {task['attempt']} of {task['max_attempts']})",
        f"enqueued {_moment(task['enqueued_at'])}, run at {_moment(task['run_at'])}, "
        f"finished {_moment(task['finished_at'])}",
    ]
    if task["executions"]:
        header = ["attempt", "outcome", "state after", "started", "ended", "lease"]
        lines = [
            [str(e.get("attempt", "?")), e.get("outcome") or "-", e.get("state") or "-",
             e.get("started") or "-", e.get("ended") or "-", (e.get("token") or "-")[:8]]
            for e in task["executions"]
        ]  # fmt: skip
        widths = [max(len(c) for c in column) for column in zip(header, *lines, strict=False)]
        out += ["", "executions:"]
        out += ["  " + _left_aligned(line, widths) for line in (header, *lines)]
    if task["errors"]:
        error = task["errors"][-1]
        out += ["", f"last error (attempt {error.get('attempt', '?')}): "
                    f"{error.get('type')}: {error.get('message')}"]  # fmt: skip
    if "logs" in shown:
        out += ["", *_log_lines(shown["logs"])]
    return "\n".join(out)


def _log_lines(attempts: list[dict[str, Any]]) -> list[str]:
    """Each attempt's kept records: time, level, logger, message, and an exception's
    traceback indented below its record."""
    if not attempts:
        return ["logs: none kept (TASK_LOGS keeps the records of attempts that log)"]
    out = ["logs:"]
    for attempt in attempts:
        dropped = f", {attempt['dropped']} earlier dropped" if attempt["dropped"] else ""
        out.append(
            f"  attempt {attempt['attempt']} (lease {attempt['lease_token'][:8]}, settled "
            f"{_moment(attempt['settled_at'])}): {len(attempt['records'])} record(s){dropped}"
        )
        for record in attempt["records"]:
            moment = record.get("time")
            when = moment.strftime("%H:%M:%S.%f")[:-3] if hasattr(moment, "strftime") else moment
            out.append(
                f"    {when} {record.get('level', ''):<8} {record.get('logger', '')}: "
                f"{record.get('message', '')}"
            )
            if record.get("exception"):
                out += [f"      {line}" for line in record["exception"].splitlines()]
    return out


def read_status() -> dict[str, Any]:
    """``tasks``: the rows of ``queue_overview()`` (with ``waiting_parents``,
    ``waiting_signal``, ``waiting_child``), each with ``paused`` (its task name is),
    ``held_by`` and ``throttled`` (overview.QueueGroup); ``queues``: one entry per queue
    with tasks, live workers or a pause (``_queue``). All read from the read database;
    with READ_DATABASE, ``read_database`` names it, ``read_database_is_replica`` says
    whether it is a standby, and ``replica_lag_seconds`` how far behind it is (None:
    not a replica, or it has replayed nothing yet)."""
    lag = operations.replica_lag()
    groups = all_groups()
    return {
        "generated_at": timezone.now().isoformat(timespec="seconds"),
        "databases": queue_databases(),
        "tasks": [row for group in groups for row in group.rows],
        "queues": [_queue(group) for group in groups],
        "schedules": schedules(),
        "read_database": lag.alias if lag else None,
        "read_database_is_replica": lag.replica if lag else None,
        "replica_lag_seconds": lag.seconds if lag else None,
    }


def _queue(group: QueueGroup) -> dict[str, Any]:
    return {
        "queue": group.name,
        "database": group.database,
        "workers": group.workers,
        "slots": group.slots,
        "in_flight": group.in_flight,
        "running": group.totals["running"],
        "paused": group.paused,
        "paused_tasks": group.paused_tasks,
        "paused_at": group.paused_at,
        "limits": group.limits,
        "held_by": group.held_by,
        "throttled": group.totals["throttled"],
        "waiting": group.totals["waiting"],
        "waiting_by_reason": group.waiting,
    }


def render_table(snapshot: dict[str, Any]) -> str:
    header = ["queue", "task", *(title for title, _ in COLUMNS)]
    lines: list[list[str]] = []
    several = len(snapshot.get("databases") or ()) > 1  # then each queue names its own
    for row in snapshot["tasks"]:
        task = f"{row['task_name']}@{row['handler_version']}"
        queue = _on(row["queue"], row.get("database"), several)
        lines.append([queue, task, *(_cell(row, key) for _, key in COLUMNS)])
    widths = [
        max(len(str(cell)) for cell in column) for column in zip(header, *lines, strict=False)
    ]
    out = [_format(header, widths), _format(["-" * w for w in widths], widths)]
    out += [_format(line, widths) for line in lines]
    if not lines:
        out.append("(no pending, running or dead tasks, and none finished in the last hour)")
    out.append("")
    out += _queue_lines(snapshot["queues"], several)
    out += _schedule_lines(snapshot.get("schedules") or [])
    out += _read_database_lines(snapshot)
    out.append(f"at {snapshot['generated_at']}")
    return "\n".join(out)


def _schedule_lines(schedules: list[dict[str, Any]]) -> list[str]:
    """The periodic schedules: a table after the tasks' (docs/periodic.md)."""
    if not schedules:
        return []
    header = ["schedule", "task", "when", "last tick", "next tick"]
    lines = [
        [
            s["name"],
            s["task"],
            s["schedule"] + ("" if s["timezone"] == "UTC" else f" ({s['timezone']})"),
            _moment(s["last_tick"]),
            "paused" if s["paused"]
            else "removed from the code" if s["origin"] == "removed"
            else _moment(s["next_tick"]),
        ]
        for s in schedules
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *lines, strict=False)]
    table = [header, ["-" * w for w in widths], *lines]
    return ["", *(_left_aligned(row, widths) for row in table), ""]


def _read_database_lines(snapshot: dict[str, Any]) -> list[str]:
    """Where the numbers come from, with READ_DATABASE: how far behind they are."""
    alias = snapshot.get("read_database")
    if alias is None:
        return []
    if not snapshot["read_database_is_replica"]:
        return [f"read from {alias} (READ_DATABASE): not a replica, no lag"]
    lag = snapshot["replica_lag_seconds"]
    if lag is None:
        return [f"read from replica {alias} (READ_DATABASE): no transaction replayed yet"]
    behind = humanize_seconds(lag)
    return [f"read from replica {alias} (READ_DATABASE): {behind} behind the primary"]


def _left_aligned(cells: list[str], widths: list[int]) -> str:
    return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()


def _moment(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


def _on(queue: str, database: str | None, several: bool) -> str:
    """A queue's name, and its database's when there are several: ``emails (queue2)``."""
    return f"{queue} ({database})" if several and database else queue


def _queue_lines(queues: list[dict[str, Any]], several: bool = False) -> list[str]:
    """Per queue: live workers, what its waiting tasks wait for, pause, limits and what
    holds its due tasks back."""
    if not queues:
        return []
    header = ["queue", "workers", "slots", "in flight", "waiting for", "paused", "limits",
              "held back", "throttled"]  # fmt: skip
    lines = [
        [_on(q["queue"], q.get("database"), several), str(q["workers"]), str(q["slots"]),
         str(q["in_flight"]), _waiting(q),
         _paused(q), _limits(q), ", ".join(HOLDS[key] for key in q["held_by"]) or "-",
         str(q["throttled"])]
        for q in queues
    ]  # fmt: skip
    widths = [max(len(cell) for cell in column) for column in zip(header, *lines, strict=False)]
    text = {0, 4, 5, 6, 7}  # left-aligned; the counts right-aligned
    return [
        "  ".join(
            cell.ljust(width) if index in text else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()
        for cells in (header, ["-" * w for w in widths], *lines)
    ]


def _paused(queue: dict[str, Any]) -> str:
    parts = ["queue"] if queue["paused"] else []
    if queue["paused_tasks"]:
        parts.append("tasks " + ", ".join(queue["paused_tasks"]))
    if not parts:
        return "-"
    if queue["paused_at"] is not None:
        parts[-1] += timezone.localtime(queue["paused_at"]).strftime(" since %Y-%m-%d %H:%M:%S")
    return "; ".join(parts)


def _waiting(queue: dict[str, Any]) -> str:
    """``parents 2, signal 1``: its waiting tasks by what they wait for."""
    by_reason = queue["waiting_by_reason"]
    return ", ".join(f"{r} {by_reason[r]}" for r in WAIT_REASONS if by_reason[r]) or "-"


def _limits(queue: dict[str, Any]) -> str:
    limits = queue["limits"]
    parts = []
    if limits["concurrency"] is not None:
        parts.append(f"concurrency {limits['concurrency']} ({queue['running']} running)")
    if limits["rate"] is not None:
        parts.append(f"rate {limits['rate']}")
    return ", ".join(parts) or "-"


def _cell(row: dict[str, Any], key: str) -> str:
    if key in ("oldest_due_seconds", "oldest_running_seconds"):
        return humanize_seconds(row[key])
    return str(row[key])


def _format(cells: list[str], widths: list[int]) -> str:
    # Names left-aligned, numbers right-aligned.
    parts = [
        cell.ljust(width) if index < 2 else cell.rjust(width)
        for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
    ]
    return "  ".join(parts).rstrip()
