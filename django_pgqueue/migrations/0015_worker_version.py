"""The release each worker runs: a nullable column on ``pgqueue_worker``, written when a
worker registers, read by the queue doctor (versions of the fleet, docs/operations.md).

A nullable column without a default changes only the catalog. Workers of the previous
release register without it (NULL: an older release).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0014_errors_dropped"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="version",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
    ]
