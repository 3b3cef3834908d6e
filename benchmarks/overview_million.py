"""How long the admin's queue overview takes with a million rows in the task table.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/pgq_overview_1m \\
        .venv/bin/python benchmarks/overview_million.py [--rows 1000000] [--repeat 20]

Migrates that database, fills its (empty) task table with a day of history and a live
backlog using generate_series, ANALYZEs, then times: the three reads of the overview
(``build_overview``), the whole admin page as Django renders it, the task list, and a
scrape of the queue gauges. It prints the scan nodes of the overview's statements, to
show that no statement reads the whole table. It refuses a table that already has rows
unless ``--replace`` is given (which empties it).

The mix, for N rows: 96% succeeded over the last 24 h (RESULT_TTL), 1% cancelled, 0.5%
dead letters over 7 days (DEAD_TTL), 2% due and waiting up to 10 minutes (2.5% of
them for a task no worker serves), 0.48% scheduled for later, 0.02% running; three
queues, eight task names, one live worker.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

FILL = """
INSERT INTO pgqueue_task (queue, task_name, state, args, enqueued_at, run_at, started_at,
                          last_attempted_at, finished_at, attempt, result)
SELECT (ARRAY['default', 'emails', 'reports'])[1 + n %% 3], 'shop.tasks.t' || (n %% 8),
       'succeeded', jsonb_build_array(n), f - interval '3 seconds', f - interval '3 seconds',
       f - interval '1 second', f - interval '1 second', f, 1, to_jsonb(n)
  FROM (SELECT n, now() - make_interval(secs => n * 86400.0 / %(succeeded)s) AS f
          FROM generate_series(1, %(succeeded)s) AS n) AS s;

INSERT INTO pgqueue_task (queue, task_name, state, enqueued_at, run_at, finished_at,
                          cancel_requested)
SELECT 'default', 'shop.tasks.t' || (n %% 8), 'cancelled', f - interval '1 minute',
       f - interval '1 minute', f, true
  FROM (SELECT n, now() - make_interval(secs => n * 86400.0 / %(cancelled)s) AS f
          FROM generate_series(1, %(cancelled)s) AS n) AS s;

INSERT INTO pgqueue_task (queue, task_name, state, enqueued_at, run_at, last_attempted_at,
                          finished_at, attempt, errors)
SELECT (ARRAY['default', 'emails', 'reports'])[1 + n %% 3], 'shop.tasks.t' || (n %% 8),
       'failed', f - interval '10 minutes', f - interval '1 minute', f - interval '2 seconds',
       f, 3, jsonb_build_array(jsonb_build_object('attempt', 3, 'type', 'ValueError',
                                                  'message', 'boom', 'traceback', 'Tr...'))
  FROM (SELECT n, now() - make_interval(secs => n * 604800.0 / %(failed)s) AS f
          FROM generate_series(1, %(failed)s) AS n) AS s;

INSERT INTO pgqueue_task (queue, task_name, state, enqueued_at, run_at, priority)
SELECT (ARRAY['default', 'emails', 'reports'])[1 + n %% 3],
       CASE WHEN n %% 40 = 0 THEN 'billing.charge' ELSE 'shop.tasks.t' || (n %% 8) END,
       'pending', now() - make_interval(secs => n * 600.0 / %(due)s),
       now() - make_interval(secs => n * 600.0 / %(due)s), (n %% 5) - 2
  FROM generate_series(1, %(due)s) AS n;

INSERT INTO pgqueue_task (queue, task_name, state, run_at)
SELECT (ARRAY['default', 'emails', 'reports'])[1 + n %% 3], 'shop.tasks.t' || (n %% 8),
       'pending', now() + make_interval(secs => n * 3)
  FROM generate_series(1, %(scheduled)s) AS n;

INSERT INTO pgqueue_task (queue, task_name, state, run_at, started_at, last_attempted_at,
                          attempt, lease_token, lease_expires_at, worker_id)
