"""Batches: the tool calls of one agent step, scheduled parallel/exclusive under one token.

The scheduler runs in the caller's thread and never occupies a pool worker: each call's whole
pipeline (hooks and body) runs inline on one worker, so no call ever waits for a worker that
another waiting call holds. Classification happens once, up front: only a tool whose
`concurrency_safe` is exactly `True` (or returns exactly `True` for the call's arguments) runs in
parallel; anything else (an exception, a non-bool, an unknown tool, invalid arguments) is
exclusive and acts as a barrier.

Turn cancellation: once the batch token is cancelled no further call starts. A job already handed
to the pool but not yet picked up is claimed back by the scheduler (the same single-claim rule as
bodies, see `_body`), and every unstarted call gets `ABORTED_BEFORE_DISPATCH` without entering
any hook, seen by the observers like any other result. Started calls are cancelled through their
tokens and joined: `execute_batch` returns only after every started call has settled.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ._body import INTERRUPTS, MAIN_THREAD_SLICE
from ._cancel import CancelSource
from ._interrupts import SigintRequest
from ._results import ToolCall, ToolResult, frozen_call
from ._tools import InvalidArguments, freeze_arguments

if TYPE_CHECKING:
    from ._registry import ToolRegistry

logger = logging.getLogger("toolreg")

Progress = Callable[[int, int], object]


def check_batch(calls: Iterable[ToolCall], max_parallel: int) -> list[ToolCall]:
    """Validate a batch before anything starts; `ValueError` names the problem."""
    if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
        raise ValueError(f"max_parallel must be an int >= 1, got {max_parallel!r}")
    if isinstance(calls, (str, bytes, Mapping)):
        raise ValueError("execute_batch() takes an iterable of ToolCall objects")
    batch = list(calls)
    seen: set[str] = set()
    for index, call in enumerate(batch):
        if not isinstance(call, ToolCall):
            raise ValueError(f"batch item {index} is a {type(call).__name__}, not a ToolCall")
        if call.call_id in seen:
            raise ValueError(f"duplicate call_id {call.call_id!r} in the batch (item {index})")
        seen.add(call.call_id)
    return batch


class _Job:
    """One batch call handed to the pool; claimed once, by its worker or by the scheduler.

    Completion lives here (`finished`), not on the wake-up queue, so a Ctrl-C that lands while
    the scheduler takes a wake-up off the queue loses nothing.
    """

    __slots__ = ("claim", "finished", "index")

    def __init__(self, index: int) -> None:
        self.index = index
        self.claim = threading.Lock()
        self.finished = False  # set by the worker after the call's result is recorded


class BatchRun:
    """Schedules one batch; lives for one `execute_batch` call, in the caller's thread."""

    def __init__(
        self,
        registry: ToolRegistry,
        calls: list[ToolCall],
        source: CancelSource,
        max_parallel: int,
        on_progress: Progress | None,
        inline: bool,
        ctrl_c: SigintRequest | None = None,
    ) -> None:
        self.registry = registry
        self.calls = calls
        self.source = source  # the batch's own source: the caller's token, close() and Ctrl-C
        self.token = source.token
        self.max_parallel = max_parallel
        self.on_progress = on_progress
        self.inline = inline  # already on one of our threads: run the calls here, one by one
        self.results: list[ToolResult[Any] | None] = [None] * len(calls)
        self.parallel = [registry._parallel_safe(call) for call in calls]
        self.wakeups: queue.SimpleQueue[None] = queue.SimpleQueue()  # a job finished, or cancel
        self.queued: dict[int, _Job] = {}  # handed to the pool, not yet seen finished
        self.running_exclusive = False
        self.done = 0
        self.interrupted: BaseException | None = None
        self.ctrl_c = ctrl_c  # a deferred Ctrl-C press: cancel, drain, and let the caller raise
        if ctrl_c is not None:
            ctrl_c.wake = lambda: self.wakeups.put(None)  # SimpleQueue.put is reentrant

    def run(self) -> list[ToolResult[Any]]:
        """Start calls in order until all started or the batch is cancelled; join; return.

        A Ctrl-C (or a hook's SystemExit on a worker) anywhere in here cancels the batch; the
        batch is still drained and every unstarted call still observed before it is re-raised.
        """
        wake = self.token.on_cancel(lambda: self.wakeups.put(None))
        try:
            try:
                self._schedule()
            except INTERRUPTS as exc:
                self._interrupt(exc)
            while True:
                try:
                    self._drain()
                    break
                except INTERRUPTS as exc:  # landed between the guarded spots of _drain
                    self._interrupt(exc)
        finally:
            wake.remove()
        self._finish_unstarted()
        if self.interrupted is not None:
            raise self.interrupted
        return [result for result in self.results if result is not None]

    def _schedule(self) -> None:
        for index in range(len(self.calls)):
            parallel = self.parallel[index]
            limit = self.max_parallel if parallel else 1
            while not self.token.cancelled and (
                len(self.queued) >= limit
                or (self.queued and (self.running_exclusive or not parallel))
            ):
                self._wait()
            if self.ctrl_c is not None and self.ctrl_c.pressed:
                self.source.cancel("KeyboardInterrupt")
            if self.token.cancelled:
                return
            self._start(index, parallel)

    def _start(self, index: int, parallel: bool) -> None:
        job = _Job(index)
        self.running_exclusive = not parallel
        self.queued[index] = job
        if self.inline:
            self._run_job(job)
            self._collect()
            return
        try:
            self.registry._executor.submit(self._run_job, job)
        except RuntimeError:  # executor shut down under us: this call never starts
            if job.claim.acquire(blocking=False):
                del self.queued[index]
                self.running_exclusive = False
            self.source.cancel("the executor refused the batch")

    def _run_job(self, job: _Job) -> None:
        """On a pool worker: the whole pipeline of one call, body inline."""
        if not job.claim.acquire(blocking=False):
            return  # the scheduler took it back after cancellation
        call = self.calls[job.index]
        try:
            if self.token.cancelled:  # cancelled while queued: unstarted, like a reclaimed job
                self.results[job.index] = self.registry._unstarted(
                    call, on_interrupt=self._interrupt
                )
            else:
                self.results[job.index] = self.registry._execute(
                    call,
                    self.token,
                    False,
                    True,
                    time.monotonic(),
                    nested=True,
                    on_interrupt=self._interrupt,
                )
        except BaseException as exc:  # a toolreg bug: never lose the call's result
            logger.exception("toolreg: batch call %s raised", call.call_id)
            if self.results[job.index] is None:
                self.results[job.index] = self.registry._unstarted(call, exc)
        finally:
            job.finished = True
            self.wakeups.put(None)

    def _wait(self) -> None:
        """Block until a job finished or the batch was cancelled; then catch up."""
        if self.ctrl_c is not None and self.ctrl_c.pressed and not self.token.cancelled:
            self.source.cancel("KeyboardInterrupt")
        try:
            if not self._collect():
                # The main thread waits in slices, so a Ctrl-C is noticed within one.
                with contextlib.suppress(queue.Empty):
                    self.wakeups.get(timeout=_wait_slice())
        except INTERRUPTS as exc:
            self._interrupt(exc)
        if self.token.cancelled:
            self._reclaim_queued()
        self._collect()

    def _collect(self) -> bool:
        """Retire every finished job; True if any was."""
        finished = [index for index, job in self.queued.items() if job.finished]
        for index in finished:
            del self.queued[index]
            if not self.parallel[index] or not self.queued:
                self.running_exclusive = False
            self._progress()
        return bool(finished)

    def _reclaim_queued(self) -> None:
        """After cancellation: jobs no worker picked up yet never start."""
        for index, job in list(self.queued.items()):
            if job.claim.acquire(blocking=False):
                del self.queued[index]

    def _drain(self) -> None:
        while self.queued:
            try:
                self._wait()
            except INTERRUPTS as exc:  # landed outside the guarded wait: same treatment
                self._interrupt(exc)

    def _finish_unstarted(self) -> None:
        for index, result in enumerate(self.results):
            if result is not None:
                continue
            try:
                call = self.calls[index]
                self.results[index] = self.registry._unstarted(call, on_interrupt=self._interrupt)
            except INTERRUPTS as exc:  # landed in our own code, not in an observer
                self._interrupt(exc)
            self._progress()

    def _progress(self) -> None:
        self.done += 1
        if self.on_progress is None:
            return
        try:
            self.on_progress(self.done, len(self.calls))
        except INTERRUPTS as exc:
            self._interrupt(exc)
        except Exception:
            logger.exception("toolreg: on_progress raised")

    def _interrupt(self, exc: BaseException) -> None:
        """Ctrl-C here, or a hook's SystemExit/KeyboardInterrupt on a worker: stop the batch."""
        if self.interrupted is None:
            self.interrupted = exc
        self.source.cancel(type(exc).__name__)


def _wait_slice() -> float | None:
    return MAIN_THREAD_SLICE if threading.current_thread() is threading.main_thread() else None


def unstarted_call(call: ToolCall) -> ToolCall:
    """The call as a result carries it: frozen arguments, or None if they are not JSON."""
    try:
        arguments: Mapping[str, Any] | None = freeze_arguments(call.arguments)
    except InvalidArguments:
        arguments = None
    return frozen_call(call.name, arguments, call.call_id)
