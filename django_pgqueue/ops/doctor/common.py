"""What every check of the doctor shares: the finding, the thresholds, the severities,
the context a group of checks runs in, and the words of the summaries."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from django_pgqueue.core.conf import get_settings
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.ops.overview import QueueGroup, database_groups, humanize_seconds

INFO, WARNING, PROBLEM = "info", "warning", "problem"
SEVERITIES = (INFO, WARNING, PROBLEM)
GROUPS = ("horizon", "vacuum", "bloat", "claim", "queues", "workers", "connections", "settings")
# Every check id a finding can have (docs/operations.md lists them).
CHECK_IDS = (
    "horizon.transaction",
    "horizon.prepared",
    "horizon.slot",
    "horizon.standby",
    "vacuum.autovacuum",
    "vacuum.vacuumer",
    "vacuum.dead_tuples",
    "vacuum.wraparound",
    "bloat.table",
    "bloat.index",
    "claim.index",
    "queues.latency",
    "queues.backlog",
    "queues.unserved",
    "workers.versions",
    "workers.handler_versions",
    "workers.unroutable",
    "workers.unused_routes",
    "connections.use",
    "connections.budget",
    "settings.lease",
    "settings.stale_after",
    "settings.retention",
    "settings.latency_objective",
    "doctor.error",
)
# A claim probe on a clean index reads about this many buffers: the index's root and
# a leaf page (a level more per ~250x the entries), and the row's heap page.
CLEAN_PROBE_BUFFERS = 4
# The connections a worker process holds beside its handlers' (docs/worker.md).
WORKER_OWN_CONNECTIONS = 5


@dataclass(frozen=True)
class Finding:
    """One thing the doctor found."""

    check: str
    severity: str
    summary: str
    fix: str = ""
    # Names and numbers an operator can look up: pid, slot, index, queue...
    evidence: dict[str, Any] = field(default_factory=dict)
    # The alias of the database it is about.
    database: str = ""

    def as_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), default=str))


@dataclass(frozen=True)
class Thresholds:
    """Where a finding becomes a warning (a problem at ``PROBLEM_FACTOR`` times it)."""

    # Seconds a transaction may hold back vacuum (DOCTOR_TRANSACTION_AGE).
    transaction_seconds: float = 60.0
    # Dead tuples in the task table, as a multiple of VACUUM_THRESHOLD.
    dead_tuples_factor: float = 5.0
    # Bloat: this share of a relation, and at least this many bytes.
    bloat_ratio: float = 0.5
    bloat_bytes: int = 256 * 1024 * 1024
    # Buffers read to find a route's head in the claim index.
    claim_buffers: int = 1000
    # Share of the server's connections in use.
    connections_ratio: float = 0.8
    # The window of the waits and of the backlog's trend, and the growth over it.
    window_minutes: int = 15
    backlog_growth: int = 1000
    # At most this many routes are probed (those with due tasks first).
    probe_routes: int = 200
    # Each statement's timeout, in seconds.
    statement_timeout: float = 10.0

    @classmethod
    def from_settings(cls, **overrides: Any) -> Thresholds:
        """The defaults, DOCTOR_TRANSACTION_AGE, and ``overrides`` over them."""
        return cls(**{"transaction_seconds": get_settings().DOCTOR_TRANSACTION_AGE, **overrides})


PROBLEM_FACTOR = 10


def ladder(value: float, warning: float, factor: float = PROBLEM_FACTOR) -> str:
    """info below ``warning``, warning from it, problem from ``factor`` times it."""
    if value >= warning * factor:
        return PROBLEM
    return WARNING if value >= warning else INFO


class Context:
    """One database's checks: its cursor inside the running group's transaction, and
    the reads several groups share (made once)."""

    def __init__(self, alias: str, thresholds: Thresholds) -> None:
        self.alias = alias
        self.thresholds = thresholds
        self.conf = get_settings()
        self.cursor: Any = None
        self._groups: list[QueueGroup] | None = None
        self._workers: list[dict[str, Any]] | None = None

    def run(self, group: str, check: Callable[[Context], list[Finding]]) -> list[Finding]:
        try:
            with transaction.atomic(using=self.alias), connections[self.alias].cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('statement_timeout', %s, true)",
                    [f"{int(self.thresholds.statement_timeout * 1000)}ms"],
                )
                self.cursor = cursor
                found = check(self)
        except DatabaseError as exc:
            found = [
                Finding(
                    "doctor.error",
                    WARNING,
                    f"the {group} checks could not run: {str(exc).strip()}",
                    "Run the doctor as a role that can read the statistics and the task "
                    "table (the table's owner, with pg_monitor to see other roles' "
                    "sessions).",
                    {"group": group},
                )
            ]
        finally:
            self.cursor = None
        return [replace(f, database=self.alias) for f in found]

    def rows(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        self.cursor.execute(QUERIES[query], params or {})
        columns = [c[0] for c in self.cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in self.cursor.fetchall()]

    def groups(self) -> list[QueueGroup]:
        """The overview's queues of this database (overview.database_groups)."""
        if self._groups is None:
            self._groups = database_groups(self.alias)
        return self._groups

    def workers(self) -> list[dict[str, Any]]:
        """The live workers of this database (heartbeat within WORKER_STALE_AFTER)."""
        if self._workers is None:
            from django_pgqueue.models import Worker

            since = timezone.now() - timedelta(seconds=self.conf.WORKER_STALE_AFTER)
            self._workers = list(
                Worker.objects.using(self.alias)
                .filter(last_heartbeat_at__gt=since)
                .values("id", "hostname", "pid", "queues", "routes", "concurrency", "version")
            )
        return self._workers


# -- words


def age(seconds: float | None) -> str:
    return humanize_seconds(seconds)


def ago(seconds: float | None) -> str:
    return "never" if seconds is None else f"{humanize_seconds(seconds)} ago"


def size_words(size: float | None) -> str:
    if size is None:
        return "?"
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "bytes" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} TiB"  # pragma: no cover - unreachable


def round_value(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else None
    return value


def rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {key: round_value(value) for key, value in row.items()}
