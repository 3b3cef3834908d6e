"""Settings, declared once.

Everything is configured through one dict in the project's settings::

    PGQUEUE = {"LEASE_SECONDS": 30, "QUEUES": ["default", "emails"]}

``SETTINGS`` below is the one table of the keys. Each row says, in one place, a key's
default, its kind and valid values, what it means, and, for the worker's keys, its
``runtaskworker`` flag and its ``WorkerOptions`` field. The rest is derived from it:

- ``DEFAULTS`` and ``get_settings()``: the effective values, the defaults overlaid with
  ``settings.PGQUEUE``;
- ``WorkerOptions`` (worker/worker.py): one field per row with an ``option``;
- the ``runtaskworker`` flags: one per row with a ``flag``, showing the effective
  default in its help;
- the ``manage.py check`` errors for a value of the wrong kind, out of range, or not
  one of its choices (checks.py), and the same refusals of a flag's value.

``docs/settings.md`` documents each key at length; tests/test_settings.py keeps it in
step with this table.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, make_dataclass
from typing import Any, NamedTuple

from django.conf import settings as django_settings

from django_pgqueue.core.reprs import short_repr


class Problem(NamedTuple):
    """What is wrong with a setting's value: ``kind`` is "kind", "range" or "choice"."""

    kind: str
    message: str


_KIND_NAMES = {
    bool: "True or False",
    int: "an int",
    float: "a number",
    str: "a string",
    list: "a list of strings",
    dict: "a dict",
}


@dataclass(frozen=True)
class Setting:
    """One key of ``settings.PGQUEUE``."""

    name: str
    default: Any
    # bool, int, float (an int is fine too), str, list (of strings) or dict.
    kind: type
    doc: str
    # The runtaskworker flag, which wins over the setting, and its help text (the
    # effective default is appended to it).
    flag: str | None = None
    help: str | None = None
    # The WorkerOptions field that carries the value into the worker (and to the
    # supervisor's children).
    option: str | None = None
    # Valid values: at least ``minimum``, greater than ``above``, at most ``maximum``,
    # one of ``choices``; ``None`` only when ``nullable``.
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    nullable: bool = False
    # A secret (ENCRYPTION_KEYS): an error about its value never quotes the value.
    secret: bool = False

    @property
    def dest(self) -> str | None:
        """The name the command's parsed options give the flag's value."""
        if self.flag is None:
            return None
        return self.option or self.flag.removeprefix("--").replace("-", "_")

    @property
    def annotation(self) -> Any:
        return self.kind | None if self.nullable else self.kind

    def problem(self, value: Any, where: str) -> Problem | None:
        """What is wrong with ``value`` for this setting, named ``where``; None if valid."""
        if value is None and self.nullable:
            return None
        if not _is_kind(value, self.kind):
            wanted = _KIND_NAMES[self.kind] + (" or None" if self.nullable else "")
            shown = f"a {type(value).__name__}" if self.secret else short_repr(value)
            return Problem("kind", f"{where} must be {wanted}, not {shown}")
        if self.choices is not None and value not in self.choices:
            choices = ", ".join(repr(c) for c in self.choices)
            return Problem("choice", f"{where} is {short_repr(value)}: use one of {choices}")
        # Written as "not (in range)" so that NaN, which compares false, is refused.
        if self.minimum is not None and not value >= self.minimum:
            return Problem("range", f"{where} is {short_repr(value)}: use {self.minimum:g} or more")
        if self.above is not None and not value > self.above:
            return Problem(
                "range", f"{where} is {short_repr(value)}: use a value greater than {self.above:g}"
            )
        if self.maximum is not None and not value <= self.maximum:
            return Problem("range", f"{where} is {short_repr(value)}: use {self.maximum:g} or less")
        return None


def _is_kind(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):  # a bool is an int to Python, never to a setting
        return False
    if kind is float:
        return isinstance(value, int | float)
    if kind is list:
        return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
    return isinstance(value, kind)


