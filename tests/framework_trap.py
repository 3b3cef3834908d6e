"""A Tasks framework module that nothing imports. A row naming its task must never make a
process import it: importing it writes the file named by PGQUEUE_TEST_IMPORT_MARK."""

import os
from pathlib import Path

from django_pgqueue.core.compat import task

if os.environ.get("PGQUEUE_TEST_IMPORT_MARK"):
    Path(os.environ["PGQUEUE_TEST_IMPORT_MARK"]).write_text(f"imported by {os.getpid()}")


@task
def trap() -> str:
    return "this module was imported"