SELECT (ARRAY['default', 'emails', 'reports'])[1 + n %% 3], 'shop.tasks.t' || (n %% 8),
       'running', now() - interval '5 seconds', now() - interval '2 seconds',
       now() - interval '2 seconds', 1, gen_random_uuid(), now() + interval '1 hour',
       'bench-worker'
  FROM generate_series(1, %(running)s) AS n;

INSERT INTO pgqueue_worker (id, hostname, pid, queues, routes, concurrency)
VALUES ('bench-worker', 'bench', 1, '["default", "emails", "reports"]',
        (SELECT jsonb_agg(jsonb_build_array('shop.tasks.t' || i, 1))
           FROM generate_series(0, 7) AS i),
        %(running)s);
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--replace", action="store_true", help="empty a non-empty table")
    args = parser.parse_args()

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment
    from prometheus_client import CollectorRegistry, generate_latest

    from django_pgqueue.db.sql import QUERIES
    from django_pgqueue.ops.metrics import QueueCollector
    from django_pgqueue.ops.operations import queue_capacity, queue_history, queue_overview
    from django_pgqueue.ops.overview import build_overview

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgqueue_task")
        (existing,) = cursor.fetchone()
        if existing and not args.replace:
            sys.exit(f"pgqueue_task already has {existing} rows; pass --replace to empty it")
        cursor.execute("TRUNCATE pgqueue_task; DELETE FROM pgqueue_worker")
        n = args.rows
        counts = {
            "cancelled": n // 100,
            "failed": n // 200,
            "due": n // 50,
            "scheduled": n * 48 // 10_000,
            "running": max(1, n // 5000),
        }
        counts["succeeded"] = n - sum(counts.values())
        started = time.perf_counter()
        cursor.execute(FILL, counts)
        cursor.execute("VACUUM ANALYZE pgqueue_task")
        cursor.execute("SELECT count(*) FROM pgqueue_task")
        print(
            f"filled {cursor.fetchone()[0]} rows in {time.perf_counter() - started:.1f}s: {counts}"
        )

        for name, params in (
            ("queue_overview", {"stale_seconds": 3600}),
            ("queue_history", {"minutes": 60}),
        ):
            cursor.execute("EXPLAIN " + QUERIES[name], params)
            plan = [row[0].strip().lstrip("-> ") for row in cursor.fetchall()]
            scans = [line.split("  (")[0] for line in plan if "Scan" in line and "pgqueue" in line]
            print(f"{name}: " + "; ".join(scans))

    def timed(label: str, work) -> None:
        work()  # warm-up
        samples = []
        for _ in range(args.repeat):
            began = time.perf_counter()
            work()
            samples.append((time.perf_counter() - began) * 1000)
        samples.sort()
        p95 = samples[max(0, round(len(samples) * 0.95) - 1)]
        print(
            f"{label:<38} median {statistics.median(samples):7.1f} ms   "
            f"p95 {p95:7.1f} ms   max {samples[-1]:7.1f} ms"
        )

    setup_test_environment()
    user_model = get_user_model()
    admin_user, _ = user_model.objects.get_or_create(
        username="overview-benchmark", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(admin_user)

    def page(url: str):
        def get() -> None:
            response = client.get(url)
            assert response.status_code == 200, response.status_code

        return get

    registry = CollectorRegistry()
    registry.register(QueueCollector(ttl=0))
    print(f"\n{args.repeat} runs each, warm cache:")
    timed("overview: the three reads", build_overview)
    timed("  queue_overview", queue_overview)
    timed("  queue_capacity", queue_capacity)
    timed("  queue_history", queue_history)
    timed("overview: admin page, rendered", page("/admin/django_pgqueue/queueoverview/"))
    timed("task list: admin page, rendered", page("/admin/django_pgqueue/task/"))
    timed("task list: dead letters", page("/admin/django_pgqueue/task/?state__exact=failed"))
    timed("queue gauges: one uncached scrape", lambda: generate_latest(registry))


if __name__ == "__main__":
    main()
