"""Chains, groups and chords: the public path, ``django_pgqueue.workflows``
(docs/workflows.md, docs/api.md).

The code lives in django_pgqueue/tasking/workflows.py, in its layer
(docs/architecture.md); this module only names what a project may import from here.
"""

from django_pgqueue.tasking.workflows import (
    Step,
    chain,
    chord,
    group,
)

__all__ = [
    "Step",
    "chain",
    "chord",
    "group",
]
