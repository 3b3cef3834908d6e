"""Encrypted payloads: what an encrypted task's row holds in place of its values.

A task declared with ``@task(encrypt=True)``, or any task under
``PGQUEUE["ENCRYPT_ALL"]``, has its payloads encrypted in its row: what the caller and
the task's code put there (docs/security.md, "Encrypted payloads"). Each value is
stored as a *sealed value*, a JSON object of one key::

    {"$enc": "<Fernet token of the value's JSON text>"}

so the columns stay valid ``jsonb``. Which columns (``PAYLOAD_COLUMNS``):

- ``args``, ``kwargs``, ``result``, ``checkpoint``, ``progress``: the value, sealed
  whole (SQL NULL stays NULL, and no keyword arguments stay ``{}``);
- ``signals``: an object of signal name -> sealed payload (the names stay in clear);
- ``wake``: the queue's record of what woke the task, with a signal's payload sealed
  under ``"payload"``.

A row is encrypted when its ``args`` are a JSON object: enqueue writes a plain row's
args as an array, always. Every reader (the worker, the admin, the Tasks framework
backend, SQL) tells the two apart from the row alone, and a row keeps the choice it was
enqueued with whatever the task's code says later.

The keys are ``PGQUEUE["ENCRYPTION_KEYS"]``, newest first (``cryptography``'s
``MultiFernet``): the first encrypts, every one decrypts. ``cryptography`` is an
optional dependency (``pip install "django-pgqueue-tasks[encrypt]"``), imported the first time
a value is sealed or opened: a project that encrypts nothing never imports it.
"""

from __future__ import annotations

import json
from typing import Any

from django_pgqueue.core.conf import configured
from django_pgqueue.core.exceptions import EncryptionError
from django_pgqueue.core.payload import dumps

MARKER = "$enc"
# What the task's code, or whoever enqueued or signalled the task, put in the row: each
# encrypted in an encrypted row, and hidden by the admin's ADMIN_SHOW_PAYLOADS.
PAYLOAD_COLUMNS = ("args", "kwargs", "result", "checkpoint", "progress", "signals", "wake")
INSTALL = 'pip install "django-pgqueue-tasks[encrypt]"'


def chosen(encrypt: bool | None) -> bool:
    """Whether a task encrypts: its own ``encrypt=`` when it set one, else
    ``PGQUEUE["ENCRYPT_ALL"]``."""
    if encrypt is not None:
        return encrypt
    return bool(configured().get("ENCRYPT_ALL", False))


def is_encrypted(args: Any) -> bool:
    """Whether a row whose ``args`` column holds ``args`` is encrypted (an object; a
    plain row's args are an array)."""
    return type(args) is dict


def is_sealed(value: Any) -> bool:
    return type(value) is dict and len(value) == 1 and MARKER in value


# -- sealing --------------------------------------------------------------------------
def seal_text(text: str) -> str:
    """The JSON text of the sealed value of a JSON ``text``."""
    token = _cipher().encrypt(text.encode()).decode("ascii")
    return f'{{"{MARKER}":"{token}"}}'  # a token is url-safe base64: nothing to escape


def seal(value: Any) -> Any:
    """``value`` sealed; None stays None (no result, no checkpoint)."""
    if value is None:
        return None
    return {MARKER: _cipher().encrypt(dumps(value).encode()).decode("ascii")}


# -- opening --------------------------------------------------------------------------
def open_text(value: Any, where: str) -> str:
    """The JSON text inside a sealed value. ``where`` names it in the error."""
    token = value.get(MARKER) if type(value) is dict else None
    if not isinstance(token, str):
        raise EncryptionError(f"{where} is not an encrypted value ({MARKER!r} missing)")
    multi, _newest = _keys()
    try:
        return multi.decrypt(token.encode("ascii")).decode()
    except Exception as exc:  # InvalidToken, or a token that is not ASCII
        raise EncryptionError(_undecryptable(where)) from exc


def open_value(value: Any, where: str) -> Any:
    """A sealed value's value; anything else (SQL NULL, a JSON null) as it is."""
    if not is_sealed(value):
        return value
    return json.loads(open_text(value, where))


def open_column(column: str, value: Any, where: str) -> Any:
    """The cleartext of one payload column of an encrypted row (PAYLOAD_COLUMNS)."""
    if column == "signals":
        if not isinstance(value, dict):
            return value
        return {name: open_value(payload, f"{where}[{name!r}]") for name, payload in value.items()}
    if column == "wake":
        if not isinstance(value, dict) or "payload" not in value:
            return value
        return {**value, "payload": open_value(value["payload"], f"{where}['payload']")}
    return open_value(value, where)


