"""The development database: the public path, ``django_pgqueue.embedded``
(docs/quickstart.md, docs/api.md).

The code lives in django_pgqueue/core/embedded.py, in its layer (docs/architecture.md);
this module only names what a project may import from here.
"""

from django_pgqueue.core.embedded import (
    embedded_database_url,
)

__all__ = [
    "embedded_database_url",
]
