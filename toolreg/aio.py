"""The asyncio facade: `AsyncToolRegistry(registry)` with the sync registry's semantics.

`await areg.execute(...)` costs one thread hop: the call's whole pipeline (hooks, approval,
guards, wrappers, the body, post hooks, observers) runs on one worker of the registry's pool,
with the body inline on that worker, so nothing runs on the event loop and nothing waits for a
second worker (no deadlock however many calls are in flight, nested calls included). The worker
hands the result back through the loop's inbox onto a plain loop future: no `asyncio.shield`,
no extra task, no second token per call.

Both hops are batched. Calls queued together (or while a worker delivers the previous outcome)
go through the facade's outbox to one runner on one worker, which serves them one after another
while another worker stands by for any call queued behind one that may block (`_Outbox`); calls
that finish before the loop runs the inbox's drain share its one `loop.call_soon_threadsafe`
(one self-pipe write, one wake-up; `_Inbox`). With many awaiters in flight that is a fraction of
a thread wake-up per call, instead of two.

Cancelling the awaiting task cancels the call's own token (never the caller's), waits until the
call has settled (its body joined, its observers notified), then raises `asyncio.CancelledError`.
The token is cancelled from toolreg's helper thread, never from the loop, because cancelling runs
every callback registered on the call's token. A call still queued for a worker when its task is
cancelled is claimed back and never starts (`ABORTED_BEFORE_DISPATCH`, observers notified off
the loop). The facade never swallows or converts a cancellation, so `Task.cancelling()` and
`uncancel()` stay balanced and `asyncio.timeout()` / `asyncio.wait_for()` around `execute` work.
Under anyio (Starlette, FastAPI, MCP servers), which re-delivers cancellation at every await in
a cancelled scope, the wait for settlement runs inside a shielded anyio scope, so it sleeps
instead of spinning while an uncooperative body drains.

Example::

    async with AsyncToolRegistry(registry) as areg:
        result = await areg.execute("search", {"q": "x"})
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ._batch import BatchHost, Progress, check_batch, execute_batch
from ._body import owned_call
from ._call import CallMode, CallState
from ._cancel import CancelSource, CancelToken, caller_token
from ._claim import Claim, claim
from ._dispatch import dispatcher_of
from ._errors import ExecutorRefusedError, InsideCallError, RegistryClosedError
from ._helper import HELPER
from ._pool import WorkerPool
from ._progress import ProgressSink, ToolProgress
from ._results import ToolCall, ToolResult
from ._validate import wait_timeout

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._registry import ToolRegistry

__all__ = ["AsyncToolRegistry"]

_NEVER = CancelToken.never()
_AWAITED = CallMode.awaited(True)
_AWAITED_MODEL = CallMode.awaited(False)

logger = logging.getLogger("toolreg")


class AsyncHost(BatchHost, Protocol):
    """What the facade needs from the dispatcher of the registry it wraps: a batch's needs,
    plus whether bodies run on the registry's own pool and a wake-up when nothing is in flight."""

    def has_own_pool(self) -> bool: ...

    def call_when_idle(self, callback: Callable[[], object]) -> Callable[[], None] | None: ...


HELPER.start()  # at import, before any loop runs: no loop ever waits for its threads to start


