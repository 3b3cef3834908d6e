from django.db import models


class Order(models.Model):
    customer_email = models.EmailField()
    total_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    receipt_sent_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"order {self.pk} for {self.customer_email}"
