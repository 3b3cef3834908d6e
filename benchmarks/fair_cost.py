"""``python -m benchmarks.fair_cost``: what a fair task's claim and settlement cost the
database, against a plain task's (docs/performance.md, "Many tenants").

One table holds ``--tasks`` due tasks of a fair task (benchmarks/tenant_tasks.py:
``fair_probe``, one key) and as many of a plain one (``plain_probe``). One connection
claims 20 of each statement's own in turn (``claim_fair``, ``claim_plain``: the
statements a worker without limits uses) and settles them, 50 claims of one, then 50
of the other, until both are drained; each statement's time is measured around it, on
the client. Prints the median per claim and per settlement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid

BATCH = 20
ROUND = 50


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fair_cost", description=__doc__)
    parser.add_argument("--tasks", type=int, default=40_000, help="due tasks of each")
    args = parser.parse_args(argv)

    from benchmarks.harness import prepare_database, raw_connection, reset_queue, setup_django

    os.environ["PGQUEUE_BENCH_TENANTS"] = "1"
    os.environ["DATABASE_URL"] = prepare_database()
    setup_django(os.environ["DATABASE_URL"])
    from benchmarks.tenant_tasks import fair_probe, plain_probe
    from django_pgqueue.db.sql import QUERIES
    from django_pgqueue.worker.claimer import claim_statement, route_params

    reset_queue()
    for definition in (fair_probe, plain_probe):
        for start in range(0, args.tasks, 1000):
            definition.enqueue_many([("A", n) for n in range(start, min(args.tasks, start + 1000))])
    statements = {}
    for definition, fair in ((fair_probe, True), (plain_probe, False)):
        route = (definition.name, definition.version)
        params = route_params(["default"], [route], 3600, None, None,
                              fair_routes={route} if fair else None)
        params.update(look_for_starving=False, limit=BATCH, lease_seconds=300, worker_id="w")
        statements[claim_statement(params)] = params
    claims: dict[str, list[float]] = {name: [] for name in statements}
    settles: dict[str, list[float]] = {name: [] for name in statements}
    with raw_connection() as conn:
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE pgqueue_task")
        conn.execute("CHECKPOINT")
        for _ in range(args.tasks // BATCH // ROUND):
            for name, params in statements.items():
                for _ in range(ROUND):
                    params["token"] = str(uuid.uuid4())
                    started = time.perf_counter()
                    rows = conn.execute(QUERIES[name], params).fetchall()
                    claimed = time.perf_counter()
                    outcomes = [{"id": r[0], "attempt": r[7], "token": r[11], "label": "success",
                                 "state": "succeeded", "result": 1.0} for r in rows]  # fmt: skip
                    settle = {"outcomes": json.dumps(outcomes), "limit_queues": [],
                              "limit_concurrency": []}  # fmt: skip
                    conn.execute(QUERIES["settle"], settle).fetchall()
                    settled = time.perf_counter()
                    claims[name].append((claimed - started) * 1000)
                    settles[name].append((settled - claimed) * 1000)
    for name in statements:
        print(f"{name}: a claim of {BATCH} {statistics.median(claims[name]):.3f} ms, "
              f"their settlement {statistics.median(settles[name]):.3f} ms "
              f"(medians of {len(claims[name])})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