def _undecryptable(where: str) -> str:
    keys = len(_keys_setting())
    return (
        f"{where} cannot be decrypted: none of the {keys} key(s) of "
        "PGQUEUE['ENCRYPTION_KEYS'] decrypts it (the key it was encrypted with was "
        "removed, or the value was altered). The row is kept as it is: put that key back "
        "in ENCRYPTION_KEYS (after the newest) and requeue the task"
    )


# -- rotation -------------------------------------------------------------------------
def rotated(column: str, value: Any, where: str) -> Any:
    """``value`` (a payload column of an encrypted row) with each sealed value in it
    encrypted again with the newest key, or None when each already is (nothing to
    write). Raises EncryptionError when one cannot be decrypted."""
    if column == "signals" and isinstance(value, dict):
        names = {name: _rotated(payload, f"{where}[{name!r}]") for name, payload in value.items()}
        if all(new is None for new in names.values()):
            return None
        return {name: value[name] if new is None else new for name, new in names.items()}
    if column == "wake" and isinstance(value, dict):
        payload = _rotated(value.get("payload"), f"{where}['payload']")
        return None if payload is None else {**value, "payload": payload}
    return _rotated(value, where)


def _rotated(value: Any, where: str) -> dict[str, str] | None:
    if not is_sealed(value):
        return None
    token = value[MARKER]
    multi, newest = _keys()
    if not isinstance(token, str) or not token.isascii():
        raise EncryptionError(_undecryptable(where))
    if _decrypts(newest, token):
        return None  # encrypted with the newest key already
    try:
        return {MARKER: multi.rotate(token.encode("ascii")).decode("ascii")}
    except Exception as exc:  # InvalidToken: no key decrypts it
        raise EncryptionError(_undecryptable(where)) from exc


def _decrypts(fernet: Any, token: str) -> bool:
    try:
        fernet.decrypt(token.encode("ascii"))
    except Exception:  # InvalidToken
        return False
    return True


# -- the keys -------------------------------------------------------------------------
_cache: tuple[tuple[Any, ...], Any, Any] | None = None


def _keys_setting() -> list[Any]:
    keys = configured().get("ENCRYPTION_KEYS") or []
    return list(keys) if isinstance(keys, list | tuple) else []


def _keys() -> tuple[Any, Any]:
    """(MultiFernet of every key, Fernet of the newest), built once per value of
    ENCRYPTION_KEYS (override_settings changes it in tests)."""
    global _cache
    keys = tuple(_keys_setting())
    cached = _cache
    if cached is not None and cached[0] == keys:
        return cached[1], cached[2]
    problem = key_problem(keys)
    if problem is not None:
        raise EncryptionError(problem)
    from cryptography.fernet import Fernet, MultiFernet

    fernets = [Fernet(key) for key in keys]
    multi = MultiFernet(fernets)
    _cache = (keys, multi, fernets[0])
    return multi, fernets[0]


def _cipher() -> Any:
    return _keys()[0]


def key_problem(keys: Any = None) -> str | None:
    """Why payloads cannot be encrypted here (``cryptography`` missing, no key, a value
    of ENCRYPTION_KEYS that is not a key), or None. Never quotes a key."""
    if keys is None:
        keys = _keys_setting()
    return install_problem() or (NO_KEYS if not keys else bad_key(keys))


NO_KEYS = (
    "PGQUEUE['ENCRYPTION_KEYS'] is empty: encrypted tasks need at least one key, newest "
    'first (make one with: python -c "from cryptography.fernet import Fernet; '
    'print(Fernet.generate_key().decode())"), read from the environment or a secrets '
    "store, never committed"
)


def install_problem() -> str | None:
    """Why ``cryptography`` cannot be used, or None."""
    try:
        import cryptography.fernet  # noqa: F401
    except ImportError:
        return f"encrypted tasks need the cryptography package, which is not installed: {INSTALL}"
    return None


def bad_key(keys: Any) -> str | None:
    """Which value of ENCRYPTION_KEYS is not a Fernet key, without quoting it; or None."""
    from cryptography.fernet import Fernet

    for index, key in enumerate(keys):
        try:
            Fernet(key)
        except Exception:
            return (
                f"PGQUEUE['ENCRYPTION_KEYS'][{index}] is not a Fernet key (32 url-safe "
                "base64-encoded bytes, as Fernet.generate_key() makes)"
            )
    return None
