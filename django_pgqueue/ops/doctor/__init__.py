"""The queue doctor: what the queue depends on, checked, each finding with its evidence
and its fix.

What slows a PostgreSQL queue down in its second year is rarely in the queue's code: a
connection left idle in transaction, a replication slot nobody reads, or a forgotten
prepared transaction keeps VACUUM from removing the claim index's dead entries, and
every claim walks more of them each day; a queue's workers were never deployed.
``diagnose()`` looks, on every database with a task table, and
returns ``Finding``s: a check id (its group, a dot, what: ``horizon.transaction``), a
severity (``info``: for the record; ``warning``: act soon; ``problem``: act now), a
one-line summary, the evidence (the backend pid, the slot, the index, the numbers)
and the fix. ``manage.py pgqueue_doctor`` prints them (exit status 0 healthy, 1
warnings, 2 problems), the admin's queue overview shows them, and the
``pgqueue_doctor_findings`` gauge counts them (metrics.py).

The groups, each run in its own short transaction under a statement timeout (a group
that fails is a ``doctor.error`` finding, and the others still run); the statements are
in db/sql/doctor.sql:

- ``horizon``: sessions, prepared transactions, replication slots and standbys that
  hold back vacuum, with their age;
- ``vacuum``: the task table's dead tuples, its last vacuum (by hand or by the workers'
  vacuumer) and autovacuum, whether anything vacuums it, wraparound;
- ``bloat``: the task table's and its indexes' size beyond their live contents;
- ``claim``: what finding a route's head in the claim index costs now, measured;
- ``queues``: per queue, the wait from due to start against its
  ``QUEUE_LIMITS[q]["latency_objective"]``, the backlog's trend, queues with due tasks
  and no live worker;
- ``workers``: the releases and handler versions of the live workers, tasks no live
  worker can run, routes no task uses;
- ``connections``: connections in use against ``max_connections``, and the live
  workers' budget (docs/worker.md, "The budget");
- ``settings``: settings that contradict each other.

``common`` holds what the checks share (the finding, the thresholds, the context a
group runs in); ``database`` the checks of PostgreSQL's side (horizon, vacuum, bloat,
claim, connections); ``fleet`` those of the queue's own (queues, workers, settings).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from django_pgqueue.core.conf import queue_databases
from django_pgqueue.ops.doctor import database, fleet
from django_pgqueue.ops.doctor.common import (
    CHECK_IDS,
    CLEAN_PROBE_BUFFERS,
    GROUPS,
    INFO,
    PROBLEM,
    SEVERITIES,
    WARNING,
    WORKER_OWN_CONNECTIONS,
    Context,
    Finding,
    Thresholds,
)

__all__ = [
    "CHECK_IDS",
    "CLEAN_PROBE_BUFFERS",
    "GROUPS",
    "INFO",
    "PROBLEM",
    "SEVERITIES",
    "WARNING",
    "WORKER_OWN_CONNECTIONS",
    "Finding",
    "Thresholds",
    "diagnose",
    "exit_status",
]

_CHECKS: dict[str, Callable[[Context], list[Finding]]] = {
    "horizon": database.horizon,
    "vacuum": database.vacuum,
    "bloat": database.bloat,
    "claim": database.claim,
    "queues": fleet.queues,
    "workers": fleet.workers,
    "connections": database.connections,
    "settings": fleet.settings,
}


def diagnose(
    databases: Iterable[str] | None = None,
    thresholds: Thresholds | None = None,
    only: Iterable[str] = (),
    ignore: Iterable[str] = (),
) -> list[Finding]:
    """The findings on each database with a task table (or those given), worst first.

    ``only`` and ``ignore`` are check ids or their prefixes (``horizon``,
    ``vacuum.autovacuum``): with ``only``, the other groups do not run."""
    thresholds = thresholds or Thresholds.from_settings()
    only, ignore = list(only), list(ignore)
    groups = [g for g in GROUPS if not only or any(_covers(g, p) or _covers(p, g) for p in only)]
    findings = []
    for alias in databases or queue_databases():
        context = Context(alias, thresholds)
        for group in groups:
            findings += context.run(group, _CHECKS[group])
    kept = [
        f
        for f in findings
        if (not only or f.check == "doctor.error" or any(_covers(p, f.check) for p in only))
        and not any(_covers(p, f.check) for p in ignore)
    ]
    return sorted(kept, key=lambda f: -SEVERITIES.index(f.severity))


def _covers(pattern: str, check: str) -> bool:
    return check == pattern or check.startswith(pattern + ".")


def exit_status(findings: Iterable[Finding]) -> int:
    """0 healthy (info at most), 1 warnings, 2 problems."""
    worst = max((SEVERITIES.index(f.severity) for f in findings), default=0)
    return worst
