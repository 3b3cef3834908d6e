"""The event loop that ``async def`` handlers run on: one loop, on its own thread."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from django_pgqueue.worker.logging import current_lease


class AsyncRunner:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="pgqueue-asyncio", daemon=True
        )
        self._thread.start()

    def run(self, coro: Any, timeout: float | None) -> Any:
        lease = current_lease.get()  # the caller's execution, for the handler's log lines

        async def bounded() -> Any:
            current_lease.set(lease)
            # Async handlers reach the ORM through sync_to_async, whose connections
            # live in asgiref's thread: recycle those like a request would.
            await sync_to_async(close_old_connections)()
            try:
                if timeout is None:
                    return await coro
                return await asyncio.wait_for(coro, timeout)
            finally:
                await sync_to_async(close_old_connections)()

        return asyncio.run_coroutine_threadsafe(bounded(), self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
