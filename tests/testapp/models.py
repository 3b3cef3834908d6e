from django.db import models


class Run(models.Model):
    """One execution of a test task, written by the handler itself."""

    task_id = models.BigIntegerField()
    attempt = models.IntegerField()
    label = models.CharField(max_length=100, blank=True)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["id"]


class Effect(models.Model):
    """One effect of a test task's handler, written in the task's database: an atomic
    task's commit keeps it or rolls it back with the attempt (tests/atomic_tasks.py).
    No unique constraint: the tests count them."""

    task_id = models.BigIntegerField()
    attempt = models.IntegerField()
    token = models.CharField(max_length=36)
    label = models.CharField(max_length=100, blank=True)
    pid = models.IntegerField()

    class Meta:
        ordering = ["id"]
