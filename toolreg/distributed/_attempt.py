"""One remote attempt on the caller's side: submit, listen, join, release (`Attempt`).

The registry calls a remote body's runner on the stage thread (see `_catalog.Runner`); each run is
one attempt, a Dask task with a key of its own:

1. Hand the attempt to its backend's `Groups`, which submit `_worker.run_remote` under a fresh
   key (with whatever other attempts wait: one `client.map`) and follow the future on the
   client's event loop; then listen on the body's token. On the main thread a Ctrl-C is held
   back for those few lines (`deferred_sigint`), so it lands once the task is handed over.
2. The token's cancellation sends `toolreg_cancel` to the board, from the client's event loop
   (the cancelling thread only schedules it; the groups send it with the cancels waiting). The
   board's answer `refused` means the body never started and never will: the join ends at
   once, even while every worker thread is busy, and the registry reports
   `ABORTED_BEFORE_DISPATCH`. Otherwise the worker's watcher cancels the body's own token,
   with the reason.
3. Join: the stage thread waits for the attempt's messages (progress, then its end: the
   outcome comes with the groups' next gather once the task finished), on the main thread in
   slices so a Ctrl-C is noticed; an exception landing there goes to `ctx._interrupt` (which
   cancels the call) and the join goes on until the body settled.
4. Release the Dask future only once no cancel is on its way to the board: the board deletes
   the record when the scheduler forgets the task, and a cancel arriving after that would leave
   a refusal behind for a task that is gone.

The loop-side state of an attempt (`_decided`, `_cancelling`, `_settled`) is only touched on
the client's event loop, so it needs no lock; the stage thread and the loop talk through the
attempt's `SimpleQueue` and `loop.add_callback`. The thread that submits a group sets each
attempt's future before any of them is followed (`submitted`, then `Groups` schedules the
follows), and the joiner reads it only on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any, cast

from distributed import Client
from distributed.client import done_callback as _done_callback
from distributed.scheduler import KilledWorker

from .._body import NotStarted, ToolContext
from .._cancel import CancelToken, Registration
from .._interrupts import INTERRUPTS, MAIN_THREAD_SLICE, deferred_sigint
from ._board import REFUSED
from ._groups import Arguments, Groups
from ._outcome import (
    ERROR,
    LOST,
    VALUE,
    Outcome,
    RemoteToolError,
    RemoteWorkerLost,
    dump_reason,
    load_contexts,
    load_error,
    load_value,
)

__all__ = ["Attempt", "deliver"]

logger = logging.getLogger("toolreg")

# How often a joiner off the main thread checks that the client lives. `_follow` reports a
# client closed during the call; this covers a client whose event loop stopped before `_follow`
# resumed (close() stops the loop it owns right after releasing the keys), when nothing else
# would ever post the attempt's end.
_CHECK_SECONDS = 1.0
_CLOSED = ("closing", "closed")  # Client.status once close() has begun

_until_done: Any = _done_callback  # `await _until_done(future, cb)`: distributed is untyped here

Message = tuple[Any, ...]  # ("progress", p, total, msg) | ("outcome", Outcome) | ("refused",)
# | ("failed", exception)


class Attempt:
    """One Dask task of a remote body: its submission, cancellation, join and release."""

    def __init__(self, client: Client, groups: Groups, key: str, token: CancelToken) -> None:
        self._client: Any = cast(Any, client)  # distributed is only partly typed
        self._groups = groups
        self.key = key
        self._token = token
        self._inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self.queued = False  # handed to the groups (`Groups.submit` sets it)
        self._future: Any = None  # the attempt's distributed.Future, until released
        # Touched on the client's event loop only:
        self._decided = False  # the end of the attempt was posted
        self._cancelling = 0  # cancels on their way to the board
        self._settled = False  # the joiner is done with the attempt
        self._task: asyncio.Future[None] | None = None  # kept: the loop holds tasks weakly

    # -- the stage thread --------------------------------------------------------------------

    def start(self, ctx: ToolContext, arguments: Arguments, listen: bool) -> Registration | None:
        """Hand the attempt to Dask (`Groups.submit`: it is then followed) and, if `listen`,
        listen on the body's token; the listener to remove after the join. Raises only if
        the attempt never reached the groups: `NotStarted` after an interrupt.

        On the main thread a Ctrl-C is held back until both are done (then it cancels the
        call like any interrupt), so no press can leave a task that nobody follows.
        """
        listener: Registration | None = None
        try:
            with deferred_sigint():
                self._groups.submit(self, arguments)
                if listen:
                    listener = self._token.on_cancel(self.cancel)
        except BaseException as exc:
            if not self.queued:  # nothing reached Dask
                _interrupt(ctx, exc)
                raise NotStarted from exc
            _interrupt(ctx, exc)  # the press held back: the call's token is cancelled now
            # Raised by an application's own handler mid-way: finish what it cut short (the
            # call's token is cancelled now, so the listener runs at once). Listening twice
            # is harmless: the first cancel counts.
            if listen and listener is None:
                listener = self._token.on_cancel(self.cancel)
        return listener

    def submitted(self, future: Any) -> None:
        """Its task exists (set by the thread that submitted its group, before following)."""
        self._future = future

    def interrupted(self, exc: BaseException, own: bool) -> None:
        """Submitting its group was interrupted (by `exc`, in the submitting thread) before its
        future came back: whether its task reached Dask is unknown, so its claim is refused on
        the board. The attempt of the interrupted thread ends as never started (`NotStarted`:
        that call is cancelled), any other as a `RemoteToolError` saying so (docs/contract.md,
        A.11: the one edge left)."""
        reason = dump_reason(type(exc).__name__)
        if own:
            self._client.loop.add_callback(self._cancel_now, reason)
            return
        failure = RemoteToolError(
            f"submitting the remote body was interrupted by {type(exc).__name__}; it never starts"
        )
        self._client.loop.add_callback(self._fail_and_refuse, failure, reason)

    def join(self, ctx: ToolContext, listener: Registration | None) -> Message:
        """Wait for the attempt's end, relaying progress; interrupts cancel, never cut it short."""
        try:
            return self._wait(ctx)
        finally:
            if listener is not None:
                listener.remove()  # waits for a callback running now: it scheduled its cancel

    def _wait(self, ctx: ToolContext) -> Message:
        main = threading.current_thread() is threading.main_thread()
        slice_ = MAIN_THREAD_SLICE if main else _CHECK_SECONDS
        inbox = self._inbox
        while True:
            try:
                message = inbox.get(timeout=slice_)
            except queue.Empty:
                if self._client.status in _CLOSED:
                    return ("failed", _client_closed())
                continue
            except BaseException as exc:  # asynchronous: nothing else runs on this line
                _interrupt(ctx, exc)
                continue
            if message[0] != "progress":
                return message
            try:
                ctx.report_progress(*message[1:])
            except INTERRUPTS as exc:  # raised by the progress callback (on this thread)
                _interrupt(ctx, exc)
            except Exception:
                logger.exception("toolreg: relaying the progress of %s failed", self.key)

    def cancel(self) -> None:
        """The body's token was cancelled (any thread): tell the board, from the client's loop."""
        self._client.loop.add_callback(self._cancel_now, dump_reason(self._token.reason))

    def settle(self) -> None:
        """The joiner is done: release the future once no cancel is on its way."""
        self._client.loop.add_callback(self._settle_now)

    def post(self, message: Message) -> None:
        self._inbox.put(message)

    # -- the client's event loop -------------------------------------------------------------

    @property
    def future(self) -> Any:
        return self._future

    @property
    def following(self) -> bool:
        """Its end is still to be decided (and its future not released)."""
        return not self._decided and self._future is not None

    def follow(self) -> None:
        """Wait for its task to finish; a finished one's outcome comes with the next gather."""
        self._task = asyncio.ensure_future(self._await_finish())

    async def _await_finish(self) -> None:
        future = self._future
        await _until_done(future, _ignore)
        if future.status == "finished":
            if self.following:
                self._groups.finished(self)
        else:  # erred or cancelled: the gather tells why
            await self._follow_alone()

    def follow_alone(self) -> None:
        """Fetch its outcome (or its failure) with a gather of its own."""
        self._task = asyncio.ensure_future(self._follow_alone())

    async def _follow_alone(self) -> None:
        future = self._future
        if future is None or self._decided:
            return
        try:
            outcome = await self._client.gather(future, asynchronous=True)
        except BaseException as exc:  # erred or cancelled: KilledWorker, a lost scheduler, ...
            # Closing the client releases every key: the future's cancel is not the task's end.
            closed = self._client.status in _CLOSED
            self.decide(("failed", _client_closed() if closed else exc))
        else:
            self.decide(("outcome", outcome))

    def decide(self, message: Message) -> None:
        if not self._decided:
            self._decided = True
            self._inbox.put(message)

    def _fail_and_refuse(self, failure: RemoteToolError, reason: bytes) -> None:
        self.decide(("failed", failure))
        self._cancel_now(reason)

    def _cancel_now(self, reason: bytes) -> None:
        if self._settled:
            return
        self._cancelling += 1
        self._groups.cancel(self, reason)

    def cancel_answered(self, phase: str | None) -> None:
        """The board's answer to one of its cancels (None: the scheduler was unreachable)."""
        self._cancelling -= 1
        if phase == REFUSED:
            self.decide(("refused",))
        if self._settled and not self._cancelling:
            self._release()

    def _settle_now(self) -> None:
        self._settled = True
        if not self._cancelling:
            self._release()

    def _release(self) -> None:
        future, self._future = self._future, None
        if future is not None:
            future.release()


