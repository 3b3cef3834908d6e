"""The worker: small components with one job each, composed by ``Worker``.

- ``Claimer``: claims as many due rows as there are free slots, in one statement.
- ``SlotPool``: threads that only run handlers (plus a watchdog for overruns).
- ``Settler``: writes outcomes back in fenced, batched statements.
- ``Heartbeat``: renews every in-flight lease in one UPDATE; refreshes the registry row.
- ``Listener``: LISTEN on the claimer's connection; how a parked claimer is woken.
- ``Sweeper``: recovers expired leases; cleans stale worker rows.
- ``Pruner``: retention of terminal rows.
- ``Supervisor``: runs several worker processes and replaces the ones that die.
"""
