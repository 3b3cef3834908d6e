"""Signals sent by the worker.

``task_started`` is sent by the worker just before a task's handler runs (before the
execution hooks of PGQUEUE['MIDDLEWARE']), for every task, native or enqueued through
Django's Tasks framework (which also gets the framework's own ``task_started``):
``sender`` is the TaskDefinition, with keyword arguments ``task_id``, ``attempt``,
``queue`` and ``database``. Receivers run on the handler's thread (for an ``async def``
handler, through ``sync_to_async`` unless they are ``async def`` themselves) and add to
the task's time: keep them short; an exception in a receiver is logged and does not
affect the task. Nothing is paid while it has no receivers.

``task_settled`` is sent by the settler after an outcome has been written (and only
then): ``sender`` is the TaskDefinition, with keyword arguments ``task_id``,
``attempt``, ``outcome`` (success, failure, timeout, cancelled, continued, snoozed,
released), ``state`` (the row's new state), ``written`` (False when the fence
matched nothing: the outcome was lost), ``queue``, ``database`` (the alias of the
task's table: task ids are per database), ``runtime`` (seconds the attempt
ran: the handler's own time for a success, else from the claim to the outcome) and
``queue_wait`` (seconds the task was due before it was claimed, by the database's
clock; worker/metrics_server.py builds its histograms from these). Receivers run on
the settler thread: keep them short; an exception in a receiver is logged and does not
affect the task.

``tasks_imported`` is sent once per process by the app's ``AppConfig.ready()``, right
after it has imported every task module (each installed app's ``tasks``, and
``PGQUEUE['TASK_MODULES']``), before a worker builds its routes: ``sender`` is the
AppConfig. A receiver may import more task modules or declare schedules, which a
worker started in this process then has (django_pgqueue.celery finalizes its apps
there).
"""

from django.dispatch import Signal

task_settled = Signal()
task_started = Signal()
tasks_imported = Signal()
