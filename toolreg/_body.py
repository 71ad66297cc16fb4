"""One start of a tool body: `ToolContext`, which is both what the body sees and the work item.

A `ToolContext` is made for every start of a body (a retrying wrapper makes several per call).
Handed to a worker as it is (no `Future`, no wrapper), it is claimed exactly once (`Claim`):

* by the thread that runs it (a pool worker, or the stage thread for inline bodies), which then
  checks the body's token once more and starts the body, or
* by a canceller (the call's cancellation, an interrupted joiner, a pool that drops it), which
  marks it never started and wakes the joiner at once: a call cancelled while queued returns
  promptly and its body never starts.

The joiner of a body handed to a worker waits on `_done`, a lock released exactly once by
whoever claimed (an inline body has no joiner and no `_done`); `_settled` is set first, so once
it reads True the outcome is recorded. Joining means this object recorded that
the body returned or raised: the registry never looks at an executor future.
"""

from __future__ import annotations

import functools
import threading
import time
from _thread import LockType
from collections.abc import Callable, Coroutine, Mapping
from threading import get_ident
from typing import Any, NoReturn, Protocol

from . import _interrupts
from ._call import CallState, Stage
from ._cancel import (
    Cancelled,
    CancelSource,
    CancelToken,
    Registration,
    cancelled_at,
    deadline,
    lazy_due_above,
)
from ._claim import Claim, claim
from ._errors import ContextSettledError
from ._interrupts import MAIN_THREAD_SLICE, slice_for, wait_until
from ._logger import logger
from ._outcomes import aborted, failure, success
from ._progress import check_progress
from ._results import ErrorCode, ToolCall, ToolResult, frozen_call, new_call_id
from ._text import describe
from ._traces import notify_traces, run_inside

__all__ = ["BodyHost", "NotStarted", "ToolContext", "rechecked", "run_body"]


_Lock = threading.Lock
_NEVER = CancelToken.never()
_CONTEXT_LOCK = threading.Lock()  # guards every ToolContext's _contexts and _closed (rarely held)
_context_acquire, _context_release = _CONTEXT_LOCK.acquire, _CONTEXT_LOCK.release
_WATCH_LOCK = threading.Lock()  # guards every ToolContext's _overdue (the cancellation path only)


class NotStarted(Exception):
    """Raised by a `_catalog.Runner` whose body never started (refused remotely): no body ran."""


class BodyHost(Protocol):
    """What a body run needs from the dispatcher that runs it."""

    overdue_after: float | None

    @property
    def submit(self) -> Submit:
        """How to hand a body to a worker."""
        ...

    def run_nested(
        self, call: ToolCall, token: CancelToken, watcher: Callable[[CallState], object]
    ) -> ToolResult[Any]:
        """Run a nested call inline, under `token`; `watcher(state)` once it has a state (the
        parent body's `_watch_nested`)."""
        ...

    def run_coroutine(
        self, make: Callable[[], Coroutine[Any, Any, Any]], token: CancelToken
    ) -> Any:
        """Run an `async def` body to completion; cancel it when `token` is cancelled."""
        ...


