"""The soak's web process (tests/test_soak.py): enqueues a mix of tasks at a steady rate.

``python -m tests.soak_enqueuer OUT --rate R --seconds S`` enqueues about R tasks a
second for S seconds, every quarter second one transaction: plain tasks, tasks that fail
a few attempts before they succeed, tasks of a concurrency-limited and of a rate-limited
queue, workflows (a chain of three steps and a group of two after it), and in a savepoint
that rolls back, two more; every fourth batch also rolls back a whole transaction of two.

Each outcome is appended to OUT as a JSON line, in one write (tests/ledger.py's append):
``{"committed": [...]}`` once a commit returned, ``{"rolled_back": [...]}`` for ids
whose transaction surely did not commit, ``{"ambiguous": [...]}`` when the commit
itself failed (the database restarted under it): whether those committed, only the
rows can say. Errors are counted and the next batch goes on, on a new connection.

``--measure N`` instead enqueues N soak_measure tasks (the capacity measurement's).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import django


class Rollback(Exception):
    """Raised to roll an atomic block back."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--measure", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()

    from django.db import connection, transaction

    from django_pgqueue.tasking.workflows import chain, group
    from tests.ledger import append
    from tests.soak_tasks import soak_flaky, soak_limited, soak_measure, soak_rated, soak_run

    if args.measure:
        for first in range(0, args.measure, 1000):
            soak_measure.enqueue_many([(n,) for n in range(first, min(first + 1000, args.measure))])
        return

    tick = 0.25
    # Tasks a second of each kind; "run" takes what the others leave of the rate.
    rates = {
        "workflow": 0.04 * args.rate / 5,  # 5 tasks each
        "flaky": 0.08 * args.rate,
        "limited": min(4.0, 0.04 * args.rate),
        "rated": min(4.0, 0.04 * args.rate),
    }
    rates["run"] = max(0.0, args.rate - sum(rates.values()) - rates["workflow"] * 4)
    owed = dict.fromkeys(rates, 0.0)
    n = batch = loops = errors = 0
    began = time.monotonic()
    while time.monotonic() - began < args.seconds:
        loops += 1
        for kind, rate in rates.items():
            owed[kind] += rate * tick
        due = {kind: int(owed[kind]) for kind in owed}
        committed: list[int] = []
        rolled_back: list[int] = []
        body_done = False
        try:
            with transaction.atomic():
                if due["run"]:
                    committed += soak_run.enqueue_many([(n + i,) for i in range(due["run"])])
                if due["flaky"]:
                    committed += soak_flaky.enqueue_many(
                        [(n + i, (n + i) % 3 + 1) for i in range(due["flaky"])])
                committed += [soak_limited.enqueue(n + i) for i in range(due["limited"])]
                committed += [soak_rated.enqueue(n + i) for i in range(due["rated"])]
                for i in range(due["workflow"]):
                    steps = chain(*(soak_run.step(n + i * 5 + j) for j in range(3)))
                    committed += steps
                    committed += group([soak_run.step(n + i * 5 + j) for j in (3, 4)],
                                       after=[steps[-1]])
                with contextlib.suppress(Rollback), transaction.atomic():
                    doomed = soak_run.enqueue_many([(-1,), (-2,)])
                    rolled_back += doomed
                    raise Rollback
                body_done = True
            append(args.out, {"committed": committed, "rolled_back": rolled_back})
            n += sum(due.values()) + 4 * due["workflow"]
            for kind in due:
                owed[kind] -= due[kind]
        except Exception as exc:
            errors += 1
            if body_done:
                append(args.out, {"ambiguous": committed, "rolled_back": rolled_back,
                                  "error": repr(exc)})
            else:
                append(args.out, {"rolled_back": committed + rolled_back, "error": repr(exc)})
            with contextlib.suppress(Exception):
                connection.close()
            time.sleep(max(0.0, began + loops * tick - time.monotonic()))
            continue
        if batch % 4 == 3:
            ids: list[int] = []
            try:
                with contextlib.suppress(Rollback), transaction.atomic():
                    ids += soak_run.enqueue_many([(-3,), (-4,)])
                    raise Rollback
            except Exception as exc:
                errors += 1
                with contextlib.suppress(Exception):
                    connection.close()
                append(args.out, {"error": repr(exc)})
            append(args.out, {"rolled_back": ids})
        batch += 1
        time.sleep(max(0.0, began + loops * tick - time.monotonic()))
    append(args.out, {"done": True, "batches": batch, "errors": errors,
                      "seconds": time.monotonic() - began})


if __name__ == "__main__":
    main()
