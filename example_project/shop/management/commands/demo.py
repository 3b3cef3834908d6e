"""``manage.py demo``: migrate, enqueue a handful of tasks, run a worker until they are
done, and print what happened. The README's first command."""

import itertools
import threading
import time

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from django_pgqueue.models import TERMINAL_STATES, Task
from django_pgqueue.tasking.workflows import chord
from django_pgqueue.worker.worker import Worker, WorkerOptions
from example_project.shop.models import Order
from example_project.shop.tasks import (
    bundle_invoice,
    flaky_sync,
    rebuild_report,
    render_invoice_page,
    send_newsletter,
    send_receipt,
    tick_clock,
)


class Command(BaseCommand):
    help = "Run the django_pgqueue demo end to end."

    def handle(self, *args, **options):
        call_command("migrate", verbosity=0)
        # The admin's static files, for runserver or gunicorn with DEBUG=False (WhiteNoise).
        call_command("collectstatic", interactive=False, verbosity=0)
        self.stdout.write("migrated the database and collected the static files")

        ids = []
        for n in range(3):
            with transaction.atomic():
                order = Order.objects.create(
                    customer_email=f"c{n}@example.com", total_cents=1000 + n
                )
                ids.append(send_receipt.enqueue(order.id))
                ids.append(flaky_sync.enqueue(order.id))
                if n == 0:
                    # Three pages side by side, then one bundle once they are all done.
                    pages, bundle = chord(
                        [render_invoice_page.step(order.id, page) for page in (1, 2, 3)],
                        bundle_invoice.step(order.id),
                    )
                    ids.extend([*pages, bundle])
        ids.append(rebuild_report.using(priority=5).enqueue(days=5))
        newsletters = send_newsletter.enqueue_many(range(1, 9))
        ids.extend(newsletters)
        try:
            with transaction.atomic():
                order = Order.objects.create(customer_email="rollback@example.com", total_cents=1)
                send_receipt.enqueue(order.id)
                raise RuntimeError("simulated failure after enqueue")
        except RuntimeError:
            pass
        self.stdout.write(
            f"enqueued {len(ids)} tasks {ids}; one more enqueue was rolled back "
            "with its order and left no task"
        )

        worker = Worker(WorkerOptions.from_settings(queues=["default", "emails"]))
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        thread.start()
        started = time.monotonic()
        deadline = started + 60
        ticks = Task.objects.filter(task_name=tick_clock.name, state="succeeded")
        ticks_before = ticks.count()
        try:
            while (
                Task.objects.filter(pk__in=ids).exclude(state__in=TERMINAL_STATES).exists()
                or ticks.count() < ticks_before + 2
            ):
                if time.monotonic() > deadline:
                    raise CommandError("the demo tasks did not finish within 60 s")
                time.sleep(0.05)
        finally:
            worker.stop()
            thread.join()

        self.stdout.write("\n  id  task                 state       attempts  result or last error")
        for row in Task.objects.filter(pk__in=ids).order_by("pk"):
            if row.state == "succeeded":
                outcome = row.result
            else:
                outcome = (row.errors or [{}])[-1].get("message")
            self.stdout.write(
                f"{row.pk:>4}  {row.task_name.rsplit('.', 1)[-1]:<20} "
                f"{row.state:<11} {row.attempt:>8}  {outcome}"
            )
        sends = list(
            Task.objects.filter(pk__in=newsletters).order_by("started_at")
            .values_list("started_at", flat=True)
        )  # fmt: skip
        gaps = ", ".join(f"{(b - a).total_seconds():.2f}" for a, b in itertools.pairwise(sends))
        self.stdout.write(
            f"\n{len(sends)} newsletters on the rate-limited 'emails' queue (4/s) started "
            f"{gaps} s apart"
        )
        rendered = Task.objects.filter(pk__in=pages)
        starts = [row.started_at for row in rendered]
        last_page = max(row.finished_at for row in rendered)
        bundled = Task.objects.get(pk=bundle)
        self.stdout.write(
            f"the invoice's {len(pages)} pages rendered side by side (their starts "
            f"{(max(starts) - min(starts)).total_seconds() * 1000:.0f} ms apart), then "
            f"bundle_invoice ran once, "
            f"{(bundled.started_at - last_page).total_seconds() * 1000:.0f} ms after the "
            "last page ended"
        )
        recent = ticks.order_by("-id")[: ticks.count() - ticks_before]
        self.stdout.write(
            f"the periodic task {tick_clock.name} (every second) ran "
            f"{len(recent)} times: {', '.join(str(t.result) for t in reversed(recent))}"
        )
        rows = list(Task.objects.filter(pk__in=ids))
        done = sum(1 for row in rows if row.state == "succeeded")
        retried = sum(1 for row in rows if row.errors)
        receipts = Order.objects.filter(receipt_sent_at__isnull=False).count()
        self.stdout.write(
            f"\n{done}/{len(ids)} tasks succeeded, {retried} after a retry; "
            f"{receipts} receipts sent in total"
        )
