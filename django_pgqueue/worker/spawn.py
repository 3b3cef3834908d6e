"""Start a fresh Python process that runs one function of django_pgqueue, with Django set up.

multiprocessing's "spawn" start method imports the parent's ``__main__`` script again in
every child. A project's ``manage.py`` without an ``if __name__ == "__main__":`` guard
then runs its command again in the child: ``runtaskworker --processes N`` starts a
supervisor inside every child, and so on. A child started here never runs the parent's
script. It runs a fixed bootstrap instead (``python -c``) that:

1. takes the parent's ``sys.path`` from its command line, so it imports what the
   parent imports (the project next to ``manage.py``, ``--pythonpath``) without a
   ``PYTHONPATH`` that the handlers' own subprocesses would inherit;
2. runs ``django.setup()`` with the parent's settings module (``DJANGO_SETTINGS_MODULE``
   in its environment);
3. calls the target with the JSON keyword arguments and exits with its return value.

The target is named, never pickled, and only a function defined in a django_pgqueue
module can be one. Both sides check it: a command line is input, and a process must not
import a path read from input.

``start_child`` is the parent's side; ``child_main`` is the child's.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

# A stream argument of subprocess.Popen: PIPE, DEVNULL, a file descriptor, a file or None.
Stream = int | IO[Any] | None

_TARGET = re.compile(r"django_pgqueue(\.[A-Za-z_][A-Za-z0-9_]*)+")

# Run by ``python -c``: sys.argv is then ["-c", <sys.path as JSON>, <target>, <kwargs as JSON>].
_BOOTSTRAP = (
    "import json, sys; "
    "sys.path[:] = json.loads(sys.argv[1]); "
    "from django_pgqueue.worker.spawn import child_main; "
    "child_main()"
)


def start_child(
    target: str,
    kwargs: Mapping[str, Any] | None = None,
    *,
    pass_fds: Sequence[int] = (),
    stdin: Stream = None,
    stdout: Stream = None,
    stderr: Stream = None,
) -> subprocess.Popen[bytes]:
    """Start a Python process that sets Django up and calls ``target(**kwargs)``.

    ``target`` is the dotted name of a function defined in a django_pgqueue module, for
    example ``"django_pgqueue.worker.supervisor.run_child"``. ``kwargs`` must be JSON.
    The child inherits this process's environment, working directory, ``sys.path`` and
    settings module, and its stdout/stderr unless others are given. ``pass_fds`` are
    file descriptors the child keeps open (pipes to talk to it), under the same numbers.
    The child's exit status is the target's return value (``None`` is 0); an exception
    prints its traceback and exits with 1.
    """
    resolve_target(target)
    return subprocess.Popen(
        _command_line(target, kwargs or {}),
        env=_child_environment(),
        pass_fds=tuple(pass_fds),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
    )


def child_main() -> None:
    """The child's side: check the target, set Django up, call the target, exit."""
    target, kwargs_json = sys.argv[2], sys.argv[3]
    _check_target_name(target)
    import django

    django.setup()
    function = resolve_target(target)
    raise SystemExit(function(**json.loads(kwargs_json)))


def resolve_target(target: str) -> Callable[..., Any]:
    """The function ``target`` names, if it is one defined in a django_pgqueue module."""
    _check_target_name(target)
    module_name, _, name = target.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"child target {target!r}: cannot import its module {module_name!r} ({exc})"
        ) from exc
    function = getattr(module, name, None)
    if not inspect.isfunction(function) or function.__module__ != module_name:
        raise ValueError(
            f"child target {target!r} is not a function defined in {module_name}; "
            "name a module-level function of that module"
        )
    return function


def _check_target_name(target: str) -> None:
    if not _TARGET.fullmatch(target):
        raise ValueError(
            f"child target {target!r} refused: only functions of django_pgqueue can run in "
            "a child process (a dotted name starting with 'django_pgqueue.')"
        )


def _command_line(target: str, kwargs: Mapping[str, Any]) -> list[str]:
    try:
        kwargs_json = json.dumps(dict(kwargs))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"child target {target!r}: its kwargs must be JSON, since the child receives "
            f"them as JSON on its command line ({exc})"
        ) from exc
    return [sys.executable, "-c", _BOOTSTRAP, json.dumps(sys.path), target, kwargs_json]


def _child_environment() -> dict[str, str]:
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    module = settings.SETTINGS_MODULE
    if not module:
        raise ImproperlyConfigured(
            "a child process sets Django up from a settings module, but this process "
            "configured its settings with settings.configure(); set DJANGO_SETTINGS_MODULE "
            "instead"
        )
    return {**os.environ, "DJANGO_SETTINGS_MODULE": module}
