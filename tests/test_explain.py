"""The hot-path statements read what they take, not what the table holds (EXPLAIN).

Each claim is measured in blocks of the queue's tables and indexes touched (EXPLAIN
ANALYZE, rolled back): beside a backlog of rows the claim cannot take (scheduled,
unroutable, another queue, finished, waiting) it must touch about as much as on a clean
table. The count is the transaction's own statistics for those relations, not the plan's
buffer total: that total also counts system-catalog reads, hundreds of which a busy
server adds at random (another database's DDL resets this backend's catalog caches).
Plans are checked with the server's default planner settings and with the worker's own
session settings, so a plan that walks the backlog fails a test whichever the planner
prefers.
"""

import json

import psycopg
import pytest
from django.db import connections

from django_pgqueue.core.limits import parse_limits
from django_pgqueue.db.sql import QUERIES
from django_pgqueue.worker.claimer import stage_params
from django_pgqueue.worker.connection import connect
from tests.conftest import database_url
from tests.sqlhelpers import all_routes, route_params

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = 50_000
DUE = 200

# What else the table holds: rows no claim of a "default" worker may take.
SHAPES = {
    "scheduled": "INSERT INTO pgqueue_task (queue, task_name, priority, state, run_at) "
    "SELECT 'default', 'tests.tasks.noop', 10, 'scheduled', now() + interval '1 hour' "
    "FROM generate_series(1, %(rows)s)",
    "unroutable": "INSERT INTO pgqueue_task (queue, task_name, priority, run_at) "
    "SELECT 'default', 'tests.not_deployed', 10, now() - interval '10 minutes' "
    "FROM generate_series(1, %(rows)s)",
    "other_queue": "INSERT INTO pgqueue_task (queue, task_name, priority) "
    "SELECT 'other', 'tests.tasks.noop', 10 FROM generate_series(1, %(rows)s)",
    "terminal": "INSERT INTO pgqueue_task (queue, task_name, state, attempt, finished_at) "
    "SELECT 'default', 'tests.tasks.noop', (ARRAY['succeeded', 'failed'])[1 + n %% 2], 1, now() "
    "FROM generate_series(1, %(rows)s) AS n",
    "waiting": "INSERT INTO pgqueue_task (queue, task_name, priority, state) "
    "SELECT 'default', 'tests.tasks.noop', 10, 'waiting' FROM generate_series(1, %(rows)s)",
}


@pytest.fixture(params=["server defaults", "worker session"])
def session(request, db_url):
    """A connection with the server's planner settings, or one like a worker's."""
    if request.param == "worker session":
        conn = connect("default")
    else:
        conn = psycopg.connect(database_url(connections["default"].settings_dict), autocommit=True)
    yield conn
    conn.close()


def fill(conn: psycopg.Connection, shape: str | None) -> None:
    conn.execute(
        "INSERT INTO pgqueue_task (queue, task_name, args) "
        "SELECT 'default', 'tests.tasks.noop', jsonb_build_array(n) "
        "FROM generate_series(1, %(due)s) AS n",
        {"due": DUE},
    )
    if shape is not None:
        conn.execute(SHAPES[shape], {"rows": ROWS})
    conn.execute("VACUUM ANALYZE pgqueue_task")


# Blocks of the queue's tables and indexes (every relation named pgqueue_*) this
# transaction has fetched so far, hits and reads. Statistics not yet flushed to the
# server are the backend's own, so the difference across one statement is that
# statement's.
QUEUE_BLOCKS = r"""
    SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint
    FROM pg_class c
    WHERE c.relname LIKE 'pgqueue\_%' AND c.relkind IN ('r', 'i')
"""


def analyze(conn: psycopg.Connection, query: str, params: dict) -> dict:
    """EXPLAIN ANALYZE the statement and roll its effects back.

    The plan comes back with the blocks of the task table and its indexes the statement
    touched, under "Queue Blocks".
    """
    conn.execute("BEGIN")
    try:
        # Planning reads index pages too (metapages, the ends of a range): a plain
        # EXPLAIN counts them, once to fill the caches and once to be subtracted.
        conn.execute("EXPLAIN " + QUERIES[query], params)
        (start,) = conn.execute(QUEUE_BLOCKS).fetchone()
        conn.execute("EXPLAIN " + QUERIES[query], params)
        (planned,) = conn.execute(QUEUE_BLOCKS).fetchone()
        (plan,) = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES[query], params
        ).fetchone()
        (end,) = conn.execute(QUEUE_BLOCKS).fetchone()
    finally:
        conn.execute("ROLLBACK")
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    top["Queue Blocks"] = (end - planned) - (planned - start)
    return top


