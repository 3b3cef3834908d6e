"""An embedded PostgreSQL for development and tests, from the ``pgserver`` package.

``embedded_database_url(path)`` starts a private server whose data lives in ``path``
(or attaches to the one already running there) and returns its URL. The server
listens on a Unix socket only and stops when the last process using it exits.
Production never uses this: set DATABASE_URL.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote


def embedded_database_url(data_dir: str | Path, dbname: str = "postgres") -> str:
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI): harmless.
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "DATABASE_URL is not set and the embedded PostgreSQL is not installed: "
            "pip install 'django-pgqueue-tasks[embedded]', or set DATABASE_URL"
        ) from exc
    path = Path(data_dir).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(path.parent / f".{path.name}.lock"):
        server = pgserver.get_server(path, cleanup_mode="stop")
    socket_dir = server.get_postmaster_info().socket_dir
    return f"postgres://postgres@/{dbname}?host={quote(str(socket_dir), safe='/')}"


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """One process at a time starts (or attaches to) the server: processes started
    together (pytest-xdist's workers) would otherwise race in pgserver's set-up, e.g.
    its ``useradd`` of the system user it runs the server as, when running as root on
    a machine that does not have that user yet (the losers' useradd fails)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: pgserver runs no useradd there
        yield
        return
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