SETTINGS: tuple[Setting, ...] = (
    # -- database and discovery --------------------------------------------------------
    Setting(
        "DATABASE", "default", str,
        "The database alias that holds the task table; it must be PostgreSQL.",
    ),
    Setting(
        "READ_DATABASE", None, str,
        "The alias the queue overview, pgqueue_status, the queue gauges and the admin's "
        "task pages read from: a replica of DATABASE. None reads from DATABASE. Claims "
        "and writes never go there.",
        nullable=True,
    ),
    Setting(
        "DATABASES", {}, dict,
        "Queues kept on another database than DATABASE: {queue: alias}. A queue not "
        "listed is on DATABASE. Each alias holds its own task table (migrate it with "
        "manage.py migrate --database ALIAS); see docs/databases.md.",
    ),
    Setting(
        "TASK_MODULES", [], list,
        "Extra modules imported at startup so that their @task functions are registered "
        "(each installed app's tasks module is imported anyway).",
    ),
    Setting(
        "MIDDLEWARE", [], list,
        "Dotted paths of TaskMiddleware classes, ordered like Django's MIDDLEWARE (the "
        "first is the outermost): hooks around every enqueue and every execution, "
        "loaded once per process (docs/middleware.md).",
    ),
    # -- task defaults: read when @task runs, copied onto each row at enqueue -----------
    Setting(
        "DEFAULT_QUEUE", "default", str,
        "The queue of tasks that name none.",
    ),
    Setting(
        "DEFAULT_PRIORITY", 0, int,
        "The priority of tasks that set none; higher runs first.",
        minimum=-100, maximum=100,
    ),
    Setting(
        "DEFAULT_MAX_ATTEMPTS", 3, int,
        "How many claims a task gets before it dead-letters.",
        minimum=1,
    ),
    Setting(
        "DEFAULT_TIMEOUT", 3600.0, float,
        "Seconds one attempt may run, for tasks that set no timeout; None removes the "
        "default ceiling.",
        above=0, nullable=True,
    ),
    Setting(
        "DEFAULT_BACKOFF", {"base": 5.0, "factor": 2.0, "cap": 600.0, "jitter": 0.25}, dict,
        "The retry delay policy; keys left out keep their defaults.",
    ),
    # -- limits on sizes: bytes of JSON (UTF-8), checked before anything is written ------
    Setting(
        "MAX_ARGS_BYTES", 1024 * 1024, int,
        "The largest arguments of one task (its args and kwargs as JSON, together), "
        "checked at enqueue; None: no limit.",
        minimum=1024, nullable=True,
    ),
    Setting(
        "MAX_METADATA_BYTES", 64 * 1024, int,
        "The largest metadata of one task (as JSON), checked at enqueue; None: no limit.",
        minimum=1024, nullable=True,
    ),
    Setting(
        "MAX_RESULT_BYTES", 1024 * 1024, int,
        "The largest result a task may return (as JSON); a larger one fails the task "
        "instead of being stored. None: no limit.",
        minimum=1024, nullable=True,
    ),
    Setting(
        "MAX_CHECKPOINT_BYTES", 1024 * 1024, int,
        "The largest checkpoint (and progress value) a handler may save (as JSON); None: "
        "no limit.",
        minimum=1024, nullable=True,
    ),
    Setting(
        "MAX_SIGNAL_BYTES", 1024 * 1024, int,
        "The largest payload of one signal (as JSON); None: no limit.",
        minimum=1024, nullable=True,
    ),
    Setting(
        "MAX_TASK_SIGNALS_BYTES", 4 * 1024 * 1024, int,
        "The most bytes of signals one task keeps (every name's last payload, as JSON): "
        "a signal that would make more is refused; None: no limit.",
        minimum=1024, nullable=True,
    ),
    Setting(
        "MAX_TASK_SIGNALS", 1000, int,
        "The most signal names one task keeps: a signal of a new name past it is "
        "refused; None: no limit.",
        minimum=1, nullable=True,
    ),
    # -- encrypted payloads (docs/security.md, "Encrypted payloads") --------------------
    Setting(
        "ENCRYPTION_KEYS", [], list,
        "Fernet keys of encrypted tasks' payloads, newest first: the first encrypts, "
        "each one decrypts. Read them from the environment or a secrets store.",
        secret=True,
    ),
    Setting(
        "ENCRYPT_ALL", False, bool,
        "Encrypt the payloads of every task, except those declared with "
        "@task(encrypt=False).",
    ),
    # -- the worker --------------------------------------------------------------------
    Setting(
        "QUEUES", ["default"], list,
        "The queues a worker claims from.",
        flag="--queues", help="comma-separated queue names", option="queues",
    ),
    Setting(
        "QUEUE_LIMITS", {}, dict,
        "Fleet-wide limits per queue, enforced by the claim: {queue: {'concurrency': N, "
        "'rate': 'N/period'}} (docs/limits.md). Every worker must have the same.",
    ),
    Setting(
        "FAIR_WEIGHTS", {}, dict,
        "Fair-share weights of keys: {key or 'prefix*': weight}. A key with weight w gets "
        "w times the slots of a key of weight 1 while both have due work; unlisted keys "
        "weigh 1 (docs/tenants.md).",
    ),
    Setting(
        "CONCURRENCY", 10, int,
        "Handler slots per worker process.",
        flag="--concurrency", help="handler slots per process", option="concurrency",
        minimum=1,
    ),
    Setting(
        "PREFETCH", None, int,
        "Claimed tasks a worker process holds ready beyond its busy slots (their leases "
        "renewed, their timeouts counted from their start). None (the default) adapts: "
        "up to 3 x CONCURRENCY while that is at most about 0.1 s of work at the "
        "handlers' recent pace, none for tasks that take 0.1 s per slot or longer. "
        "Bigger claims mean fewer durable commits per task; 0 for long tasks spread over "
        "many workers.",
        flag="--prefetch", help="claimed tasks held ready beyond the busy slots",
        option="prefetch",
        minimum=0, nullable=True,
    ),
    Setting(
        "ASYNC_CONCURRENCY", 100, int,
        "Async slots per worker process: how many async def handlers it awaits at once "
        "on its event loop, beside the CONCURRENCY thread slots. They hold no thread and "
        "no database connection while they await (thread execution only).",
        flag="--async-concurrency", help="async def handlers awaited at once per process",
        option="async_concurrency",
        minimum=1,
    ),
    Setting(
        "PROCESSES", 1, int,
        "Worker processes; with more than 1, a supervisor runs them.",
        flag="--processes", help="worker processes under a supervisor",
        minimum=1,
    ),
    Setting(
        "LEASE_SECONDS", 30.0, float,
        "How long a claim owns a task without a renewal.",
        flag="--lease", help="lease duration in seconds", option="lease_seconds",
        above=0,
    ),
    Setting(
        "HEARTBEAT_SECONDS", 10.0, float,
        "How often the heartbeat renews the leases; a third of the lease or less.",
        flag="--heartbeat", help="lease renewal interval", option="heartbeat_seconds",
        above=0,
    ),
    Setting(
        "POLL_INTERVAL", 2.0, float,
        "The longest an idle claimer sleeps without a wake-up.",
        flag="--poll-interval", help="seconds between polls when idle",
        option="poll_interval",
        above=0,
    ),
    Setting(
        "SWEEP_INTERVAL", 1.0, float,
        "How often each worker recovers expired leases.",
        flag="--sweep-interval", help="seconds between expired-lease sweeps",
        option="sweep_interval",
        above=0,
    ),
    Setting(
        "SHUTDOWN_GRACE", 25.0, float,
        "Seconds running handlers get after the first SIGTERM/SIGINT.",
        flag="--shutdown-grace", help="seconds running handlers get after SIGTERM",
        option="shutdown_grace",
        minimum=0,
    ),
    Setting(
        "STARVATION_TIMEOUT", 60.0, float,
        "How long a due task may wait before it takes one slot of a claim regardless of "
        "priority.",
        flag="--starvation-timeout",
        help="seconds a due task may wait before it jumps the priority order",
        option="starvation_timeout",
        minimum=0,
    ),
    Setting(
        "TIMEOUT_GRACE", 10.0, float,
        "How far past its timeout a sync handler may run before its slot is written off.",
        option="timeout_grace",
        minimum=0,
    ),
    Setting(
        "WRITE_OFF_LIMIT", 3, int,
        "Written-off slots after which a worker process recycles itself.",
        option="write_off_limit",
        minimum=1,
    ),
    Setting(
        "WRITE_OFF_EXIT_AFTER", 60.0, float,
        "Seconds a written-off handler may go on running (its task keeps its lease "
        "meanwhile) before its worker process stops claiming, settles it as a timeout "
        "and exits, to be replaced.",
        option="write_off_exit_after",
        minimum=0,
    ),
    Setting(
        "MAX_TASKS", None, int,
        "A worker process that has run this many tasks stops claiming, finishes the "
        "tasks it holds and exits with status 0, for its process manager to start it "
        "again (with PROCESSES > 1 the supervisor replaces it). None: never.",
        flag="--max-tasks", help="exit with status 0 after running this many tasks",
        option="max_tasks",
        minimum=1, nullable=True,
    ),
    Setting(
        "MAX_MEMORY", None, int,
        "The same, once the worker process's resident memory is above this many KiB "
        "(checked every second). None: never.",
        flag="--max-memory",
        help="exit with status 0 once resident memory is above this many KiB",
        option="max_memory",
        minimum=1, nullable=True,
    ),
    Setting(
        "EXECUTION", "thread", str,
        '"thread": handlers run in the slot threads; "process": each slot owns a child '
        "process that runs its handlers and is killed on timeout and hard cancel.",
        flag="--execution",
        help="run handlers in threads, or each slot's in a child process that can be "
        "killed on timeout and hard cancel",
        option="execution",
        choices=("thread", "process"),
    ),
    Setting(
        "KILL_GRACE", 2.0, float,
        'With EXECUTION = "process": seconds a handler\'s process has to stop after it '
        "was told to, before it is SIGKILLed.",
        option="kill_grace",
        minimum=0,
    ),
    Setting(
        "MAX_TASKS_PER_CHILD", None, int,
        'With EXECUTION = "process": a handler process that has run this many tasks '
        "exits after the last one's outcome, and its slot starts a new one. None: never.",
        flag="--max-tasks-per-child",
        help="with --execution process: a new handler process after this many tasks",
        option="max_tasks_per_child",
        minimum=1, nullable=True,
    ),
    Setting(
        "MAX_MEMORY_PER_CHILD", None, int,
        'With EXECUTION = "process": a handler process whose resident memory is above '
        "this many KiB after a task exits, and its slot starts a new one. None: never.",
        flag="--max-memory-per-child",
        help="with --execution process: a new handler process once one's resident "
        "memory is above this many KiB after a task",
        option="max_memory_per_child",
        minimum=1, nullable=True,
    ),
    Setting(
        "PREPARED_STATEMENTS", True, bool,
        "Whether the worker's connections use server-side prepared statements (False "
        "behind PgBouncer in transaction mode).",
    ),
    Setting(
        "PREPARE_ENQUEUE", None, bool,
        "Whether enqueue sends its statement as a prepared statement on the caller's "
        "connection. None: where the connection outlives a request (CONN_MAX_AGE or "
        "Django's pool), unless TRANSACTION_POOLER or PREPARED_STATEMENTS = False. True: "
        "always (a pooler that keeps prepared statements: PgBouncer 1.21+ with "
        "max_prepared_statements). False: never (the parameters are still bound on the "
        "server).",
        nullable=True,
    ),
    Setting(
        "TRANSACTION_POOLER", False, bool,
        "DATABASE is reached through a transaction-mode pooler (PgBouncer): the worker "
        "relies on no session state there (no prepared statements, no session "
        "settings, no session locks) and LISTENs on LISTEN_DATABASE, or polls.",
    ),
    Setting(
        "LISTEN_DATABASE", None, str,
        "A database alias with a direct (or session-pooled) address of the same "
        "database, for the worker's LISTEN connection and its session locks, behind a "
        "transaction pooler. None: the worker listens on DATABASE (or, with "
        "TRANSACTION_POOLER, polls).",
        nullable=True,
    ),
    Setting(
        "DEAD_CONNECTION_TIMEOUT", 15.0, float,
        "How long a worker connection may wait for PostgreSQL before it is taken for dead "
        "and reconnected.",
        above=0,
    ),
    Setting(
        "CLAIM_BATCH_BYTES", 8 * 1024 * 1024, int,
        "The most bytes of stored payloads (args, kwargs, checkpoint, metadata, signals) "
        "one claim takes: past it, a claim takes fewer rows (always at least one) and "
        "claims again at once. None: no limit.",
        minimum=1, nullable=True,
    ),
    Setting(
        "ASYNC_CLAIMS", False, bool,
        "Commit claims without waiting for the WAL flush: faster, but a PostgreSQL crash "
        "can forget a claim whose handler already runs. Opt-in only.",
    ),
    Setting(
        "METRICS_PORT", None, int,
        "Serve Prometheus /metrics from the worker on this port.",
        flag="--metrics-port", help="serve Prometheus /metrics on this port",
        minimum=1, maximum=65535, nullable=True,
    ),
    Setting(
        "METRICS_ADDR", "0.0.0.0", str,
        "The address the worker's /metrics server binds: 0.0.0.0 (every interface) for "
        "a Prometheus on another host; 127.0.0.1 for one on the same host.",
        flag="--metrics-addr", help="address the /metrics server binds",
    ),
    Setting(
        "LOG_FORMAT", "text", str,
        'The format of the log handler the worker adds when LOGGING configures none for '
        'django_pgqueue or the root logger: "text", or "json" (one object per line, '
        "with the task's fields; docs/logging.md).",
        flag="--log-format", help="text, or one JSON object per line",
        choices=("text", "json"),
    ),
    Setting(
        "TASK_LOGS", None, str,
        "Keep the log records a handler emits during an attempt, at this level and above, "
        'with the task (its admin page, pgqueue_status --task ID --logs): "DEBUG", '
        '"INFO", "WARNING", "ERROR" or "CRITICAL". None (the default) keeps none '
        "(docs/logging.md).",
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), nullable=True,
    ),
    Setting(
        "TASK_LOG_RECORDS", 200, int,
        "With TASK_LOGS: the most records one attempt keeps (its newest); the older ones "
        "are dropped and counted.",
        minimum=1,
    ),
    Setting(
        "TASK_LOG_BYTES", 64 * 1024, int,
        "With TASK_LOGS: the most bytes of records one attempt keeps (its newest).",
        minimum=16 * 1024,
    ),
    Setting(
        "TASK_LOG_TASK_BYTES", 256 * 1024, int,
        "With TASK_LOGS: the most bytes of records one task keeps over its attempts: "
        "past it, the oldest attempts' records are deleted (the newest attempt's are "
        "always kept). None: no limit.",
        minimum=16 * 1024, nullable=True,
    ),
    Setting(
        "QUEUE_METRICS", True, bool,
        "Register the queue gauges in prometheus_client's default registry at startup.",
    ),
    Setting(
        "WORKER_QUEUE_METRICS", False, bool,
        "Also serve the queue gauges on a worker's --metrics-port.",
    ),
    Setting(
        "METRICS_CACHE_SECONDS", 10.0, float,
        "The queue gauges are read from the database at most once per this many seconds "
        "per process.",
        minimum=0,
    ),
    Setting(
        "WORKER_STALE_AFTER", 60.0, float,
        "A worker whose heartbeat is older than this counts as gone.",
        above=0,
    ),
    Setting(
        "VACUUM_INTERVAL", 5.0, float,
        "How often each worker checks the task table's dead tuples; None leaves the table "
        "to autovacuum.",
        above=0, nullable=True,
    ),
    Setting(
        "VACUUM_THRESHOLD", 20000, int,
        "Dead tuples in the task table past which a worker vacuums it.",
        minimum=0,
    ),
    Setting(
        "UNROUTABLE_TTL", 24 * 3600.0, float,
        "A due task that no live worker can run is failed after waiting this long; None "
        "keeps it pending forever.",
        minimum=0, nullable=True,
    ),
    Setting(
        "SCHEDULER", True, bool,
        "Whether a worker enqueues the ticks of the periodic schedules of its queues "
        "(docs/periodic.md); False leaves them to other workers.",
        option="scheduler",
    ),
    # -- the admin ---------------------------------------------------------------------
    Setting(
        "ADMIN_SHOW_PAYLOADS", True, bool,
        "Whether the admin shows and searches what the tasks' code put in a row: args, "
        "kwargs, result, checkpoint, progress, the signals' payloads, and runtime "
        "schedules' args and kwargs (docs/security.md).",
    ),
    Setting(
        "ADMIN_SEARCH_ROWS", 1_000_000, int,
        "How many task ids one search of the task list by args, kwargs, metadata or error "
        "text reads: the newest, or those below the page's search_below (docs/admin.md).",
        minimum=1000,
    ),
    Setting(
        "ADMIN_SEARCH_TIMEOUT", 10.0, float,
        "Seconds the task list's reads may take while it searches by content "
        "(statement_timeout); a slower search stops and says so (docs/admin.md).",
        above=0,
    ),
    Setting(
        "ADMIN_COUNT_ESTIMATE_ABOVE", 1_000_000, int,
        "Past this many tasks (the planner's estimate), the unfiltered task list shows the "
        "estimate instead of counting every row; None always counts (docs/admin.md).",
        minimum=0, nullable=True,
    ),
    # -- the doctor --------------------------------------------------------------------
    Setting(
        "DOCTOR_TRANSACTION_AGE", 60.0, float,
        "Seconds a transaction, a prepared transaction or a query may hold back vacuum "
        "before the queue doctor (pgqueue_doctor, the admin's health panel, the "
        "pgqueue_doctor_findings gauge) reports it as a warning; ten times as long is a "
        "problem.",
        above=0,
    ),
    Setting(
        "DOCTOR_METRICS_SECONDS", 60.0, float,
        "The pgqueue_doctor_findings gauge, served beside the queue gauges, runs the "
        "doctor at most once per this many seconds per process; None leaves it out.",
        minimum=0, nullable=True,
    ),
    # -- retention ---------------------------------------------------------------------
    Setting(
        "RESULT_TTL", 24 * 3600.0, float,
        "Seconds succeeded and cancelled rows are kept after they finished.",
        minimum=0,
    ),
    Setting(
        "DEAD_TTL", 7 * 24 * 3600.0, float,
        "Seconds dead letters (failed rows) are kept after they finished.",
        minimum=0,
    ),
    Setting(
        "PRUNE_INTERVAL", 60.0, float,
        "How often each worker's pruner runs.",
        above=0,
    ),
    Setting(
        "PRUNE_BATCH", 1000, int,
        "Rows per delete statement and state.",
        minimum=1,
    ),
    Setting(
        "PRUNE_ARCHIVE_DIR", None, str,
        "A directory where retention (the workers' pruners, and pgqueue_prune) writes "
        "the rows it deletes, before it deletes them: gzip JSON Lines, one file per day "
        "and database (docs/operations.md). None: rows are deleted without an archive.",
        nullable=True,
    ),
)  # fmt: skip

