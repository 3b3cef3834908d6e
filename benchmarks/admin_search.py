"""What the admin's search by content costs on a big task table (docs/admin.md).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/pgq_admin_10m \\
        .venv/bin/python benchmarks/admin_search.py [--fill 10000000] [--repeat 5]

``--fill N`` migrates the database and fills its (empty) task table with N rows by
generate_series, in chunks of 1,000,000 (minutes for 10,000,000): a week of history,
0.5% dead letters with an error each, 0.04% pending; kwargs ``{"order_id": n,
"customer": ..., "notify": ...}``, args ``[n, "shopK"]``, metadata ``{"tenant": ...,
"request_id": md5}``. Without it, the table as it is.

Then it times the task list as the admin draws it (Django's test client, a superuser,
the whole page rendered: the count and the first page of 100), median of ``--repeat``
runs after one warm-up, for searches that find a task in the newest window, that find
nothing (so read the whole window), a frequent term, error text, and the window before.
It also runs the same containment with no window once (``--unbounded``), to show what
the window saves, and prints the scan node of the bounded query (EXPLAIN ANALYZE).
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

CHUNK = 1_000_000
FILL = """
INSERT INTO pgqueue_task (queue, task_name, state, args, kwargs, metadata, enqueued_at, run_at,
                          started_at, last_attempted_at, finished_at, attempt, result, errors)
SELECT (ARRAY['default','emails','reports'])[1 + n %% 3],
       'shop.orders.tasks.sync_order_' || (n %% 8),
       CASE WHEN n %% 200 = 0 THEN 'failed' WHEN n %% 2500 = 1 THEN 'pending'
            ELSE 'succeeded' END,
       jsonb_build_array(n, 'shop' || (n %% 500)),
       jsonb_build_object('order_id', n, 'customer', 'c' || (n %% 100000), 'notify', n %% 2 = 0),
       jsonb_build_object('tenant', 't' || (n %% 1000), 'request_id', md5(n::text)),
       f, f, f, f, CASE WHEN n %% 2500 = 1 THEN NULL ELSE f + interval '1 second' END, 1,
       CASE WHEN n %% 200 = 0 OR n %% 2500 = 1 THEN NULL ELSE to_jsonb(n) END,
       CASE WHEN n %% 200 = 0 THEN jsonb_build_array(jsonb_build_object(
            'attempt', 3, 'type', 'ConnectionError',
            'message', 'shop' || (n %% 500) || '.example.com: connection refused (order '
                       || n || ')',
            'traceback', 'Traceback (most recent call last):\\n  File "shop/orders/tasks.py", '
                         || 'line 42, in sync_order\\nConnectionError: connection refused'))
            ELSE '[]'::jsonb END
  FROM (SELECT n, now() - make_interval(secs => (%(total)s - n) * 604800.0 / %(total)s) AS f
          FROM generate_series(%(start)s, %(stop)s) AS n) AS s
"""


def fill(total: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT FROM pgqueue_task)")
        if cursor.fetchone()[0]:
            raise SystemExit("the task table has rows: fill an empty database")
        for start in range(1, total + 1, CHUNK):
            stop = min(total, start + CHUNK - 1)
            cursor.execute(FILL, {"total": total, "start": start, "stop": stop})
            print(f"filled {stop:,} rows", flush=True)
        cursor.execute("VACUUM ANALYZE pgqueue_task")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fill", type=int, default=0, help="fill an empty table first")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--unbounded", action="store_true", help="also time no window")
    args = parser.parse_args()

    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment

    from django_pgqueue.core.conf import get_settings

    settings.ALLOWED_HOSTS = ["*"]
    setup_test_environment()
    call_command("migrate", verbosity=0)
    if args.fill:
        fill(args.fill)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), max(id), pg_size_pretty(pg_total_relation_size("
                       "'pgqueue_task')) FROM pgqueue_task")  # fmt: skip
        rows, top, size = cursor.fetchone()
    print(f"pgqueue_task: {rows:,} rows, max id {top:,}, {size} with its indexes")

    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    url = "/admin/django_pgqueue/task/"
    window = get_settings().ADMIN_SEARCH_ROWS
    cases = [
        ("the list, no search", {}),
        ("kwargs {order_id: newest-10}, 1 match", {"kwargs": f'{{"order_id": {top - 10}}}'}),
        ("kwargs {order_id: 42}, no match in the window", {"kwargs": '{"order_id": 42}'}),
        ("args [\"shop7\"], ~2,000 matches", {"args": '["shop7"]'}),
        ("metadata {tenant: t7}, ~1,000 matches", {"metadata": '{"tenant": "t7"}'}),
        ("error text 'order <newest failed>'", {"error": f"(order {top - top % 200})"}),
        ("error text, no match", {"error": "no such text"}),
        (
            "kwargs {order_id: 42}, the oldest window",
            {"kwargs": '{"order_id": 42}', "search_below": str(window + 1)},
        ),
        (
            "kwargs {order_id: 42} + state=failed",
            {"kwargs": '{"order_id": 42}', "state__exact": "failed"},
        ),
    ]
    print(f"window: {window:,} ids; median of {args.repeat} runs after a warm-up (ms)")
    for label, params in cases:
        client.get(url, params)  # warm-up
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            response = client.get(url, params)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code in (200, 302), (label, response.status_code)
        found = (
            response.context["cl"].result_count
            if response.status_code == 200
            else "none: stopped by ADMIN_SEARCH_TIMEOUT,"
        )
        print(
            f"  {label:48s} {statistics.median(times):8.0f} ms  "
            f"(min {min(times):.0f}, max {max(times):.0f}; {found} found)",
            flush=True,
        )

    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS) SELECT count(*) FROM pgqueue_task "
            "WHERE kwargs @> '{\"order_id\": 42}' AND id >= %s AND id < %s",
            [top + 1 - window, top + 1],
        )
        print("bounded count:\n  " + "\n  ".join(r[0] for r in cursor.fetchall()))
        if args.unbounded:
            started = time.perf_counter()
            cursor.execute(
                "SELECT count(*) FROM pgqueue_task WHERE kwargs @> '{\"order_id\": 42}'"
            )
            print(
                f"unbounded count (every row): {(time.perf_counter() - started) * 1000:.0f} ms"
            )


if __name__ == "__main__":
    main()
