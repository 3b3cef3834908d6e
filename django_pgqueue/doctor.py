"""The queue doctor, as functions: the public path, ``django_pgqueue.doctor``
(docs/operations.md, docs/api.md).

The code lives in django_pgqueue/ops/doctor/, in its layer (docs/architecture.md); this
module only names what a project may import from here.
"""

from django_pgqueue.ops.doctor import (
    CHECK_IDS,
    CLEAN_PROBE_BUFFERS,
    GROUPS,
    INFO,
    PROBLEM,
    SEVERITIES,
    WARNING,
    WORKER_OWN_CONNECTIONS,
    Finding,
    Thresholds,
    diagnose,
    exit_status,
)

__all__ = [
    "CHECK_IDS",
    "CLEAN_PROBE_BUFFERS",
    "GROUPS",
    "INFO",
    "PROBLEM",
    "SEVERITIES",
    "WARNING",
    "WORKER_OWN_CONNECTIONS",
    "Finding",
    "Thresholds",
    "diagnose",
    "exit_status",
]
