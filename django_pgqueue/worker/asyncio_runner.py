"""The event loop that ``async def`` handlers run on: one loop, on its own thread."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class AsyncRunner:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="pgqueue-asyncio", daemon=True
        )
        self._thread.start()

    def result(self, coro: Any) -> Any:
        """Run ``coro`` on the loop and wait for its result, from another thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
