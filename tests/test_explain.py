"""The hot-path statements use their indexes on a deep backlog (EXPLAIN, not timing)."""

import pytest

from django_pgqueue.sql import QUERIES
from tests.sqlhelpers import all_routes

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def backlog(pg):
    """100k pending tasks over three queues and mixed priorities, plus history."""
    pg.execute("""
        INSERT INTO pgqueue_task (queue, task_name, priority, args, run_at)
        SELECT (ARRAY['default', 'emails', 'reports'])[1 + n % 3],
               'tests.tasks.noop', (n % 7) - 3, jsonb_build_array(n),
               now() - make_interval(secs => n % 1000)
          FROM generate_series(1, 100000) AS n
    """)
    pg.execute("""
        INSERT INTO pgqueue_task (queue, task_name, state, finished_at, attempt)
        SELECT 'default', 'tests.tasks.noop', 'succeeded', now(), 1
          FROM generate_series(1, 20000)
    """)
    pg.execute("ANALYZE pgqueue_task")
    return pg


def plan(conn, name, params):
    rows = conn.execute("EXPLAIN " + QUERIES[name], params).fetchall()
    return "\n".join(r[0] for r in rows)


def test_the_claim_is_an_index_ordered_top_n_on_a_100k_backlog(backlog):
    text = plan(
        backlog,
        "claim",
        {
            "queue": "default",
            "limit": 10,
            "routes": all_routes(),
            "lease_seconds": 30,
            "starvation_seconds": 60,
            "worker_id": "w",
        },
    )

    assert "Index Scan using pgqueue_task_claim" in text, text
    assert "Index Scan using pgqueue_task_due" in text, text
    assert "Seq Scan on pgqueue_task" not in text, text
    assert "Sort" not in text.split("CTE picked")[1].split("CTE")[0], text


def test_the_lease_sweep_reads_only_running_rows(backlog):
    text = plan(backlog, "recover_expired_leases", {"limit": 100})

    assert "pgqueue_task_lease" in text, text
    assert "Seq Scan on pgqueue_task" not in text, text


def test_next_due_uses_the_due_index(backlog):
    text = plan(backlog, "next_due", {"queue": "emails", "routes": all_routes()})

    assert "pgqueue_task_due" in text, text
    assert "Seq Scan on pgqueue_task" not in text, text


def test_prune_uses_the_retention_index(backlog):
    text = plan(backlog, "prune", {"result_ttl": 3600, "dead_ttl": 3600, "batch": 500})

    assert "pgqueue_task_retention" in text, text
    assert "Seq Scan on pgqueue_task" not in text, text


def test_worker_connections_cannot_plan_a_sort_or_bitmap_scan_of_the_backlog(pg):
    # Stale statistics once made the planner sort the whole backlog for every claim
    # (0.8 s a claim); the worker's sessions rule those plan shapes out.
    settings = dict(pg.execute(
        "SELECT name, setting FROM pg_settings WHERE name IN ('enable_sort', 'enable_bitmapscan')"
    ).fetchall())

    assert settings == {"enable_sort": "off", "enable_bitmapscan": "off"}
