"""A handler's exception, carried from a prefork child to the worker for its log record.

With ``EXECUTION = "process"`` a handler raises in a child process, and only its outcome
crosses back to the worker, as JSON on the pool's pipe. So that the worker's log record
of the settlement (and an error reporter reading it, such as Sentry) still carries the
handler's exception, the child also sends a description of it (``describe``): its
class's module and name, its message and notes, and, for each frame of its traceback,
the file, line, function and module; its cause and context likewise.

The worker rebuilds it (``rebuild``) as an instance of a stand-in class with the same
module and name, a subclass of ``HandlerException`` (the original class is never
imported: a message can never make the worker import a dotted path), whose traceback
runs through frames with the handler's files, lines and functions. Formatted, it reads
as the child's traceback would; Sentry shows the same frames with their source lines
and groups the events as it groups thread mode's. Local variables stay in the child.
"""

from __future__ import annotations

import functools
import sys
import traceback
import types
from typing import Any

# A RecursionError's thousand frames are cut to the innermost ones.
MAX_FRAMES = 100
# How many causes and contexts deep a description goes.
MAX_CHAIN = 5
MAX_MESSAGE = 10_000


class HandlerException(Exception):
    """The base of the stand-ins for exceptions raised in a prefork child."""


def describe(exc: BaseException | None, depth: int = 0) -> dict[str, Any] | None:
    """``exc`` as JSON-ready values, for the pipe to the worker (None for None)."""
    if exc is None or depth > MAX_CHAIN:
        return None
    try:
        message = str(exc)
    except Exception:  # a __str__ that raises must not lose the outcome
        message = f"<str() of the {type(exc).__name__} raised>"
    frames = [
        {
            "file": frame.f_code.co_filename,
            "line": line,
            "function": frame.f_code.co_name,
            "module": frame.f_globals.get("__name__"),
        }
        for frame, line in traceback.walk_tb(exc.__traceback__)
    ]
    return {
        "module": type(exc).__module__,
        "type": type(exc).__qualname__,
        "message": message[:MAX_MESSAGE],
        "notes": [str(n) for n in getattr(exc, "__notes__", ())],
        "frames": frames[-MAX_FRAMES:],
        "cause": describe(exc.__cause__, depth + 1),
        "context": None if exc.__suppress_context__ else describe(exc.__context__, depth + 1),
    }


def rebuild(description: dict[str, Any] | None) -> HandlerException | None:
    """The stand-in exception of a ``describe`` result, with its traceback."""
    if description is None:
        return None
    exc = _stand_in(description["module"], description["type"])(description["message"])
    for note in description["notes"]:
        exc.add_note(note)
    tb = None
    for frame in reversed(description["frames"]):
        # tb_lasti -1: no column positions (they would be the stub's, not the handler's).
        tb = types.TracebackType(tb, _frame(frame), -1, frame["line"])
    exc.__traceback__ = tb
    exc.__cause__ = rebuild(description["cause"])
    exc.__context__ = rebuild(description["context"])
    exc.__suppress_context__ = description["context"] is None and exc.__cause__ is not None
    return exc


@functools.lru_cache(maxsize=256)
def _stand_in(module: str, qualname: str) -> type[HandlerException]:
    name = qualname.rpartition(".")[2]
    return type(name, (HandlerException,), {"__module__": module, "__qualname__": qualname})


class _FrameMaker(Exception):
    pass


_STUB = compile("raise _FrameMaker", "<stub>", "exec")


def _frame(frame: dict[str, Any]) -> types.FrameType:
    """A real frame object with the handler frame's file, function and module: a
    one-line code object renamed to them, run until it raises."""
    code = _STUB.replace(
        co_filename=frame["file"], co_name=frame["function"], co_firstlineno=frame["line"]
    )
    namespace = {"__name__": frame["module"], "__file__": frame["file"], "_FrameMaker": _FrameMaker}
    try:
        exec(code, namespace, {})
    except _FrameMaker:
        return sys.exc_info()[2].tb_next.tb_frame  # the frame of the stub itself
    raise AssertionError("unreachable: the stub always raises")
