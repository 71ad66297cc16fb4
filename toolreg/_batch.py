"""Batches: the tool calls of one agent step, scheduled parallel/exclusive under one token.

The scheduler runs in the caller's thread and never occupies a pool worker: each call's whole
pipeline (hooks and body) runs inline on one worker, so no call ever waits for a worker that
another waiting call holds. Classification happens once, up front, with the entry checks: only a
tool whose `concurrency_safe` is exactly `True` (or returns exactly `True` for the call's
arguments) runs in parallel; anything else (an exception, a non-bool, an unknown tool, invalid
arguments) is exclusive and acts as a barrier. A call that passed the entry checks here is not
checked (frozen, validated) again when it runs.

Consecutive parallel calls form a segment, run by up to `max_parallel` runners: work items that
each take the segment's next call (in input order) and run it, until the segment is used up, so
workers never wait for the scheduler between calls. The runners form a chain: the scheduler
hands over the first, and each runner hands over the next once it has taken a call and more are
left, before it runs that call. A runner woken this way waits for the GIL, so it takes a call
only when the running ones block (or outlast the switch interval): calls that never block keep
one worker busy instead of waking `max_parallel`, and calls that block still overlap up to
`max_parallel`. A runner that finds nothing left takes the rest of the chain back unstarted.
The scheduler waits for a segment's runners before it starts the next segment; an exclusive
call is a segment of one, hence a barrier. The scheduler is woken once per segment, by its last
runner to finish, once per finished call only when `on_progress` wants to hear of each, and
once when the batch is cancelled.

Turn cancellation: once the batch token is cancelled no further call starts. Runners stop taking
calls, a runner still queued is claimed back by the scheduler (the same `Claim` as bodies), and
every unstarted call gets `ABORTED_BEFORE_DISPATCH` without entering any hook, seen by the
observers like any other result. Started calls are cancelled through their tokens and joined:
`execute_batch` returns only after every started call settled. The batch's token is a lazy
child of the caller's that nobody listens to: the batch's one listener is on the caller's token,
and the batch runs it itself when it cancels its own token (close(), Ctrl-C, a refused runner).
That listener wakes the scheduler and starts the overdue watch of the bodies its runners are
running (each runner records the state of its current call before that call's body can start),
so a batch call registers no listener of its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from . import _validate
from ._call import CallMode, CallState
from ._cancel import CancelSource, CancelToken
from ._catalog import CatalogEntry
from ._claim import Claim, claim
from ._interrupts import INTERRUPTS, MAIN_THREAD_SLICE, SigintRequest, deferred_sigint
from ._logger import logger
from ._pipeline import check_entry
from ._results import ToolCall, ToolResult, frozen_call

__all__ = ["BatchHost", "Progress", "check_batch", "execute_batch"]


Progress = Callable[[int, int], object]

_BATCH_ITEM = CallMode.batch_item()


class BatchHost(Protocol):
    """What a batch needs from the dispatcher."""

    overdue_after: float | None

    def run(
        self,
        call: ToolCall,
        caller: CancelToken,
        mode: CallMode,
        progress: Any = None,
        admitted: CatalogEntry | None = None,
        watcher: Callable[[CallState], object] | None = None,
        owns_call: bool = False,
    ) -> tuple[ToolResult[Any], BaseException | None]: ...

    def unstarted(
        self, call: ToolCall, reason: object
    ) -> tuple[ToolResult[Any], BaseException | None]: ...

    @property
    def tools(self) -> Any: ...

    def hand_over(self, item: Any, may_block: bool = True, goes_on: bool = False) -> None: ...

    def admit(self, entry: Any, nested: bool) -> int: ...

    def untrack(self, key: int) -> None: ...

    def on_body_thread(self, ident: int) -> bool: ...

    def inside(self, ident: int | None = None) -> bool: ...


def check_batch(calls: Iterable[ToolCall], max_parallel: int) -> list[ToolCall]:
    """Validate a batch before anything starts: `TypeError` or `ValueError` names the problem."""
    _validate.count(max_parallel, "max_parallel")
    if isinstance(calls, (str, bytes, Mapping)):
        raise TypeError("execute_batch() takes an iterable of ToolCall objects")
    batch = list(calls)
    seen: set[str] = set()
    for index, call in enumerate(batch):
        if not isinstance(call, ToolCall):
            raise TypeError(f"batch item {index} is a {type(call).__name__}, not a ToolCall")
        if call.call_id in seen:
            raise ValueError(f"duplicate call_id {call.call_id!r} in the batch (item {index})")
        seen.add(call.call_id)
    return batch


def execute_batch(
    host: BatchHost,
    calls: Iterable[ToolCall],
    caller: CancelToken,
    max_parallel: int,
    on_progress: Progress | None,
) -> list[ToolResult[Any]]:
    """`ToolRegistry.execute_batch`, with a Ctrl-C on the main thread deferred to safe points."""
    batch = check_batch(calls, max_parallel)
    if on_progress is not None and not callable(on_progress):
        raise TypeError("on_progress must be callable")
    with deferred_sigint() as ctrl_c:  # a Ctrl-C here becomes a cancellation request
        return BatchRun(host, batch, caller, max_parallel, on_progress, ctrl_c).run()


class _Segment:
    """Consecutive calls that may overlap, run by up to `max_parallel` runners."""

    __slots__ = ("end", "indices", "lock", "runners", "token")

    def __init__(self, start: int, end: int, runners: int, token: CancelToken) -> None:
        # Hands out each call once, in input order: `next()` on a count is atomic (one C call).
        self.indices = itertools.count(start)
        self.end = end
        self.token = token  # the batch's: once cancelled, no further call is taken
        self.lock = threading.Lock()  # guards runners
        self.runners = runners  # runners that have not finished (or been taken back)

    def runner_done(self) -> bool:
        """One runner less; True for the last one."""
        with self.lock:
            self.runners -= 1
            return self.runners == 0


class _Runner(Claim):
    """One worker's share of a segment: it takes the segment's calls in order and runs them."""

    __slots__ = ("batch", "next", "segment", "state")

    def __init__(self, batch: BatchRun, segment: _Segment, next: _Runner | None) -> None:
        super().__init__()
        self.batch = batch
        self.segment = segment
        # The segment's next runner, handed over by this one once it has taken a call and more
        # are left (None once passed on, and for the last). Only this runner's thread uses it.
        self.next = next
        # The call this runner runs now (or ran last), for the batch's cancellation listener.
        # Written by the runner before the call's body can start; read from any thread.
        self.state: CallState | None = None

    def _run(self) -> None:
        if not claim(self):
            return  # the scheduler took it back after cancellation
        try:
            # The batch caller's context variables, as the asyncio facade and call hooks expect
            # (a copy per runner: one Context cannot be entered by two threads at once).
            self.batch.context.copy().run(self._run_calls)
        finally:
            if self.next is not None:  # the chain ends here: nothing was left to pass on
                self._pass_on(False)
            self._done()

    def _run_calls(self) -> None:
        batch = self.batch
        segment = self.segment
        take = segment.indices.__next__
        token, end = segment.token, segment.end
        # The token is read before an index is drawn, so every call drawn is run (a
        # cancellation after the read is the pipeline's to handle: the call then starts no
        # body); an index drawn past the end is dropped.
        while not token.cancelled and (index := take()) < end:
            if self.next is not None:
                self._pass_on(index + 1 < end)
            batch.run_call(index, self)
        self.state = None  # the last call's state is not kept alive by the batch

    def _pass_on(self, more: bool) -> None:
        """Start the next runner if calls are left after the one this runner took; else, or if
        the executor refuses it, take it back with every runner after it (none will start)."""
        runner = self.next
        if more and runner is not None:
            try:
                # It wakes waiting for the GIL: it takes a call only if this one blocks (or
                # outlasts the switch interval), so calls that never block wake no one else.
                self.batch.host.hand_over(runner, goes_on=True)
            except RuntimeError:  # shut down under us: this runner runs the rest alone
                pass
            else:
                self.next = None
                return
        # Kept until now, so that if anything raised above, `_run` still ends the chain.
        self.next = None
        while runner is not None:
            runner.take_back()
            runner = runner.next

    def watch(self, state: CallState) -> None:
        """The dispatcher's watcher hook: `state` is the call this runner is about to run."""
        # Without around wrappers a call runs one body at a time, always `state.body`, so
        # `watch_overdue` covers it and the body needs no listener of its own. A wrapper may
        # run several at once (proceed() on other threads): those keep their own listeners.
        if not state.hooks.around:
            state.caller_watched = True
        self.state = state

    def watch_overdue(self) -> None:
        """The batch was cancelled: start the overdue watch of the body running now, if any.

        A body starts only after `watch` stored its state and after its last token check; a
        cancellation marks the tokens before its listeners run. So a body this read misses
        (no state yet, or the previous call's) sees the cancellation at that check and never
        starts, and a settled body's watch is a no-op: every body that runs under the
        cancellation is watched, as a listener per call would have done. (A body that has its
        own listener too is watched once: the watch is kept only by whoever sets it first.)
        """
        state = self.state
        if state is not None:
            state.watch_body()

    def _drop(self) -> None:
        """The executor discarded this runner: it never starts, nor do the ones it would pass on."""
        runner: _Runner | None = self
        while runner is not None:
            runner.take_back()
            runner = runner.next

    def take_back(self) -> bool:
        """For the scheduler, after cancellation: a runner no worker picked up never starts."""
        if not claim(self):
            return False
        self._done()
        return True

    def _done(self) -> None:
        if self.segment.runner_done():
            self.batch.wakeups.put(None)


