"""The checks of PostgreSQL's side: what holds back vacuum (horizon), the task table's
dead tuples and vacuums (vacuum), bloat, the claim index (claim), connections."""

from __future__ import annotations

import json
from typing import Any

from django.db import DatabaseError, transaction

from django_pgqueue.db.sql import QUERIES
from django_pgqueue.ops.doctor.common import (
    CLEAN_PROBE_BUFFERS,
    INFO,
    PROBLEM,
    WARNING,
    WORKER_OWN_CONNECTIONS,
    Context,
    Finding,
    Thresholds,
    age,
    ago,
    ladder,
    rounded,
    size_words,
)

# -- horizon ------------------------------------------------------------------------------


def horizon(ctx: Context) -> list[Finding]:
    limit = ctx.thresholds.transaction_seconds
    findings = []
    for row in ctx.rows("doctor_horizon_backends", {"min_seconds": limit}):
        idle = (row["state"] or "").startswith("idle in transaction")
        doing = (
            f"has been {row['state']} for {age(row['state_seconds'])}"
            if idle
            else f"has run a query for {age(row['state_seconds'])}"
            if row["state"] == "active"
            else f"is {row['state'] or 'in a transaction'}"
        )
        who = ", ".join(
            part
            for part in (
                row["user"] and f"user {row['user']}",
                row["application_name"] and f"application {row['application_name']!r}",
                row["client_addr"] and f"from {row['client_addr']}",
            )
            if part
        )
        fix = (
            f"End it: SELECT pg_terminate_backend({row['pid']}); then find the code that "
            "leaves its transaction open (its last statement is in the evidence), and set "
            "idle_in_transaction_session_timeout on its role, so that the server ends such "
            "sessions itself."
            if idle
            else f"Cancel it if it is not needed: SELECT pg_cancel_backend({row['pid']}); "
            "run long reports on a replica, or set statement_timeout on their role."
        )
        findings.append(
            Finding(
                "horizon.transaction",
                ladder(row["age_seconds"], limit),
                f"session {row['pid']}{f' ({who})' if who else ''} {doing}, in a "
                f"transaction begun {age(row['age_seconds'])} ago: vacuum cannot remove "
                "what changed since, so every claim walks more dead entries",
                fix,
                {**rounded(row), "held_seconds_limit": limit},
            )
        )
    for row in ctx.rows("doctor_prepared_transactions"):
        if row["age_seconds"] < limit:
            continue
        findings.append(
            Finding(
                "horizon.prepared",
                ladder(row["age_seconds"], limit),
                f"prepared transaction {row['gid']!r} (owner {row['owner']}) has waited "
                f"{age(row['age_seconds'])} for its COMMIT PREPARED: it holds back vacuum "
                "and keeps its locks, across restarts",
                f"Finish it as its transaction manager would have: COMMIT PREPARED "
                f"'{row['gid']}' or ROLLBACK PREPARED '{row['gid']}'.",
                rounded(row),
            )
        )
    for row in ctx.rows("doctor_replication_slots"):
        findings += _slot(row)
    for row in ctx.rows("doctor_standby_feedback"):
        findings.append(
            Finding(
                "horizon.standby",
                INFO,
                f"standby {row['application_name']!r} (pid {row['pid']}) sends "
                "hot_standby_feedback: its queries hold back vacuum here "
                f"({row['xmin_age']} transactions behind)",
                "Keep long queries off a standby with hot_standby_feedback, or bound them "
                "with statement_timeout there.",
                rounded(row),
            )
        )
    return findings


