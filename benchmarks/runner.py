"""``python -m benchmarks``: the plan of the command line (cli.py), each of its workloads
(workloads.py) run once a run, ours and a peer's side by side, and the report
(report.py).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from benchmarks.cli import Plan, parse_plan
from benchmarks.harness import (
    BENCH_DB,
    enqueue_backlog,
    prepare_database,
    psycopg_connect,
    server_info,
    setup_django,
)
from benchmarks.pgbench import pgbench_baseline, pgbench_insert
from benchmarks.report import PEER_PAIRS, Report, print_header, suite_rows
from benchmarks.workloads import (
    ATOMIC_ENV,
    SHAPES,
    W1_KINDS,
    drain,
    enqueue_chatty,
    enqueue_inserts,
    enqueue_keyed,
    inserted_rows,
    key_claim_latency,
    task_log_rows,
    w1_many,
    w1_single,
    w3_idle_others,
    w3_latency,
    w5_scheduled,
    w6_recovery,
    w7_soak,
    w8_claim_latency,
    w9_chain,
    w9_fan_in,
    w10_async,
)


def main(argv: list[str] | None = None) -> int:
    plan = parse_plan(argv)
    peer = peer_module(plan.peer)
    # Before the database is made again: a peer that is not installed stops here.
    peer_version = peer.available() if peer is not None else None
    url = prepare_database()
    if plan.async_commit:
        with psycopg_connect(url) as conn:
            conn.execute(f"ALTER DATABASE {BENCH_DB} SET synchronous_commit = off")
    setup_django(url)
    info = server_info()
    pgqueuer = peer if plan.peer == "pgqueuer" else None
    celery = peer if plan.peer == "celery" else None
    brokers: list[str] = []
    if pgqueuer is not None:
        pgqueuer.install()
        info["pgqueuer"] = peer_version
    if celery is not None:
        brokers = celery.install()
        info["celery"] = peer_version
    print_header(info, plan.runs)

    rows = suite_rows(plan)
    peer_tables: list[tuple[list[tuple], str]] = []
    if pgqueuer is not None:
        peer_tables.append((PEER_PAIRS, "against PgQueuer"))
    if celery is not None:
        rows.update(celery.rows(brokers, plan.tasks))
        peer_tables.append((celery.pairs(brokers), "against Celery"))
    report = Report(rows)
    Suite(plan, report, pgqueuer, celery, brokers).run()
    report.finish(plan, info, peer_tables)
    return 0


def peer_module(name: str | None) -> ModuleType | None:
    """The module that measures --peer (imported only when asked for: it needs the
    peer's packages)."""
    if name == "pgqueuer":
        from benchmarks import peer_pgqueuer

        return peer_pgqueuer
    if name == "celery":
        from benchmarks import peer_celery

        return peer_celery
    return None


class Suite:
    """The plan's workloads, run by run, each sample recorded in the report; with a peer,
    its measurement of the same workload beside ours."""

    def __init__(
        self,
        plan: Plan,
        report: Report,
        pgqueuer: ModuleType | None,
        celery: ModuleType | None,
        brokers: list[str],
    ) -> None:
        self.plan = plan
        self.report = report
        self.record = report.record
        self.pgqueuer = pgqueuer
        self.celery = celery
        self.brokers = brokers

    def run(self) -> None:
        for run in range(self.plan.runs):
            print(f"run {run + 1}/{self.plan.runs}", flush=True)
            self.once(run)

    def once(self, run: int) -> None:
        """Every workload of the plan, once; W7 and W8's claim latency in the first run
        only."""
        only, n, record = self.plan.only, self.plan.tasks, self.record
        base = pgbench_baseline(self.plan.baseline_seconds)
        record("baseline", base, base)
        if "W1" in only:
            self.w1(run)
        if only & {"W2", "W2A", "W4", "W8"}:
            self.side_by_side(run, self.w2a, self.theirs(self.w2a_pgqueuer, self.w2a_celery))
        if "W2A-LIMITS" in only:
            d = drain(n, 1, limits=True)
            record("w2a_limits", d["rate"], d)
        if "W2A-KEYS" in only:
            self.w2a_keys()
        if "W2A-ASYNC" in only:
            d = drain(n, 1, async_claims=True)
            record("w2a_async", d["rate"], d)
        if "W2A-ATOMIC" in only:
            self.w2a_atomic()
        if "W2A-TASKLOGS" in only:
            self.w2a_tasklogs()
        if "W2A-MIDDLEWARE" in only:
            d = drain(n, 1, env={"PGQUEUE_BENCH_MIDDLEWARE": "1"})
            record("w2a_middleware", d["rate"], d)
        if "W2A-ENCRYPT" in only:
            d = drain(n, 1, enqueue=lambda: enqueue_backlog(n, encrypted=True))
            record("w2a_encrypt", d["rate"], d)
        if "W2A-OTEL" in only:
            for key, otel in (("w2a_no_otel", "off"), ("w2a_otel", "sdk"),
                              ("w2a_otel_export", "export")):  # fmt: skip
                d = drain(n, 1, env={"PGQUEUE_BENCH_OTEL": otel})
                record(key, d["rate"], d)
        if "W3" in only:  # W3-latency: the idle latency alone
            d = w3_idle_others(500)
            record("w3_idle_others", d["per_enqueue"], d)
        if "W2A-PROCESS" in only:
            d = drain(n, 1, execution="process")
            record("w2a_process", d["rate"], d)
        if "W2" in only:
            d = drain(n, 2)
            record("w2b", d["rate"], d)
        if only & {"W3", "W3-LATENCY"}:
            self.side_by_side(run, self.w3, self.theirs(self.w3_pgqueuer, self.w3_celery))
        if "W10" in only:
            d = w10_async(1000, 1.0)
            record("w10", d["seconds"], d)
        if "W4" in only:
            d = drain(n, 1, backlog=10 * n)
            record("w4", d["rate"], d)
        if "W5" in only:
            d = w5_scheduled(200, 2.0, 0.01)
            record("w5_p50", d["p50_ms"], d)
            record("w5_p99", d["p99_ms"], d)
        if "W6" in only:
            self.w6()
        if "W8" in only:
            for shape in SHAPES:
                d = drain(n, 1, shape=(shape, self.plan.shape_rows))
                record(f"w8_{shape}", d["rate"], d)
        if "W9" in only:
            self.w9()
        if "W8" in only and run == 0:
            self.w8_claim()
        if "W7" in only and run == 0:
            self.w7()

    # -- ours and the peer's -----------------------------------------------------------
    def side_by_side(
        self, run: int, ours: Callable[[], None], theirs: Callable[[], None] | None
    ) -> None:
        """Ours and the peer's measurement of one workload, in an order that alternates
        from run to run (so neither always runs first); ours alone without a peer."""
        steps = [ours] if theirs is None else ([ours, theirs] if run % 2 == 0 else [theirs, ours])
        for step in steps:
            step()

    def theirs(
        self, pgqueuer_step: Callable[[], None] | None, celery_step: Callable[[], None] | None
    ) -> Callable[[], None] | None:
        """The peer's measurement of a workload, if a peer is measured."""
        if self.pgqueuer is not None:
            return pgqueuer_step
        return celery_step if self.celery is not None else None

    # -- W1 ----------------------------------------------------------------------------
    def w1(self, run: int) -> None:
        from django.conf import settings as django_settings

        n, record = self.plan.tasks, self.record
        base = pgbench_insert(self.plan.baseline_seconds)
        record("baseline_insert", base, base)
        base = pgbench_insert(self.plan.baseline_seconds, clients=4)
        record("baseline_insert_4c", base, base)
        self.side_by_side(
            run,
            lambda: self.w1_enqueue(1, "w1_single_1c"),
            self.theirs(lambda: self.w1_pgqueuer(1, "w1_peer_1c"), self.w1_celery),
        )
        self.side_by_side(
            run,
            lambda: self.w1_enqueue(4, "w1_single"),
            self.theirs(lambda: self.w1_pgqueuer(4, "w1_peer_4c"), None),
        )
        self.side_by_side(run, self.w1_tx, self.theirs(None, self.w1_tx_celery))
        for kind in W1_KINDS:
            if kind == "framework" and not hasattr(django_settings, "TASKS"):
                print("  (W1 framework: no Tasks framework installed, skipped)")
            elif kind not in ("enqueue", "tx"):
                d = w1_single(n // 4, 1, kind)
                record(f"w1_{kind}", d["rate"], d)
        d = w1_many(n, 1000)
        record("w1_many", d["rate"], d)

    def w1_enqueue(self, clients: int, key: str) -> None:
        n = self.plan.tasks
        d = w1_single(n if clients > 1 else n // 4, clients)
        self.record(key, d["rate"], d)

    def w1_pgqueuer(self, clients: int, key: str) -> None:
        n = self.plan.tasks
        d = self.pgqueuer.enqueue_single(n if clients > 1 else n // 4, clients)
        self.record(key, d["rate"], d)

    def w1_celery(self) -> None:
        for broker in self.brokers:
            d = self.celery.enqueue_single(self.plan.tasks // 4, broker)
            self.record(f"w1_celery_{broker}", d["rate"], d)

    def w1_tx(self) -> None:
        d = w1_single(self.plan.tasks // 4, 1, "tx")
        self.record("w1_tx", d["rate"], d)

    def w1_tx_celery(self) -> None:
        for broker in self.brokers:
            d = self.celery.enqueue_single(self.plan.tasks // 4, broker, tx=True)
            self.record(f"w1_tx_celery_{broker}", d["rate"], d)

    # -- W2a and its variants ----------------------------------------------------------
    def w2a(self) -> None:
        d = drain(self.plan.tasks, 1)
        self.record("w2a", d["rate"], d)
        self.record("w2a_cpu", d["cpu_ms_per_task"], {})
        self.record("w2a_wtx", d["write_txns_per_task"], {})

    def w2a_pgqueuer(self) -> None:
        d = self.pgqueuer.drain(self.plan.tasks)
        self.record("w2a_peer", d["rate"], d)
        self.record("w2a_peer_cpu", d["cpu_ms_per_task"], {})

    def w2a_celery(self) -> None:
        for broker in self.brokers:
            for config in self.celery.CONFIGS:
                d = self.celery.drain(self.plan.tasks, broker, config)
                self.record(f"w2a_celery_{broker}_{config}", d["rate"], d)
                self.record(f"w2a_celery_{broker}_{config}_cpu", d["cpu_ms_per_task"], {})

    def w2a_keys(self) -> None:
        n, record = self.plan.tasks, self.record
        for kind in ("concurrency", "rate"):
            d = drain(
                n,
                1,
                enqueue=lambda kind=kind: enqueue_keyed(kind, n),
                env={"PGQUEUE_BENCH_KEYS": "1"},
            )
            record(f"w2a_keys_{kind}", d["rate"], d)
        d = key_claim_latency()
        record("claim_plain_p50", d["plain_p50_ms"], d)
        record("claim_plain_p99", d["plain_p99_ms"], {})
        record("claim_limited_p50", d["limited_p50_ms"], {})
        record("claim_limited_p99", d["limited_p99_ms"], {})
        record("claim_keys_p50", d["keyed_p50_ms"], {})
        record("claim_keys_p99", d["keyed_p99_ms"], {})
        record("claim_busy_key_rounds", d["busy_rounds"], {})
        record("claim_busy_key_round_p50", d["busy_round_p50_ms"], {})
        record("claim_busy_key_round_max", d["busy_round_max_ms"], {})

    def w2a_atomic(self) -> None:
        n = self.plan.tasks
        rates = {}
        for how, key in (("plain", "w2a_insert"), ("transaction", "w2a_insert_txn"),
                         ("atomic", "w2a_atomic")):  # fmt: skip
            d = drain(n, 1, enqueue=lambda how=how: enqueue_inserts(n, how), env=ATOMIC_ENV)
            d["rows"] = inserted_rows()
            assert d["rows"] == n, f"W2a-atomic ({how}): {d['rows']} rows for {n} tasks"
            rates[how] = d["rate"]
            self.record(key, d["rate"], d)
        self.record("w2a_atomic_ratio", rates["atomic"] / rates["plain"], {})

    def w2a_tasklogs(self) -> None:
        n = self.plan.tasks
        rates = {}
        for level, key in ((None, "w2a_chatty"), ("INFO", "w2a_tasklogs")):
            env = {"PGQUEUE_BENCH_TASK_LOGS": level} if level else {}
            d = drain(n, 1, enqueue=lambda: enqueue_chatty(n), env=env)
            d["task_log_rows"] = task_log_rows()
            expected = n if level else 0
            assert d["task_log_rows"] == expected, f"W2a-tasklogs: {d['task_log_rows']} rows"
            rates[key] = d["rate"]
            self.record(key, d["rate"], d)
        self.record("w2a_tasklogs_ratio", rates["w2a_tasklogs"] / rates["w2a_chatty"], {})

    # -- W3 ----------------------------------------------------------------------------
    def w3(self) -> None:
        d = w3_latency(200, 0.05)
        self.record("w3_p50", d["p50_ms"], d)
        self.record("w3_p95", d["p95_ms"], {})
        self.record("w3_p99", d["p99_ms"], {})
        self.record("w3_commit_p50", d["from_commit_p50_ms"], {})
        self.record("w3_commit_p99", d["from_commit_p99_ms"], {})
        self.record("w3_enqueue_p50", d["enqueue_call_p50_ms"], {})

    def w3_pgqueuer(self) -> None:
        d = self.pgqueuer.latency(200, 0.05)
        self.record("w3_peer_p50", d["p50_ms"], d)
        self.record("w3_peer_p95", d["p95_ms"], {})
        self.record("w3_peer_p99", d["p99_ms"], {})
        self.record("w3_peer_commit_p50", d["from_commit_p50_ms"], {})
        self.record("w3_peer_enqueue_p50", d["enqueue_call_p50_ms"], {})

    def w3_celery(self) -> None:
        for broker in self.brokers:
            for pool in self.celery.POOLS:
                d = self.celery.latency(200, 0.05, broker, pool)
                self.record(f"w3_celery_{broker}_{pool}_p50", d["p50_ms"], d)
                self.record(f"w3_celery_{broker}_{pool}_p99", d["p99_ms"], {})

    # -- W6 to W9 ----------------------------------------------------------------------
    def w6(self) -> None:
        d = w6_recovery(8, self.plan.lease)
        self.record("w6", d["seconds"], d)
        # The target depends on the lease the workers ran with.
        row = self.report.rows["w6"]
        row.check = lambda v, r, limit=d["lease"] + 2: v <= limit
        row.target = f"<= {d['lease'] + 2:g} s (lease + 2)"

    def w7(self) -> None:
        d = w7_soak(self.plan.soak_tasks)
        self.record("w7_ratio", d["last_over_first"], d)
        if d["rss_growth"] is not None:
            self.record("w7_rss", d["rss_growth"], {})

    def w8_claim(self) -> None:
        d = w8_claim_latency(0)
        self.record("w8_claim_empty_p50", d["p50_ms"], d)
        self.record("w8_claim_empty_p99", d["p99_ms"], {})
        d = w8_claim_latency(self.plan.terminal_rows)
        self.record("w8_claim_full_p50", d["p50_ms"], d)
        self.record("w8_claim_full_p99", d["p99_ms"], {})

    def w9(self) -> None:
        members = self.plan.members
        plain = drain(members, 1)
        self.record("w9_plain", plain["rate"], plain)
        d = w9_fan_in(members)
        self.record("w9_fan_in", d["rate"], d)
        self.record("w9_fan_in_ratio", d["rate"] / plain["rate"], {})
        self.record("w9_fan_in_lag", d["callback_start_lag_ms"], {})
        self.record("w9_fan_in_enqueue", d["enqueue_callback_s"], {})
        d = w9_chain(self.plan.steps)
        self.record("w9_chain", d["seconds"], d)
        self.record("w9_chain_handover", d["handover_p50_ms"], {})
