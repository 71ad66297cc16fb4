"""Batches: the tool calls of one agent step, scheduled parallel/exclusive under one token.

The scheduler runs in the caller's thread and never occupies a pool worker: each call's whole
pipeline (hooks and body) runs inline on one worker, so no call ever waits for a worker that
another waiting call holds. Classification happens once, up front: only a tool whose
`concurrency_safe` is exactly `True` (or returns exactly `True` for the call's arguments) runs in
parallel; anything else (an exception, a non-bool, an unknown tool, invalid arguments) is
exclusive and acts as a barrier.

Consecutive parallel calls form a segment, run by up to `max_parallel` runners: pool tasks that
each take the segment's next call (in input order) and run it, until the segment is used up, so
workers never wait for the scheduler between calls. The scheduler waits for a segment's runners
before it starts the next segment; an exclusive call is a segment of one, hence a barrier.

Turn cancellation: once the batch token is cancelled no further call starts. Runners stop taking
calls, a runner still queued in the pool is claimed back by the scheduler (the same single-claim
rule as bodies, see `_body`), and every unstarted call gets `ABORTED_BEFORE_DISPATCH` without
entering any hook, seen by the observers like any other result. Started calls are cancelled
through their tokens and joined: `execute_batch` returns only after every started call settled.
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


class _Segment:
    """Consecutive calls that may overlap, run by up to `max_parallel` runners.

    A runner is one pool task that takes the segment's calls in input order, one at a time,
    and runs each whole pipeline inline, until the segment is used up or the batch cancelled:
    workers never wait for the scheduler between calls. An exclusive call is a segment of one.
    """

    __slots__ = ("claims", "end", "lock", "next", "runners")

    def __init__(self, start: int, end: int, runners: int) -> None:
        self.lock = threading.Lock()  # guards next and runners
        self.next = start  # the next call to start
        self.end = end
        self.runners = runners  # runners that have not finished (or been taken back)
        self.claims = [threading.Lock() for _ in range(runners)]  # one start claim per runner

    def take(self, cancelled: Callable[[], bool]) -> int | None:
        """The next call to run, in input order, or None when done or cancelled."""
        with self.lock:
            if self.next >= self.end or cancelled():
                return None
            index = self.next
            self.next += 1
            return index

    def runner_done(self) -> None:
        with self.lock:
            self.runners -= 1


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
        self.wakeups: queue.SimpleQueue[None] = queue.SimpleQueue()  # progress, or cancel
        self.finished: list[int] = []  # indices in completion order; list.append is atomic
        self.reported = 0  # how many of `finished` on_progress has seen
        self.done = 0
        self.segment: _Segment | None = None
        self.interrupted: BaseException | None = None
        self.ctrl_c = ctrl_c  # a deferred Ctrl-C press: cancel, drain, and let the caller raise
        if ctrl_c is not None:
            ctrl_c.wake = lambda: self.wakeups.put(None)  # SimpleQueue.put is reentrant

    def run(self) -> list[ToolResult[Any]]:
        """Run segment after segment until all ran or the batch is cancelled; join; return.

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
        self._report()
        self._finish_unstarted()
        if self.interrupted is not None:
            raise self.interrupted
        return [result for result in self.results if result is not None]

    def _schedule(self) -> None:
        start, total = 0, len(self.calls)
        while start < total:
            self._check_ctrl_c()
            if self.token.cancelled:
                return
            end = start + 1
            if self.parallel[start]:
                while end < total and self.parallel[end]:
                    end += 1
            runners = 1 if self.inline else min(self.max_parallel, end - start)
            self._run_segment(_Segment(start, end, runners))
            start = end

    def _run_segment(self, segment: _Segment) -> None:
        self.segment = segment
        if self.inline:
            self._runner(segment, 0)
        else:
            for runner in range(len(segment.claims)):
                self._submit(segment, runner)
        self._drain()

    def _submit(self, segment: _Segment, runner: int) -> None:
        try:
            self.registry._executor.submit(self._runner, segment, runner)
        except RuntimeError:  # executor shut down under us: this runner never starts
            if segment.claims[runner].acquire(blocking=False):
                segment.runner_done()
            self.source.cancel("the executor refused the batch")

    def _runner(self, segment: _Segment, runner: int) -> None:
        """On a pool worker: run the segment's calls in order, each pipeline inline."""
        if not segment.claims[runner].acquire(blocking=False):
            return  # the scheduler took it back after cancellation
        try:
            cancelled = self._cancelled
            while (index := segment.take(cancelled)) is not None:
                self._run_call(index)
        finally:
            segment.runner_done()
            self.wakeups.put(None)

    def _cancelled(self) -> bool:
        return self.token.cancelled

    def _run_call(self, index: int) -> None:
        call = self.calls[index]
        try:
            self.results[index] = self.registry._execute(
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
            if self.results[index] is None:
                self.results[index] = self.registry._unstarted(call, exc)
        finally:
            self.finished.append(index)
            self.wakeups.put(None)

    def _drain(self) -> None:
        """Wait until the current segment's runners all finished, reporting progress."""
        segment = self.segment
        while segment is not None and segment.runners > 0:
            self._check_ctrl_c()
            if self.token.cancelled:
                self._reclaim(segment)
                if segment.runners == 0:
                    break
            try:
                # The main thread waits in slices, so a Ctrl-C is noticed within one.
                with contextlib.suppress(queue.Empty):
                    self.wakeups.get(timeout=_wait_slice())
            except INTERRUPTS as exc:
                self._interrupt(exc)
            self._report()
        self._report()

    def _reclaim(self, segment: _Segment) -> None:
        """After cancellation: runners no worker picked up yet never start."""
        for claim in segment.claims:
            if claim.acquire(blocking=False):
                segment.runner_done()

    def _check_ctrl_c(self) -> None:
        if self.ctrl_c is not None and self.ctrl_c.pressed and not self.token.cancelled:
            self.source.cancel("KeyboardInterrupt")

    def _report(self) -> None:
        """on_progress for every call that finished since the last report."""
        while self.reported < len(self.finished):
            self.reported += 1
            self._progress()

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