SETTINGS_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
DEFAULTS: dict[str, Any] = {s.name: s.default for s in SETTINGS}
# Copied for each get_settings() that uses them, so that a caller cannot change a default.
_MUTABLE_DEFAULTS = frozenset(k for k, v in DEFAULTS.items() if isinstance(v, list | dict))

PgQueueSettings = make_dataclass(
    "PgQueueSettings",
    # A secret (ENCRYPTION_KEYS) is left out of the repr, should the settings be logged.
    [(s.name, s.annotation, field(repr=not s.secret)) for s in SETTINGS],
    frozen=True,
    namespace={
        "__doc__": "The effective settings: one attribute per row of SETTINGS.",
        "__module__": __name__,
    },
)


def configured() -> dict[str, Any]:
    """``settings.PGQUEUE`` as the project wrote it (no defaults)."""
    return getattr(django_settings, "PGQUEUE", {}) or {}


def unknown_keys() -> list[str]:
    """Keys in settings.PGQUEUE that this version does not know (reported by checks)."""
    return sorted(set(configured()) - set(SETTINGS_BY_NAME))


def get_setting(name: str) -> Any:
    """One effective setting, without building them all: for hot paths (enqueue reads
    DATABASE on every call). Like ``get_settings``, it reads ``settings.PGQUEUE`` each
    time, so ``override_settings`` works."""
    if name in _MUTABLE_DEFAULTS:
        return getattr(get_settings(), name)
    return configured().get(name, DEFAULTS[name])


