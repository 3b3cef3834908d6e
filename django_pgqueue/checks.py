"""``manage.py check`` messages for misconfiguration.

A value of the wrong kind, out of its range or not one of its choices is found from its
row of ``conf.SETTINGS``; the rules about several settings, or about other Django
settings, are written out below. A hint points to the documentation by its URL
(``DOCS_URL``, the Documentation URL of the package's metadata), never by a path in
the repository, which an installed package does not have.
"""

from __future__ import annotations

import logging
import math

from django.conf import settings as django_settings
from django.core.checks import Error, Tags, Warning, register
from django.db import connections
from django.db.migrations.loader import MigrationLoader

from django_pgqueue.core.conf import (
    SETTINGS,
    SETTINGS_BY_NAME,
    configured,
    get_settings,
    migrate_command,
    queue_databases,
    unknown_keys,
)
from django_pgqueue.core.exceptions import InvalidTaskError
from django_pgqueue.core.fairness import parse_weights
from django_pgqueue.core.limits import parse_limits
from django_pgqueue.core.options import validate_queue
from django_pgqueue.db import encryption
from django_pgqueue.tasking.registry import missing_task_modules, registry

# The documentation, as pyproject.toml's [project.urls] Documentation names it.
DOCS_URL = "https://github.com/django-pgqueue/django-pgqueue/tree/main/docs"

# The id of each kind of problem found from the table.
PROBLEM_IDS = {
    "kind": "django_pgqueue.E010",
    "range": "django_pgqueue.E011",
    "choice": "django_pgqueue.E012",
}
# CONCURRENCY below 1 had its own id before the table: it keeps it.
KEPT_IDS = {("CONCURRENCY", "range"): "django_pgqueue.E003"}


@register(Tags.compatibility)
def check_settings(app_configs, **kwargs):
    messages = []
    for key in unknown_keys():
        messages.append(
            Warning(
                f"PGQUEUE[{key!r}] is not a django_pgqueue setting and is ignored",
                hint=f"See {DOCS_URL}/settings.md for the valid keys.",
                id="django_pgqueue.W001",
            )
        )
    invalid = set()
    project = configured()
    for setting in SETTINGS:
        if setting.name not in project:
            continue
        problem = setting.problem(project[setting.name], f"PGQUEUE[{setting.name!r}]")
        if problem is None:
            continue
        invalid.add(setting.name)
        messages.append(
            Error(
                problem.message,
                hint=f"{setting.doc} The default is {setting.default!r}; "
                f"see {DOCS_URL}/settings.md.",
                id=KEPT_IDS.get((setting.name, problem.kind), PROBLEM_IDS[problem.kind]),
            )
        )
    if "QUEUE_LIMITS" in project and "QUEUE_LIMITS" not in invalid:
        try:
            parse_limits(project["QUEUE_LIMITS"])
        except ValueError as exc:
            messages.append(
                Error(str(exc), hint=f"See {DOCS_URL}/limits.md.", id="django_pgqueue.E020")
            )
    if "FAIR_WEIGHTS" in project and "FAIR_WEIGHTS" not in invalid:
        try:
            parse_weights(project["FAIR_WEIGHTS"])
        except ValueError as exc:
            messages.append(
                Error(str(exc), hint=f"See {DOCS_URL}/tenants.md.", id="django_pgqueue.E022")
            )
    if "MIDDLEWARE" in project and "MIDDLEWARE" not in invalid:
        messages.extend(_check_middleware(project["MIDDLEWARE"]))
    conf = get_settings()
    if "DATABASE" not in invalid:
        messages.extend(_check_database("PGQUEUE['DATABASE']", conf.DATABASE, "task database"))
    if conf.READ_DATABASE is not None and "READ_DATABASE" not in invalid:
        messages.extend(
            _check_database(
                "PGQUEUE['READ_DATABASE']", conf.READ_DATABASE, "read database (READ_DATABASE)"
            )
        )
    if "DATABASES" not in invalid:
        messages.extend(_check_databases(conf))
    if (
        not invalid & {"HEARTBEAT_SECONDS", "LEASE_SECONDS"}
        and conf.HEARTBEAT_SECONDS * 2 > conf.LEASE_SECONDS
    ):
        messages.append(
            Warning(
                f"HEARTBEAT_SECONDS ({conf.HEARTBEAT_SECONDS:g}) is more than half of "
                f"LEASE_SECONDS ({conf.LEASE_SECONDS:g}): one late heartbeat loses the lease",
                hint="Keep the heartbeat at a third of the lease or less.",
                id="django_pgqueue.W002",
            )
        )
    per_child = [
        name
        for name in ("MAX_TASKS_PER_CHILD", "MAX_MEMORY_PER_CHILD")
        if getattr(conf, name) is not None and name not in invalid
    ]
    if per_child and conf.EXECUTION != "process" and "EXECUTION" not in invalid:
        messages.append(
            Warning(
                f"{' and '.join(per_child)} recycle the handler processes of EXECUTION = "
                f"'process', and EXECUTION is {conf.EXECUTION!r}: runtaskworker refuses to "
                "start without --execution process",
                hint="A worker that runs its handlers in threads recycles itself with "
                f"MAX_TASKS and MAX_MEMORY; see {DOCS_URL}/worker-shutdown.md.",
                id="django_pgqueue.W008",
            )
        )
    if conf.TASK_LOGS is not None and "TASK_LOGS" not in invalid:
        messages.extend(_check_task_logs_level(conf.TASK_LOGS))
    return messages


