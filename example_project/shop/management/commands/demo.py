"""``manage.py demo``: migrate, enqueue a handful of tasks, run a worker until they are
done, and print what happened. The README's first command."""

import threading
import time

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from django_pgqueue.models import TERMINAL_STATES, Task
from django_pgqueue.worker.worker import Worker, WorkerOptions
from example_project.shop.models import Order
from example_project.shop.tasks import flaky_sync, rebuild_report, send_receipt


class Command(BaseCommand):
    help = "Run the django_pgqueue demo end to end."

    def handle(self, *args, **options):
        call_command("migrate", verbosity=0)
        self.stdout.write("migrated the database")

        ids = []
        for n in range(3):
            with transaction.atomic():
                order = Order.objects.create(
                    customer_email=f"c{n}@example.com", total_cents=1000 + n
                )
                ids.append(send_receipt.enqueue(order.id))
                ids.append(flaky_sync.enqueue(order.id))
        ids.append(rebuild_report.using(priority=5).enqueue(days=5))
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
        deadline = time.monotonic() + 60
        try:
            while Task.objects.filter(pk__in=ids).exclude(state__in=TERMINAL_STATES).exists():
                if time.monotonic() > deadline:
                    raise CommandError("the demo tasks did not finish within 60 s")
                time.sleep(0.05)
        finally:
            worker.stop()
            thread.join()

        self.stdout.write("\n  id  task             state       attempts  result or last error")
        for row in Task.objects.filter(pk__in=ids).order_by("pk"):
            if row.state == "succeeded":
                outcome = row.result
            else:
                outcome = (row.errors or [{}])[-1].get("message")
            self.stdout.write(
                f"{row.pk:>4}  {row.task_name.rsplit('.', 1)[-1]:<16} "
                f"{row.state:<11} {row.attempt:>8}  {outcome}"
            )
        rows = list(Task.objects.filter(pk__in=ids))
        done = sum(1 for row in rows if row.state == "succeeded")
        retried = sum(1 for row in rows if row.errors)
        receipts = Order.objects.filter(receipt_sent_at__isnull=False).count()
        self.stdout.write(
            f"\n{done}/{len(ids)} tasks succeeded, {retried} after a retry; "
            f"{receipts} receipts sent in total"
        )
