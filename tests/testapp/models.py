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