def _check_task_logs_level(level: str) -> list[Warning]:
    """TASK_LOGS keeps the records that reach the root logger's handlers: a record
    below the level of its logger (the root logger's, for a logger without a level of
    its own) is never made, so never kept."""
    root = logging.getLogger().getEffectiveLevel()
    if root <= logging.getLevelName(level):
        return []
    root_name = logging.getLevelName(root)
    return [
        Warning(
            f"TASK_LOGS is {level!r} and the root logger's level is {root_name}: records "
            f"below {root_name} of loggers without a level of their own are never emitted, "
            "so no task keeps them",
            hint=f"Set the level {level} on the loggers your tasks use, or on the root "
            f"logger, in LOGGING; see {DOCS_URL}/logging.md.",
            id="django_pgqueue.W010",
        )
    ]


@register(Tags.compatibility)
def check_encryption(app_configs, **kwargs):
    """Encrypted tasks (ENCRYPT_ALL, a @task(encrypt=True)) or ENCRYPTION_KEYS, while
    payloads cannot be encrypted here: an error when cryptography is not installed or a
    value of ENCRYPTION_KEYS is not a key; a warning when there is no key (a process
    that neither enqueues nor runs encrypted tasks, a migration's, may go without).
    The messages never quote a key."""
    project = configured()
    keys = project.get("ENCRYPTION_KEYS")
    if keys is not None and SETTINGS_BY_NAME["ENCRYPTION_KEYS"].problem(keys, "") is not None:
        return []  # not a list: reported by check_settings
    users = []
    if project.get("ENCRYPT_ALL") is True:
        users.append("ENCRYPT_ALL is True")
    encrypting = sorted(d.name for d in registry.all() if d.encrypt)
    if encrypting:
        shown = ", ".join(encrypting[:5])
        more = f" and {len(encrypting) - 5} more" if len(encrypting) > 5 else ""
        users.append(f"task(s) {shown}{more} are declared with encrypt=True")
    if not (keys or users):
        return []
    why = f" ({'; '.join(users)})" if users else ""
    problem = encryption.install_problem() or (keys and encryption.bad_key(keys))
    if problem:
        return [
            Error(
                f"{problem}{why}",
                hint="Encrypted tasks can be neither enqueued nor run until this is "
                f"fixed; see {DOCS_URL}/security.md.",
                id="django_pgqueue.E050",
            )
        ]
    if not keys:
        return [
            Warning(
                f"{encryption.NO_KEYS}{why}",
                hint="This process can neither enqueue nor run encrypted tasks; see "
                f"{DOCS_URL}/security.md.",
                id="django_pgqueue.W009",
            )
        ]
    return []


def _check_middleware(paths: list[str]) -> list[Error]:
    """Each path of PGQUEUE['MIDDLEWARE'] imports a TaskMiddleware subclass."""
    from django_pgqueue.tasking.middleware import problem

    messages = []
    for path in paths:
        wrong = problem(path)
        if wrong is not None:
            messages.append(
                Error(
                    f"PGQUEUE['MIDDLEWARE']: {wrong}",
                    hint="Each entry is the dotted path of a subclass of "
                    f"django_pgqueue.middleware.TaskMiddleware; see {DOCS_URL}/middleware.md.",
                    id="django_pgqueue.E040",
                )
            )
    return messages


