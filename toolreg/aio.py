"""The asyncio facade: `AsyncToolRegistry(registry)` with the sync registry's semantics.

`await areg.execute(...)` costs one thread hop: the call's whole pipeline (hooks, approval,
guards, wrappers, the body, post hooks, observers) runs on one worker of the registry's pool,
with the body inline on that worker, so nothing runs on the event loop and nothing waits for a
second worker (no deadlock however many calls are in flight, nested calls included). The result
comes back through `loop.call_soon_threadsafe`.

Cancelling the awaiting task cancels the call's token (never the caller's), waits until the call
has settled (its body joined, its observers notified), then raises `asyncio.CancelledError`.
The token is cancelled from the facade's helper thread, never from the loop, because cancelling
runs every callback registered on the call's token. A call still queued for a worker when its
task is cancelled is claimed back and never starts (`ABORTED_BEFORE_DISPATCH`, observers
notified off the loop). The facade never swallows or converts a cancellation, so
`Task.cancelling()` and `uncancel()` stay balanced and `asyncio.timeout()` /
`asyncio.wait_for()` around `execute` work. Under anyio
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
import functools
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, TypeVar

from ._batch import Progress, check_batch
from ._cancel import CancelSource, CancelToken
from ._progress import ProgressSink, ToolProgress
from ._registry import ToolRegistry, _as_call, _as_token, _check_wait
from ._results import ToolCall, ToolResult

__all__ = ["AsyncToolRegistry"]

logger = logging.getLogger("toolreg")
T = TypeVar("T")


class AsyncToolRegistry:
    """Async access to a `ToolRegistry`: same arguments, same results, same guarantees.

    A process-wide helper thread, started when `toolreg.aio` is imported, cancels calls and
    starts pool threads, so the event loop never runs token callbacks or waits for a thread to
    start. The facade owns a pool for batch schedulers (they wait for body workers, so they
    must not occupy one). `aclose()` or `async with` closes the registry and that pool.
    """

    def __init__(self, registry: ToolRegistry) -> None:
        if not isinstance(registry, ToolRegistry):
            raise TypeError(
                f"AsyncToolRegistry wraps a ToolRegistry, got {type(registry).__name__}"
            )
        self._registry = registry
        self._schedulers = ThreadPoolExecutor(thread_name_prefix="toolreg-aio-batch")

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
        progress: Callable[[ToolProgress], object] | None = None,
        cancel_reason: object = None,
    ) -> ToolResult[Any]:
        """`ToolRegistry.execute`, awaited; see the module docstring for cancellation.

        `progress(update)` runs on this event loop (scheduled, never awaited by the worker) for
        each increasing `ctx.report_progress` of the body; its exceptions are logged.
        `cancel_reason` is the reason the call's token is cancelled with when the awaiting
        task is cancelled (default: a string naming the task, e.g. "asyncio task Task-7 was
        cancelled").
        """
        started = time.monotonic()
        loop = asyncio.get_running_loop()  # before entry: without a loop nothing is counted in
        call = _as_call(call_or_name, arguments)
        caller = _as_token(token)
        sink = _loop_progress(loop, progress)
        registry = self._registry
        registry._enter(nested=registry._inside())  # entry is now: close() waits for this call
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
                True,
                progress=sink,
            )

        def never_started() -> ToolResult[Any]:
            try:
                return registry._unstarted(call)
            finally:
                registry._leave()

        job = _Job(work, never_started, registry._leave)
        try:
            submit = self._body_submit()
            result: ToolResult[Any] = await self._run(job, canceller, submit, cancel_reason)
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
        batch = check_batch(calls, max_parallel)
        caller = _as_token(token)
        if on_progress is not None and not callable(on_progress):
            raise TypeError("on_progress must be callable")
        asyncio.get_running_loop()  # before entry: without a loop nothing is counted in
        registry._enter(nested=registry._inside())
        canceller = CancelSource()
        context = contextvars.copy_context()

        def work() -> list[ToolResult[Any]]:
            with CancelSource(caller, canceller.token) as turn:
                return context.run(
                    registry._execute_batch, batch, turn.token, max_parallel, on_progress
                )

        def never_started() -> list[ToolResult[Any]]:
            try:
                return [registry._unstarted(call) for call in batch]
            finally:
                registry._leave()

        job = _Job(work, never_started, registry._leave)
        # The scheduler waits for body workers, so it runs on a pool of its own.
        submit = self._via_helper(self._schedulers)
        try:
            results: list[ToolResult[Any]] = await self._run(job, canceller, submit, None)
            return results
        finally:
            canceller.close()

    def _body_submit(self) -> Submit:
        """Where a call's pipeline runs: a body worker, without starting threads on the loop."""
        if self._registry._inside():
            # Called from an async body, whose worker waits for it: use a pool it cannot block.
            return self._via_helper(self._schedulers)
        executor = self._registry._executor
        threads = getattr(executor, "_threads", None)
        if threads is not None and len(threads) >= getattr(executor, "_max_workers", 0):
            return functools.partial(_hand_over, executor)  # every worker exists: no start
        return self._via_helper(executor)

    def _via_helper(self, executor: Executor) -> Submit:
        def submit(job: _Job) -> None:
            _HELPER.call_soon(lambda: _hand_over(executor, job))

        return submit

    async def _run(
        self, job: _Job, canceller: CancelSource, submit: Submit, cancel_reason: object
    ) -> Any:
        """Run `job` on a thread; on task cancellation cancel it off the loop, wait, re-raise."""
        loop = asyncio.get_running_loop()
        settled: asyncio.Future[tuple[bool, Any]] = loop.create_future()
        job.deliver = lambda outcome: _deliver(loop, settled, outcome)
        submit(job)
        try:
            ok, value = await asyncio.shield(settled)
        except asyncio.CancelledError:
            reason = cancel_reason
            if reason is None:
                task = asyncio.current_task()
                reason = f"asyncio task {task.get_name() if task else '?'} was cancelled"
            job.cancel(canceller, reason)
            await _wait_settled(settled)
            raise  # the task's own cancellation, unconverted: cancelling()/uncancel() stay right
        if ok:
            return value
        raise value

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Await until no call of the registry is in flight, without blocking the loop.

        The same as `ToolRegistry.wait_idle`: True when idle, False if `timeout` seconds ran
        out first; `RuntimeError` from inside one of the registry's own calls.
        """
        registry = self._registry
        if registry._inside():
            raise RuntimeError("wait_idle() from inside one of this registry's calls would wait")
        seconds = None if timeout is None else _check_wait(timeout)
        loop = asyncio.get_running_loop()
        idle: asyncio.Future[None] = loop.create_future()
        forget = registry._call_when_idle(lambda: _deliver(loop, idle, None))
        if forget is None:
            return True
        try:
            await asyncio.wait((idle,), timeout=seconds)
            return idle.done()
        finally:
            forget()

    async def aclose(self) -> None:
        """Close the registry (cancel, drain, shut down) without blocking the loop."""
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        self._registry.close()
        self._schedulers.shutdown(wait=True)

    async def __aenter__(self) -> AsyncToolRegistry:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncToolRegistry {self._registry!r}>"


def _hand_over(executor: Executor, job: _Job) -> None:
    """Submit the job; an executor that refuses it (shut down) fails the call, never hangs it."""
    try:
        executor.submit(job.run)
    except BaseException as exc:
        job.refuse(exc)


Submit = Callable[["_Job"], None]


class _Job:
    """One awaited call or batch: claimed once, by the worker that runs it or by a canceller."""

    def __init__(
        self,
        work: Callable[[], Any],
        never_started: Callable[[], Any],
        abandon: Callable[[], None],
    ) -> None:
        self._work = work
        self._never_started = never_started  # the results if a canceller claims it first
        self._abandon = abandon  # undo the entry if the executor refuses the job
        self._claim = threading.Lock()
        self.deliver: Callable[[tuple[bool, Any]], None] = lambda outcome: None

    def run(self) -> None:
        """On a worker: run the work unless a canceller claimed it; deliver its outcome."""
        if self._claim.acquire(blocking=False):
            self._finish(self._work)

    def cancel(self, canceller: CancelSource, reason: object) -> None:
        """On the loop: claim it if no worker took it yet (it never starts), else cancel it.

        Both the unstarted results (observers) and the token's cancellation (its callbacks) are
        user code, so they run on the helper thread; the claim itself is decided right here.
        """
        if self._claim.acquire(blocking=False):
            _HELPER.call_soon(lambda: self._finish(self._never_started))
        else:
            _HELPER.call_soon(lambda: canceller.cancel(reason))

    def refuse(self, exc: BaseException) -> None:
        """The executor would not take the job (it was shut down): fail the awaiting task."""
        if self._claim.acquire(blocking=False):
            self._abandon()
            refused = RuntimeError(f"the executor refused the call: {exc}")
            self.deliver((False, refused))

    def _finish(self, produce: Callable[[], Any]) -> None:
        try:
            outcome = (True, produce())
        except BaseException as exc:
            outcome = (False, exc)
        self.deliver(outcome)


def _deliver(loop: asyncio.AbstractEventLoop, settled: asyncio.Future[T], outcome: T) -> None:
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
        loop.call_soon_threadsafe(_settle, settled, outcome)


def _settle(settled: asyncio.Future[T], outcome: T) -> None:
    if not settled.done():
        settled.set_result(outcome)


def _loop_progress(
    loop: asyncio.AbstractEventLoop, progress: Callable[[ToolProgress], object] | None
) -> ProgressSink | None:
    """A sink whose kept updates are scheduled on `loop`, where `progress` runs."""
    if progress is None:
        return None
    if not callable(progress):
        raise TypeError(f"progress must be callable, got {type(progress).__name__}")

    def schedule(update: ToolProgress) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
            loop.call_soon_threadsafe(_report_progress, progress, update)

    return ProgressSink(schedule)


def _report_progress(progress: Callable[[ToolProgress], object], update: ToolProgress) -> None:
    try:
        progress(update)
    except Exception:
        logger.exception("toolreg: progress callback %r raised", progress)


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


class _Helper:
    """The process-wide helper thread: runs small jobs handed over from event loops, in order.

    A daemon started at import (imports happen before loops run), so no loop ever waits for it
    to start; after `fork()` the child starts a new one on first use.
    """

    def __init__(self) -> None:
        self._start()
        os.register_at_fork(after_in_child=self._start)

    def _start(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="toolreg-aio-helper", daemon=True)
        self._thread.start()

    def call_soon(self, job: Callable[[], object]) -> None:
        """Run `job()` on the helper thread; never blocks."""
        self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except BaseException:  # the helper must survive anything a job does
                logger.exception("toolreg: an asyncio facade job raised")


_HELPER = _Helper()
