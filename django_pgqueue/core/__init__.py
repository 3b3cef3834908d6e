"""Pure code, no database: what a value may be, checked before any SQL runs.

The lowest layer (docs/architecture.md): the options of a task and a call
(``options``), the settings (``conf``), what JSON may go into a row (``payload``), the
retry policy (``retry``), ``QUEUE_LIMITS`` and ``FAIR_WEIGHTS`` parsed (``limits``,
``fairness``), when schedules tick (``ticks``), what the package raises and sends
(``exceptions``, ``signals``), the one import of Django's Tasks framework (``compat``),
how an error quotes a value (``reprs``) and the development database (``embedded``).
Nothing here imports from the layers above. The documented modules keep their public
paths (``django_pgqueue.exceptions``, ``.signals``, ``.embedded``).
"""
