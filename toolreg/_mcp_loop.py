"""Event-loop plumbing of the MCP bridge: admission slots and the progress pump.

The bridge's handlers run on one asyncio event loop; these helpers keep per-request work
bounded and ordered (`Admission`, `ProgressPump`). Token cancellations, whose callbacks are user
code, run on toolreg's helper threads (`_helper.HELPER`), never on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from mcp.server.context import ServerRequestContext

from ._progress import ToolProgress

__all__ = ["Admission", "ProgressPump"]

logger = logging.getLogger("toolreg")


class Admission:
    """`max_concurrent_calls` slots, handed over first come, first served (event loop only)."""

    __slots__ = ("_free", "_waiting")

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    def try_acquire(self) -> bool:
        """Take a free slot without waiting, unless others are already waiting."""
        if self._free and not self._waiting:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> None:
        """Wait for a slot; a cancelled waiter holds none (a slot handed to it is passed on)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed over just as it was cancelled: pass it on
            else:
                self._waiting.remove(waiter)
            raise

    def release(self) -> None:
        """Give the slot to the longest waiter, or free it."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class ProgressPump:
    """Relays a call's progress to `notifications/progress`, coalesced to the latest update.

    `__call__` runs on the event loop (the facade schedules it there) and wakes the pump, a
    task of its own that sends one update at a time. `close()` cancels that task: the handler
    closes it before it answers and as soon as the request is cancelled, so nothing is sent
    after either.
    """

    __slots__ = ("_closed", "_latest", "_task", "_wake")

    def __init__(self, ctx: ServerRequestContext[Any]) -> None:
        self._latest: ToolProgress | None = None
        self._wake = asyncio.Event()
        self._closed = False
        self._task = asyncio.get_running_loop().create_task(self._pump(ctx))

    def __call__(self, update: ToolProgress) -> None:
        if not self._closed:
            self._latest = update
            self._wake.set()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._task.cancel()

    async def _pump(self, ctx: ServerRequestContext[Any]) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            update, self._latest = self._latest, None
            if update is None:
                continue
            try:
                await ctx.session.report_progress(update.progress, update.total, update.message)
            except Exception:  # progress is best effort: it must never fail the call
                logger.exception("toolreg: sending MCP progress failed; no more is sent")
                return
