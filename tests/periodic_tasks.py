"""Tasks and schedules of tests/test_periodic.py. Worker subprocesses import this module
(TASK_MODULES), and so does the test process.

A schedule fires in every worker that declares it, so none is declared unless the
environment asks: PGQUEUE_TEST_SCHEDULES names the schedules of SCHEDULES to declare,
comma-separated. tests/test_periodic.py passes it to the workers it starts; every other
worker (and the test process) declares none.
"""

import os

from django_pgqueue import periodic, task


@task
def beat(label: str = "") -> str:
    return label


@task(queue="other")
def beat_elsewhere() -> None:
    """A task of a queue the default workers do not serve."""


SCHEDULES = {
    "every_second": lambda: periodic(beat, every=1, name="every_second", args=["tick"]),
    "to_remove": lambda: periodic(beat, every=1, name="to_remove"),
    "minutely": lambda: periodic(beat, cron="* * * * *", name="minutely"),
    "other_queue": lambda: periodic(beat_elsewhere, every=1, name="other_queue"),
}

for _name in filter(None, os.environ.get("PGQUEUE_TEST_SCHEDULES", "").split(",")):
    SCHEDULES[_name]()
