"""The checks of the queue's own side: each queue's waits and backlog (queues), the live
workers (workers), and settings that contradict each other (settings)."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from datetime import UTC, datetime
from typing import Any

from django_pgqueue.core.conf import database_for
from django_pgqueue.core.limits import QueueLimit, queue_limits
from django_pgqueue.ops.doctor.common import (
    INFO,
    PROBLEM,
    WARNING,
    Context,
    Finding,
    Thresholds,
    round_value,
)
from django_pgqueue.ops.overview import QueueGroup, humanize_seconds

# -- queues -------------------------------------------------------------------------------


def queues(ctx: Context) -> list[Finding]:
    t = ctx.thresholds
    groups = {g.name: g for g in ctx.groups()}
    findings = []
    limits = {
        q: limit
        for q, limit in queue_limits().items()
        if limit.latency_objective is not None and database_for(q) == ctx.alias
    }
    waits = {
        row["queue"]: row
        for row in ctx.rows(
            "doctor_queue_waits", {"queues": sorted(limits), "minutes": t.window_minutes}
        )
    }
    for queue, limit in sorted(limits.items()):
        findings.append(_latency(queue, limit, waits.get(queue), groups.get(queue), t))
    for row in ctx.rows("doctor_backlog", {"minutes": t.window_minutes}):
        now, before = row["depth_now"], row["depth_before"]
        growth = now - before
        growing = growth >= t.backlog_growth and now >= 2 * before
        findings.append(
            Finding(
                "queues.backlog",
                WARNING if growing else INFO,
                f"queue {row['queue']}: backlog {before:,} -> {now:,} tasks over the last "
                f"{t.window_minutes} min ({growth / t.window_minutes:+,.1f}/min)",
                "The queue gets more than its workers finish: add workers or slots, or "
                "look for what slows its handlers down."
                if growing
                else "",
                {
                    "queue": row["queue"],
                    "depth_now": now,
                    "depth_before": before,
                    "window_minutes": t.window_minutes,
                    "per_minute": round(growth / t.window_minutes, 1),
                },
            )
        )
    for group in groups.values():
        due = group.totals["pending_routable"] + group.totals["pending_unroutable"]
        if group.workers or not (due or group.totals["scheduled"]):
            continue
        findings.append(
            Finding(
                "queues.unserved",
                PROBLEM if due else INFO,
                f"queue {group.name} has {due:,} due and {group.totals['scheduled']:,} "
                "scheduled tasks, and no live worker serves it",
                f"Start workers for it: runtaskworker --queues {group.name} (or add it to "
                "PGQUEUE['QUEUES']).",
                {
                    "queue": group.name,
                    "due": due,
                    "scheduled": group.totals["scheduled"],
                    "oldest_due_seconds": round_value(group.totals["oldest_due_seconds"]),
                },
            )
        )
    return findings


def _latency(
    queue: str,
    limit: QueueLimit,
    waits: dict[str, Any] | None,
    group: QueueGroup | None,
    t: Thresholds,
) -> Finding:
    objective = limit.latency_objective
    assert objective is not None
    p95 = waits["p95_seconds"] if waits else None
    oldest = group.totals["oldest_unthrottled_seconds"] if group else None
    worst = max((v for v in (p95, oldest) if v is not None), default=0.0)
    severity = PROBLEM if worst > 5 * objective else WARNING if worst > objective else INFO
    started = waits["started"] if waits else 0
    parts = []
    if waits:
        parts.append(
            f"95% of the {started:,} tasks started in the last {t.window_minutes} min waited "
            f"{humanize_seconds(p95)} or less from due to start"
        )
    else:
        parts.append(f"no task started in the last {t.window_minutes} min")
    if oldest is not None:
        parts.append(f"the oldest due task has waited {humanize_seconds(oldest)}")
    return Finding(
        "queues.latency",
        severity,
        f"queue {queue}: {', and '.join(parts)}; the objective is {humanize_seconds(objective)}",
        ""
        if severity == INFO
        else f"Give the queue more capacity (it has {group.workers if group else 0} live "
        f"workers, {group.slots if group else 0} slots), or find what holds it back: its "
        "limits, a pause, slow handlers sharing its workers' slots.",
        {
            "queue": queue,
            "objective_seconds": objective,
            "started": started,
            **(
                {}
                if not waits
                else {
                    "p50_seconds": round_value(waits["p50_seconds"]),
                    "p95_seconds": round_value(p95),
                    "max_seconds": round_value(waits["max_seconds"]),
                }
            ),
            "oldest_due_seconds": round_value(oldest),
            "window_minutes": t.window_minutes,
        },
    )


# -- workers ------------------------------------------------------------------------------


def workers(ctx: Context) -> list[Finding]:
    workers = ctx.workers()
    findings = []
    if workers:
        releases: dict[str, list[str]] = defaultdict(list)
        for worker in workers:
            releases[worker["version"] or "older than 0.2 (unknown)"].append(worker["id"])
        shown = ", ".join(f"{v} ({len(ids)})" for v, ids in sorted(releases.items()))
        findings.append(
            Finding(
                "workers.versions",
                INFO,
                f"{len(workers)} live worker(s), release(s): {shown}"
                + (" (a rolling deploy, or a host left behind)" if len(releases) > 1 else ""),
                "",
                {"releases": dict(releases)},
            )
        )
        versions: dict[str, Counter[int]] = defaultdict(Counter)
        for worker in workers:
            for name, version in worker["routes"]:
                versions[name][version] += 1
        for name, counts in sorted(versions.items()):
            if len(counts) > 1:
                served = ", ".join(f"v{v} ({n} worker(s))" for v, n in sorted(counts.items()))
                findings.append(
                    Finding(
                        "workers.handler_versions",
                        INFO,
                        f"task {name} is served at handler versions {served}",
                        "",
                        {"task_name": name, "versions": {str(v): n for v, n in counts.items()}},
                    )
                )
    used: set[tuple[str, int]] = set()
    for group in ctx.groups():
        for row in group.rows:
            used.add((row["task_name"], row["handler_version"]))
            if row["pending_unroutable"] and group.workers:
                findings.append(
                    Finding(
                        "workers.unroutable",
                        WARNING,
                        f"{row['pending_unroutable']:,} due task(s) of {row['task_name']} "
                        f"v{row['handler_version']} in queue {group.name}: no live worker of "
                        "the queue has registered this task at this version",
                        "Deploy workers with this task at this handler version (a producer "
                        "was deployed before its consumer); UNROUTABLE_TTL fails them once "
                        "they have waited that long.",
                        {
                            "queue": group.name,
                            "task_name": row["task_name"],
                            "handler_version": row["handler_version"],
                            "due": row["pending_unroutable"],
                            "oldest_due_seconds": round_value(row["oldest_due_seconds"]),
                        },
                    )
                )
    registered = {(name, version) for w in workers for name, version in w["routes"]}
    unused = sorted(registered - used)
    if unused:
        findings.append(
            Finding(
                "workers.unused_routes",
                INFO,
                f"{len(unused)} task(s) the live workers run have no task in their queues "
                "(none due, scheduled, running, waiting or dead, none finished in the last "
                "hour): "
                + ", ".join(f"{n} v{v}" for n, v in unused[:10])
                + (" ..." if len(unused) > 10 else ""),
                "",
                {"routes": [[n, v] for n, v in unused]},
            )
        )
    return findings


# -- settings -----------------------------------------------------------------------------


def settings(ctx: Context) -> list[Finding]:
    conf = ctx.conf
    findings = []
    if conf.HEARTBEAT_SECONDS + conf.DEAD_CONNECTION_TIMEOUT > conf.LEASE_SECONDS:
        findings.append(
            Finding(
                "settings.lease",
                WARNING,
                f"LEASE_SECONDS ({conf.LEASE_SECONDS:g}) is shorter than HEARTBEAT_SECONDS "
                f"({conf.HEARTBEAT_SECONDS:g}) plus DEAD_CONNECTION_TIMEOUT "
                f"({conf.DEAD_CONNECTION_TIMEOUT:g}): a heartbeat whose connection dies "
                "renews no lease until that is noticed, and the leases lapse first: another "
                "worker starts tasks still running",
                "Raise LEASE_SECONDS, or lower DEAD_CONNECTION_TIMEOUT.",
                _settings_evidence(
                    conf, "LEASE_SECONDS", "HEARTBEAT_SECONDS", "DEAD_CONNECTION_TIMEOUT"
                ),
            )
        )
    if conf.WORKER_STALE_AFTER < 2 * conf.HEARTBEAT_SECONDS:
        findings.append(
            Finding(
                "settings.stale_after",
                WARNING,
                f"WORKER_STALE_AFTER ({conf.WORKER_STALE_AFTER:g}) is less than two "
                f"heartbeats ({conf.HEARTBEAT_SECONDS:g} s each): one late heartbeat makes "
                "a live worker look gone; its row is deleted and its tasks show unroutable",
                "Keep WORKER_STALE_AFTER at several HEARTBEAT_SECONDS (60 and 10 by default).",
                _settings_evidence(conf, "WORKER_STALE_AFTER", "HEARTBEAT_SECONDS"),
            )
        )
    for name, queue, period in _schedule_periods(ctx.alias):
        if period > conf.RESULT_TTL:
            findings.append(
                Finding(
                    "settings.retention",
                    WARNING,
                    f"RESULT_TTL ({humanize_seconds(conf.RESULT_TTL)}) is shorter than the "
                    f"period of schedule {name!r} ({humanize_seconds(period)}): each run is "
                    "pruned before the next, so nothing shows that it ran",
                    "Raise RESULT_TTL above the longest schedule's period, or keep the "
                    "pruned rows in an archive (PRUNE_ARCHIVE_DIR).",
                    {
                        "schedule": name,
                        "queue": queue,
                        "period_seconds": period,
                        "RESULT_TTL": conf.RESULT_TTL,
                    },
                )
            )
    polling = conf.TRANSACTION_POOLER and conf.LISTEN_DATABASE is None
    for queue, limit in sorted(queue_limits().items()):
        objective = limit.latency_objective
        if objective is None or database_for(queue) != ctx.alias:
            continue
        if limit.rate is not None and limit.rate.interval > objective:
            findings.append(
                Finding(
                    "settings.latency_objective",
                    WARNING,
                    f"queue {queue}: its rate {limit.rate.label} starts a task every "
                    f"{humanize_seconds(limit.rate.interval)} once its burst is spent, longer "
                    f"than its latency objective ({humanize_seconds(objective)})",
                    "Raise the rate or the objective: the two cannot both hold under load.",
                    {"queue": queue, "rate": limit.rate.label, "objective_seconds": objective},
                )
            )
        if polling and objective < conf.POLL_INTERVAL:
            findings.append(
                Finding(
                    "settings.latency_objective",
                    WARNING,
                    f"queue {queue}: its workers poll every {conf.POLL_INTERVAL:g} s (a "
                    "transaction pooler without LISTEN_DATABASE), longer than its latency "
                    f"objective ({humanize_seconds(objective)})",
                    "Set LISTEN_DATABASE to a direct address for wake-ups, or lower POLL_INTERVAL.",
                    {
                        "queue": queue,
                        "POLL_INTERVAL": conf.POLL_INTERVAL,
                        "objective_seconds": objective,
                    },
                )
            )
    return findings


def _settings_evidence(conf: Any, *names: str) -> dict[str, Any]:
    return {name: getattr(conf, name) for name in names}


def _schedule_periods(alias: str) -> list[tuple[str, str, float]]:
    """(name, queue, longest gap between its next ticks) of the schedules whose queue
    is on ``alias``: those declared in code and those added at runtime."""
    from django_pgqueue.models import Schedule
    from django_pgqueue.tasking.runtime_schedules import runtime_definition
    from django_pgqueue.tasking.schedule import schedule_registry

    schedules = {s.name: s for s in schedule_registry.all()}
    for row in Schedule.objects.using(alias).exclude(definition=None).only("name", "definition"):
        if row.name not in schedules:
            definition = runtime_definition(row.name, row.definition)
            if definition is not None:
                schedules[row.name] = definition
    now = datetime.now(UTC)
    periods = []
    for name, schedule in sorted(schedules.items()):
        if database_for(schedule.queue) != alias:
            continue
        ticks = [now]
        for _ in range(8):
            following = schedule.ticks.after(ticks[-1])
            if following is None:
                break
            ticks.append(following)
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ticks[1:])]
        if gaps:
            periods.append((name, schedule.queue, max(gaps)))
    return periods
