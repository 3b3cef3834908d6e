"""The async workload's task (W10), in its own module: only the W10 worker loads it, so
the other workloads' workers run no event loop and claim in one lane, as users with
only sync tasks do."""

import asyncio

from django_pgqueue import task


@task
async def sleep_async(seconds: float) -> None:
    await asyncio.sleep(seconds)
