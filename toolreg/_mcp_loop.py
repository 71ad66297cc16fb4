"""Event-loop plumbing of the MCP bridge: admission slots, the progress pump, the canceller.

The bridge's handlers run on one asyncio event loop; these helpers keep user code off it
(`OFF_LOOP` runs token cancellations, whose callbacks are user code, on a daemon thread) and
keep per-request work bounded and ordered (`Admission`, `ProgressPump`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from mcp.server.context import ServerRequestContext

from ._progress import ToolProgress

__all__ = ["OFF_LOOP", "Admission", "ProgressPump"]

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


class _OffLoop:
    """A daemon thread that runs cancellations handed over from event loops, in order.

    Started by the first `Bridge` (outside any hot path); after `fork()` the child starts a new
    one on first use. A job that raises is logged and the thread carries on.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _thread and _pid (start is idempotent)
        self._jobs: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def start(self) -> None:
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                return
            self._jobs = queue.SimpleQueue()
            thread = threading.Thread(
                target=self._serve, args=(self._jobs,), name="toolreg-mcp-canceller", daemon=True
            )
            thread.start()
            self._thread, self._pid = thread, os.getpid()

    def call_soon(self, job: Callable[[], object]) -> None:
        """Run `job()` on the thread; never blocks (but starts the thread after a fork)."""
        if self._pid != os.getpid():
            self.start()
        self._jobs.put(job)

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[Callable[[], object]]) -> None:
        while True:
            job = jobs.get()
            try:
                job()
            except BaseException:  # the thread must survive anything a callback does
                logger.exception("toolreg: cancelling an MCP call raised")


OFF_LOOP = _OffLoop()