def buffers(plan: dict) -> int:
    """Blocks of the queue's tables and indexes the statement touched (see analyze)."""
    return plan["Queue Blocks"]


def rows_read(plan: dict) -> int:
    """Rows the scans of pgqueue_task produced or threw away (a walk shows up here)."""
    own = 0
    if plan.get("Relation Name") == "pgqueue_task" and "Scan" in plan["Node Type"]:
        loops = plan.get("Actual Loops", 1)
        own = (plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)) * loops
    return own + sum(rows_read(child) for child in plan.get("Plans", []))


def node_types(plan: dict) -> list[str]:
    found = [f"{plan['Node Type']} {plan.get('Relation Name', '')}".strip()]
    for child in plan.get("Plans", []):
        found += node_types(child)
    return found


def claim_params(limit: int = 10, limited: bool = False) -> dict:
    limits = key_limits = None
    if limited:  # a concurrency and a rate limit that do not bind, and every route keyed
        limits = parse_limits({"default": {"concurrency": 1000, "rate": "100000/s"}})
        key_limits = dict.fromkeys(all_routes(), 5)
    return {
        # The worker's default CLAIM_BATCH_BYTES: its cut is part of the plan pinned.
        **route_params(["default"], all_routes(), 60.0, limits, key_limits,
                       claim_batch_bytes=8 * 1024 * 1024),
        "limit": limit,
        "token": "00000000-0000-0000-0000-000000000001",
        "lease_seconds": 30,
        "worker_id": "w",
    }


def claim_plan(conn: psycopg.Connection, limited: bool = False, query: str = "claim") -> dict:
    analyze(conn, query, claim_params(limited=limited))  # warm the caches
    return analyze(conn, query, claim_params(limited=limited))


@pytest.mark.parametrize("query", ["claim", "claim_plain"])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_claim_beside_rows_it_cannot_take_reads_what_it_reads_on_a_clean_table(
    session, shape, query
):
    fill(session, None)
    clean = claim_plan(session, query=query)
    session.execute("TRUNCATE pgqueue_task")

    fill(session, shape)
    beside = claim_plan(session, query=query)

    assert beside["Actual Rows"] == 10
    assert "Seq Scan pgqueue_task" not in node_types(beside), beside
    # The same rows read, however many others the table holds (a walk over the 50,000
    # would read them); pages touched may grow by one per index descent as the indexes
    # deepen, never with the number of rows.
    assert rows_read(beside) <= rows_read(clean) + 5, (rows_read(clean), rows_read(beside))
    assert buffers(beside) <= 2 * buffers(clean), (buffers(clean), buffers(beside))


@pytest.mark.parametrize("shape", SHAPES)
def test_a_limited_claim_beside_rows_it_cannot_take_reads_what_it_reads_on_a_clean_table(
    session, shape
):
    # Limits add counts of running rows (pgqueue_task_running) and of busy keys, never
    # a walk over the rows the claim cannot take.
    fill(session, None)
    clean = claim_plan(session, limited=True)
    session.execute("TRUNCATE pgqueue_task")

    fill(session, shape)
    beside = claim_plan(session, limited=True)

    assert beside["Actual Rows"] == 10
    assert "Seq Scan pgqueue_task" not in node_types(beside), beside
    assert rows_read(beside) <= rows_read(clean) + 5, (rows_read(clean), rows_read(beside))
    assert buffers(beside) <= 2 * buffers(clean), (buffers(clean), buffers(beside))


def test_under_a_scheduled_backlog_staging_and_next_due_read_one_index_entry(session):
    fill(session, "scheduled")
    params = stage_params(["default", "other"], 1000)

    stage = analyze(session, "stage", params)
    next_due = analyze(session, "next_due", params)

    assert buffers(stage) < 20, stage
    assert buffers(next_due) < 20, next_due
    assert "Seq Scan pgqueue_task" not in node_types(stage) + node_types(next_due)


def test_staging_fair_tasks_beside_a_fair_backlog_reads_the_heads_of_their_flows(session):
    # Given 50,000 pending tasks of one fair task over 1,000 keys, with their places,
    # and 10 of its tasks come due (statistics that say so)
    session.execute(
        "INSERT INTO pgqueue_task (queue, task_name, priority, fair_key, fair_tag) "
        "SELECT 'default', 'tests.tenant_tasks.fair_job', 10, 'customer:' || n %% 1000, n "
        "FROM generate_series(1, %(rows)s) AS n",
        {"rows": ROWS},
    )
    session.execute(
        "INSERT INTO pgqueue_task (queue, task_name, priority, fair_key, state, run_at) "
        "SELECT 'default', 'tests.tenant_tasks.fair_job', 10, 'customer:late', 'scheduled', "
        "now() - interval '1 second' FROM generate_series(1, 10)"
    )
    session.execute("VACUUM ANALYZE pgqueue_task")

    # When they are staged
    plan = analyze(session, "stage", stage_params(["default"], 1000))

    # Then their places come from the head of the flows and of their key's own flow (one
    # probe of each fair index), not from a walk over the backlog's pending rows
    assert "Seq Scan pgqueue_task" not in node_types(plan), node_types(plan)
    assert rows_read(plan) < 100, rows_read(plan)
    assert buffers(plan) < 400, buffers(plan)


