"""The queue gauges for a web process's ``/metrics``: the public path,
``django_pgqueue.metrics`` (docs/metrics.md, docs/api.md).

The code lives in django_pgqueue/ops/metrics.py, in its layer (docs/architecture.md);
this module only names what a project may import from here.
"""

from django_pgqueue.ops.metrics import (
    DoctorCollector,
    QueueCollector,
    register_queue_collector,
    unregister_queue_collector,
)

__all__ = [
    "DoctorCollector",
    "QueueCollector",
    "register_queue_collector",
    "unregister_queue_collector",
]
