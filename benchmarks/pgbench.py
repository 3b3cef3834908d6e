"""The pgbench baselines: what the server itself does per second, measured in the same
invocation as the workloads, so that their ratios survive a noisy machine.

One INSERT, one UPDATE by primary key and one DELETE per transaction, 4 clients (the
drains' yardstick); and one INSERT per transaction, 1 or 4 clients (the single
enqueue's).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks.harness import raw_connection

BASELINE_SCRIPT = """\\set k random(1, 1000000000)
INSERT INTO bench_baseline (k, v) VALUES (:k, 1) ON CONFLICT DO NOTHING;
UPDATE bench_baseline SET v = v + 1 WHERE k = :k;
DELETE FROM bench_baseline WHERE k = :k;
"""


def pgbench_binary() -> str:
    found = shutil.which("pgbench")
    if found:
        return found
    import pgserver

    bundled = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pgbench"
    if bundled.exists():
        return str(bundled)
    raise RuntimeError("pgbench not found: install PostgreSQL's client tools")


def pgbench_env() -> dict[str, str]:
    from django.db import connections

    s = connections["default"].settings_dict
    env = dict(os.environ)
    env["PGHOST"] = s.get("OPTIONS", {}).get("host") or s.get("HOST") or "127.0.0.1"
    env["PGPORT"] = str(s.get("PORT") or 5432)
    env["PGUSER"] = s.get("USER") or "postgres"
    env["PGDATABASE"] = s["NAME"]
    if s.get("PASSWORD"):
        env["PGPASSWORD"] = s["PASSWORD"]
    return env


# The single enqueue's yardstick: one INSERT of a generated key per transaction.
INSERT_SCRIPT = "INSERT INTO bench_insert (v) VALUES (1);\n"


def pgbench_baseline(seconds: float) -> float:
    with raw_connection() as conn:
        conn.execute("DROP TABLE IF EXISTS bench_baseline")
        conn.execute("CREATE TABLE bench_baseline (k bigint PRIMARY KEY, v int)")
    return _pgbench(BASELINE_SCRIPT, 4, seconds)


def pgbench_insert(seconds: float, clients: int = 1) -> float:
    with raw_connection() as conn:
        conn.execute("DROP TABLE IF EXISTS bench_insert")
        conn.execute("CREATE TABLE bench_insert (k bigserial PRIMARY KEY, v int)")
    return _pgbench(INSERT_SCRIPT, clients, seconds)


def _pgbench(text: str, clients: int, seconds: float) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(text)
    jobs = str(clients)
    out = subprocess.run(
        [
            pgbench_binary(),
            "-n",
            "-f",
            script.name,
            "-c",
            jobs,
            "-j",
            jobs,
            "-T",
            str(int(seconds)),
        ],
        env=pgbench_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(script.name)
    return float(re.search(r"tps = ([\d.]+)", out).group(1))
