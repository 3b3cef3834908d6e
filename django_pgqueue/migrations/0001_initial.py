
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='Worker',
            fields=[
                ('id', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('hostname', models.CharField(max_length=255)),
                ('pid', models.IntegerField()),
                ('queues', models.JSONField(default=list)),
                ('routes', models.JSONField(default=list, help_text='[[task_name, handler_version], ...]')),
                ('concurrency', models.IntegerField()),
                ('in_flight', models.IntegerField(db_default=0)),
                ('started_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('last_heartbeat_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'db_table': 'pgqueue_worker',
                'ordering': ['hostname', 'pid'],
            },
        ),
        migrations.CreateModel(
            name='Task',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('queue', models.CharField(db_default='default', max_length=100)),
                ('task_name', models.CharField(max_length=255)),
                ('handler_version', models.IntegerField(db_default=1)),
                ('priority', models.SmallIntegerField(db_default=0)),
                ('state', models.CharField(choices=[('pending', 'pending'), ('running', 'running'), ('waiting', 'waiting'), ('succeeded', 'succeeded'), ('failed', 'failed'), ('cancelled', 'cancelled')], db_default='pending', max_length=16)),
                ('args', models.JSONField(db_default=models.Value([], models.JSONField()))),
                ('kwargs', models.JSONField(db_default=models.Value({}, models.JSONField()))),
                ('run_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('enqueued_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('last_attempted_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('attempt', models.IntegerField(db_default=0)),
                ('max_attempts', models.IntegerField(db_default=3)),
                ('retry_policy', models.JSONField(db_default=models.Value({}, models.JSONField()))),
                ('timeout', models.DurationField(blank=True, null=True)),
                ('lease_token', models.UUIDField(blank=True, null=True)),
                ('lease_expires_at', models.DateTimeField(blank=True, null=True)),
                ('worker_id', models.CharField(blank=True, max_length=64, null=True)),
                ('result', models.JSONField(blank=True, null=True)),
                ('errors', models.JSONField(db_default=models.Value([], models.JSONField()))),
                ('unique_key', models.CharField(blank=True, max_length=255, null=True)),
                ('checkpoint', models.JSONField(blank=True, null=True)),
                ('progress', models.JSONField(blank=True, null=True)),
                ('cancel_requested', models.BooleanField(db_default=False)),
                ('metadata', models.JSONField(db_default=models.Value({}, models.JSONField()))),
            ],
            options={
                'db_table': 'pgqueue_task',
                'ordering': ['-id'],
                'indexes': [models.Index(models.F('queue'), models.OrderBy(models.F('priority'), descending=True), models.F('run_at'), models.F('id'), condition=models.Q(('state', 'pending')), name='pgqueue_task_claim'), models.Index(condition=models.Q(('state', 'pending')), fields=['queue', 'run_at', 'id'], name='pgqueue_task_due'), models.Index(condition=models.Q(('state', 'running')), fields=['lease_expires_at'], name='pgqueue_task_lease'), models.Index(condition=models.Q(('state__in', ['succeeded', 'failed', 'cancelled'])), fields=['state', 'finished_at'], name='pgqueue_task_retention')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('unique_key__isnull', False), ('state__in', ['pending', 'running', 'waiting'])), fields=('unique_key',), name='pgqueue_task_unique_live'), models.CheckConstraint(condition=models.Q(('state__in', ['pending', 'running', 'waiting', 'succeeded', 'failed', 'cancelled'])), name='pgqueue_task_state_valid'), models.CheckConstraint(condition=models.Q(('priority__gte', -100), ('priority__lte', 100)), name='pgqueue_task_priority_range'), models.CheckConstraint(condition=models.Q(('max_attempts__gte', 1)), name='pgqueue_task_max_attempts_positive')],
            },
        ),
        migrations.RunSQL(
            # The task table is a queue: every row is inserted, updated twice and
            # deleted within a day. Vacuum it by row count, not by a fraction of its
            # size, and at full speed, so dead tuples never pile up in the claim index;
            # leave room in each page for HOT updates (heartbeats, progress).
            sql="""
                ALTER TABLE pgqueue_task SET (
                    fillfactor = 85,
                    autovacuum_vacuum_scale_factor = 0.0,
                    autovacuum_vacuum_threshold = 5000,
                    autovacuum_vacuum_insert_scale_factor = 0.0,
                    autovacuum_vacuum_insert_threshold = 20000,
                    autovacuum_analyze_scale_factor = 0.0,
                    autovacuum_analyze_threshold = 5000,
                    autovacuum_vacuum_cost_delay = 0
                );
            """,
            reverse_sql="ALTER TABLE pgqueue_task RESET (fillfactor, autovacuum_vacuum_scale_factor, "
            "autovacuum_vacuum_threshold, autovacuum_vacuum_insert_scale_factor, "
            "autovacuum_vacuum_insert_threshold, autovacuum_analyze_scale_factor, "
            "autovacuum_analyze_threshold, autovacuum_vacuum_cost_delay);",
        ),
    ]
