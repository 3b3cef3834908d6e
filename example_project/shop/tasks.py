"""The example site's tasks. Imported automatically: this is an installed app's tasks.py."""

import time

from django.utils import timezone

from django_pgqueue import Retry, TaskContext, periodic, task

from .models import Order


@task(queue="emails", priority=10, max_attempts=5, timeout=60)
def send_receipt(order_id: int) -> str:
    """Idempotent: a second run finds receipt_sent_at set and does nothing."""
    updated = Order.objects.filter(pk=order_id, receipt_sent_at__isnull=True).update(
        receipt_sent_at=timezone.now()
    )
    return "sent" if updated else "already sent"


@task(takes_context=True, backoff={"base": 0.2, "factor": 2, "cap": 1, "jitter": 0})
def flaky_sync(context: TaskContext, order_id: int) -> str:
    """Fails on its first attempt, to show a retry with backoff."""
    if context.attempt == 1:
        raise Retry(delay=0.2, reason="upstream inventory API timed out (demo)")
    return f"inventory synced for order {order_id} on attempt {context.attempt}"


@task(takes_context=True)
def rebuild_report(context: TaskContext, days: int) -> dict:
    """Sliced work with progress reports."""
    done = (context.checkpoint or {}).get("done", 0)
    for day in range(done, days):
        time.sleep(0.01)
        context.report_progress({"day": day + 1, "of": days})
    return {"days": days, "attempt": context.attempt}


@task(queue="emails")
def send_newsletter(subscriber: int) -> str:
    """On the rate-limited "emails" queue (settings.PGQUEUE["QUEUE_LIMITS"]): the email
    provider allows a few sends per second, across every worker."""
    return f"newsletter sent to subscriber {subscriber}"


@task
def render_invoice_page(order_id: int, page: int) -> dict:
    """One page of an order's invoice. The pages of an invoice render side by side: the
    members of a chord (docs/workflows.md), enqueued with bundle_invoice as its callback."""
    time.sleep(0.1)  # the PDF engine at work
    return {"page": page, "file": f"invoice-{order_id}-page-{page}.pdf"}


@task(takes_context=True)
def bundle_invoice(context: TaskContext, order_id: int) -> str:
    """The chord's callback: runs once, after every page has rendered, and reads the
    pages' results (it gets them from the database, not as arguments)."""
    pages = sorted(
        (parent["result"] for parent in context.parent_results().values()),
        key=lambda result: result["page"],
    )
    return f"invoice-{order_id}.pdf from {', '.join(page['file'] for page in pages)}"


@periodic(every=1)
@task
def tick_clock() -> str:
    """A periodic task: enqueued once per second across the whole fleet (docs/periodic.md)."""
    return f"tick at {timezone.now():%H:%M:%S}"