def read_database(alias: str | None = None) -> str:
    """The alias of the reads an operator looks at (the overview, pgqueue_status, the
    queue gauges, the admin's lists and pages) for the queues on ``alias`` (default:
    DATABASE): ``READ_DATABASE`` for DATABASE when it is set, else the alias itself.
    Never for a claim, a write, or a read that must see a write just made."""
    primary = get_setting("DATABASE")
    if alias is None or alias == primary:
        return get_setting("READ_DATABASE") or primary
    return alias


def database_of(read_alias: str) -> str:
    """The alias whose rows ``read_alias`` reads: DATABASE for READ_DATABASE."""
    if read_alias == get_setting("READ_DATABASE"):
        return get_setting("DATABASE")
    return read_alias


def database_for(queue: str) -> str:
    """The alias that holds ``queue``'s tasks: its entry in DATABASES, else DATABASE.
    On every enqueue, so it reads the two keys without building the settings."""
    project = configured()
    mapped = project.get("DATABASES")
    if mapped:
        alias = mapped.get(queue)
        if alias:
            return alias
    return project.get("DATABASE", "default")


def queue_databases() -> list[str]:
    """Every alias that holds a task table: DATABASE first, then each alias of
    DATABASES in the order of first mention."""
    project = configured()
    aliases = [project.get("DATABASE", "default")]
    for alias in (project.get("DATABASES") or {}).values():
        if alias not in aliases:
            aliases.append(alias)
    return aliases


