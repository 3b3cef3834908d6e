"""A web-like process for tests/test_upgrade.py: enqueues continuously, as requests do.

Run as a script by any release's interpreter, in that release's project (its settings
and its tests/ledger_tasks.py on PYTHONPATH), so it uses only what every release has:
the public ``enqueue`` and ``enqueue_many`` of a ``@task``, in ``transaction.atomic()``.

    python -P tests/upgrade_web.py OUT STOP [INTERVAL]

Until the file STOP exists, every INTERVAL seconds (default 0.03) it runs one short
transaction, like a request: most commit one ``enqueue`` or an ``enqueue_many`` of two;
every tenth enqueues three tasks and rolls back. Each outcome is one JSON line appended
to OUT in one write (readable while it runs):

    {"lock_timeout": "3s", "pid": ...}           first: the session's lock_timeout
    {"committed": [ids], "seconds": s}          after the commit returned
    {"rolled_back": [ids], "seconds": s}
    {"error": "...", "seconds": s}              the transaction failed (the test fails)

``seconds`` is how long the transaction took, from BEGIN to the end of COMMIT. The
lock_timeout comes from ``PGOPTIONS`` (``-c lock_timeout=...``), as docs/upgrading.md
advises for a migration: an enqueue that waits for a lock longer fails instead.
"""

import json
import os
import sys
import time

SECONDS_PER_TASK = 0.01


def append(path: str, event: dict) -> None:
    line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class Rollback(Exception):
    pass


def main(out: str, stop: str, interval: float) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connection, transaction

    from tests.ledger_tasks import ledger_run

    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        append(out, {"lock_timeout": cursor.fetchone()[0], "pid": os.getpid()})

    n = 0
    while not os.path.exists(stop):
        started = time.monotonic()
        try:
            if n % 10 == 9:
                ids: list[int] = []
                try:
                    with transaction.atomic():
                        ids.append(ledger_run.enqueue(-n, SECONDS_PER_TASK))
                        ids += ledger_run.enqueue_many([(-n, SECONDS_PER_TASK)] * 2)
                        raise Rollback
                except Rollback:
                    pass
                append(out, {"rolled_back": ids, "seconds": time.monotonic() - started})
            else:
                with transaction.atomic():
                    if n % 2:
                        ids = ledger_run.enqueue_many([(n, SECONDS_PER_TASK)] * 2)
                    else:
                        ids = [ledger_run.enqueue(n, SECONDS_PER_TASK)]
                append(out, {"committed": ids, "seconds": time.monotonic() - started})
        except Exception as exc:
            append(out, {"error": f"{type(exc).__name__}: {exc}",
                         "seconds": time.monotonic() - started})
            connection.close()  # a new connection for the next "request"
        n += 1
        time.sleep(interval)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 0.03)
