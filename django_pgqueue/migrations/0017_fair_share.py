"""Fair share by key (docs/tenants.md): two columns and two indexes on ``pgqueue_task``,
and the table of weights set at runtime.

* ``fair_key``: the key of a fair task's flow; ``fair_tag``: its place in the flow (its
  virtual start time). Nullable columns without a default change only the catalog: no
  rewrite of the task table.
* ``pgqueue_task_fair`` (the claim of a fair route) and ``pgqueue_task_fair_flow`` (the
  last place of a flow) hold pending rows with a fair key only: an enqueue of any other
  task writes nothing more. They are built CONCURRENTLY (this migration cannot run in a
  transaction), so enqueues and claims go on while they build.
* ``pgqueue_fair_weight``: one row per key or key prefix with a weight set at runtime.

Workers of the previous release never read the new columns: they claim fair tasks in
plain priority order (docs/tenants.md, "Upgrading").
"""

import django.db.models.functions.datetime
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

FAIR = models.Q(("fair_key__isnull", False), ("state", "pending"))


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_pgqueue", "0016_decrypt_permission"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="fair_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="fair_tag",
            field=models.FloatField(blank=True, null=True),
        ),
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                models.F("queue"),
                models.F("task_name"),
                models.F("handler_version"),
                models.OrderBy(models.F("priority"), descending=True),
                models.OrderBy(models.F("fair_tag"), nulls_first=True),
                models.F("id"),
                condition=FAIR,
                name="pgqueue_task_fair",
            ),
        ),
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                fields=["queue", "task_name", "handler_version", "fair_key", "priority",
                        "fair_tag"],
                condition=FAIR,
                name="pgqueue_task_fair_flow",
            ),
        ),
        migrations.CreateModel(
            name="FairWeight",
            fields=[
                ("key", models.CharField(max_length=256, primary_key=True, serialize=False)),
                ("weight", models.FloatField()),
                (
                    "set_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "db_table": "pgqueue_fair_weight",
                "ordering": ["key"],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("weight__gt", 0), ("weight__lte", 1000000)),
                        name="pgqueue_fair_weight_range",
                    )
                ],
            },
        ),
    ]