def migrate_command(alias: str) -> str:
    """The command that applies django_pgqueue's migrations to the database ``alias``."""
    return "python manage.py migrate" + (f" --database {alias}" if alias != "default" else "")


def queues_by_database(queues: list[str]) -> dict[str, list[str]]:
    """``queues`` grouped by the alias that holds them (DATABASE's group first)."""
    groups: dict[str, list[str]] = {}
    for queue in queues:
        groups.setdefault(database_for(queue), []).append(queue)
    order = queue_databases()
    return dict(sorted(groups.items(), key=lambda item: order.index(item[0])
                       if item[0] in order else len(order)))  # fmt: skip


def get_settings() -> PgQueueSettings:
    """The effective settings: each row's default overlaid with ``settings.PGQUEUE``.

    Read on every call (cheap) so ``override_settings`` works in tests.
    """
    project = configured()
    values = {name: project.get(name, default) for name, default in DEFAULTS.items()}
    for name in _MUTABLE_DEFAULTS - project.keys():
        values[name] = copy.deepcopy(DEFAULTS[name])
    backoff = values["DEFAULT_BACKOFF"]
    if isinstance(backoff, dict):  # anything else is left for the checks to report
        values["DEFAULT_BACKOFF"] = {**DEFAULTS["DEFAULT_BACKOFF"], **backoff}
    return PgQueueSettings(**values)
