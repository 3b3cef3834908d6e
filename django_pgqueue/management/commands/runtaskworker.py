"""``manage.py runtaskworker``: run a worker (or a supervisor of several).

Its flags come from the rows of ``conf.SETTINGS`` that name one: a flag wins over its
setting, and its help shows the setting's effective value as the default.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError

from django_pgqueue.checks import unapplied_migrations, unapplied_problem
from django_pgqueue.core.conf import (
    SETTINGS,
    SETTINGS_BY_NAME,
    Setting,
    get_settings,
    migrate_command,
    queue_databases,
    queues_by_database,
)
from django_pgqueue.core.options import validate_queue
from django_pgqueue.db import encryption
from django_pgqueue.tasking.registry import missing_task_modules, registry
from django_pgqueue.worker.logging import configure_logging, configured_format
from django_pgqueue.worker.worker import EXIT_RECYCLE, Worker, WorkerOptions, reexec

FLAG_SETTINGS = [s for s in SETTINGS if s.flag is not None]


class Command(BaseCommand):
    help = "Run a django_pgqueue worker: claim tasks from the given queues and run them."

    def add_arguments(self, parser: CommandParser) -> None:
        conf = get_settings()
        for setting in FLAG_SETTINGS:
            _add_flag(parser, setting, getattr(conf, setting.name))
        parser.add_argument(
            "--burst", action="store_true", help="exit once no task is due and nothing is running"
        )
        parser.add_argument(
            "--no-prune", action="store_true", help="do not run retention in this worker"
        )
        parser.add_argument(
            "--log-level",
            choices=["DEBUG", "INFO", "WARNING", "ERROR"],
            help="the level of the django_pgqueue loggers, over LOGGING's (default: the "
            "level LOGGING sets for django_pgqueue, else INFO)",
        )
        parser.add_argument(
            "--database",
            metavar="ALIAS",
            help="serve only the queues on this alias (PGQUEUE['DATABASES']); by default a "
            "worker process is started for each database that holds one of the queues",
        )

    def handle(self, *args, **opts):
        log_format = opts["log_format"] or get_settings().LOG_FORMAT
        configure_logging(opts["log_level"], log_format)
        opts["queues"] = _queues(opts["queues"])
        options = WorkerOptions.from_settings(
            **{s.option: opts[s.dest] for s in FLAG_SETTINGS if s.option is not None},
            burst=opts["burst"] or None,
            prune=not opts["no_prune"],
        )
        _check(options, opts)
        groups = _by_database(options, opts["database"])
        metrics_port = opts["metrics_port"] or get_settings().METRICS_PORT
        metrics_addr = opts["metrics_addr"] or get_settings().METRICS_ADDR
        processes = opts["processes"] or get_settings().PROCESSES
        if processes > 1 or len(groups) > 1:
            if options.burst:
                raise CommandError(
                    "--burst runs a single process: drop --processes"
                    if processes > 1
                    else "--burst runs a single process, and these queues are on several "
                    f"databases ({', '.join(g.database for g in groups)}): pass --database"
                )
            _check_ready(groups)
            from django_pgqueue.worker.supervisor import Supervisor

            sys.exit(
                Supervisor(
                    groups,
                    processes,
                    opts["log_level"],
                    metrics_port,
                    configured_format(),
                    metrics_addr=metrics_addr,
                ).run()
            )
        [options] = groups
        _check_ready(groups)
        if metrics_port:
            from django_pgqueue.worker.metrics_server import serve_worker_metrics

            serve_worker_metrics(metrics_port, metrics_addr)
        worker = Worker(options)
        if metrics_port:
            from django_pgqueue.worker.metrics_server import watch_worker

            watch_worker(worker)
        code = worker.run()
        if code == EXIT_RECYCLE:
            reexec()
        sys.exit(code)


def _by_database(options: WorkerOptions, only: str | None) -> list[WorkerOptions]:
    """The options of one worker per database that holds some of the queues
    (PGQUEUE['DATABASES']), or of the one ``--database`` names."""
    groups = queues_by_database(options.queues)
    if only is not None:
        if only not in queue_databases():
            raise CommandError(
                f"--database {only!r} holds no task table: use one of "
                f"{', '.join(queue_databases())}"
            )
        if only not in groups:
            on = ", ".join(f"{q} on {a}" for a, qs in groups.items() for q in qs)
            raise CommandError(f"none of the queues is on database {only!r} ({on})")
        groups = {only: groups[only]}
    return [replace(options, queues=queues, database=alias) for alias, queues in groups.items()]


def _add_flag(parser: CommandParser, setting: Setting, effective: Any) -> None:
    """The flag of one setting: its type or choices from the setting's kind."""
    if setting.choices is not None:
        kind: dict[str, Any] = {"choices": list(setting.choices)}
    elif setting.kind in (int, float):
        kind = {"type": setting.kind}
    else:  # a string; a list is given comma-separated
        kind = {}
    parser.add_argument(
        setting.flag,
        dest=setting.dest,
        help=f"{setting.help} (default: {_shown(effective)})",
        **kind,
    )


