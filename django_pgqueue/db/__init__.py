"""The database contract: the named SQL statements (``sql/``), the cursor an enqueue
writes through (``enqueue_cursor``) and what an encrypted row holds (``encryption``).

The tables themselves are ``django_pgqueue.models``, at the top of the package because
Django looks for an app's models there and the migrations are written against it; it
belongs to this layer (docs/architecture.md).
"""