@register(Tags.compatibility)
def check_task_queues(app_configs, **kwargs):
    """A @task whose queue is not in PGQUEUE['QUEUES'] never runs on a worker started
    without --queues: one warning per such queue, naming its tasks."""
    if not isinstance(get_settings().QUEUES, list | tuple):
        return []  # reported by check_settings
    served = set(get_settings().QUEUES)
    unserved: dict[str, list[str]] = {}
    for definition in registry.all():
        if definition.queue not in served:
            unserved.setdefault(definition.queue, []).append(definition.name)
    messages = []
    for queue, names in sorted(unserved.items()):
        names = sorted(set(names))
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        messages.append(
            Warning(
                f"queue {queue!r} of task(s) {shown} is not in PGQUEUE['QUEUES']: "
                "runtaskworker without --queues will not run them",
                hint=f"Add {queue!r} to PGQUEUE['QUEUES'], or, if a worker started with "
                f"--queues serves it, add 'django_pgqueue.W003' to SILENCED_SYSTEM_CHECKS "
                f"(see {DOCS_URL}/settings.md).",
                id="django_pgqueue.W003",
            )
        )
    return messages


# The settings keyed by queue name, and the id of the warning for a key that is no queue.
QUEUE_KEYED = {"QUEUE_LIMITS": "django_pgqueue.W004", "DATABASES": "django_pgqueue.W005"}


@register(Tags.compatibility)
def check_queue_keys(app_configs, **kwargs):
    """A key of a setting keyed by queue (QUEUE_LIMITS, DATABASES) that is no queue of
    QUEUES, of a registered task or of a Tasks framework backend is most likely a typo:
    what it sets applies to nothing. One warning per such key."""
    project = configured()
    if not isinstance(get_settings().QUEUES, list | tuple):
        return []  # reported by check_settings
    known = _known_queues()
    messages = []
    for name, check_id in QUEUE_KEYED.items():
        value = project.get(name)
        if not isinstance(value, dict):
            continue  # unset, or reported by check_settings
        for queue in value:
            if not isinstance(queue, str) or queue in known:
                continue
            messages.append(
                Warning(
                    f"PGQUEUE[{name!r}] has an entry for queue {queue!r}, which is neither in "
                    "PGQUEUE['QUEUES'] nor the queue of a registered task: it applies to "
                    "nothing",
                    hint=f"Known queues: {', '.join(sorted(known))}. Correct the name; if "
                    "the queue is only named at enqueue (queue=...) or its tasks are "
                    "registered only in other processes, add it to PGQUEUE['QUEUES'] or "
                    f"{check_id!r} to SILENCED_SYSTEM_CHECKS (see {DOCS_URL}/settings.md).",
                    id=check_id,
                )
            )
    return messages


def _known_queues() -> set[str]:
    """The queues this process knows of: QUEUES, the registered tasks' queues, and the
    queues of the Tasks framework's backends (settings.TASKS)."""
    known = set(get_settings().QUEUES)
    known.update(definition.queue for definition in registry.all())
    for backend in (getattr(django_settings, "TASKS", None) or {}).values():
        if isinstance(backend, dict) and isinstance(backend.get("QUEUES"), list | tuple):
            known.update(q for q in backend["QUEUES"] if isinstance(q, str))
    return known


@register(Tags.compatibility)
def check_task_modules(app_configs, **kwargs):
    """A module of TASK_MODULES that does not exist: its tasks are not registered, and
    runtaskworker refuses to start. A warning, not an error, so that the commands that
    run no task (migrate, runserver) still run."""
    return [
        Warning(
            f"PGQUEUE['TASK_MODULES'] lists {module!r}, which cannot be imported ({reason}): "
            "its tasks are not registered",
            hint="Correct the dotted path, or remove it from PGQUEUE['TASK_MODULES'] "
            f"(see {DOCS_URL}/settings.md).",
            id="django_pgqueue.W006",
        )
        for module, reason in missing_task_modules().items()
    ]


@register(Tags.database)
def check_migrations(app_configs, databases=None, **kwargs):
    """django_pgqueue's migrations not applied to a database that holds a task table
    (run with ``manage.py check --database ALIAS``; Django runs the database checks
    only for the databases it is given).

    ``migrate`` runs the database checks too, before it migrates: a database where
    nothing was ever migrated (no django_migrations table) is left alone, so that a
    project's first ``migrate`` does not warn about what it is about to do. There,
    runtaskworker and enqueue say to migrate."""
    messages = []
    for alias in queue_databases():
        if databases is None or alias not in databases or alias not in connections.databases:
            continue
        missing, migrated_before = _unapplied(alias)
        if missing and migrated_before:
            messages.append(
                Warning(
                    f"{unapplied_problem(alias, missing)}: enqueue and runtaskworker fail "
                    "until they are applied",
                    hint=f"Run {migrate_command(alias)} (migrate runs this check too, "
                    "before it applies them).",
                    id="django_pgqueue.W007",
                )
            )
    return messages


