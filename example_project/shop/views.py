from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from .models import Order
from .tasks import flaky_sync, send_receipt


@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """The order and its receipt task commit together, or not at all."""
    with transaction.atomic():
        order = Order.objects.create(
            customer_email=request.POST.get("email", "customer@example.com"),
            total_cents=int(request.POST.get("total_cents", 1999)),
        )
        receipt_task = send_receipt.enqueue(order.id)
        sync_task = flaky_sync.enqueue(order.id)
    return JsonResponse({"order": order.id, "tasks": [receipt_task, sync_task]})
