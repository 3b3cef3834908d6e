"""The Celery app of ``--peer celery`` (benchmarks/peer_celery.py): a no-op and a probe,
on the broker, configuration and output file the environment names. Plain Celery (no
Django in the worker): what a worker of a Celery project pays for its tasks, without
the project.

- ``PGQUEUE_BENCH_CELERY_BROKER``: the broker URL;
- ``PGQUEUE_BENCH_CELERY_CONFIG``: "defaults" (Celery's) or "at-least-once"
  (task_acks_late, worker_prefetch_multiplier=1, task_reject_on_worker_lost);
- ``PGQUEUE_BENCH_CELERY_OUT``: the file each task appends one line to (one write on an
  O_APPEND descriptor: a no-op's line, the time it ended; a probe's, "<n> <time it
  started>").
"""

import os
import time

from celery import Celery

QUEUE = "pgqueue-bench-celery"
AT_LEAST_ONCE = {
    "task_acks_late": True,
    "worker_prefetch_multiplier": 1,
    "task_reject_on_worker_lost": True,
}

app = Celery("bench", broker=os.environ.get("PGQUEUE_BENCH_CELERY_BROKER"))
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
if os.environ.get("PGQUEUE_BENCH_CELERY_CONFIG") == "at-least-once":
    app.conf.update(AT_LEAST_ONCE)

_out = None


def _write(line: str) -> None:
    global _out
    if _out is None:  # per process: prefork children open their own after the fork
        _out = os.open(os.environ["PGQUEUE_BENCH_CELERY_OUT"], os.O_WRONLY | os.O_APPEND)
    os.write(_out, line.encode())


@app.task(name="bench.noop")
def noop(n):
    _write(f"{time.time()}\n")


@app.task(name="bench.probe")
def probe(n):
    _write(f"{n} {time.time()}\n")