def unapplied_migrations(alias: str) -> list[str]:
    """The names of django_pgqueue's migrations that the database ``alias`` has not
    applied, in the order migrate applies them (one read of django_migrations).

    Read over a connection of its own, outside any pool, that gives up connecting as a
    worker's does (DEAD_CONNECTION_TIMEOUT, at most 5 s): a server that is down or does
    not answer raises OperationalError instead of holding the caller."""
    return _unapplied(alias)[0]


def _unapplied(alias: str) -> tuple[list[str], bool]:
    """unapplied_migrations(alias), and whether any migration was ever applied there."""
    connection = connections.create_connection(alias)
    options = {**connection.settings_dict["OPTIONS"], "pool": False}
    dead_after = get_settings().DEAD_CONNECTION_TIMEOUT
    options.setdefault("connect_timeout", max(2, math.ceil(min(dead_after, 5))))
    connection.settings_dict = {**connection.settings_dict, "OPTIONS": options}
    # MigrationRecorder reads through connections[alias] (the thread's own connection,
    # left open), not through ``connection``: django_migrations is read here instead.
    loader = MigrationLoader(None, ignore_no_migrations=True)
    leaves = [key for key in loader.graph.leaf_nodes() if key[0] == "django_pgqueue"]
    planned = [
        name
        for app, name in dict.fromkeys(
            key for leaf in leaves for key in loader.graph.forwards_plan(leaf)
        )
        if app == "django_pgqueue"
    ]
    try:
        with connection.cursor() as cursor:
            if "django_migrations" not in connection.introspection.table_names(cursor):
                return planned, False
            cursor.execute("SELECT name FROM django_migrations WHERE app = 'django_pgqueue'")
            applied = {name for (name,) in cursor.fetchall()}
        return [name for name in planned if name not in applied], True
    finally:
        connection.close()


def unapplied_problem(alias: str, missing: list[str]) -> str:
    return (
        f"database {alias!r} lacks {len(missing)} migration(s) of django_pgqueue "
        f"({', '.join(missing)})"
    )


def _check_databases(conf) -> list[Error]:
    """PGQUEUE['DATABASES'] maps valid queue names to PostgreSQL aliases, none of them
    the replica the reads go to (a replica takes no enqueue and no claim)."""
    messages: list[Error] = []
    for queue, alias in conf.DATABASES.items():
        where = f"PGQUEUE['DATABASES'][{queue!r}]"
        try:
            validate_queue(queue)
        except InvalidTaskError as exc:
            messages.append(Error(f"PGQUEUE['DATABASES']: {exc}", id="django_pgqueue.E021"))
            continue
        if not isinstance(alias, str):
            messages.append(
                Error(
                    f"{where} must be a database alias (a string), not {alias!r}",
                    id="django_pgqueue.E021",
                )
            )
            continue
        if alias == conf.READ_DATABASE:
            messages.append(
                Error(
                    f"{where} is {alias!r}, which is READ_DATABASE: a replica cannot hold "
                    "a queue (enqueues and claims write)",
                    id="django_pgqueue.E021",
                )
            )
            continue
        messages.extend(_check_database(where, alias, f"database of queue {queue!r}"))
    return messages


def _check_database(where: str, alias: str, what: str) -> list[Error]:
    """The setting ``where`` names an alias of DATABASES, and it is PostgreSQL
    (DATABASE, an alias of PGQUEUE['DATABASES'], and READ_DATABASE: the replica the
    overview reads, which holds the same table)."""
    if alias not in connections.databases:
        return [
            Error(
                f"{where} is {alias!r}, which is not in DATABASES",
                hint=f"Known aliases: {', '.join(sorted(connections.databases))}.",
                id="django_pgqueue.E001",
            )
        ]
    if "postgresql" not in connections.databases[alias]["ENGINE"]:
        return [
            Error(
                f"the {what} {alias!r} is not PostgreSQL; django_pgqueue needs "
                "PostgreSQL (SKIP LOCKED, LISTEN/NOTIFY, jsonb)",
                id="django_pgqueue.E002",
            )
        ]
    return []
