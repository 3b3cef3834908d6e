"""A manage.py written without the ``if __name__ == "__main__":`` guard, as some projects
have it. Process mode must never run it again in its children: each child would start a
supervisor of its own (tests/test_supervisor.py)."""

import os
import sys

from django.core.management import execute_from_command_line

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
execute_from_command_line(sys.argv)
