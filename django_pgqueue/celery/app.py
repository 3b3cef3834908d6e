"""Celery's app (``Celery("proj")``) on this queue: its configuration, its task
decorator, its autodiscovery, its beat schedule and ``send_task``.

Celery's Django layout works unchanged::

    # proj/celery.py
    import os
    from django_pgqueue.celery import Celery          # was: from celery import Celery

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.autodiscover_tasks()

    # proj/__init__.py
    from .celery import app as celery_app

``proj/celery.py`` is imported while Django's settings load, so nothing here reads
them then: the configuration is read on first use, and the app is finalized (its
tasks registered with the queue, its beat schedule declared) once django_pgqueue's
AppConfig has imported every task module (``django_pgqueue.signals.tasks_imported``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils import timezone as django_timezone
from django.utils.module_loading import import_string

from django_pgqueue.celery import beat, canvas, state
from django_pgqueue.celery import options as celery_options
from django_pgqueue.celery import registry as celery_registry
from django_pgqueue.celery.exceptions import Unsupported
from django_pgqueue.celery.result import AsyncResult, GroupResult
from django_pgqueue.celery.signals import Signal
from django_pgqueue.celery.task import Task, add_autoretry, make_task
from django_pgqueue.core.signals import tasks_imported

# The keys this package reads, with Celery's defaults. Any other key is kept (and
# means nothing here: broker and result backend settings, worker settings...).
DEFAULTS: dict[str, Any] = {
    "broker_url": None,
    "result_backend": None,
    "timezone": None,
    "enable_utc": True,
    "imports": (),
    "include": (),
    "task_default_queue": None,
    "task_default_priority": None,
    "task_default_rate_limit": None,
    "task_routes": None,
    "task_annotations": None,
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ("json",),
    "result_accept_content": None,
    "task_always_eager": False,
    "task_eager_propagates": False,
    "task_time_limit": None,
    "task_soft_time_limit": None,
    "task_ignore_result": False,
    "beat_schedule": {},
    "pgqueue_priority": None,
}
# Celery's old setting names (with the CELERY_ namespace, the key after it).
_OLD_NAMES = {
    "always_eager": "task_always_eager",
    "eager_propagates_exceptions": "task_eager_propagates",
    "routes": "task_routes",
    "default_queue": "task_default_queue",
    "annotations": "task_annotations",
    "celerybeat_schedule": "beat_schedule",
    "celery_timezone": "timezone",
}


class Settings:
    """``app.conf``: Celery's settings by their lowercase names, as attributes or keys;
    values set on it win over its sources (``config_from_object``), read on first use
    and again after Django's ``override_settings``."""

    def __init__(self) -> None:
        object.__setattr__(self, "_changes", {})
        object.__setattr__(self, "_sources", [])
        object.__setattr__(self, "_loaded", None)

    def add_source(self, obj: Any, namespace: str | None, silent: bool = False) -> None:
        self._sources.append((obj, namespace, silent))
        self.reset()

    def reset(self) -> None:
        object.__setattr__(self, "_loaded", None)

    def _values(self) -> dict[str, Any]:
        if self._loaded is None:
            loaded: dict[str, Any] = {}
            for obj, namespace, silent in self._sources:
                try:
                    loaded.update(_read(obj, namespace))
                except ImportError:
                    if not silent:
                        raise
            object.__setattr__(self, "_loaded", loaded)
        return self._loaded

    def __getitem__(self, key: str) -> Any:
        if key in self._changes:
            return self._changes[key]
        values = self._values()
        if key in values:
            return values[key]
        if key in DEFAULTS:
            default = DEFAULTS[key]
            if isinstance(default, dict):  # app.conf.beat_schedule["x"] = ... keeps it
                default = self._changes[key] = {}
            return default
        raise KeyError(key)

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"Celery setting {name!r} is not set") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self._changes[name] = value

    def __setitem__(self, key: str, value: Any) -> None:
        self._changes[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self._changes or key in self._values() or key in DEFAULTS

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def update(self, other: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self._changes.update(other or {}, **kwargs)

    def setdefault(self, key: str, default: Any) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def keys(self) -> list[str]:
        return sorted({*DEFAULTS, *self._values(), *self._changes})

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __repr__(self) -> str:
        return f"<Settings: {len(self._changes)} set here, {len(self._sources)} source(s)>"


def _read(obj: Any, namespace: str | None) -> dict[str, Any]:
    """The Celery settings of a source: ``"django.conf:settings"`` (or another
    ``module:attribute``), a module's dotted path, a module or an object, or a dict."""
    if isinstance(obj, str):
        module, _, attribute = obj.partition(":")
        obj = importlib.import_module(module)
        if attribute:
            obj = getattr(obj, attribute)
    prefix = f"{namespace}_" if namespace else ""
    names = obj.keys() if isinstance(obj, Mapping) else dir(obj)
    values = {}
    for name in names:
        if not isinstance(name, str) or name.startswith("_") or not name.startswith(prefix):
            continue
        try:
            value = obj[name] if isinstance(obj, Mapping) else getattr(obj, name)
        except (AttributeError, KeyError):
            continue
        key = name[len(prefix) :].lower()
        values[_OLD_NAMES.get(key, key)] = value
    if namespace and not isinstance(obj, Mapping) and hasattr(obj, "CELERYBEAT_SCHEDULE"):
        values.setdefault("beat_schedule", obj.CELERYBEAT_SCHEDULE)
    return values


def _settings_changed(**kwargs: Any) -> None:
    for app in _apps:
        app.conf.reset()


setting_changed.connect(_settings_changed, dispatch_uid="django_pgqueue.celery.conf")


class TaskRegistry(Mapping):
    """``app.tasks``: the Celery-style tasks of this process, by name."""

    def __getitem__(self, name: str) -> Task:
        return celery_registry.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(celery_registry.all_tasks())

    def __len__(self) -> int:
        return len(celery_registry.all_tasks())

    def register(self, task: Any) -> Task:
        return state.get_current_app().register_task(task)

    def unregister(self, name: str) -> None:
        celery_registry.unregister(name)


# Celery's app API that has no counterpart here, and what to use instead.
_UNSUPPORTED = {
    "control": (
        "cancel a task with AsyncResult(id).revoke() or django_pgqueue.cancel(id), pause a "
        "queue with django_pgqueue.pause(queue), and see the workers and their tasks in the "
        "admin or with manage.py pgqueue_status"
    ),
    "events": "the admin and the metrics show the queue (docs/admin.md, docs/metrics.md)",
    "amqp": "there is no broker: a task is a row of your database",
    "backend": "a task's result is its row: read it with AsyncResult(id)",
    "pool": "there is no broker: a task is a row of your database",
    "connection": "there is no broker: a task is a row of your database",
    "connection_for_read": "there is no broker: a task is a row of your database",
    "connection_for_write": "there is no broker: a task is a row of your database",
    "producer_or_acquire": "there is no broker: delay() is an INSERT in your transaction",
    "producer_pool": "there is no broker: delay() is an INSERT in your transaction",
    "Worker": "run python manage.py runtaskworker (docs/worker.md)",
    "WorkController": "run python manage.py runtaskworker (docs/worker.md)",
    "worker_main": "run python manage.py runtaskworker (docs/worker.md)",
    "start": "run python manage.py runtaskworker (docs/worker.md)",
    "Beat": "there is no beat process: the workers fire the beat schedule (docs/celery.md)",
    "select_queues": "pass runtaskworker --queues",
    "setup_security": "payloads are JSON only, never pickle: there is nothing to sign",
}


class Celery:
    """A Celery app: its configuration (``conf``), its tasks (``task``, ``tasks``),
    ``autodiscover_tasks``, ``send_task``, ``AsyncResult`` and the beat schedule."""

    def __init__(
        self,
        main: str | None = None,
        loader: Any = None,
        backend: Any = None,
        amqp: Any = None,
        events: Any = None,
        log: Any = None,
        control: Any = None,
        set_as_current: bool = True,
        tasks: Any = None,
        broker: str | None = None,
        include: Any = None,
        changes: Mapping[str, Any] | None = None,
        config_source: Any = None,
        fixups: Any = None,
        task_cls: Any = None,
        autofinalize: bool = True,
        namespace: str | None = None,
        strict_typing: bool = True,
        **kwargs: Any,
    ) -> None:
        self.main = main
        self.conf = Settings()
        if changes:
            self.conf.update(changes)
        if broker:
            self.conf.broker_url = broker
        if backend:
            self.conf.result_backend = backend
        if include:
            self.conf.include = tuple(include)
        self.conf.update(kwargs)
        if config_source is not None:
            self.config_from_object(config_source, namespace=namespace)
        base = import_string(task_cls.replace(":", ".")) if isinstance(task_cls, str) else task_cls
        self.Task = type("Task", (base or Task,), {"app": self, "__module__": __name__})
        # The default app (no Celery(...) of this package in the project: one moving queue
        # by queue, still running Celery's own app) leaves the beat schedule and the
        # broker's settings to Celery: it declares no schedule and checks no serializer.
        self.is_default = False
        self._autodiscover: list[tuple[Any, str]] = []
        self._periodic: dict[str, dict[str, Any]] = {}
        self.finalized = False
        self.on_configure = Signal("on_configure")
        self.on_after_configure = Signal("on_after_configure")
        self.on_after_finalize = Signal("on_after_finalize")
        self.on_after_fork = Signal("on_after_fork")
        _apps.append(self)
        if set_as_current:
            state.set_current_app(self)

    # -- configuration -----------------------------------------------------------------
    def config_from_object(
        self, obj: Any, silent: bool = False, force: bool = False, namespace: str | None = None
    ) -> None:
        """Read Celery's settings from ``obj`` (``"django.conf:settings"`` with
        ``namespace="CELERY"``: each ``CELERY_<NAME>`` setting), on first use."""
        self.conf.add_source(obj, namespace, silent)

    def config_from_envvar(
        self, variable_name: str, silent: bool = False, force: bool = False
    ) -> bool:
        module = os.environ.get(variable_name)
        if not module:
            if silent:
                return False
            raise ImproperlyConfigured(f"the environment variable {variable_name!r} is not set")
        self.config_from_object(module, silent=silent)
        return True

    def add_defaults(self, obj: Any) -> None:
        for key, value in (obj() if callable(obj) else obj).items():
            self.conf.setdefault(key, value)

    @property
    def timezone(self) -> ZoneInfo:
        return ZoneInfo(str(self.conf.timezone or "UTC"))

    def now(self) -> datetime:
        return django_timezone.now()

    # -- tasks -------------------------------------------------------------------------
    def task(self, *args: Any, **opts: Any) -> Any:
        """``@app.task`` or ``@app.task(bind=True, max_retries=5, ...)``."""
        if len(args) == 1 and callable(args[0]) and not opts:
            return self._task_from_fun(args[0], {})
        if args:
            raise TypeError("@app.task takes options as keywords: @app.task(name=..., ...)")

        def decorate(fun: Callable[..., Any]) -> Task:
            return self._task_from_fun(fun, opts)

        return decorate

    def _task_from_fun(self, fun: Callable[..., Any], options: dict[str, Any]) -> Task:
        return _add(make_task(self, fun, options))

    def register_task(self, task: Any, **options: Any) -> Task:
        """A class-based task (a Task subclass with ``run``, or an instance of one)."""
        if isinstance(task, type):
            task = task()
        if task.name is None:
            task.name = celery_registry.task_name(type(task).__module__, type(task).__name__,
                                                  self.main)  # fmt: skip
        if task.app is None:
            task.app = self
        add_autoretry(task)
        return _add(task)

    @property
    def tasks(self) -> TaskRegistry:
        return TaskRegistry()

    @property
    def current_task(self) -> Any:
        return state.get_current_task()

    def autodiscover_tasks(
        self, packages: Any = None, related_name: str = "tasks", force: bool = False
    ) -> None:
        """Import ``<package>.<related_name>`` of each package (default: every installed
        app) when the app is finalized, or now if ``force`` or Django is ready."""
        self._autodiscover.append((packages, related_name))
        if force or self.finalized:
            self._discover(packages, related_name)

    def _discover(self, packages: Any, related_name: str) -> None:
        packages = packages() if callable(packages) else packages
        if packages is None:
            packages = [config.name for config in apps.get_app_configs()]
        for package in packages:
            module = f"{package}.{related_name}"
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name not in (module, package):
                    raise

    # -- calling -----------------------------------------------------------------------
    def send_task(
        self, name: str, args: Any = None, kwargs: Any = None, countdown: float | None = None,
        eta: datetime | None = None, task_id: str | None = None, expires: Any = None,
        link: Any = None, link_error: Any = None, **options: Any,
    ) -> AsyncResult:  # fmt: skip
        """Enqueue a task by name, registered here or not (a task only the workers
        have waits, pending, for a worker that has it); returns its AsyncResult."""
        for key, value in (("countdown", countdown), ("eta", eta), ("task_id", task_id),
                           ("expires", expires), ("link", link), ("link_error", link_error)):
            if value is not None:
                options[key] = value  # fmt: skip
        return canvas.Signature(name, args, kwargs, options, app=self).apply_async()

    def signature(self, *args: Any, **kwargs: Any) -> canvas.Signature:
        kwargs.setdefault("app", self)
        return canvas.signature(*args, **kwargs)

    def AsyncResult(self, task_id: str, **kwargs: Any) -> AsyncResult:
        return AsyncResult(task_id, app=self, **kwargs)

    def GroupResult(self, *args: Any, **kwargs: Any) -> GroupResult:
        return GroupResult(*args, app=self, **kwargs)

    # -- beat --------------------------------------------------------------------------
    def add_periodic_task(
        self, schedule: Any, sig: Any, args: Any = (), kwargs: Any = (), name: str | None = None,
        **opts: Any,
    ) -> str:  # fmt: skip
        """A beat entry for ``sig`` (``app.add_periodic_task(10.0, ping.s("hello"))``),
        declared as a periodic schedule with the others."""
        sig = canvas.maybe_signature(sig)
        key = name or repr(sig)
        entry = {
            "schedule": schedule,
            "task": sig.task,
            "args": tuple(args) or sig.args,
            "kwargs": dict(kwargs) or sig.kwargs,
            "options": {**sig.options, **opts},
        }
        self._periodic[key] = entry
        if self.finalized and not self.is_default:
            beat.declare(self, {key: entry})
        return key

    # -- finalizing --------------------------------------------------------------------
    def finalize(self, auto: bool = False) -> None:
        """Import the app's task modules, register its tasks with the queue, check its
        configuration, and declare its beat schedule (once)."""
        if self.finalized:
            return
        self.finalized = True
        for module in (*self.conf.imports, *self.conf.include):
            importlib.import_module(module)
        for packages, related_name in self._autodiscover:
            self._discover(packages, related_name)
        if not self.is_default:
            _check_conf(self.conf)
        for task in celery_registry.all_tasks().values():
            task.definition()
        self.on_after_configure.send(sender=self, source=self.conf)
        self.on_after_finalize.send(sender=self)
        if not self.is_default:
            beat.declare(self, {**self.conf.beat_schedule, **self._periodic})

    def __getattr__(self, name: str) -> Any:
        if name in _UNSUPPORTED:
            raise Unsupported(f"app.{name} has no counterpart here: {_UNSUPPORTED[name]}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"<Celery {self.main or '__main__'}: django_pgqueue>"


_apps: list[Celery] = []


def _add(task: Task) -> Task:
    """Register a Celery-style task; with the queue too, once settings can be read."""
    celery_registry.register(task)
    if settings.configured and apps.models_ready:
        task.definition()
    return task


def _check_conf(conf: Settings) -> None:
    for key in ("task_serializer", "result_serializer"):
        celery_options.check_serializer(conf.get(key), f"CELERY_{key.upper()}")
    for key in ("accept_content", "result_accept_content"):
        for content in conf.get(key) or ():
            celery_options.check_serializer(content, f"CELERY_{key.upper()}")
    if conf.get("task_annotations"):
        raise Unsupported(
            "CELERY_TASK_ANNOTATIONS has no counterpart: set rate_limit, time_limit and "
            "the other options on the tasks themselves (@app.task(rate_limit=...))"
        )


def shared_task(*args: Any, **options: Any) -> Any:
    """``@shared_task`` or ``@shared_task(bind=True, ...)``: a task of the current app
    (the one ``proj/celery.py`` created)."""

    def decorate(fun: Callable[..., Any]) -> Task:
        app = state.get_current_app()
        task = make_task(app, fun, options)
        task.app = None  # resolved to the current app when used, as Celery's proxy
        return _add(task)

    if len(args) == 1 and callable(args[0]) and not options:
        return decorate(args[0])
    if args:
        raise TypeError("@shared_task takes options as keywords: @shared_task(name=..., ...)")
    return decorate


def _finalize_apps(**kwargs: Any) -> None:
    """Once every task module is imported: finalize every app, and register with the
    queue every task declared before settings could be read."""
    for app in list(_apps):
        app.finalize(auto=True)
    if not _apps:
        for task in celery_registry.all_tasks().values():
            task.definition()


def _default_app() -> Celery:
    """The app of ``shared_task`` in a project that creates none of this package's (one
    still running Celery's own, while it moves queue by queue): Celery's settings from
    Django's (``CELERY_*``), and no beat schedule (Celery's beat still fires it)."""
    app = Celery("default", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.is_default = True
    return app


tasks_imported.connect(_finalize_apps, dispatch_uid="django_pgqueue.celery.finalize")
state.default_app_factory = _default_app
current_app = state.Proxy(state.get_current_app, "current_app")
current_task = state.Proxy(state.get_current_task, "current_task")
