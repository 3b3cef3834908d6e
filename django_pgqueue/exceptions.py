"""Every exception of the package: the public path, ``django_pgqueue.exceptions``
(docs/api.md, docs/api.md).

The code lives in django_pgqueue/core/exceptions.py, in its layer
(docs/architecture.md); this module only names what a project may import from here.
"""

from django_pgqueue.core.exceptions import (
    AtomicWriteRefused,
    Cancelled,
    Continue,
    EncryptionError,
    HandlerSignal,
    InvalidTaskError,
    LeaseLost,
    PayloadTooLarge,
    PgQueueError,
    Retry,
    Snooze,
    Suspend,
    TaskDoesNotExist,
    TaskNotRegistered,
    TransactionDatabaseError,
)

__all__ = [
    "AtomicWriteRefused",
    "Cancelled",
    "Continue",
    "EncryptionError",
    "HandlerSignal",
    "InvalidTaskError",
    "LeaseLost",
    "PayloadTooLarge",
    "PgQueueError",
    "Retry",
    "Snooze",
    "Suspend",
    "TaskDoesNotExist",
    "TaskNotRegistered",
    "TransactionDatabaseError",
]