class BatchRun:
    """Schedules one batch; lives for one `execute_batch` call, in the caller's thread."""

    def __init__(
        self,
        host: BatchHost,
        calls: list[ToolCall],
        caller: CancelToken,
        max_parallel: int,
        on_progress: Progress | None,
        ctrl_c: SigintRequest | None = None,
    ) -> None:
        self.host = host
        self.calls = calls
        #: The batch's own source: the caller's token, close() and Ctrl-C cancel it. It stays
        #: lazy (linked to nothing, listened to by nobody): the batch listens on the caller's
        #: token, and runs the same listener itself when it cancels its own (`cancel`).
        self.caller = caller
        self.source = CancelSource(caller)
        self.token = self.source.token
        self.max_parallel = max_parallel
        self.on_progress = on_progress
        self.thread = threading.get_ident()  # the scheduler's (for close()'s "inside" check)
        self.context = contextvars.copy_context()  # what the runners run the calls in
        # Already on one of the registry's body threads: run the calls here, one by one.
        self.inline = host.on_body_thread(self.thread)
        self.results: list[ToolResult[Any] | None] = [None] * len(calls)
        self.admitted: list[tuple[ToolCall, CatalogEntry] | None] = [None] * len(calls)
        self.parallel = [False] * len(calls)
        self.wakeups: queue.SimpleQueue[None] = queue.SimpleQueue()  # progress, or cancel
        self.finished: list[int] = []  # indices in completion order; list.append is atomic
        self.reported = 0  # how many of `finished` on_progress has seen
        self.done = 0
        self.runners: list[_Runner] = []  # the current segment's
        self.interrupted: BaseException | None = None
        self.ctrl_c = ctrl_c  # a deferred Ctrl-C press: cancel, drain, and let the caller raise
        if ctrl_c is not None:
            # SimpleQueue.put is reentrant: safe in a signal handler. Not a method of the batch,
            # which keeps the request: see `run`'s `finally` on reference cycles.
            ctrl_c.wake = functools.partial(self.wakeups.put, None)

    def cancel(self, reason: object) -> None:
        """Cancel the batch (also its in-flight table entry's cancel): no further call starts."""
        if self.source.cancel(reason):
            self._on_cancel()

    def _on_cancel(self) -> None:
        """The batch token was cancelled (by the caller's, or by `cancel`): wake the scheduler,
        watch the running bodies. It may run twice (the caller's token and `cancel` racing):
        both effects are idempotent."""
        self.wakeups.put(None)
        if self.host.overdue_after is None:
            return
        for runner in self.runners:  # the current segment's (a list replaced whole)
            runner.watch_overdue()

    def run(self) -> list[ToolResult[Any]]:
        """Classify, run segment after segment until done or cancelled, join, return.

        A Ctrl-C (or a hook's SystemExit on a worker) anywhere in here cancels the batch; the
        batch is still drained and every unstarted call still observed before it is re-raised.
        """
        key = self.host.admit(self, self.host.inside(self.thread))
        try:
            # On the caller's token: a listener on the batch's own would make it eager (linked
            # into the caller's and unlinked again), which costs a small batch more than its
            # calls' reads of a lazy token cost a large one.
            wake = self.caller.on_cancel(self._on_cancel)
            try:
                try:
                    self._classify()
                    self._schedule()
                except BaseException as exc:  # asynchronous, or a bug: cancel and drain
                    self._interrupt(exc)
                while True:
                    try:
                        self._drain()
                        break
                    except BaseException as exc:  # landed between the guarded spots
                        self._interrupt(exc)
            finally:
                wake.remove()
            self._report()
            self._finish_unstarted()
        finally:
            self.source.close()
            self.host.untrack(key)
            # The runners refer to the batch: dropped, a finished batch (and the results and
            # calls it holds) is freed as soon as the caller lets go of it, not by a later
            # cyclic collection: memory a cycle keeps is not reused while the next batch runs.
            self.runners = []
        if self.interrupted is not None:
            raise self.interrupted
        return [result for result in self.results if result is not None]

    def _classify(self) -> None:
        for index, call in enumerate(self.calls):
            self.parallel[index] = self._parallel_safe(index, call)

    def _parallel_safe(self, index: int, call: ToolCall) -> bool:
        """Entry checks, once; whether the call may overlap others (only an exact True)."""
        arguments, entry, problem = check_entry(self.host.tools.entries, call)
        if problem is not None or arguments is None or entry is None:
            return False  # exclusive, even for True: the call's own entry checks report it
        self.admitted[index] = (frozen_call(call.name, arguments, call.call_id), entry)
        safe = entry.tool.concurrency_safe
        if safe is True or safe is False:
            return safe
        try:
            return safe(arguments) is True
        except INTERRUPTS:
            raise
        except BaseException:
            logger.debug(
                "toolreg: %s is exclusive: its classifier failed", call.call_id, exc_info=True
            )
            return False

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
            self._run_segment(start, end)
            start = end

    def _run_segment(self, start: int, end: int) -> None:
        count = 1 if self.inline else min(self.max_parallel, end - start)
        segment = _Segment(start, end, count, self.token)
        # Chained: the scheduler hands over the first runner, each runner the next one once it
        # has taken a call and more are left, so a segment whose calls never block wakes one
        # worker (a runner that finds nothing to take wakes no one).
        runner = None
        runners = []
        for _ in range(count):
            runner = _Runner(self, segment, runner)
            runners.append(runner)
        runners.reverse()
        self.runners = runners
        if self.inline:
            runners[0]._run()
        else:
            self._submit(runners[0])
        self._drain()

    def _submit(self, runner: _Runner) -> None:
        try:
            self.host.hand_over(runner)
        except RuntimeError:  # the executor was shut down under us: no runner starts
            for each in self.runners:
                each.take_back()
            self.cancel("the executor refused the batch")

    def run_call(self, index: int, runner: _Runner) -> None:
        """On a runner: one call's whole pipeline, inline."""
        call = self.calls[index]
        admitted = self.admitted[index]
        try:
            if admitted is None:
                result, interrupted = self.host.run(
                    call, self.token, _BATCH_ITEM, None, None, runner.watch
                )
            else:
                frozen, entry = admitted
                result, interrupted = self.host.run(
                    frozen, self.token, _BATCH_ITEM, None, entry, runner.watch
                )
            self.results[index] = result
            if interrupted is not None:
                self._interrupt(interrupted)
        except BaseException:  # a toolreg bug: never lose the call's result
            logger.exception("toolreg: batch call %s raised", call.call_id)
            if self.results[index] is None:
                self.results[index], _ = self.host.unstarted(call, self._turn_over())
        finally:
            self.finished.append(index)
            if self.on_progress is not None:
                self.wakeups.put(None)

    def _drain(self) -> None:
        """Wait until the current segment's runners all finished, reporting progress."""
        runners = self.runners
        if not runners:
            return
        segment = runners[0].segment
        main = threading.current_thread() is threading.main_thread()
        while segment.runners > 0:
            self._check_ctrl_c()
            if self.token.cancelled:
                for runner in runners:
                    runner.take_back()
                if segment.runners == 0:
                    break
            try:
                # The main thread waits in slices, so a Ctrl-C is noticed within one.
                with contextlib.suppress(queue.Empty):
                    self.wakeups.get(timeout=MAIN_THREAD_SLICE if main else None)
            except BaseException as exc:  # asynchronous: nothing else runs on this line
                self._interrupt(exc)
            self._report()
        self._report()

    def _check_ctrl_c(self) -> None:
        if self.ctrl_c is not None and self.ctrl_c.pressed and not self.token.cancelled:
            self.cancel("KeyboardInterrupt")

    def _report(self) -> None:
        """on_progress for every call that finished since the last report."""
        if self.on_progress is None:  # only the count: `_progress` for each, without the calls
            finished = len(self.finished)
            self.done += finished - self.reported
            self.reported = finished
            return
        while self.reported < len(self.finished):
            self.reported += 1
            self._progress()

    def _finish_unstarted(self) -> None:
        for index, result in enumerate(self.results):
            if result is not None:
                continue
            try:
                call = self.calls[index]
                self.results[index], interrupted = self.host.unstarted(call, self._turn_over())
                if interrupted is not None:
                    self._interrupt(interrupted)
            except BaseException as exc:  # landed in our own code, not in an observer
                self._interrupt(exc)
            self._progress()

    def _turn_over(self) -> object:
        """Why a call of this batch never started: the batch's cancellation."""
        reason = self.token.reason
        return "batch cancelled" if reason is None else reason

    def _progress(self) -> None:
        self.done += 1
        if self.on_progress is None:
            return
        try:
            self.on_progress(self.done, len(self.calls))
        except INTERRUPTS as exc:
            self._interrupt(exc)
        except BaseException:
            logger.exception("toolreg: on_progress raised")

    def _interrupt(self, exc: BaseException) -> None:
        """Ctrl-C here, or a hook's SystemExit/KeyboardInterrupt on a worker: stop the batch."""
        if self.interrupted is None:
            self.interrupted = exc
        self.cancel(type(exc).__name__)