def _shown(value: Any) -> str:
    """A setting's value as the flag's help shows it: 30, not 30.0; a,b for a list."""
    if value is None:
        return "none"
    if isinstance(value, list | tuple):
        return ",".join(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _queues(value: str | None) -> list[str] | None:
    """The queues of ``--queues a,b``; None when the flag is left out (or empty)."""
    if not value:
        return None
    queues = [q.strip() for q in value.split(",") if q.strip()]
    try:
        for queue in queues:
            validate_queue(queue)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    return queues


def _check(options: WorkerOptions, opts: dict[str, Any]) -> None:
    """Refuse to start with a value the worker cannot run with: each is checked against
    its row of conf.SETTINGS, and named by its flag when the flag gave it, otherwise by
    its setting (which ``manage.py check`` reports before the command runs)."""
    conf = get_settings()
    for setting in SETTINGS:
        if setting.option is None and setting.flag is None:
            continue  # not the worker's: read elsewhere, and checked by manage.py check
        given = setting.dest is not None and opts[setting.dest] is not None
        if setting.option is not None:
            value = getattr(options, setting.option)
        else:
            value = opts[setting.dest] if given else getattr(conf, setting.name)
        problem = setting.problem(value, setting.flag if given else f"PGQUEUE[{setting.name!r}]")
        if problem is not None:
            raise CommandError(problem.message)
    if options.heartbeat_seconds >= options.lease_seconds:
        raise CommandError(
            f"--heartbeat ({options.heartbeat_seconds:g}s) must be shorter than --lease "
            f"({options.lease_seconds:g}s), or every lease lapses between renewals"
        )
    if not options.queues:
        raise CommandError("no queues to work on: pass --queues or set PGQUEUE['QUEUES']")
    if options.execution != "process":
        for setting in (
            SETTINGS_BY_NAME["MAX_TASKS_PER_CHILD"],
            SETTINGS_BY_NAME["MAX_MEMORY_PER_CHILD"],
        ):
            if getattr(options, setting.option) is not None:
                raise CommandError(
                    f"{setting.flag} (PGQUEUE[{setting.name!r}]) recycles the handler "
                    "processes of --execution process; "
                    "a worker that runs its handlers in threads recycles itself with "
                    "--max-tasks and --max-memory"
                )


def _check_ready(groups: list[WorkerOptions]) -> None:
    """Refuse to start without every module of TASK_MODULES, or on a database that has
    not applied every migration of django_pgqueue: one line that says what to do,
    instead of the error of the first statement that meets a missing table. Nor,
    with encrypted tasks, without a usable key (encryption.py)."""
    missing_modules = missing_task_modules()
    if missing_modules:
        listed = ", ".join(f"{m!r} ({reason})" for m, reason in missing_modules.items())
        raise CommandError(
            f"PGQUEUE['TASK_MODULES'] lists what cannot be imported: {listed}; correct it "
            "to start a worker"
        )
    encrypting = sorted(d.name for d in registry.all() if d.encrypt)
    if encrypting or get_settings().ENCRYPT_ALL:
        problem = encryption.key_problem()
        if problem is not None:  # it would fail every encrypted task it claims
            raise CommandError(f"{problem}; encrypted tasks cannot run without it")
    for group in groups:
        try:
            missing = unapplied_migrations(group.database)
        except OperationalError:
            continue  # unreachable: the worker waits for it, and registers once it answers
        if missing:
            raise CommandError(
                f"{unapplied_problem(group.database, missing)}: run "
                f"{migrate_command(group.database)}, then start the worker"
            )