class AsyncToolRegistry:
    """Async access to a `ToolRegistry`: same arguments, same results, same guarantees.

    The facade runs awaited calls on the registry's own pool and batch schedulers on a small
    pool of its own (a scheduler waits for body workers, so it must not occupy one).

    Ownership follows the project's one rule: a component closes what it created, never what
    it was given. So `aclose()` (or leaving `async with`) stops the facade's own scheduler
    threads and leaves the registry open; whoever created the registry closes it (from async
    code without blocking the loop: `await asyncio.to_thread(registry.close)`).
    """

    def __init__(self, registry: ToolRegistry) -> None:
        dispatcher = dispatcher_of(registry)
        if dispatcher is None:
            raise TypeError(
                f"AsyncToolRegistry wraps a ToolRegistry, got {type(registry).__name__}"
            )
        self._registry = registry
        self._dispatcher = dispatcher
        self._schedulers: WorkerPool | None = None  # created on the first awaited batch
        # Awaited calls bound for the registry's own pool (a caller's executor gets each call
        # through its own submit(), from the helper thread).
        self._outbox = _Outbox(dispatcher) if dispatcher.has_own_pool() else None
        self._lock = threading.Lock()  # guards _schedulers

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
        loop = asyncio.get_running_loop()  # before entry: without a loop nothing is counted in
        call, owned = owned_call(call_or_name, arguments)  # a name: made and owned here
        caller = _NEVER if token is None else caller_token(token)
        sink = None if progress is None else _loop_progress(loop, progress)
        mode = _AWAITED if start_if_cancelled else _AWAITED_MODEL
        inbox = _inbox_for(loop)
        job = _AwaitedCall(self._dispatcher, loop, inbox, call, owned, caller, mode, sink)
        self._enter(job)
        try:  # awaited right here, not in a helper coroutine: one coroutine per call
            ok, value = await job.waiter
        except asyncio.CancelledError:
            await job.settle_cancelled(cancel_reason)
            raise  # the task's own cancellation, unconverted: cancelling()/uncancel() hold
        if not ok:
            raise value
        result: ToolResult[Any] = value
        return result

    async def execute_batch(
        self,
        calls: Iterable[ToolCall],
        *,
        token: CancelToken | None = None,
        max_parallel: int = 8,
        on_progress: Progress | None = None,
    ) -> list[ToolResult[Any]]:
        """`ToolRegistry.execute_batch`, awaited; cancelling the task cancels the batch.

        `on_progress(done, total)` runs on the scheduler's thread (not the event loop).
        """
        loop = asyncio.get_running_loop()
        batch = check_batch(calls, max_parallel)
        caller = caller_token(token)
        if on_progress is not None and not callable(on_progress):
            raise TypeError("on_progress must be callable")
        inbox = _inbox_for(loop)
        job = _AwaitedBatch(self._dispatcher, loop, inbox, batch, caller, max_parallel, on_progress)
        self._enter(job)
        try:
            ok, value = await job.waiter
        except asyncio.CancelledError:
            await job.settle_cancelled(None)
            raise  # the task's own cancellation, unconverted: cancelling()/uncancel() hold
        if not ok:
            raise value
        results: list[ToolResult[Any]] = value
        return results

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Await until no call of the registry is in flight, without blocking the loop.

        The same as `ToolRegistry.wait_idle`: True when idle, False if `timeout` seconds ran
        out first; `RuntimeError` from inside one of the registry's own calls.
        """
        dispatcher = self._dispatcher
        if dispatcher.inside():
            raise InsideCallError("wait_idle() from inside one of this registry's calls would wait")
        seconds = wait_timeout(timeout)
        loop = asyncio.get_running_loop()
        idle: asyncio.Future[None] = loop.create_future()
        forget = dispatcher.call_when_idle(lambda: _deliver(loop, idle, None))
        if forget is None:
            return True
        try:
            await asyncio.wait((idle,), timeout=seconds)
            return idle.done()
        finally:
            forget()

    def _enter(self, job: _Job) -> None:
        """Count the job in and hand it to a worker; the caller awaits `job.waiter`.

        The job counts itself out when its work is done (on the worker, observers included),
        so a loop that is closed with the call in flight leaves nothing counted in.
        """
        dispatcher = self._dispatcher
        # Entry: close() waits for it. Admission may cancel the job at once (a close() that
        # began meanwhile), and the helper may then count it out before admit() returns: its
        # key is known from the start.
        _admit(dispatcher, job)
        try:
            self._submit(job)
        except BaseException:
            dispatcher.untrack(job.key)
            raise

    def _submit(self, job: _Job) -> None:
        """Hand the job to a worker without blocking the loop (no thread starts here)."""
        dispatcher = self._dispatcher
        if isinstance(job, _AwaitedBatch) or dispatcher.on_body_thread(threading.get_ident()):
            # A batch's scheduler waits for body workers, and a call from an async body is
            # awaited by that body's worker: neither may occupy a body worker.
            pool = self._scheduler_pool()
            try:
                pool._hand_over(job, may_block=False)
            except RuntimeError as exc:  # shut down by aclose()
                job.refuse(exc)
        elif self._outbox is not None:
            self._outbox.put(job)
        else:  # a caller's executor may start a thread in submit(): do it off the loop
            HELPER.call_soon(lambda: _hand_over_or_refuse(dispatcher, job))

    def _scheduler_pool(self) -> WorkerPool:
        with self._lock:
            if self._schedulers is None:
                self._schedulers = WorkerPool(64, "toolreg-aio-batch")
            return self._schedulers

    async def aclose(self) -> None:
        """Stop the facade's own threads (without blocking the loop); the registry stays open.

        Awaited batches still running keep their scheduler until they end. Idempotent.
        """
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        with self._lock:
            schedulers, self._schedulers = self._schedulers, None
        if schedulers is not None:
            schedulers.shutdown(wait=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncToolRegistry {self._registry!r}>"


def _reason(cancel_reason: object) -> object:
    if cancel_reason is not None:
        return cancel_reason
    task = asyncio.current_task()
    return f"asyncio task {task.get_name() if task else '?'} was cancelled"


def _admit(dispatcher: AsyncHost, job: _Job) -> None:
    """Count the job in; `RegistryClosedError` if closed, or closing unless nested.

    Whether this thread is inside one of the registry's calls (a nested call, admitted while
    the registry closes) is looked up only when it matters: the lookup scans the calls in
    flight, and an open registry admits every call.
    """
    try:
        dispatcher.admit(job, False)
    except RegistryClosedError:
        if not dispatcher.inside():
            raise
        dispatcher.admit(job, True)  # nested: admitted (and cancelled) unless closed


def _hand_over_or_refuse(dispatcher: AsyncHost, job: _Job) -> None:
    try:
        dispatcher.hand_over(job)
    except BaseException as exc:
        job.refuse(exc)


class _Job(Claim):
    """One awaited call or batch: claimed once, by the worker that runs it or by a canceller.

    Its outcome goes back to the loop through the loop's `_Inbox` onto `waiter`, a plain loop
    future; after a cancellation a fresh future is awaited for settlement (on the loop thread,
    so the swap needs no lock).
    """

    __slots__ = (
        "_cancel_reason",
        "_state",
        "delivered",
        "dispatcher",
        "inbox",
        "key",
        "loop",
        "outcome",
        "waiter",
    )

    def __init__(
        self, dispatcher: AsyncHost, loop: asyncio.AbstractEventLoop, inbox: _Inbox
    ) -> None:
        super().__init__()
        self.dispatcher = dispatcher
        self.loop = loop
        self.inbox = inbox
        self.waiter: asyncio.Future[tuple[bool, Any]] = loop.create_future()
        self.outcome: tuple[bool, Any] | None = None  # set on the loop thread
        # Set once, by whoever finishes the job, before it is posted to the inbox.
        self.delivered: tuple[bool, Any] | None = None
        self._cancel_reason: object = _NOT_CANCELLED  # set by the canceller
        self._state: CallState | None = None  # the running call's state (awaited calls)
        self.key = id(self)  # its place in the in-flight table (the key track() gives it)

    def _work(self) -> Any:
        raise NotImplementedError

    def _never_started(self, reason: object) -> Any:
        """The results of work that never started because of `reason` (observed)."""
        raise NotImplementedError

    def _cancel_running(self, reason: object) -> None:
        raise NotImplementedError

    # -- the worker ------------------------------------------------------------------------------

    def _run(self) -> None:
        """On a worker: run the work unless a canceller claimed it; deliver its outcome."""
        if claim(self):
            self._finish(self._work)

    def _drop(self) -> None:
        if claim(self):
            HELPER.call_soon(lambda: self._finish(self._dropped))

    def _dropped(self) -> Any:
        return self._never_started("the executor dropped the call")

    def _finish(self, produce: Callable[[], Any]) -> None:
        self._deliver(self._outcome(produce))

    def _outcome(self, produce: Callable[[], Any]) -> tuple[bool, Any]:
        """What `produce()` returned or raised; the job is counted out once it is done."""
        try:
            outcome: tuple[bool, Any] = (True, produce())
        except BaseException as exc:
            outcome = (False, exc)
        finally:
            self.dispatcher.untrack(self.key)  # in flight until here: observers included
        return outcome

    def _deliver(self, outcome: tuple[bool, Any]) -> None:
        """From any thread: hand the outcome to the loop, which settles it (`settle`)."""
        self.delivered = outcome
        self.inbox.post(self)

    # -- the loop ----------------------------------------------------------------------------------

    def cancel(self, reason: object) -> None:
        """Claim it if no worker took it yet (it never starts), else cancel the running call.

        Both the unstarted results (observers) and the token's cancellation (its callbacks) are
        user code, so they run on the helper thread; the claim itself is decided right here.
        """
        if claim(self):
            HELPER.call_soon(lambda: self._finish(lambda: self._never_started(reason)))
        else:
            self._cancel_reason = reason
            HELPER.call_soon(lambda: self._cancel_running(reason))

    def refuse(self, exc: BaseException) -> None:
        """The executor would not take the job (it was shut down): fail the awaiting task."""
        if claim(self):
            self.dispatcher.untrack(self.key)
            refused = ExecutorRefusedError(f"the executor refused the call: {exc}")
            self._deliver((False, refused))

    async def settle_cancelled(self, cancel_reason: object) -> None:
        """The awaiting task was cancelled: cancel the job unless its outcome is in already,
        and wait until it has settled."""
        if self.outcome is None:
            self.cancel(_reason(cancel_reason))
            await self.settled()

    async def settled(self) -> None:
        """After a cancellation: wait until the outcome is in, without spinning."""
        if self.outcome is not None:
            return
        self.waiter = self.loop.create_future()
        await _wait_settled(self.waiter)

    def settle(self) -> None:
        """On the loop (the inbox's drain): record the outcome and wake whoever awaits it."""
        outcome = self.delivered
        assert outcome is not None  # posted only once delivered
        self.outcome = outcome
        waiter = self.waiter
        if not waiter.done():
            waiter.set_result(outcome)


class _Inbox:
    """The outcomes bound for one event loop, settled by one loop callback per batch.

    A job that finishes appends itself here and wakes the loop (`call_soon_threadsafe`: a
    self-pipe write, during which the worker gives up the GIL) only if no drain is scheduled
    yet, so the calls that finish before the loop gets to run the drain share one wake-up.

    No lock: a deque's append and popleft are atomic, only the loop pops, and the drain clears
    `_scheduled` *before* it pops, so a job appended after the drain's last pop finds it cleared
    and schedules a drain of its own (at worst an extra, empty one). Without a lock, a fork in
    the middle of a post leaves nothing locked in the child either.
    """

    __slots__ = ("_jobs", "_scheduled", "owner")

    def __init__(self, owner: Callable[[], asyncio.AbstractEventLoop | None]) -> None:
        self.owner = owner  # the loop, weakly: a thread's cached inbox does not keep it alive
        self._jobs: deque[_Job] = deque()
        self._scheduled = False  # a drain is scheduled on the loop and has not started yet

    def post(self, job: _Job) -> None:
        """From any thread: queue the delivered job; wake the loop if no drain is due."""
        jobs = self._jobs
        jobs.append(job)
        if self._scheduled:
            return
        self._scheduled = True
        try:
            job.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # a closed loop: nobody is waiting any more
            jobs.clear()  # what other threads posted meanwhile is as dead: let it go
            self._scheduled = False

    def _drain(self) -> None:
        """On the loop: settle every job posted so far."""
        self._scheduled = False  # before popping: a later post schedules the next drain
        jobs = self._jobs
        while jobs:
            jobs.popleft().settle()


class _Outbox:
    """Awaited calls bound for the registry's own pool, served by runners on its workers.

    Handing every call to a worker of its own wakes one worker per call. Here the loop queues
    the call, and a runner (a `_Runner` handed to the pool) serves queued calls one after the
    other until none is left; the loop hands a runner over only if no runner is *ready*, that
    is about to look at the queue: the standby (handed over, not started yet) or one that is
    between two calls. So calls that arrive together, or while a runner delivers the previous
    outcome, wake no other worker, and sequential calls keep one warm worker.

    A runner that takes a call while others still wait makes sure one runner is ready (it
    hands a standby over if none is), so a body that blocks holds up none of the calls queued
    behind it: each gets a worker of its own if it needs one, as with a hand-off per call (no
    deadlock however many calls are in flight). A standby that starts while another runner is
    ready leaves the queue to that one: quick calls are served by one worker, not passed along
    a chain. Invariant: while calls are queued, a runner is ready.
    """

    __slots__ = ("__weakref__", "_dispatcher", "_jobs", "_lock", "_looking", "_standby")

    def __init__(self, dispatcher: AsyncHost) -> None:
        self._dispatcher = dispatcher
        # Guards _jobs, _standby and _looking; held for a few list and counter operations,
        # never while a call runs or a runner is handed over.
        self._lock = threading.Lock()
        self._jobs: deque[_Job] = deque()
        self._standby: _Runner | None = None  # handed over, not started: at most one counts
        self._looking = 0  # runners between two calls: each takes the next one next
        _OUTBOXES.add(self)

    def put(self, job: _Job) -> None:
        """On the loop: queue the job; hand a runner to the pool unless one is ready."""
        runner = None
        try:
            lock = self._lock
            lock.acquire()  # not `with`: its lookups cost more than this block (once per call)
            try:
                self._jobs.append(job)
                if self._standby is not None or self._looking:
                    return
                runner = self._standby = _Runner(self)
            finally:
                lock.release()
            self._hand_over(runner, _busy(job.loop))
        except BaseException:  # a signal handler's exception, wherever it landed in here
            self._after_interrupt(runner)
            raise

    def _hand_over(self, runner: _Runner, goes_on: bool = False) -> None:
        """`goes_on`: the loop has other callbacks to run first (`_busy`): the worker is woken
        without being given the CPU, so the calls those callbacks queue join this runner's
        queue instead of each waiting for the loop to get the GIL back."""
        try:
            self._dispatcher.hand_over(runner, may_block=False, goes_on=goes_on)
        except RuntimeError as exc:  # the pool was shut down: nothing will run what is queued
            for queued in self._lost(runner):
                queued.refuse(exc)

    def _after_interrupt(self, runner: _Runner | None) -> None:
        """An interrupt cut `put()` short, maybe before `runner` was handed over: it stops
        being the standby (if it runs after all, it is one runner more), and a new standby
        is handed over if the queue has no ready runner then."""
        with self._lock:
            if runner is not None and self._standby is runner:
                self._standby = None
            if not self._jobs or self._standby is not None or self._looking:
                return
            replacement = self._standby = _Runner(self)
        self._hand_over(replacement)

    def _serve(self, runner: _Runner) -> None:
        """On a worker: serve queued calls until none is left (unless another runner is ready)."""
        with self._lock:
            if self._standby is runner:
                self._standby = None
            if self._standby is not None or self._looking:  # another runner is ready
                return
            job, spawn = self._take()
        while job is not None:
            if spawn is not None:  # the calls behind this one must not wait for it: it may block
                self._hand_over(spawn)
            try:
                self._run_one(job)
            except BaseException:  # a job never raises; if one did, the queue is still served
                logger.exception("toolreg: an awaited call raised on its runner")
            del job  # not held while this runner waits for the GIL or the lock
            lock = self._lock
            lock.acquire()  # not `with`, as in `put`
            try:
                self._looking -= 1
                job, spawn = self._take()
            finally:
                lock.release()

    def _run_one(self, job: _Job) -> None:
        """Run the job unless a canceller claimed it; deliver its outcome."""
        outcome = None
        try:
            if claim(job):
                outcome = job._outcome(job._work)
        finally:
            lock = self._lock
            lock.acquire()  # not `with`, as in `put`
            try:
                self._looking += 1  # ready again, before the outcome wakes the loop to queue more
            finally:
                lock.release()
        if outcome is not None:
            job._deliver(outcome)

    def _take(self) -> tuple[_Job | None, _Runner | None]:
        """With the lock held: the next call (None: none is left) and, if others wait and no
        runner is ready, the standby to hand over before running it."""
        jobs = self._jobs
        if not jobs:
            return None, None
        job = jobs.popleft()
        if jobs and self._standby is None and not self._looking:
            spawn = self._standby = _Runner(self)
            return job, spawn
        return job, None

    def _lost(self, runner: _Runner) -> list[_Job]:
        """`runner` will never run: if no other runner is ready, take the queue."""
        with self._lock:
            if self._standby is runner:
                self._standby = None
            if self._standby is not None or self._looking:
                return []
            queued = list(self._jobs)
            self._jobs.clear()
            return queued

    def _dropped(self, runner: _Runner) -> None:
        """The pool discarded `runner` (shutdown): the calls it would serve never start."""
        for queued in self._lost(runner):
            queued._drop()

    def _after_fork_in_child(self) -> None:
        # The parent's runners are not in the child (its pool starts afresh), nor are its calls;
        # the lock may have been held by one of its threads.
        self._lock = threading.Lock()
        self._jobs = deque()
        self._standby = None
        self._looking = 0


def _busy(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop` has callbacks ready to run after the current one (asyncio's own loops
    keep them in `_ready`; a loop without one is taken as idle)."""
    return bool(getattr(loop, "_ready", None))


class _Runner:
    """One hand-off of an outbox to the pool: a pool work item."""

    __slots__ = ("outbox",)

    def __init__(self, outbox: _Outbox) -> None:
        self.outbox = outbox

    def _run(self) -> None:
        self.outbox._serve(self)

    def _drop(self) -> None:
        self.outbox._dropped(self)


_OUTBOXES: weakref.WeakSet[_Outbox] = weakref.WeakSet()


def _reset_outboxes_in_child() -> None:
    for outbox in list(_OUTBOXES):
        outbox._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_outboxes_in_child)


_LOCAL = threading.local()  # per thread: `inbox`, the inbox of the loop last run on it


def _inbox_for(loop: asyncio.AbstractEventLoop) -> _Inbox:
    """The inbox of `loop`, the loop running on this thread (cached per thread)."""
    inbox: _Inbox | None = getattr(_LOCAL, "inbox", None)
    if inbox is not None and inbox.owner() is loop:
        return inbox
    try:
        owner: Callable[[], asyncio.AbstractEventLoop | None] = weakref.ref(loop)
    except TypeError:  # a loop without weak references: an inbox per call, none cached
        return _Inbox(lambda: loop)
    inbox = _LOCAL.inbox = _Inbox(owner)
    return inbox


def _forget_inbox_in_child() -> None:
    # A fork may copy an inbox whose drain was being scheduled by a thread that is gone, so
    # it would never drain again: the child's loops start with fresh ones.
    _LOCAL.__dict__.pop("inbox", None)


os.register_at_fork(after_in_child=_forget_inbox_in_child)


_NOT_CANCELLED = object()


class _AwaitedCall(_Job):
    __slots__ = ("call", "caller", "context", "mode", "owned", "progress")

    def __init__(
        self,
        dispatcher: AsyncHost,
        loop: asyncio.AbstractEventLoop,
        inbox: _Inbox,
        call: ToolCall,
        owned: bool,
        caller: CancelToken,
        mode: CallMode,
        progress: ProgressSink | None,
    ) -> None:
        super().__init__(dispatcher, loop, inbox)
        self.call = call
        self.owned = owned  # the facade made `call` from a name: nothing else has seen it
        self.caller = caller
        self.mode = mode
        self.progress = progress
        self.context = contextvars.copy_context()  # like asyncio.to_thread

    def _work(self) -> ToolResult[Any]:
        result, interrupted = self.context.run(
            self.dispatcher.run,
            self.call,
            self.caller,
            self.mode,
            self.progress,
            None,
            self.watch,
            self.owned,
        )
        if interrupted is not None:  # a hook raised SystemExit/KeyboardInterrupt: as in sync
            raise interrupted
        return result

    def watch(self, state: CallState) -> None:
        """The dispatcher made the call's state: a cancellation that came first applies now."""
        self._state = state
        reason = self._cancel_reason
        if reason is not _NOT_CANCELLED:
            state.cancel(reason)

    def _cancel_running(self, reason: object) -> None:
        state = self._state
        if state is not None:
            state.cancel(reason)

    def _never_started(self, reason: object) -> ToolResult[Any]:
        # In the awaiting task's context, like the call it replaces (call hooks see it there).
        result, interrupted = self.context.run(self.dispatcher.unstarted, self.call, reason)
        if interrupted is not None:  # a call hook raised SystemExit/KeyboardInterrupt: as _work
            raise interrupted
        return result


class _AwaitedBatch(_Job):
    __slots__ = ("batch", "caller", "context", "max_parallel", "on_progress", "turn")

    def __init__(
        self,
        dispatcher: AsyncHost,
        loop: asyncio.AbstractEventLoop,
        inbox: _Inbox,
        batch: list[ToolCall],
        caller: CancelToken,
        max_parallel: int,
        on_progress: Progress | None,
    ) -> None:
        super().__init__(dispatcher, loop, inbox)
        self.batch = batch
        self.caller = caller
        self.max_parallel = max_parallel
        self.on_progress = on_progress
        self.turn = CancelSource(caller)  # the awaiting task's cancellation cancels the batch
        self.context = contextvars.copy_context()

    def _work(self) -> list[ToolResult[Any]]:
        try:
            return self.context.run(
                execute_batch,
                self.dispatcher,
                self.batch,
                self.turn.token,
                self.max_parallel,
                self.on_progress,
            )
        finally:
            self.turn.close()

    def _cancel_running(self, reason: object) -> None:
        self.turn.cancel(reason)

    def _never_started(self, reason: object) -> list[ToolResult[Any]]:
        self.turn.close()
        # In the awaiting task's context, like the batch it replaces (call hooks see it there).
        results: list[ToolResult[Any]] = self.context.run(self._unstarted, reason)
        return results

    def _unstarted(self, reason: object) -> list[ToolResult[Any]]:
        results: list[ToolResult[Any]] = []
        first: BaseException | None = None
        for call in self.batch:  # every call observed, then the first interrupt (as a batch)
            result, interrupted = self.dispatcher.unstarted(call, reason)
            results.append(result)
            if first is None:
                first = interrupted
        if first is not None:
            raise first
        return results


def _deliver(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], outcome: Any) -> None:
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
        loop.call_soon_threadsafe(_settle, future, outcome)


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    if not future.done():
        future.set_result(outcome)


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
