"""``manage.py runtaskworker``: run a worker (or a supervisor of several)."""

from __future__ import annotations

import os
import sys

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue.conf import get_settings
from django_pgqueue.registry import validate_queue
from django_pgqueue.worker.logging import configure_logging
from django_pgqueue.worker.worker import EXIT_RECYCLE, Worker, WorkerOptions


class Command(BaseCommand):
    help = "Run a django_pgqueue worker: claim tasks from the given queues and run them."

    def add_arguments(self, parser):
        conf = get_settings()
        parser.add_argument(
            "--queues", help=f"comma-separated queue names (default: {','.join(conf.QUEUES)})"
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            help=f"handler slots per process (default: {conf.CONCURRENCY})",
        )
        parser.add_argument(
            "--processes",
            type=int,
            help=f"worker processes under a supervisor (default: {conf.PROCESSES})",
        )
        parser.add_argument(
            "--lease",
            type=float,
            dest="lease_seconds",
            help=f"lease duration in seconds (default: {conf.LEASE_SECONDS:g})",
        )
        parser.add_argument(
            "--heartbeat",
            type=float,
            dest="heartbeat_seconds",
            help=f"lease renewal interval (default: {conf.HEARTBEAT_SECONDS:g})",
        )
        parser.add_argument(
            "--poll-interval",
            type=float,
            help=f"seconds between polls when idle (default: {conf.POLL_INTERVAL:g})",
        )
        parser.add_argument(
            "--sweep-interval",
            type=float,
            help=f"seconds between expired-lease sweeps (default: {conf.SWEEP_INTERVAL:g})",
        )
        parser.add_argument(
            "--shutdown-grace",
            type=float,
            help=f"seconds running handlers get after SIGTERM (default: {conf.SHUTDOWN_GRACE:g})",
        )
        parser.add_argument(
            "--starvation-timeout",
            type=float,
            help="seconds a due task may wait before it jumps the priority "
            f"order (default: {conf.STARVATION_TIMEOUT:g})",
        )
        parser.add_argument(
            "--execution",
            choices=["thread", "process"],
            help="run handlers in threads, or each slot's in a child process that can be "
            f"killed on timeout and hard cancel (default: {conf.EXECUTION})",
        )
        parser.add_argument(
            "--burst", action="store_true", help="exit once no task is due and nothing is running"
        )
        parser.add_argument(
            "--no-prune", action="store_true", help="do not run retention in this worker"
        )
        parser.add_argument(
            "--metrics-port", type=int, help="serve Prometheus /metrics on this port"
        )
        parser.add_argument(
            "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
        )

    def handle(self, *args, **opts):
        configure_logging(opts["log_level"])
        queues = None
        if opts["queues"]:
            queues = [q.strip() for q in opts["queues"].split(",") if q.strip()]
            try:
                for queue in queues:
                    validate_queue(queue)
            except ValueError as exc:
                raise CommandError(str(exc)) from exc
        options = WorkerOptions.from_settings(
            queues=queues,
            concurrency=opts["concurrency"],
            lease_seconds=opts["lease_seconds"],
            heartbeat_seconds=opts["heartbeat_seconds"],
            poll_interval=opts["poll_interval"],
            sweep_interval=opts["sweep_interval"],
            shutdown_grace=opts["shutdown_grace"],
            starvation_timeout=opts["starvation_timeout"],
            execution=opts["execution"],
            burst=opts["burst"] or None,
            prune=not opts["no_prune"],
        )
        _check(options)
        metrics_port = opts["metrics_port"] or get_settings().METRICS_PORT
        processes = opts["processes"] or get_settings().PROCESSES
        if processes > 1:
            if options.burst:
                raise CommandError("--burst runs a single process; drop --processes")
            from django_pgqueue.worker.supervisor import Supervisor

            # A child whose handler overran its ceiling exits at once and is replaced.
            options.write_off_limit = 1
            sys.exit(Supervisor(options, processes, opts["log_level"], metrics_port).run())
        if metrics_port:
            from django_pgqueue.metrics import serve_worker_metrics

            serve_worker_metrics(metrics_port)
        worker = Worker(options)
        if metrics_port:
            from django_pgqueue.metrics import watch_worker

            watch_worker(worker)
        code = worker.run()
        if code == EXIT_RECYCLE:
            self.stderr.write("recycling: starting a fresh worker process")
            # sys.orig_argv keeps "-m django" when that is how the worker was started.
            os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
        sys.exit(code)


def _check(options: WorkerOptions) -> None:
    if options.concurrency < 1:
        raise CommandError("--concurrency must be at least 1")
    if options.lease_seconds <= 0 or options.heartbeat_seconds <= 0:
        raise CommandError("--lease and --heartbeat must be positive")
    if options.heartbeat_seconds >= options.lease_seconds:
        raise CommandError(
            f"--heartbeat ({options.heartbeat_seconds:g}s) must be shorter than --lease "
            f"({options.lease_seconds:g}s), or every lease lapses between renewals"
        )
    if options.execution not in ("thread", "process"):
        raise CommandError(
            f"PGQUEUE['EXECUTION'] is {options.execution!r}: use 'thread' or 'process'"
        )
    if options.kill_grace < 0:
        raise CommandError(f"PGQUEUE['KILL_GRACE'] is {options.kill_grace:g}: use 0 or more")
    if not options.queues:
        raise CommandError("no queues to work on: pass --queues or set PGQUEUE['QUEUES']")