def test_the_lease_sweep_reads_only_running_rows(session):
    fill(session, "terminal")

    plan = analyze(session, "recover_expired_leases", {"limit": 100})

    assert buffers(plan) < 20, plan


def test_prune_uses_the_retention_index(session):
    fill(session, "scheduled")

    plan = analyze(session, "prune", {"result_ttl": 3600, "dead_ttl": 3600, "batch": 500})

    assert buffers(plan) < 20, plan
    assert "Seq Scan pgqueue_task" not in node_types(plan)


def test_prune_of_a_long_history_with_workflow_edges_reads_only_its_batch(session):
    # Given 50,000 succeeded rows past their time to live, chained by 50,000 edges, and
    # statistics that say so
    session.execute(
        "INSERT INTO pgqueue_task (queue, task_name, state, finished_at) "
        "SELECT 'default', 'tests.tasks.noop', 'succeeded', now() - interval '2 hours' "
        "FROM generate_series(1, %(rows)s)",
        {"rows": ROWS},
    )
    session.execute(
        "INSERT INTO pgqueue_dependency (parent_id, child_id, resolved, proceed_on_failure) "
        "SELECT id, id + 1, true, false FROM pgqueue_task"
    )
    session.execute("VACUUM ANALYZE pgqueue_task")
    session.execute("VACUUM ANALYZE pgqueue_dependency")

    # When one batch of 500 is pruned, under the worker's generic plan too
    plan = analyze(session, "prune", {"result_ttl": 3600, "dead_ttl": 3600, "batch": 500})

    # Then the 500 rows and their edges go by index (no scan of either table), and the
    # statement reads a few blocks per row, not the table: 11 to 13 a row with the
    # deletes of edges and logs its CTEs make (a join over a sequential scan of
    # pgqueue_task read ~700 blocks more per batch)
    scans = node_types(plan)
    assert "Seq Scan pgqueue_task" not in scans, scans
    assert "Seq Scan pgqueue_dependency" not in scans, scans
    assert not any(name.startswith("Hash") for name in scans), scans
    assert buffers(plan) < 500 * 14, buffers(plan)


def test_worker_connections_cannot_plan_a_sort_or_bitmap_scan_of_the_backlog(pg):
    # Stale statistics once made the planner sort the whole backlog for every claim
    # (0.8 s a claim); the worker's sessions rule those plan shapes out, and JIT (which
    # those prices would otherwise trigger for microsecond statements).
    settings = dict(
        pg.execute(
            "SELECT name, setting FROM pg_settings "
            "WHERE name IN ('enable_sort', 'enable_bitmapscan', 'jit')"
        ).fetchall()
    )

    assert settings == {"enable_sort": "off", "enable_bitmapscan": "off", "jit": "off"}


# -- fair share (docs/tenants.md) -----------------------------------------------------
FAIR_ROWS = 100_000


def fill_fair(conn: psycopg.Connection, keys: int) -> None:
    """100,000 due tasks of tests.tenant_tasks.fair_job over ``keys`` keys, each key's
    rows one step apart from the head, as enqueue_many_keyed places them."""
    conn.execute(
        "INSERT INTO pgqueue_task (queue, task_name, args, fair_key, fair_tag) "
        "SELECT 'default', 'tests.tenant_tasks.fair_job', jsonb_build_array(n), "
        "'customer:' || (n %% %(keys)s), (n / %(keys)s)::float8 "
        "FROM generate_series(0, %(rows)s - 1) AS n",
        {"keys": keys, "rows": FAIR_ROWS},
    )
    conn.execute("VACUUM ANALYZE pgqueue_task")


def fair_params(look_for_starving: bool) -> dict:
    from tests.tenant_tasks import fair_job

    route = (fair_job.name, fair_job.version)
    return {
        **claim_params(),
        **route_params(["default"], [route], 60.0, claim_batch_bytes=8 * 1024 * 1024,
                       fair_routes={route}),
        "look_for_starving": look_for_starving,
    }


