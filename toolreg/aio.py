"""The asyncio facade: `AsyncToolRegistry(registry)` with the sync registry's semantics.

`await areg.execute(...)` costs one thread hop: the call's whole pipeline (hooks, approval,
guards, wrappers, the body, post hooks, observers) runs on one worker of the registry's pool,
with the body inline on that worker, so nothing runs on the event loop and nothing waits for a
second worker (no deadlock however many calls are in flight, nested calls included). The result
comes back through `loop.call_soon_threadsafe`.

Cancelling the awaiting task cancels the call's token (never the caller's), waits until the call
has settled (its body joined, its observers notified), then raises `asyncio.CancelledError`.
The facade never swallows or converts a cancellation, so `Task.cancelling()` and `uncancel()`
stay balanced and `asyncio.timeout()` / `asyncio.wait_for()` around `execute` work. Under anyio
(Starlette, FastAPI, MCP servers), which re-delivers cancellation at every await in a cancelled
scope, the wait for settlement runs inside a shielded anyio scope, so it sleeps instead of
spinning while an uncooperative body drains.

Example::

    async with AsyncToolRegistry(registry) as areg:
        result = await areg.execute("search", {"q": "x"})
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._batch import Progress
from ._cancel import CancelSource, CancelToken
from ._registry import ToolRegistry, _as_call, _as_token
from ._results import ToolCall, ToolResult

__all__ = ["AsyncToolRegistry"]


class AsyncToolRegistry:
    """Async access to a `ToolRegistry`: same arguments, same results, same guarantees."""

    def __init__(self, registry: ToolRegistry) -> None:
        if not isinstance(registry, ToolRegistry):
            raise TypeError(
                f"AsyncToolRegistry wraps a ToolRegistry, got {type(registry).__name__}"
            )
        self._registry = registry
        self._lock = threading.Lock()  # guards _schedulers
        self._schedulers: ThreadPoolExecutor | None = None  # batch schedulers: off the body pool

    @property
    def registry(self) -> ToolRegistry:
        """The wrapped sync registry."""
        return self._registry

    async def execute(
        self,
        call_or_name: ToolCall | str,
        arguments: Mapping[str, Any] | None = None,
        *,
        token: CancelToken | None = None,
        start_if_cancelled: bool = True,
    ) -> ToolResult[Any]:
        """`ToolRegistry.execute`, awaited; see the module docstring for cancellation."""
        started = time.monotonic()
        call = _as_call(call_or_name, arguments)
        caller = _as_token(token)
        registry = self._registry
        _check_open(registry)
        canceller = CancelSource()  # ours: cancels the call, never the caller's token
        context = contextvars.copy_context()

        def work() -> ToolResult[Any]:
            return context.run(
                registry._execute,
                call,
                caller,
                start_if_cancelled,
                True,
                started,
                False,
                canceller.token,
            )

        try:
            result: ToolResult[Any] = await _run_on(registry._executor.submit, work, canceller)
            return result
        finally:
            canceller.close()

    async def execute_batch(
        self,
        calls: Iterable[ToolCall],
        *,
        token: CancelToken | None = None,
        max_parallel: int = 8,
        on_progress: Progress | None = None,
    ) -> list[ToolResult[Any]]:
        """`ToolRegistry.execute_batch`, awaited; cancelling the task cancels the batch."""
        registry = self._registry
        _check_open(registry)
        caller = _as_token(token)
        canceller = CancelSource()
        batch = list(calls)
        context = contextvars.copy_context()

        def work() -> list[ToolResult[Any]]:
            with CancelSource(caller, canceller.token) as turn:
                return context.run(
                    registry.execute_batch,
                    batch,
                    token=turn.token,
                    max_parallel=max_parallel,
                    on_progress=on_progress,
                )

        # The scheduler waits for pool workers, so it must not occupy one itself.
        try:
            results: list[ToolResult[Any]] = await _run_on(
                self._scheduler_pool().submit, work, canceller
            )
            return results
        finally:
            canceller.close()

    def _scheduler_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._schedulers is None:
                self._schedulers = ThreadPoolExecutor(thread_name_prefix="toolreg-aio-batch")
            return self._schedulers

    async def aclose(self) -> None:
        """Close the registry (cancel, drain, shut down) without blocking the loop."""
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        self._registry.close()
        with self._lock:
            schedulers, self._schedulers = self._schedulers, None
        if schedulers is not None:
            schedulers.shutdown(wait=True)

    async def __aenter__(self) -> AsyncToolRegistry:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncToolRegistry {self._registry!r}>"


def _check_open(registry: ToolRegistry) -> None:
    if registry._closing:
        raise RuntimeError("this ToolRegistry is closed: create a new one to run calls")


async def _run_on(
    submit: Callable[[Callable[[], Any]], object], work: Callable[[], Any], canceller: CancelSource
) -> Any:
    """Run `work` on a thread; on task cancellation cancel it, wait for it, re-raise."""
    loop = asyncio.get_running_loop()
    settled: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        try:
            outcome = (True, work())
        except BaseException as exc:
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(_settle, settled, outcome)

    submit(run)
    try:
        ok, value = await asyncio.shield(settled)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        canceller.cancel(f"asyncio task {task.get_name() if task else '?'} was cancelled")
        await _wait_settled(settled)
        raise  # the task's own cancellation, unconverted: cancelling()/uncancel() stay right
    if ok:
        return value
    raise value


def _settle(settled: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if not settled.done():
        settled.set_result(outcome)


async def _wait_settled(settled: asyncio.Future[Any]) -> None:
    """Wait for a cancelled call to settle, absorbing repeated cancellation without spinning."""
    anyio = sys.modules.get("anyio")
    while not settled.done():
        try:
            if anyio is not None:
                # anyio re-cancels the task at every await of a cancelled scope; a shielded
                # scope stops that, so this sleeps until the call settles.
                with anyio.CancelScope(shield=True):
                    await asyncio.shield(settled)
            else:
                await asyncio.shield(settled)
        except asyncio.CancelledError:
            continue  # cancelled again (asyncio): keep waiting; the first one is re-raised
