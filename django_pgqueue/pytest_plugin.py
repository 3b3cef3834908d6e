"""The pytest plugin of django_pgqueue: the ``pgqueue`` fixture (docs/testing.md).

Registered through the ``pytest11`` entry point, so it loads in every pytest run of an
environment where django-pgqueue-tasks is installed, Django project or not. Loading it
imports the ``django_pgqueue`` package, which reads no settings and no models at
import; the helpers (and with them the models) are imported when a test asks for the
fixture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from django_pgqueue.testing.helpers import PgQueue


@pytest.fixture
def pgqueue(db: None) -> PgQueue:
    """The test helpers of ``django_pgqueue.testing``, on the test's database:
    ``pgqueue.assert_enqueued(...)``, ``pgqueue.refute_enqueued(...)``,
    ``pgqueue.enqueued(...)``, ``pgqueue.run_tasks(...)``, ``pgqueue.drain(...)``.

    Requires pytest-django's database access: ``db`` by default (the test runs in a
    transaction rolled back at its end); with ``transactional_db`` or
    ``@pytest.mark.django_db(transaction=True)`` the helpers see committed data."""
    from django_pgqueue.testing.helpers import PgQueue

    return PgQueue()