@pytest.mark.slow
@pytest.mark.parametrize("query", ["claim_fair", "claim"])
def test_a_fair_claim_reads_as_much_with_100000_keys_as_with_one(session, query):
    # Given 100,000 due tasks of one key, then of 100,000 keys (one each)
    params = fair_params(look_for_starving=query == "claim")
    fill_fair(session, keys=1)
    analyze(session, query, params)  # warm the caches
    one_key = analyze(session, query, params)
    session.execute("TRUNCATE pgqueue_task")
    fill_fair(session, keys=FAIR_ROWS)
    analyze(session, query, params)
    many_keys = analyze(session, query, params)

    # Then a claim of 10 reads the same rows: an index-ordered top-N, not a walk of keys
    assert one_key["Actual Rows"] == many_keys["Actual Rows"] == 10
    scans = node_types(many_keys)
    assert "Seq Scan pgqueue_task" not in scans, scans
    assert rows_read(many_keys) <= rows_read(one_key) + 5, (
        rows_read(one_key), rows_read(many_keys),
    )  # fmt: skip
    assert buffers(many_keys) <= 2 * buffers(one_key), (buffers(one_key), buffers(many_keys))


@pytest.mark.slow
def test_a_fair_enqueue_reads_two_index_entries_whatever_the_number_of_keys(session):
    from tests.tenant_tasks import fair_job

    fill_fair(session, keys=FAIR_ROWS // 2)  # two tasks per key
    row = {
        "id": None, "queue": "default", "task_name": fair_job.name, "handler_version": 1,
        "priority": 0, "args": "[]", "kwargs": "{}", "run_at": None, "delay": "0",
        "state": "pending", "max_attempts": 3, "retry_policy": "{}", "timeout": None,
        "unique_key": None, "metadata": "{}", "concurrency_key": None, "expires_at": None,
        "expires": None, "fair_key": "customer:7", "fair_weight": 1.0, "sequence_key": None,
        "sequence_hold": False,
    }  # fmt: skip

    plan = analyze(session, "enqueue_keyed", row)

    assert "Seq Scan pgqueue_task" not in node_types(plan)
    assert buffers(plan) < 60, plan


def test_prune_and_storing_task_logs_reach_them_by_index_under_a_long_history(session):
    # Given 50,000 succeeded rows past their time to live, each with a row of logs, 10
    # tasks just settled, and statistics that say so
    session.execute(
        "INSERT INTO pgqueue_task (queue, task_name, state, finished_at) "
        "SELECT 'default', 'tests.tasks.noop', 'succeeded', now() - interval '2 hours' "
        "FROM generate_series(1, %(rows)s)",
        {"rows": ROWS},
    )
    session.execute(
        "INSERT INTO pgqueue_task_log (task_id, attempt, lease_token, records, bytes) "
        "SELECT id, 1, gen_random_uuid(), '[]', 100 FROM pgqueue_task"
    )
    session.execute(
        "INSERT INTO pgqueue_task (queue, task_name, state, attempt, lease_token, "
        "lease_expires_at) SELECT 'default', 'tests.tasks.noop', 'running', 1, "
        "gen_random_uuid(), now() + interval '1 minute' FROM generate_series(1, 10)"
    )
    running = session.execute(
        "SELECT id, lease_token::text FROM pgqueue_task WHERE state = 'running'"
    ).fetchall()
    session.execute(QUERIES["settle"], {
        "outcomes": json.dumps([{"id": id_, "attempt": 1, "token": token, "label": "success",
                                 "state": "succeeded"} for id_, token in running]),
        "limit_queues": [], "limit_concurrency": [],
    })  # fmt: skip
    session.execute("VACUUM ANALYZE pgqueue_task")
    session.execute("VACUUM ANALYZE pgqueue_task_log")
    logs = [
        {"id": id_, "attempt": 1, "token": token, "records": [{"message": "hi"}],
         "dropped": 0, "bytes": 100, "task_bytes": 1000}
        for id_, token in running
    ]  # fmt: skip

    # When a batch of 500 is pruned, and the 10 settlements' records are stored
    pruned = analyze(session, "prune", {"result_ttl": 3600, "dead_ttl": 3600, "batch": 500})
    stored = analyze(session, "store_task_logs", {"logs": json.dumps(logs)})

    # Then neither scans the logs, nor the tasks: by pgqueue_task_log_task, by id
    for plan in (pruned, stored):
        assert "Seq Scan pgqueue_task_log" not in node_types(plan), node_types(plan)
        assert "Seq Scan pgqueue_task" not in node_types(plan), node_types(plan)
    assert stored["Actual Rows"] == 10  # every settled attempt stored
    assert buffers(pruned) < 500 * 14, buffers(pruned)