def _slot(row: dict[str, Any]) -> list[Finding]:
    name, wal = row["slot_name"], size_words(row["retained_wal_bytes"])
    evidence = {"slot": name, **{k: v for k, v in rounded(row).items() if k != "slot_name"}}
    drop = (
        f"If its consumer is gone for good: SELECT pg_drop_replication_slot('{name}'); "
        "otherwise bring its consumer back."
    )
    if row["xmin_age"] is not None:
        if row["active"]:
            return [
                Finding(
                    "horizon.slot",
                    INFO,
                    f"replication slot {name!r} holds back vacuum of every table as long "
                    f"as its standby's oldest query runs ({row['xmin_age']} transactions "
                    "behind)",
                    "Keep long queries off that standby, or bound them with "
                    "statement_timeout there.",
                    evidence,
                )
            ]
        return [
            Finding(
                "horizon.slot",
                PROBLEM,
                f"replication slot {name!r} is inactive and holds back vacuum of every "
                f"table ({row['xmin_age']} transactions behind), and keeps {wal} of WAL",
                drop,
                evidence,
            )
        ]
    if row["active"]:
        return []
    what = (
        f"holds back vacuum of the system catalogs ({row['catalog_xmin_age']} transactions "
        "behind) and keeps"
        if row["catalog_xmin_age"] is not None
        else "keeps"
    )
    return [
        Finding(
            "horizon.slot",
            WARNING,
            f"replication slot {name!r} is inactive: it {what} {wal} of WAL, growing until "
            "the disk is full",
            drop,
            evidence,
        )
    ]


# -- vacuum -------------------------------------------------------------------------------


def vacuum(ctx: Context) -> list[Finding]:
    [table] = ctx.rows("doctor_task_table")
    conf = ctx.conf
    findings = []
    # The workers vacuum over a direct connection: behind a transaction pooler, only
    # DATABASE's workers, over LISTEN_DATABASE (worker/worker.py).
    pooled = conf.TRANSACTION_POOLER and (ctx.alias != conf.DATABASE or not conf.LISTEN_DATABASE)
    vacuumer = conf.VACUUM_INTERVAL is not None and table["owned"] and not pooled
    autovacuum = table["autovacuum_server"] and table["autovacuum_table"]
    if not autovacuum:
        where = "on this server" if not table["autovacuum_server"] else "for pgqueue_task"
        findings.append(
            Finding(
                "vacuum.autovacuum",
                WARNING if vacuumer else PROBLEM,
                f"autovacuum is off {where}"
                + (
                    ": only the workers' vacuumer cleans pgqueue_task, and only while workers run"
                    if vacuumer
                    else ", and the workers' vacuumer is off: nothing vacuums pgqueue_task"
                ),
                "Turn autovacuum on (autovacuum = on; ALTER TABLE pgqueue_task RESET "
                "(autovacuum_enabled)): the queue's other tables (pgqueue_worker, written by "
                "every heartbeat; pgqueue_queue; pgqueue_dependency) have no vacuumer of "
                "their own.",
                {
                    "autovacuum_server": table["autovacuum_server"],
                    "autovacuum_table": table["autovacuum_table"],
                },
            )
        )
    if conf.VACUUM_INTERVAL is not None and not table["owned"]:
        findings.append(
            Finding(
                "vacuum.vacuumer",
                WARNING,
                "this role does not own pgqueue_task: workers that run as it cannot "
                "VACUUM it, so their vacuumer is off and autovacuum alone keeps the claim "
                "index clean",
                "Run the workers as the role that ran the migrations (the table's owner), "
                "or set VACUUM_INTERVAL = None to say so.",
                {"vacuum_interval": conf.VACUUM_INTERVAL},
            )
        )
    dead, live = table["dead_tuples"] or 0, table["live_tuples"] or 0
    limit = max(1000.0, ctx.thresholds.dead_tuples_factor * conf.VACUUM_THRESHOLD)
    severity = ladder(dead, limit)
    findings.append(
        Finding(
            "vacuum.dead_tuples",
            severity,
            f"pgqueue_task has {dead:,} dead tuples beside {live:,} live; last VACUUM (by "
            f"hand or the workers' vacuumer): {ago(table['last_vacuum_seconds'])}, last "
            f"autovacuum: {ago(table['last_autovacuum_seconds'])}",
            ""
            if severity == INFO
            else "If a horizon finding names a session, a prepared transaction or a slot, "
            "end it first: VACUUM cannot remove what it holds back. Then VACUUM (ANALYZE) "
            "pgqueue_task, and check that the workers' vacuumer runs (VACUUM_INTERVAL, "
            "the table's owner) or autovacuum does.",
            {
                "table": "pgqueue_task",
                **rounded(
                    {
                        k: table[k]
                        for k in (
                            "live_tuples",
                            "dead_tuples",
                            "last_vacuum_seconds",
                            "last_autovacuum_seconds",
                            "last_analyze_seconds",
                            "vacuum_count",
                            "autovacuum_count",
                        )
                    }
                ),
                "warning_at": int(limit),
            },
        )
    )
    if table["frozen_xid_age"] >= table["freeze_max_age"]:
        findings.append(
            Finding(
                "vacuum.wraparound",
                PROBLEM if table["frozen_xid_age"] >= 1_000_000_000 else WARNING,
                f"pgqueue_task's oldest unfrozen transaction id is {table['frozen_xid_age']:,} "
                f"transactions old, past autovacuum_freeze_max_age "
                f"({table['freeze_max_age']:,}): a vacuum to prevent wraparound is due",
                "Let the anti-wraparound vacuum finish (end what holds the horizon back), or "
                "run VACUUM (FREEZE) pgqueue_task.",
                {k: table[k] for k in ("frozen_xid_age", "freeze_max_age")},
            )
        )
    return findings


