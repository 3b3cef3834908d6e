"""The async workloads' tasks (W10, and python -m benchmarks.connections), in their own
module: only the workers of those workloads load it, so the other workloads' workers
run no event loop and claim in one lane, as users with only sync tasks do."""

import asyncio

from asgiref.sync import sync_to_async
from django.db import connection

from django_pgqueue import task


@task
async def sleep_async(seconds: float) -> None:
    await asyncio.sleep(seconds)


def _select_one() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


@task
async def query_then_sleep_async(seconds: float) -> None:
    """One query through ``sync_to_async`` (as an async handler reaches the ORM), then
    ``seconds`` awaited away from the database (python -m benchmarks.connections)."""
    await sync_to_async(_select_one)()
    await asyncio.sleep(seconds)
