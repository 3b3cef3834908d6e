"""Operating and observing the queue, outside the worker: what is done to tasks
(``operations``), retention and the archive (``retention``, ``archive``), and the reads
of the queue's state for the admin, Prometheus and ``pgqueue_doctor`` (``overview``,
``metrics``, ``doctor/``).

The documented modules keep their public paths (``django_pgqueue.operations``,
``.metrics``, ``.doctor``); docs/architecture.md.
"""