# -- bloat --------------------------------------------------------------------------------


def bloat(ctx: Context) -> list[Finding]:
    t = ctx.thresholds
    [table] = ctx.rows("doctor_task_table")
    findings = []
    if table["estimated_live_bytes"] is None:
        findings.append(
            Finding(
                "bloat.table",
                INFO,
                "pgqueue_task has no statistics yet (never analyzed): its bloat cannot be "
                "estimated",
                "ANALYZE pgqueue_task (the workers' vacuumer and autovacuum do).",
                {"table": "pgqueue_task", "table_bytes": table["table_bytes"]},
            )
        )
    else:
        findings.append(
            _bloat_finding(
                "bloat.table",
                "pgqueue_task",
                table["table_bytes"],
                table["estimated_live_bytes"],
                t,
                "VACUUM makes the space reusable for new rows; only pg_repack, or VACUUM "
                "FULL (which locks the table: every enqueue and claim waits), gives it back "
                "to the disk. A queue's table that shrank after a spike reuses it anyway.",
                always=True,
            )
        )
    for row in ctx.rows("doctor_task_indexes"):
        if row["estimated_bytes"] is None:
            continue
        finding = _bloat_finding(
            "bloat.index",
            row["index"],
            row["index_bytes"],
            row["estimated_bytes"],
            t,
            f"REINDEX INDEX CONCURRENTLY {row['index']}; rebuilds it without blocking "
            "enqueues and claims.",
        )
        if finding is not None:
            findings.append(finding)
    return findings


def _bloat_finding(
    check: str,
    relation: str,
    size: int,
    live: int,
    t: Thresholds,
    fix: str,
    always: bool = False,
) -> Finding | None:
    bloat = max(0, size - live)
    ratio = bloat / size if size else 0.0
    if ratio < t.bloat_ratio and not always:
        return None
    severity = WARNING if ratio >= t.bloat_ratio and bloat >= t.bloat_bytes else INFO
    kind = "index" if check == "bloat.index" else "table"
    return Finding(
        check,
        severity,
        f"{relation} takes {size_words(size)}, about {size_words(bloat)} ({ratio:.0%}) more "
        "than its live contents (an estimate from the statistics)",
        fix if severity != INFO else "",
        {
            kind: relation,
            "bytes": size,
            "estimated_live_bytes": live,
            "bloat_ratio": round(ratio, 3),
        },
    )


# -- claim --------------------------------------------------------------------------------


