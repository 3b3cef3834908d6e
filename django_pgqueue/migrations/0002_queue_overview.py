from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY: a deployed queue keeps taking writes while the index
    # is built (it cannot run inside a transaction).
    atomic = False

    dependencies = [
        ('django_pgqueue', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='QueueOverview',
            fields=[
            ],
            options={
                'verbose_name': 'queue overview',
                'verbose_name_plural': 'queue overview',
                'proxy': True,
                'default_permissions': (),
                'indexes': [],
                'constraints': [],
            },
            bases=('django_pgqueue.task',),
        ),
        AddIndexConcurrently(
            model_name='task',
            index=models.Index(condition=models.Q(('state', 'waiting')), fields=['queue', 'task_name'], name='pgqueue_task_waiting'),
        ),
    ]
