"""Event-loop plumbing of the MCP bridge: the progress pump.

The bridge's handlers run on one asyncio event loop; `ProgressPump` keeps a request's progress
notifications ordered and coalesced (admission is an `anyio.Semaphore`, see `Bridge`). Token
cancellations, whose callbacks are user code, run on toolreg's helper threads
(`_helper.HELPER`), never on the loop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from mcp.server.context import ServerRequestContext

from .._progress import ToolProgress
from .._text import escape_surrogates

__all__ = ["ProgressPump"]

logger = logging.getLogger("toolreg")


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
                message = None if update.message is None else escape_surrogates(update.message)
                await ctx.session.report_progress(update.progress, update.total, message)
            except Exception:  # progress is best effort: it must never fail the call
                logger.exception("toolreg: sending MCP progress failed; no more is sent")
                return
