"""The project's tasks, written as Celery's documentation writes them."""

import time

from django_pgqueue.celery import shared_task  # was: from celery import shared_task
from django_pgqueue.celery.exceptions import (  # was: from celery.exceptions import ...
    MaxRetriesExceededError,
)
from tests.celery_project.shop.services import RequestException, Twitter, fetch, released


@shared_task
def add(x, y):
    return x + y


@shared_task
def mul(x, y):
    return x * y


@shared_task
def xsum(numbers):
    return sum(numbers)


@shared_task
def fail(message):
    raise ValueError(message)


@shared_task
def report():
    return "report"


@shared_task
def send_welcome_email(user_id):
    return f"welcome {user_id}"


@shared_task(bind=True)
def dump_context(self, x, y, *, z=None):
    return {
        "id": self.request.id,
        "retries": self.request.retries,
        "args": list(self.request.args),
        "kwargs": self.request.kwargs,
        "routing_key": self.request.delivery_info["routing_key"],
        "headers": self.request.headers,
        "is_eager": self.request.is_eager,
    }


@shared_task(bind=True, default_retry_delay=0.1, max_retries=3)
def send_twitter_status(self, oauth, tweet):
    try:
        twitter = Twitter(oauth)
        return twitter.update_status(tweet)
    except (Twitter.FailWhaleError, Twitter.LoginError) as exc:
        raise self.retry(exc=exc)  # noqa: B904 - as Celery's documentation writes it


@shared_task(bind=True, max_retries=1)
def give_up_politely(self, oauth, tweet):
    try:
        return Twitter(oauth).update_status(tweet)
    except Twitter.FailWhaleError:
        try:
            raise self.retry(countdown=0.1) from None
        except MaxRetriesExceededError:
            return "gave up"


@shared_task(bind=True, max_retries=1)
def retry_without_exc(self, oauth, tweet):
    try:
        return Twitter(oauth).update_status(tweet)
    except Twitter.FailWhaleError:
        raise self.retry(countdown=0.1) from None


@shared_task(
    autoretry_for=(RequestException,),
    retry_backoff=True,
    retry_backoff_max=1,
    retry_kwargs={"max_retries": 5},
)
def refresh_timeline(url, fail=0):
    return fetch(url, fail=fail)


@shared_task(autoretry_for=(OSError,), dont_autoretry_for=(FileNotFoundError,), max_retries=3)
def read_feed(path):
    raise FileNotFoundError(path)


@shared_task(ignore_result=True)
def fire_and_forget(x):
    return x


@shared_task(bind=True)
def long_report(self, steps, release_label):
    """Publishes its progress (a custom state), then waits until the test releases it."""
    for step in range(steps):
        if not self.request.called_directly:
            self.update_state(state="PROGRESS", meta={"current": step + 1, "total": steps})
    deadline = time.monotonic() + 60
    while not released(release_label) and time.monotonic() < deadline:
        time.sleep(0.05)
    return "done"


@shared_task(rate_limit="10/m")
def throttled(x):
    return x


@shared_task(time_limit=30, soft_time_limit=20, acks_late=True, reject_on_worker_lost=True)
def bounded(x):
    return x


@shared_task
def on_error(request, exc, traceback):
    return {"task": request.id, "exc": f"{type(exc).__name__}: {exc}", "traceback": bool(traceback)}


@shared_task
def on_error_old_style(task_id):
    return {"task": task_id}