def _ignore(future: Any) -> None:
    """`_until_done` calls back; the attempt reads the future itself."""


def _interrupt(ctx: ToolContext, exc: BaseException) -> None:
    """An exception landed in the join: cancel the call (re-raised once it is complete)."""
    interrupt = ctx._interrupt
    if interrupt is None:  # pragma: no cover - a runner always has one while it runs
        raise exc
    interrupt(exc)


def deliver(message: Message, ctx: ToolContext) -> Any:
    """The attempt's end as the runner's return value or exception."""
    kind = message[0]
    if kind == "refused":
        raise NotStarted
    if kind == "failed":
        raise _failure(message[1], ctx)
    outcome: Outcome = message[1]
    if outcome.kind == VALUE or outcome.kind == ERROR:
        for item in load_contexts(outcome):
            ctx.defer_context(item)
        if outcome.kind == ERROR:
            raise load_error(outcome)
        return load_value(outcome)
    if outcome.kind == LOST:
        raise _lost(ctx)
    if ctx.token.cancelled:  # REFUSED: the caller's cancel reached the board first
        raise NotStarted
    raise RemoteToolError(
        "the scheduler's claim board did not know the call, so it never started (was the "
        "scheduler restarted?)"
    )


def _failure(exc: BaseException, ctx: ToolContext) -> Exception:
    if isinstance(exc, KilledWorker):  # Dask gave up after losing workers: never rerun
        return _lost(ctx)
    if isinstance(exc, RemoteToolError):
        return exc
    error = RemoteToolError(f"the Dask task of the call failed: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def _client_closed() -> RemoteToolError:
    return RemoteToolError("the Dask client was closed during the call; its outcome is unknown")


def _lost(ctx: ToolContext) -> RemoteWorkerLost:
    return RemoteWorkerLost(
        f"remote worker lost while running {ctx.call.name!r} (call {ctx.call.call_id}); "
        "its outcome is unknown, and it is not run again"
    )
