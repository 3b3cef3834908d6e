"""The task table and the worker registry.

The ORM reads these (admin, history, tests); the hot path (enqueue, claim, settle,
heartbeat, sweep) is explicit SQL in ``db/sql/``, one file a concern. Index names are
referenced from those files' comments (``contract.sql`` lists them), so keep them stable.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_pgqueue.db import encryption


class TaskState(models.TextChoices):
    # Waiting for its run_at: not claimable. Staged to pending once due (sql: stage).
    SCHEDULED = "scheduled", _("scheduled")
    PENDING = "pending", _("pending")
    RUNNING = "running", _("running")
    WAITING = "waiting", _("waiting")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    CANCELLED = "cancelled", _("cancelled")


TERMINAL_STATES = (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)
LIVE_STATES = (TaskState.SCHEDULED, TaskState.PENDING, TaskState.RUNNING, TaskState.WAITING)


class Task(models.Model):
    """One row per task. ``id`` is the public task id."""

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=100, db_default="default")
    task_name = models.CharField(max_length=255)
    handler_version = models.IntegerField(db_default=1)
    priority = models.SmallIntegerField(db_default=0)
    state = models.CharField(max_length=16, choices=TaskState.choices, db_default=TaskState.PENDING)

    args = models.JSONField(db_default=models.Value([], models.JSONField()))
    kwargs = models.JSONField(db_default=models.Value({}, models.JSONField()))

    run_at = models.DateTimeField(db_default=Now())
    enqueued_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    attempt = models.IntegerField(db_default=0)
    max_attempts = models.IntegerField(db_default=3)
    retry_policy = models.JSONField(db_default=models.Value({}, models.JSONField()))
    timeout = models.DurationField(null=True, blank=True)

    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    worker_id = models.CharField(max_length=64, null=True, blank=True)

    result = models.JSONField(null=True, blank=True)
    errors = models.JSONField(db_default=models.Value([], models.JSONField()))
    # errors keeps its last 100 entries (a statement that appends one drops the oldest
    # past that, db/sql/contract.sql); how many it dropped, for the admin to say so.
    errors_dropped = models.IntegerField(db_default=0)
    unique_key = models.CharField(max_length=255, null=True, blank=True)
    checkpoint = models.JSONField(null=True, blank=True)
    progress = models.JSONField(null=True, blank=True)
    cancel_requested = models.BooleanField(db_default=False)
    # A hard cancel: in process execution mode the handler's child process is killed.
    cancel_hard = models.BooleanField(db_default=False)
    # One entry per execution (claim) of the task: attempt, lease token, worker, start,
    # end and outcome; appended by the settlement, the lease sweep and late outcomes.
    executions = models.JSONField(db_default=models.Value([], models.JSONField()))
    metadata = models.JSONField(db_default=models.Value({}, models.JSONField()))
    # Fleet-wide per-key concurrency (docs/limits.md): at most the task's key_concurrency
    # rows of one (queue, concurrency_key) run at once. NULL: not limited by key.
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)
    # Waiting work (docs/workflows.md). A waiting row waits for its parents ("parents":
    # parents_pending of its pgqueue_dependency edges are unresolved), for a child it
    # suspended on ("child"), or for a signal named wait_signal ("signal"), until
    # wait_until at the latest. signals holds every signal delivered (early ones too);
    # wake says what made it pending again, for the next attempt's context.
    parents_pending = models.IntegerField(db_default=0)
    wait_reason = models.CharField(max_length=16, null=True, blank=True)
    wait_signal = models.CharField(max_length=255, null=True, blank=True)
    wait_until = models.DateTimeField(null=True, blank=True)
    signals = models.JSONField(db_default=models.Value({}, models.JSONField()))
    wake = models.JSONField(null=True, blank=True)
    # Some task waits for this one: its end runs the pgqueue_release_dependents trigger.
    has_dependents = models.BooleanField(db_default=False)
    # Expiry (docs/tasks.md): a task that has not started by then never starts; the
    # claim or the stager ends it cancelled, with an Expired error. NULL: never expires.
    # A row waiting for its parents waits until then at most (wait_until).
    expires_at = models.DateTimeField(null=True, blank=True)
    # Fair share (docs/tenants.md): the key whose flow the task belongs to (NULL: not a
    # fair task; "" for a fair task whose key function returned None), and its place in
    # its flow, the virtual start time the claim orders it by within its priority. Set
    # when the row becomes due (enqueue, stage); NULL until then.
    fair_key = models.CharField(max_length=255, null=True, blank=True)
    fair_tag = models.FloatField(null=True, blank=True)
    # Ordered work per key (docs/tenants.md): the tasks of one (queue, sequence_key) run
    # one at a time, in id order; the others wait their turn ('waiting', wait_reason
    # 'sequence'), and the pgqueue_sequence_* triggers (migration 0017) start the next
    # when one ends. sequence_hold: a failure of this task holds its sequence
    # (on_failure="hold"); on a failed row, that it holds it until released.
    sequence_key = models.CharField(max_length=255, null=True, blank=True)
    sequence_hold = models.BooleanField(db_default=False)

    class Meta:
        db_table = "pgqueue_task"
        ordering = ["-id"]
        # The admin's enqueue form runs any registered task with any arguments, queue
        # and priority: a permission of its own, not Django's add_task; the cleartext of
        # encrypted tasks' payloads is one too, beyond view_task (docs/security.md).
        permissions = [
            ("enqueue_task", "Can enqueue any registered task from the admin"),
            ("decrypt_task", "Can see the cleartext of encrypted tasks in the admin"),
        ]
        indexes = [
            # The claim: an index-ordered top-N per (queue, task, version) over pending
            # rows, which are all due (scheduled rows are not in it). A claim walks only
            # the routes it can run, so rows of other tasks and versions cost it nothing.
            models.Index(
                "queue",
                "task_name",
                "handler_version",
                models.F("priority").desc(),
                "run_at",
                "id",
                name="pgqueue_task_claim",
                condition=Q(state="pending"),
            ),
            # Oldest-due first per route: the starvation escape, the oldest-due age.
            models.Index(
                fields=["queue", "task_name", "handler_version", "run_at", "id"],
                name="pgqueue_task_due",
                condition=Q(state="pending"),
            ),
            # Scheduled rows by due time: the stager and the claimer's next-due wake-up.
            models.Index(
                fields=["queue", "run_at", "id"],
                name="pgqueue_task_scheduled",
                condition=Q(state="scheduled"),
            ),
            # Lease recovery sweeps only the (few) running rows.
            models.Index(
                fields=["lease_expires_at"],
                name="pgqueue_task_lease",
                condition=Q(state="running"),
            ),
            # Limits count running rows per queue and per (queue, concurrency key): the
            # limited claim and its throttle check (docs/limits.md). Only running rows.
            models.Index(
                fields=["queue", "concurrency_key"],
                name="pgqueue_task_running",
                condition=Q(state="running"),
            ),
            # Retention prunes terminal rows oldest-first.
            models.Index(
                fields=["state", "finished_at"],
                name="pgqueue_task_retention",
                condition=Q(state__in=["succeeded", "failed", "cancelled"]),
            ),
            # Fair share (docs/tenants.md): the claim of a fair route, an index-ordered
            # top-N by priority, then virtual start time, whatever the number of keys.
            # Only pending rows with a fair key: other tasks write nothing to it.
            models.Index(
                "queue",
                "task_name",
                "handler_version",
                models.F("priority").desc(),
                models.F("fair_tag").asc(nulls_first=True),
                "id",
                name="pgqueue_task_fair",
                condition=Q(state="pending", fair_key__isnull=False),
            ),
            # The last place of one flow (route, key, priority): where a task that joins
            # it goes (enqueue, stage). One probe per key.
            models.Index(
                fields=["queue", "task_name", "handler_version", "fair_key", "priority",
                        "fair_tag"],
                name="pgqueue_task_fair_flow",
                condition=Q(state="pending", fair_key__isnull=False),
            ),
            # Sequences (docs/tenants.md): the rows of a (queue, sequence_key) that are
            # live or hold it (a failed row with sequence_hold), in id order: whose turn
            # is next, and which sequences are held. Rows without a key are not in it.
            models.Index(
                fields=["queue", "sequence_key", "id"],
                name="pgqueue_task_sequence",
                condition=Q(sequence_key__isnull=False)
                & (
                    Q(state__in=["scheduled", "pending", "running", "waiting"])
                    | Q(state="failed", sequence_hold=True)
                ),
            ),
            # Suspensions with a timeout, by when they time out: the stager wakes them.
            models.Index(
                fields=["queue", "wait_until", "id"],
                name="pgqueue_task_wait_timeout",
                condition=Q(state="waiting", wait_until__isnull=False),
            ),
            # The queue overview counts waiting rows without scanning the table.
            models.Index(
                fields=["queue", "task_name"],
                name="pgqueue_task_waiting",
                condition=Q(state="waiting"),
            ),

            # Unique keys with options (find_unique): every row that has a key, in any
            # state. Rows without a key (most) are not in it.
            models.Index(
                fields=["unique_key", "enqueued_at"],
                name="pgqueue_task_unique_key",
                condition=Q(unique_key__isnull=False),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["unique_key"],
                name="pgqueue_task_unique_live",
                condition=Q(unique_key__isnull=False)
                & Q(state__in=["scheduled", "pending", "running", "waiting"]),
            ),
            models.CheckConstraint(
                condition=Q(
                    state__in=[
                        "scheduled",
                        "pending",
                        "running",
                        "waiting",
                        "succeeded",
                        "failed",
                        "cancelled",
                    ]
                ),
                name="pgqueue_task_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=-100, priority__lte=100),
                name="pgqueue_task_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1), name="pgqueue_task_max_attempts_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_name}#{self.id} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def encrypted(self) -> bool:
        """Whether the task's payloads are encrypted in its row (docs/security.md,
        "Encrypted payloads"): its args are an object then, an array otherwise."""
        return encryption.is_encrypted(self.args)

    def cleartext(self, field: str) -> Any:
        """The value of a payload column (args, kwargs, result, checkpoint, progress,
        signals, wake), decrypted if the task is encrypted. Raises EncryptionError when
        no key of PGQUEUE["ENCRYPTION_KEYS"] decrypts it."""
        if field not in encryption.PAYLOAD_COLUMNS:
            raise ValueError(
                f"{field!r} is not a payload column; use one of "
                f"{', '.join(encryption.PAYLOAD_COLUMNS)}"
            )
        value = getattr(self, field)
        if not self.encrypted:
            return value
        return encryption.open_column(field, value, f"task {self.pk}'s {field}")


class QueueOverview(Task):
    """No table of its own: the admin's queue overview page hangs off this proxy, so
    that the admin index links to it (see admin/overview.py). Its one permission,
    ``django_pgqueue.pause_queue``, lets an operator pause and resume queues there."""

    class Meta:
        proxy = True
        default_permissions = ()
        permissions = [("pause_queue", "Can pause and resume queues and task names")]
        verbose_name = _("queue overview")
        verbose_name_plural = _("queue overview")


class Dependency(models.Model):
    """An edge of a workflow: ``child`` waits for ``parent`` to end (docs/workflows.md).

    Written by an enqueue with ``after=`` and by ``context.wait_for(child)``; resolved,
    in the transaction that ends the parent, by the pgqueue_release_dependents trigger
    (migration 0008). ``proceed_on_failure``: the child runs even if the parent ended
    failed or cancelled (otherwise it is cancelled with it)."""

    id = models.BigAutoField(primary_key=True)
    parent_id = models.BigIntegerField()
    child_id = models.BigIntegerField()
    resolved = models.BooleanField(db_default=False)
    proceed_on_failure = models.BooleanField(db_default=False)

    class Meta:
        db_table = "pgqueue_dependency"
        constraints = [
            models.UniqueConstraint(fields=["parent_id", "child_id"], name="pgqueue_dep_edge"),
        ]
        indexes = [models.Index(fields=["child_id"], name="pgqueue_dep_child")]

    def __str__(self) -> str:
        return f"{self.child_id} after {self.parent_id}"


class TaskLog(models.Model):
    """The log records one attempt of a task emitted while its handler ran (TASK_LOGS,
    docs/logging.md): one row per attempt that logged, written in the transaction of
    its settlement and only if that settlement was written (sql: store_task_logs).

    ``records``: a JSON list, oldest first, of {"time" (seconds since the epoch),
    "level", "logger", "message"} and "exception" (the traceback) when the record
    carried one (``entries`` gives their time as a datetime): the attempt's newest
    records within TASK_LOG_RECORDS and TASK_LOG_BYTES; ``dropped`` counts those left
    out. ``bytes`` is the size of ``records`` (about their JSON's), for the task's own
    budget (TASK_LOG_TASK_BYTES). ``lease_token`` names the execution, as the task's
    ``executions`` entries do. Deleted with the task (prune, delete_finished)."""

    id = models.BigAutoField(primary_key=True)
    task_id = models.BigIntegerField()
    attempt = models.IntegerField()
    lease_token = models.UUIDField()
    records = models.JSONField()
    dropped = models.IntegerField(db_default=0)
    bytes = models.IntegerField(db_default=0)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_task_log"
        default_permissions = ()  # read on the task's page, with the task's permissions
        indexes = [models.Index(fields=["task_id", "id"], name="pgqueue_task_log_task")]

    def __str__(self) -> str:
        return f"task {self.task_id} attempt {self.attempt}: {len(self.records)} record(s)"

    def entries(self) -> list[dict[str, Any]]:
        """The records, each with its ``time`` as an aware datetime (UTC)."""
        entries = []
        for record in self.records:
            entry = dict(record)
            if isinstance(entry.get("time"), int | float):
                entry["time"] = datetime.fromtimestamp(entry["time"], UTC)
            entries.append(entry)
        return entries


class Queue(models.Model):
    """Fleet-wide state of one queue, decided in the database (one row per queue,
    created when a worker serving it registers)."""

    name = models.CharField(max_length=100, primary_key=True)
    # When a claim last let a starving task jump the priority order (one per window).
    last_escape_at = models.DateTimeField(db_default=models.Value("-infinity"))
    # Paused: no worker claims from the queue (running tasks finish). paused_tasks:
    # task names paused within the queue (a JSON list). Read by every claim.
    paused = models.BooleanField(db_default=False)
    paused_tasks = models.JSONField(db_default=models.Value([], models.JSONField()))
    paused_at = models.DateTimeField(null=True, blank=True)
    # The rate limit's state (GCRA, docs/limits.md): the theoretical arrival time of the
    # next start; a claim may start k tasks while rate_tat - burst <= now().
    rate_tat = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgqueue_queue"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class KeyRate(models.Model):
    """The per-key rate limit's state (GCRA, docs/limits.md): one row per (queue, key)
    of tasks with a ``key_rate``, written by the claim, deleted by the sweeper once the
    key's budget is whole again (a missing row is a whole budget)."""

    pk = models.CompositePrimaryKey("queue", "key")
    queue = models.CharField(max_length=100)
    key = models.CharField(max_length=255)
    # The theoretical arrival time of the key's next start: a claim may start k tasks
    # of the key while tat - burst <= now() (as pgqueue_queue.rate_tat for a queue).
    tat = models.DateTimeField()
    # Where the rows set aside for this key (snooze_throttled_keys) end: the next ones
    # are spaced from there.
    snoozed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgqueue_key_rate"

    def __str__(self) -> str:
        return f"{self.queue}:{self.key}"


class FairWeight(models.Model):
    """A fair-share weight set at runtime (operations.set_fair_weight, the
    ``pgqueue_fair`` command): for one key, or for every key that starts with a prefix
    (``key`` ends with ``*``). It wins over PGQUEUE["FAIR_WEIGHTS"] for the keys it
    matches, from the next task of those keys that becomes due (docs/tenants.md)."""

    key = models.CharField(max_length=256, primary_key=True)
    weight = models.FloatField()
    set_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_fair_weight"
        ordering = ["key"]
        constraints = [
            models.CheckConstraint(
                condition=Q(weight__gt=0, weight__lte=1_000_000),
                name="pgqueue_fair_weight_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key}: {self.weight:g}"


class Worker(models.Model):
    """A live worker process, registered at start and refreshed by its heartbeat."""

    id = models.CharField(max_length=64, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    routes = models.JSONField(default=list, help_text="[[task_name, handler_version], ...]")
    concurrency = models.IntegerField()
    in_flight = models.IntegerField(db_default=0)
    started_at = models.DateTimeField(db_default=Now())
    last_heartbeat_at = models.DateTimeField(db_default=Now())
    # The django_pgqueue release the worker runs (NULL: a release before it said).
    version = models.CharField(max_length=64, null=True, blank=True)

    class Meta:
        db_table = "pgqueue_worker"
        ordering = ["hostname", "pid"]

    def __str__(self) -> str:
        return f"{self.hostname}:{self.pid}"


class Schedule(models.Model):
    """One row per periodic schedule (docs/periodic.md), by name: created the first
    time a worker sees the schedule, advanced by each tick it enqueues (sql:
    enqueue_tick). A schedule declared in code has no ``definition``; task_name, spec
    and timezone are a copy of it, for the admin to show after it was removed. A
    schedule added at runtime (add_schedule, the admin) is its ``definition``."""

    name = models.CharField(max_length=255, primary_key=True)
    task_name = models.CharField(max_length=255)
    # "0 7 * * mon" or "every 10s".
    spec = models.CharField(max_length=255)
    timezone = models.CharField(max_length=64)
    # When a worker first saw the schedule: it runs no tick before.
    created_at = models.DateTimeField(db_default=Now())
    # The last tick enqueued (the database decides each tick once), when, as which
    # task, by which worker. A tick's task is not a foreign key: retention prunes tasks.
    last_tick = models.DateTimeField(null=True, blank=True)
    last_enqueued_at = models.DateTimeField(null=True, blank=True)
    last_task_id = models.BigIntegerField(null=True, blank=True)
    last_worker_id = models.CharField(max_length=64, null=True, blank=True)
    # A runtime schedule (periodic.RuntimeSchedule.stored); NULL: declared in code.
    definition = models.JSONField(null=True, blank=True)
    # Paused: no tick is enqueued (sql: enqueue_tick). Resumed: no tick before it runs.
    paused_at = models.DateTimeField(null=True, blank=True)
    resumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgqueue_schedule"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
