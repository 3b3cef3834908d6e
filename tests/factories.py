"""factory-boy factories for task rows (for tests that need rows a worker did not make)."""

import factory
from django.utils import timezone

from django_pgqueue.models import Task


class TaskFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Task

    queue = "default"
    task_name = "tests.tasks.noop"
    handler_version = 1
    priority = 0
    # A row due later is "scheduled", as enqueue would write it.
    state = factory.LazyAttribute(lambda o: "scheduled" if o.run_at > timezone.now() else "pending")
    args = factory.LazyFunction(list)
    kwargs = factory.LazyFunction(dict)
    run_at = factory.LazyFunction(timezone.now)
    max_attempts = 3
    retry_policy = factory.LazyFunction(
        lambda: {"base": 0.05, "factor": 2.0, "cap": 0.2, "jitter": 0.0}
    )
