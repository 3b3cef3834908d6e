"""Signals sent by the worker.

``task_settled`` is sent by the settler after an outcome has been written (and only
then): ``sender`` is the TaskDefinition, with keyword arguments ``task_id``,
``attempt``, ``outcome`` (success, failure, timeout, cancelled, continued, snoozed,
released), ``state`` (the row's new state) and ``written`` (False when the fence
matched nothing: the outcome was lost). Receivers run on the settler thread: keep them
short; an exception in a receiver is logged and does not affect the task.
"""

from django.dispatch import Signal

task_settled = Signal()
