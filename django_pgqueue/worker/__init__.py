"""The worker: small components with one job each, composed by ``Worker``.

One module per concept:

- ``worker``: ``Worker`` composes the components; start-up, signals and shutdown.
- ``claimer``: claims as many due rows as there are free slots, in one statement.
- ``batcher``: claims the rows of batch handlers into batches, one slot per batch.
- ``slots``: threads that only run handlers, and the watchdog that writes off overruns.
- ``settler``: writes outcomes back in fenced, batched statements.
- ``heartbeat``: renews every in-flight lease in one UPDATE; refreshes the registry row.
- ``sweeper``: recovers expired leases; cleans stale worker rows; fails unroutable tasks.
- ``pruner``: retention of terminal rows, in small batches.
- ``vacuumer``: vacuums the task table once its dead tuples pile up.
- ``listener``: LISTEN on the claimer's connection: how a parked claimer is woken.
- ``periodic``: the base of the components that do one thing on an interval.
- ``supervisor``: runs ``--processes N`` worker processes; replaces the ones that exit.
- ``spawn``: starts a fresh interpreter that runs one function of django_pgqueue.
- ``prefork``: with ``--execution process``, each slot's handlers run in its child process.
- ``claimed``: what the worker holds about a claimed task: the row and its lease.
- ``outcomes``: the outcome policy: what each way an attempt can end does to the row.
- ``execution``: runs one claimed task's handler and names how it ended.
- ``atomic``: an atomic task's handler and its outcome, committed in one transaction.
- ``asyncio_runner``: the event loop that ``async def`` handlers run on.
- ``inflight``: the claims this process holds and has not settled yet, keyed by lease.
- ``connection``: the components' own PostgreSQL connections, reconnecting with backoff.
- ``logging``: log set-up, and the execution each log line is about.
- ``task_logs``: the records a handler logs during an attempt, kept with it (TASK_LOGS);
  ``attempt_log``: one attempt's records, within their limits.
- ``stats``: the counters a worker keeps about itself (``metrics_server`` exports them).
- ``metrics_server``: the worker's Prometheus metrics and its ``/metrics`` HTTP server.
"""
