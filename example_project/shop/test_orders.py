"""The shop's own tests, written with django_pgqueue.testing (docs/testing.md).

Run them with the example's settings (the repository's ``python -m pytest`` runs them
too, through tests/test_example_project.py)::

    DATABASE_URL=postgres://... python -m pytest example_project --ds example_project.settings

or, for the TestCase classes only, ``python manage.py test example_project``.
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError
from django.test import TestCase
from django.urls import reverse

from django_pgqueue.testing import assert_enqueued, refute_enqueued, run_tasks

from .models import Order
from .tasks import flaky_sync, send_receipt


def place_order(client, **data) -> int:
    response = client.post(reverse("place-order"), {"email": "ann@example.com", **data})
    assert response.status_code == 200
    return response.json()["order"]


# -- with pytest and the pgqueue fixture -----------------------------------------------
def test_an_order_enqueues_its_receipt_and_inventory_sync(client, pgqueue) -> None:
    order_id = place_order(client, total_cents=2500)
    pgqueue.assert_enqueued(send_receipt, args=[order_id], queue="emails")
    pgqueue.assert_enqueued(flaky_sync, args=[order_id], queue="default")


def test_the_receipt_is_sent_when_the_emails_queue_runs(client, pgqueue) -> None:
    order_id = place_order(client)
    result = pgqueue.run_tasks(queues="emails")
    assert result.counts == {"success": 1}
    assert Order.objects.get(pk=order_id).receipt_sent_at is not None
    pgqueue.assert_enqueued(flaky_sync, args=[order_id])  # "default" did not run


def test_the_inventory_sync_succeeds_on_its_retry(client, pgqueue) -> None:
    order_id = place_order(client)
    result = pgqueue.drain(queues="default")  # retries included
    assert [(run.attempt, run.outcome, run.state) for run in result.runs] == [
        (1, "failure", "scheduled"),
        (2, "success", "succeeded"),
    ]
    assert result.runs[-1].result == f"inventory synced for order {order_id} on attempt 2"


def test_an_order_that_fails_to_save_enqueues_nothing(client, pgqueue) -> None:
    # The order and its tasks are one transaction: a negative total breaks the order's
    # CHECK constraint, and its tasks roll back with it.
    with pytest.raises(IntegrityError):
        client.post(reverse("place-order"), {"total_cents": -1})
    pgqueue.refute_enqueued(send_receipt)
    assert pgqueue.enqueued() == []


# -- with Django's TestCase and the plain functions ------------------------------------
class PlaceOrderTests(TestCase):
    def test_the_receipt_is_sent_once(self) -> None:
        order_id = place_order(self.client)
        assert_enqueued(send_receipt, args=[order_id])
        run_tasks(queues="emails")
        refute_enqueued(send_receipt)
        sent_at = Order.objects.get(pk=order_id).receipt_sent_at
        self.assertIsNotNone(sent_at)
        # Sending it again (a retry, a duplicate) changes nothing: the task is idempotent.
        send_receipt.enqueue(order_id)
        result = run_tasks(queues="emails")
        self.assertEqual(result.runs[0].result, "already sent")
        self.assertEqual(Order.objects.get(pk=order_id).receipt_sent_at, sent_at)