class ToolContext(Claim):
    """What a running body gets besides its arguments.

    * `call`: the call being executed (frozen arguments).
    * `token`: the token the body must observe: the call's own token (the caller's, plus
      `close()` and Ctrl-C) fused with whatever token the around wrappers left in
      `dispatch.token` (a deadline, say).
    * `defer_context(item)`: keep `item` in the result's `contexts` (kept through cancellation).
    * `execute(call_or_name, arguments=None)`: a nested call, run inline on this thread with
      this call's token as its caller token, so it cannot deadlock on a busy pool; like
      `start_if_cancelled=False`, it starts no body once this call is cancelled.
    * `report_progress(progress, total=None, message=None)`: tell the caller how far along the
      body is (see the method).

    After the body has settled, `defer_context`, `execute` and `report_progress` raise
    `RuntimeError`. A context cannot be pickled: it belongs to this process and this call.

    Example::

        @registry.tool(description="Fetch pages")
        def fetch(args, ctx):
            for n, url in enumerate(args["urls"], 1):
                ctx.token.raise_if_cancelled()
                ctx.report_progress(n, len(args["urls"]))
            ctx.defer_context({"fetched": len(args["urls"])})
            return "done"
    """

    # Not slotted: what most runs never change is a class-level default below, so a run sets
    # only what it must (one is made for every body start).
    _started = False  # the body started (written by the claimant before _done is released)
    _settled = False  # the outcome is recorded, or the body never starts
    _live_on_return = False  # the token was live when the body returned (the body's view)
    _value: Any = None
    _error: BaseException | None = None
    _contexts: list[Any] | None = None  # deferred items; guarded by _CONTEXT_LOCK
    _closed = False  # no more deferring or nesting; guarded by _CONTEXT_LOCK
    _overdue: CancelSource | None = None  # the overdue warning, once cancelled
    _dispatched_at: float | None = None  # monotonic, on the body's thread
    _thread: int | None = None  # the body's thread, set as it starts
    # The nested call this body runs on its own thread now (or ran last), whose body this body's
    # overdue watch starts too (`_watch_nested`); written by the body's thread, read by a canceller.
    _nested: CallState | None = None
    # The body's token is its call's own token: whatever cancels it also starts this body's
    # overdue watch, which then covers the nested call running under it (`_watch_nested`).
    # False for a body given another token (a wrapper's deadline alone may cancel that, and an
    # inline body is not watched for it: contract 4.4).
    _covers_nested = True
    _settled_at: float | None = None
    # Held until the claimant has finished, released once; only a body that is handed to a worker
    # has one (made before anyone can see the context): an inline body has no joiner.
    _done: LockType | None = None
    # A runner joins on the stage thread and reports interrupts there; cleared on settling (it
    # refers to the call's state, which refers to this context).
    _interrupt: Callable[[BaseException], None] | None = None

    call: ToolCall
    token: CancelToken

    def __init__(
        self, state: CallState, token: CancelToken, host: BodyHost, joined: bool = True
    ) -> None:
        self._claim = [True]  # taken once, by the party that owns the start (`Claim`)
        if joined:  # handed to a worker: the joiner waits on `_done`
            self._done = done = _Lock()
            done.acquire()
        # What the run needs of the call, copied: the context never refers back to the call's
        # state (which refers to it), so a finished call is freed without the cyclic GC.
        self.call = state.call
        self.token = token
        self._live = state.live  # the caller's token was live at entry: the recheck applies
        entry = state.entry
        self._fn = entry.tool.fn
        self._is_async = entry.is_async
        runner = self._runner = entry.runner
        if runner is not None:
            self._interrupt = state.interrupt
        self._traces = state.traces
        self._progress = state.progress
        self._host = host

    # -- what the body uses ----------------------------------------------------------------------

    def defer_context(self, item: object) -> None:
        """Keep `item` for the result's `contexts` (in call order); thread-safe."""
        with _CONTEXT_LOCK:
            if self._closed:
                raise ContextSettledError("defer_context() after the tool body has returned")
            if self._contexts is None:
                self._contexts = []
            self._contexts.append(item)

    def execute(
        self, call_or_name: ToolCall | str, arguments: Mapping[str, Any] | None = None
    ) -> ToolResult[Any]:
        """Run a nested tool call inline, under this call's token; returns its `ToolResult`."""
        if self._closed:
            raise ContextSettledError("ctx.execute() after the tool body has returned")
        return self._host.run_nested(
            as_call(call_or_name, arguments), self.token, self._watch_nested
        )

    def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Report progress to the `progress=` callback of the `execute` that runs this call.

        `progress` and `total` are real numbers (`TypeError` for a bool or a non-number,
        `ValueError` for NaN or an infinity), `message` a str or None. A value not greater
        than the last one reported for this call (across retry attempts) is dropped, so the
        callback only ever sees increasing values. The sync callback runs on this thread; an
        awaited call's callback is scheduled on its event loop. Progress of a nested call's
        body is dropped. Raises `RuntimeError` after the body has settled.
        """
        check_progress(progress, total, message)
        if self._closed:
            raise ContextSettledError("report_progress() after the tool body has returned")
        sink = self._progress
        if sink is not None:
            sink.report(self.call, progress, total, message)

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "a ToolContext cannot be pickled: it belongs to one call in this process "
            "(pass what the work needs, e.g. ctx.call.arguments)"
        )

    def __repr__(self) -> str:
        return f"<ToolContext {self.call.name!r} call_id={self.call.call_id!r}>"

    # -- the party that runs the body ----------------------------------------------------------

    def _run(self) -> None:
        """Start the body here if nobody claimed it, and if its token allows; never raises."""
        if not claim(self):
            return  # a canceller owns it: it never starts, and the joiner was woken already
        try:
            if self._live and self.token.cancelled:
                return  # the last recheck: cancelled while queued, so it never starts
            self._started = True
            self._thread = get_ident()
            self._dispatched_at = time.monotonic()
            if not self._live:
                self._watch_overdue()  # pre-aborted: it starts under a cancelled token
            try:
                if self._traces:
                    value = run_inside(self._traces, self, self._call_body)
                elif self._runner is None and not self._is_async:
                    value = self._fn(self.call.arguments, self)  # the common case, directly
                else:
                    value = self._call_body()
            except NotStarted:
                self._started = False  # refused where it was to run: no body ran
                self._dispatched_at = None
                return
            except BaseException as exc:  # recorded for the stage thread; the worker lives on
                self._error = exc
            else:
                self._value = value
                # Read here, not after the join: a deadline firing while the joiner wakes up
                # must not turn an on-time success into a cancellation.
                self._live_on_return = not self.token.cancelled
            self._settled_at = time.monotonic()
        finally:
            # `with _CONTEXT_LOCK`, without its method lookups (this runs for every body).
            _context_acquire()
            try:
                self._closed = True
            finally:
                _context_release()
            if self._runner is not None:
                self._interrupt = None
            self._settled = True
            done = self._done
            if done is not None:
                done.release()

    def _call_body(self) -> Any:
        if self._runner is not None:
            return self._runner(self)
        if self._is_async:
            return self._host.run_coroutine(self._coroutine, self.token)
        return self._fn(self.call.arguments, self)

    def _coroutine(self) -> Coroutine[Any, Any, Any]:
        coroutine: Coroutine[Any, Any, Any] = self._fn(self.call.arguments, self)
        return coroutine

    def _watch_nested(self, state: CallState) -> None:
        """The dispatcher's watcher: `state` is a nested call this body is about to run.

        Made on the body's own thread, with no around wrapper (which may run bodies elsewhere),
        under a body whose overdue watch starts whenever its token is cancelled, the nested call
        is covered by that watch (`_watch_overdue` passes it on), so its body registers no
        listener of its own on this body's token. The argument is the batch runner's: a nested
        body starts only after this stored its state and after its last token check, and a
        watch starts only once the token is cancelled; so a body the watch misses (no state
        yet, or the previous call's) sees the cancellation at that check and never starts.
        """
        if self._covers_nested and state.thread == self._thread and not state.hooks.around:
            state.caller_watched = True
            self._nested = state

    def _drop(self) -> None:
        """The pool discarded this item: it never starts."""
        self._claim_back()

    def _is_settled(self) -> bool:
        return self._settled

    def _wake(self) -> None:
        """The joiner woke at a lazy deadline's due time: act as its listener would have."""
        if self.token.cancelled:
            self._cancelled()

    # -- cancellers --------------------------------------------------------------------------------

    def _cancelled(self) -> None:
        """The call was cancelled: claim a body that has not started, else watch it."""
        if self._live and self._claim_back():
            return
        self._watch_overdue()

    def _claim_back(self) -> bool:
        """Claim the body for a canceller: True if it had not started (it never will)."""
        if not claim(self):
            return False
        with _CONTEXT_LOCK:
            self._closed = True
        self._settled = True
        done = self._done
        if done is not None:
            done.release()
        return True

    def _watch_overdue(self) -> None:
        """Warn once if the body has not settled `overdue_after` seconds from now."""
        after = self._host.overdue_after
        if self._settled or after is None or self._overdue is not None:
            return
        watch = deadline(None, after)
        if self._keep_watch(watch):
            watch.token.on_cancel(self._warn_overdue)
            nested = self._nested
            if nested is not None:
                nested.watch_body()  # the nested call under this body's token (`_watch_nested`)

    def _keep_watch(self, watch: CancelSource) -> bool:
        """Keep `watch` as the overdue watch, unless another thread set one first."""
        with _WATCH_LOCK:
            if self._overdue is not None:
                return False
            self._overdue = watch
            return True

    def _warn_overdue(self) -> None:
        if not self._settled:
            if self._traces:
                notify_traces(self._traces, "overdue", self)
            logger.warning(
                "toolreg: tool %s has not settled %gs after its cancellation; the registry keeps "
                "waiting for it (a non-quiescent call: make the body observe ctx.token)",
                f"{self.call.name!r} (call {self.call.call_id})",
                self._host.overdue_after,
            )


Submit = Callable[[ToolContext], bool]  # hands the body to a worker; True if one took it at once

# Seconds the joiner of a body an idle worker took waits before it registers who wakes it on
# cancellation (`_join`): a body that settles sooner costs no listener on the caller's token.
LISTEN_AFTER = 0.005


# Read once: reading an enum member is a descriptor call every time.
_DISPATCH, _BODY, _AFTER_BODY = Stage.DISPATCH, Stage.BODY, Stage.AFTER_BODY
_TOOL_ERROR = ErrorCode.TOOL_ERROR


def run_body(host: BodyHost, state: CallState, token: CancelToken) -> ToolResult[Any]:
    """The body stage: start one body of the call under `token`, join it, and make its result.

    The body runs inline on this thread (the stage thread of a nested, batch or awaited call, or
    a remote body's runner, which joins it here) or is handed to a worker and joined
    (`_join`). After the join, on the stage thread, its overdue watch stops and its moments go
    to the call's timeline (the first start, the last settle, and when the token it observed
    was cancelled). The result: the body's success (`_outcomes.success`), `TOOL_ERROR` for what
    it raised or for an executor that refused it, or the call's cancellation if it never
    started or raised `Cancelled` once its token was cancelled.
    """
    state.stage = _DISPATCH
    joined = not state.inline and state.entry.runner is None
    ctx = ToolContext(state, token, host, joined)
    own = token is state.token
    if not own:
        ctx._covers_nested = False
    state.body = ctx
    state.stage = _BODY
    refused = None
    if joined:
        refused = _join(state, ctx, host.submit, state.interrupt)
    elif (
        state.caller_watched
        or not state.live
        or state.caller is _NEVER
        or host.overdue_after is None
    ):
        ctx._run()
    else:
        # Inline, with nothing to join, but a cancellation by the caller still starts the
        # overdue watch (a batch starts it for its calls itself: one listener per batch).
        watch = state.caller.on_cancel(ctx._watch_overdue)
        try:
            ctx._run()
        finally:
            watch.remove()
    overdue = ctx._overdue
    if overdue is not None:
        overdue.close()
    items = ctx._contexts
    contexts = () if items is None else tuple(items)
    started = ctx._started
    error = ctx._error
    if started:
        if state.dispatched_at is None:
            state.dispatched_at = ctx._dispatched_at
        state.settled_at = ctx._settled_at
    if not own:
        # A body that returned read its token then (`_live_on_return`): a cause that came
        # after it returned is not one it observed, so the mark says all (no resolving).
        at = cancelled_at(token, resolve=not started or error is not None)
        if at is not None:
            state.body_cancelled_at = at
    if not started:
        if refused is None:
            return aborted(state)
        return failure(state.call, _TOOL_ERROR, refused, contexts)
    state.dispatched = True
    state.stage = _AFTER_BODY
    if error is None:
        return success(state, ctx._value, ctx._live_on_return, contexts)
    if isinstance(error, Cancelled) and token.cancelled:
        return aborted(state, contexts)
    return failure(state.call, _TOOL_ERROR, describe(error), contexts, error)


def _join(
    state: CallState,
    ctx: ToolContext,
    submit: Submit,
    interrupted: Callable[[BaseException], None],
) -> str | None:
    """Hand the body of `ctx` to a worker and join it.

    Returns a problem message if the executor refused the body (it never started), else None.
    Anything that lands while handing over or joining is an interrupt: `interrupted(exc)`
    cancels the call, the body is claimed back if it has not started, and the join goes on.
    """
    # Who wakes the joiner if the body is cancelled before it starts (`_listen`) is registered
    # only when it can matter: at once for a body left queued (a call cancelled while queued
    # returns at once), and for a body an idle worker took only if it has not settled within a
    # first short wait: that worker starts it, or refuses it at its token check, without
    # anyone's help, and most bodies settle long before. A cancellation that came before the
    # registration runs it at once, so the late one misses nothing. Nothing else runs between
    # the hand-off and that first wait: a worker woken on another CPU waits for the GIL meanwhile.
    token = ctx.token
    own = token is state.token
    listens = not own or (state.live and state.caller is not _NEVER)
    listener: Registration | None = None
    done = ctx._done
    assert done is not None  # made `joined` by the caller, which hands it over
    try:
        taken = False
        try:
            taken = submit(ctx)
        except RuntimeError as exc:  # the executor was shut down by its owner
            if ctx._claim_back() and not state.revoked():
                return f"the executor refused the body: {exc}"
            # Cancelled meanwhile (a canceller may have claimed it first): it never starts, and
            # the join below finds it settled, so the call is ABORTED_BEFORE_DISPATCH.
        deferred = listens and taken
        due: float | bool | None = None
        if deferred:
            first = LISTEN_AFTER  # shorter than a main-thread slice: a Ctrl-C waits no longer
        else:
            due = None if own else lazy_due_above(token, state.token)
            if listens:
                listener = _listen(state, ctx, due)
            first = _first_wait(due)
        if first < 0:
            while not ctx._settled:  # no signal lands off the main thread: block until settled
                done.acquire()
        elif not ctx._settled:
            # One wait first, without the helper's machinery: most bodies settle within it.
            try:
                done.acquire(True, first)
            except BaseException as exc:  # asynchronous (a signal handler): cancel, go on
                _interrupt_join(ctx, interrupted, exc)
        if not ctx._settled:
            if deferred:
                due = None if own else lazy_due_above(token, state.token)
                listener = _listen(state, ctx, due)
            # False: the body's token has (or gets) the listener, so no due time to wake at.
            wake_at = None if due is None or due is False else functools.partial(_due, due)
            wait_until(
                ctx._is_settled,
                functools.partial(done.acquire, True),
                functools.partial(_interrupt_join, ctx, interrupted),
                wake_at,
                ctx._wake,
            )
    except BaseException as exc:  # landed between the guarded spots: the claim decides
        _interrupt_join(ctx, interrupted, exc)
        wait_until(
            ctx._is_settled,
            functools.partial(done.acquire, True),
            functools.partial(_interrupt_join, ctx, interrupted),
        )
    finally:
        if listener is not None:
            listener.remove()  # waits for a callback running right now
    return None


def rechecked(ctx: ToolContext) -> bool:
    """Whether the token of `ctx` is rechecked right before its body starts (the caller's
    token was live at entry): a runner that finds it cancelled then refuses the start
    (`NotStarted`); otherwise the call was pre-aborted and its body starts cancelled."""
    return ctx._live


def _first_wait(due: float | bool | None) -> float:
    """How long the joiner's first wait may block: a main-thread slice (a Ctrl-C is noticed
    within one) or no limit, and no later than a lazy due time on the body's token."""
    main = get_ident() == _interrupts.main_thread_ident
    if due is None or due is False:
        return MAIN_THREAD_SLICE if main else -1.0
    return slice_for(main, due)


def _interrupt_join(
    ctx: ToolContext, interrupted: Callable[[BaseException], None], exc: BaseException
) -> None:
    interrupted(exc)
    ctx._claim_back()


def _listen(state: CallState, ctx: ToolContext, due: float | bool | None) -> Registration | None:
    """Who wakes the joiner if the body is cancelled before it starts.

    `due` is `lazy_due_above(ctx.token, state.token)` (a token only ever goes from lazy
    to eager, and what the lazy reading asks for serves both). The body's token is the call's
    own token, or a lazy deadline below it (TimeoutPolicy): then the caller's token gets the
    one listener (none for a never-cancelled caller: `close()`, Ctrl-C and the asyncio facade
    reach the body through `CallState.cancel`), and the joiner wakes by itself at the
    deadline's due time. Anything else (`due` False) listens on the body's token.
    """
    if due is False:
        return ctx.token.on_cancel(ctx._cancelled)
    caller = state.caller
    if state.live and caller is not _NEVER:
        return caller.on_cancel(functools.partial(_caller_cancelled, state))
    return None


def _due(due: float) -> float:
    return due


def _caller_cancelled(state: CallState) -> None:
    state.cancel(state.caller.reason)


def owned_call(call_or_name: object, arguments: Mapping[str, Any] | None) -> tuple[ToolCall, bool]:
    """`as_call`, and whether the call was made here from a name (so nothing else has seen it,
    and the entry checks may freeze its arguments in place)."""
    if type(call_or_name) is str:
        arguments = {} if arguments is None else arguments
        return frozen_call(call_or_name, arguments, new_call_id()), True
    return as_call(call_or_name, arguments), False


def as_call(call_or_name: object, arguments: Mapping[str, Any] | None) -> ToolCall:
    """A `ToolCall` from what `execute` was given; `TypeError` for anything else."""
    if isinstance(call_or_name, ToolCall):
        if arguments is not None:
            raise TypeError("pass arguments inside the ToolCall, not beside it")
        return call_or_name
    if isinstance(call_or_name, str):
        return ToolCall(call_or_name, arguments)
    raise TypeError(f"execute() takes a ToolCall or a tool name, got {type(call_or_name).__name__}")
