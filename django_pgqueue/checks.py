"""``manage.py check`` messages for misconfiguration."""

from __future__ import annotations

from django.core.checks import Error, Tags, Warning, register
from django.db import connections

from django_pgqueue.conf import get_settings, unknown_keys


@register(Tags.compatibility)
def check_settings(app_configs, **kwargs):
    messages = []
    for key in unknown_keys():
        messages.append(
            Warning(
                f"PGQUEUE[{key!r}] is not a django_pgqueue setting and is ignored",
                hint="See docs/settings.md for the valid keys.",
                id="django_pgqueue.W001",
            )
        )
    conf = get_settings()
    if conf.DATABASE not in connections.databases:
        messages.append(
            Error(
                f"PGQUEUE['DATABASE'] is {conf.DATABASE!r}, which is not in DATABASES",
                id="django_pgqueue.E001",
            )
        )
    elif "postgresql" not in connections.databases[conf.DATABASE]["ENGINE"]:
        messages.append(
            Error(
                f"the task database {conf.DATABASE!r} is not PostgreSQL; django_pgqueue needs "
                "PostgreSQL (SKIP LOCKED, LISTEN/NOTIFY, jsonb)",
                id="django_pgqueue.E002",
            )
        )
    if conf.HEARTBEAT_SECONDS * 2 > conf.LEASE_SECONDS:
        messages.append(
            Warning(
                f"HEARTBEAT_SECONDS ({conf.HEARTBEAT_SECONDS:g}) is more than half of "
                f"LEASE_SECONDS ({conf.LEASE_SECONDS:g}): one late heartbeat loses the lease",
                hint="Keep the heartbeat at a third of the lease or less.",
                id="django_pgqueue.W002",
            )
        )
    if conf.CONCURRENCY < 1:
        messages.append(
            Error("PGQUEUE['CONCURRENCY'] must be at least 1", id="django_pgqueue.E003")
        )
    return messages