def claim(ctx: Context) -> list[Finding]:
    routes = _probe_routes(ctx)
    if not routes:
        return []
    # The worker's planner settings (worker/connection.py): the claim's index order.
    ctx.cursor.execute(
        "SELECT set_config('enable_sort', 'off', true), "
        "set_config('enable_bitmapscan', 'off', true)"
    )
    worst: dict[str, Any] | None = None
    for queue, task_name, version in routes:
        params = {"queue": queue, "task_name": task_name, "handler_version": version}
        try:
            with transaction.atomic(using=ctx.alias):
                ctx.cursor.execute(QUERIES["doctor_claim_probe"], params)
                (plan,) = ctx.cursor.fetchone()
        except DatabaseError as exc:
            return [
                Finding(
                    "claim.index",
                    PROBLEM,
                    f"finding the head of queue {queue}, task {task_name} v{version} in "
                    f"pgqueue_task_claim did not finish: {str(exc).strip()}",
                    _CLAIM_FIX,
                    {"index": "pgqueue_task_claim", **params},
                )
            ]
        plan = (plan if isinstance(plan, list) else json.loads(plan))[0]
        node = plan["Plan"]
        buffers = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
        if worst is None or buffers > worst["buffers"]:
            worst = {
                **params,
                "buffers": buffers,
                "milliseconds": round(plan.get("Execution Time", 0.0), 3),
            }
    assert worst is not None
    severity = ladder(worst["buffers"], ctx.thresholds.claim_buffers)
    return [
        Finding(
            "claim.index",
            severity,
            f"finding the head of queue {worst['queue']}, task {worst['task_name']} "
            f"v{worst['handler_version']} in pgqueue_task_claim read {worst['buffers']:,} "
            f"buffers (a clean index: about {CLEAN_PROBE_BUFFERS}); each claim of it does "
            "the same",
            "" if severity == INFO else _CLAIM_FIX,
            {
                "index": "pgqueue_task_claim",
                **worst,
                "clean_index_buffers": CLEAN_PROBE_BUFFERS,
                "routes_probed": len(routes),
            },
        )
    ]


_CLAIM_FIX = (
    "Dead entries lie in front of the head: rows claimed since the last VACUUM, kept by "
    "whatever holds the horizon back (see the horizon findings). End that, then VACUUM "
    "pgqueue_task; REINDEX INDEX CONCURRENTLY pgqueue_task_claim rebuilds the index "
    "without blocking enqueues and claims."
)


def _probe_routes(ctx: Context) -> list[tuple[str, str, int]]:
    """What the claims walk: the (queue, task, version) of due tasks, then every other
    one a live worker claims; at most ``probe_routes`` of them."""
    due = sorted(
        (group.name, row["task_name"], row["handler_version"])
        for group in ctx.groups()
        for row in group.rows
        if row["pending_routable"] + row["pending_unroutable"]
    )
    served = sorted(
        (queue, name, version)
        for worker in ctx.workers()
        for queue in worker["queues"]
        for name, version in worker["routes"]
    )
    return list(dict.fromkeys(due + served))[: ctx.thresholds.probe_routes]


# -- connections --------------------------------------------------------------------------


def connections(ctx: Context) -> list[Finding]:
    t = ctx.thresholds
    [row] = ctx.rows("doctor_connections")
    available = row["max_connections"] - row["reserved"]
    ratio = row["used"] / available if available else 1.0
    severity = PROBLEM if ratio >= 0.95 else WARNING if ratio >= t.connections_ratio else INFO
    findings = [
        Finding(
            "connections.use",
            severity,
            f"the server has {row['used']} of {available} connections in use ({ratio:.0%}); "
            f"this database {row['this_database']}, its workers' own {row['workers']}",
            ""
            if severity == INFO
            else "Put a pooler (PgBouncer) in front of the web processes (docs/scaling.md), "
            "or raise max_connections; look for idle connections in pg_stat_activity.",
            {**row, "available": available, "ratio": round(ratio, 3)},
        )
    ]
    workers = ctx.workers()
    budget = sum(WORKER_OWN_CONNECTIONS + w["concurrency"] for w in workers)
    if workers:
        over = budget > available
        pooled = ctx.conf.TRANSACTION_POOLER
        findings.append(
            Finding(
                "connections.budget",
                WARNING if over and not pooled else INFO,
                f"at their peak the {len(workers)} live worker(s) of this database may hold "
                f"{budget:,} connections ({WORKER_OWN_CONNECTIONS} each plus one per slot "
                f"whose handler uses the database), and the server allows {available}"
                + (" (behind a transaction pooler: compare with its pool size)" if pooled else ""),
                "Lower --concurrency, use Django's connection pool for the handlers (its "
                "max_size caps their part), or a pooler (docs/worker.md, 'The budget')."
                if over and not pooled
                else "",
                {"workers": len(workers), "budget": budget, "available": available},
            )
        )
    return findings
