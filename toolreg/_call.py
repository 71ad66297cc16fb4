"""The state of one call, as data: how it was entered (`CallMode`), where it is (`Stage`), and
everything its stages share (`CallState`).

Nothing here runs a stage (that is `_pipeline`) or owns a thread (that is `_dispatch`). Each field
of `CallState` says who writes it, on which thread, and when; a field written by a worker is
read by the stage thread only after the join (a lock release and acquire order them).
"""

from __future__ import annotations

import enum
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from ._cancel import _NEVER, CancelToken, _new_token, cancel_token, child_token
from ._cancel import cancelled_at as _cancelled_at
from ._logger import logger as _logger
from ._record import record

if TYPE_CHECKING:
    from ._catalog import CatalogEntry
    from ._hooks import CallTrace, HookSet
    from ._progress import ProgressSink
    from ._results import ToolCall, ToolResult
    from ._tools import Tool

__all__ = ["BodyRun", "CallMode", "CallState", "DebugCallState", "Stage"]

_CHAIN_LOCK = threading.Lock()  # guards every CallState's chain_open, foreign_proceeds, drained


class Stage(str, enum.Enum):
    """Where a call is; members compare equal to their values (`Stage.BODY == "body"`)."""

    ENTRY = "entry"
    PRE_EXECUTE = "pre_execute"
    APPROVAL = "approval"
    GUARDS = "guards"
    AROUND = "around"
    DISPATCH = "dispatch"
    BODY = "body"
    AFTER_BODY = "after_body"
    POST_EXECUTE = "post_execute"
    OBSERVERS = "observers"

    def __str__(self) -> str:
        return self.value


@record(frozen=True, slots=True)
class CallMode:
    """How a call was entered. Use the named constructors; instances are shared constants.

    * `start_if_cancelled`: a caller token cancelled at entry still reaches the body (the
      direct-call contract); False for model-driven entries, which start nothing then.
    * `inline`: the body runs on the thread running the stages, not on a pool worker (that
      thread is already a worker dedicated to this call, or to its parent).
    * `admit_while_closing`: entered from inside a call that is in flight, so `close()` in
      progress must not refuse it (it is cancelled instead).
    """

    name: str
    start_if_cancelled: bool
    inline: bool
    admit_while_closing: bool

    def __init__(
        self, name: str, start_if_cancelled: bool, inline: bool, admit_while_closing: bool
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "start_if_cancelled", start_if_cancelled)
        object.__setattr__(self, "inline", inline)
        object.__setattr__(self, "admit_while_closing", admit_while_closing)

    @staticmethod
    def direct(start_if_cancelled: bool = True) -> CallMode:
        """`registry.execute(...)`."""
        return _DIRECT if start_if_cancelled else _DIRECT_MODEL

    @staticmethod
    def nested() -> CallMode:
        """`ctx.execute(...)`: inline, under the parent call's token, model-driven."""
        return _NESTED

    @staticmethod
    def batch_item() -> CallMode:
        """One call of `execute_batch`: inline on a batch runner, model-driven."""
        return _BATCH_ITEM

    @staticmethod
    def awaited(start_if_cancelled: bool = True) -> CallMode:
        """`await areg.execute(...)`: the whole call inline on one worker."""
        return _AWAITED if start_if_cancelled else _AWAITED_MODEL

    def __repr__(self) -> str:
        return f"CallMode.{self.name}"


_DIRECT = CallMode("direct(True)", True, False, False)
_DIRECT_MODEL = CallMode("direct(False)", False, False, False)
_NESTED = CallMode("nested()", False, True, True)
_BATCH_ITEM = CallMode("batch_item()", False, True, True)
_AWAITED = CallMode("awaited(True)", True, True, True)
_AWAITED_MODEL = CallMode("awaited(False)", False, True, True)


class BodyRun(Protocol):
    """What a call's state, and whoever watches the call, use of one body run: the
    `_body.ToolContext` the stage thread records in `CallState.body`. (`_body` builds on this
    module, so this module names the run by what it uses of it.)"""

    token: CancelToken  # the token the body observes
    _started: bool  # the body started (read after the join, or with the claim's ordering)

    def _cancelled(self) -> None:
        """The call was cancelled: a body not started never starts, a running one is watched."""
        ...

    def _watch_overdue(self) -> None:
        """Warn once if the body has not settled in time (the call was cancelled)."""
        ...


class CallState:
    """Everything the stages of one call share; one object per call.

    Written at entry by the thread that runs the stages (the *stage thread*: the caller for
    `execute`, a worker for batch items and awaited calls) unless a field says otherwise.
    """

    # Not slotted: the fields most calls never change are class-level defaults below, so a
    # call sets only what it must (this object is made for every call).

    #: The catalog entry of the tool (validators, `async def` or not) and the tool itself;
    #: None until the entry checks passed (no stage runs before then).
    entry: CatalogEntry = None  # type: ignore[assignment]
    tool: Tool = None  # type: ignore[assignment]
    #: The stage the call is in (read by `in_flight()` from any thread); set by the stage
    #: thread as the call enters each stage (and logged then, in a `DebugCallState`).
    stage: Stage = Stage.ENTRY
    #: A body of this call has started. Set by the stage thread after the join.
    dispatched = False
    #: The timeline (monotonic): the first body start, the last body settle, and when the
    #: token the last body observed was cancelled. Set by the stage thread after each join.
    dispatched_at: float | None = None
    settled_at: float | None = None
    body_cancelled_at: float | None = None
    #: The latest body run (a retrying wrapper makes several). Set by the stage thread;
    #: `cancel` reads it from any thread.
    body: BodyRun | None = None
    #: A Ctrl-C (or other asynchronous exception) that landed in the call: re-raised once the
    #: call is complete. Set by the stage thread.
    interrupted: BaseException | None = None
    #: The registry-made `HOOK_ERROR` result, if any (it skips post hooks).
    hook_error: ToolResult[Any] | None = None
    #: A result the registry built and no user code has seen: finished in place.
    own_result: ToolResult[Any] | None = None
    #: The result the around chain last handed back from a `proceed()` (or the body), made
    #: or checked by the registry: a wrapper that returns it as it is needs no check. Written
    #: by whichever thread runs that part of the chain; any value it holds is well-formed.
    proceeded: ToolResult[Any] | None = None
    #: The around chain: open while the outermost wrapper runs; `foreign_proceeds` counts
    #: `proceed()` calls running on other threads, and `drained` is set when the last one
    #: leaves after the chain closed. Guarded by `_CHAIN_LOCK`, through the chain methods
    #: below, except that the stage thread opens the chain and reads `chain_open` without it
    #: (it opens it before any `proceed()` exists, and only it closes it).
    chain_open = False
    foreign_proceeds = 0
    drained: threading.Event | None = None
    #: What the call hooks follow this call with (see `_traces`); set at entry.
    traces: tuple[CallTrace, ...] = ()
    #: The registry made `call` itself (from a tool name): the entry checks may freeze it in
    #: place instead of copying it.
    owns_call = False
    #: Whoever made the caller's token starts the overdue watch of this call's body when that
    #: token is cancelled (a batch does, for the calls its runners are running), so an inline
    #: body registers no listener of its own on it. Set by the stage thread before any body.
    caller_watched = False

    def __init__(
        self,
        call: ToolCall,
        hooks: HookSet,
        caller: CancelToken,
        mode: CallMode,
        entered: float,
        inline: bool,
        progress: ProgressSink | None,
        wall: float | None = None,
        thread: int | None = None,
    ) -> None:
        #: The call: as given until the entry checks passed, then as executed, with
        #: frozen arguments.
        self.call = call
        #: The hooks registered at entry: they serve the whole call.
        self.hooks = hooks
        #: The caller's token, captured at entry, outside anything a wrapper can reach.
        self.caller = caller
        #: Whether `caller` was live at entry, read once: it decides every recheck.
        self.live = caller is _NEVER or not caller.cancelled
        #: How the call was entered.
        self.mode = mode
        #: The call's own token: a lazy child of `caller`; `close()`, Ctrl-C and the asyncio
        #: facade cancel it (from any thread, through `cancel`).
        self.token = _new_token() if caller is _NEVER else child_token(caller)
        #: Entry time: `time.monotonic()`, and the wall clock (`time.time()`) read with it.
        self.entered = entered
        # The same moment on the wall clock: read next to `entered`, or derived from it.
        self.wall = time.time() - (time.monotonic() - entered) if wall is None else wall
        #: The stage thread's ident, and whether bodies run on it (`mode.inline`, or it is a
        #: worker already running a body of this registry).
        self.thread = threading.get_ident() if thread is None else thread
        self.inline = inline
        #: The caller's `progress=` sink (direct and awaited calls only).
        self.progress = progress

    def cancel(self, reason: object) -> None:
        """Cancel the call (never the caller): its token, and a body still waiting to start.

        Safe from any thread; used by `close()`, by an interrupt, and by the asyncio facade.
        """
        cancel_token(self.token, reason)
        body = self.body
        if body is not None:
            body._cancelled()

    def interrupt(self, exc: BaseException) -> None:
        """A Ctrl-C (or another exception a signal handler raised) landed in the call.

        The call's own token is cancelled (never the caller's); the first exception is kept
        and re-raised once the call is complete.
        """
        if self.interrupted is None:
            self.interrupted = exc
        cancel_token(self.token, type(exc).__name__)

    def first_cancelled_at(self) -> float | None:
        """When the call's token, or the token its body observed, was first cancelled."""
        body = self.body_cancelled_at
        own = _cancelled_at(self.token)
        if own is None:
            return body
        return body if body is not None and body < own else own

    def watch_body(self) -> None:
        """The caller's token was cancelled: start the overdue watch of the body running now
        (a no-op for a body that settled, or that is watched already)."""
        body = self.body
        if body is not None:
            body._watch_overdue()

    # -- the around chain (see `_pipeline._around`) ----------------------------------------------

    def close_chain(self) -> int:
        """The chain returned: refuse new `proceed()` calls; how many still run elsewhere."""
        with _CHAIN_LOCK:
            self.chain_open = False
            return self.foreign_proceeds

    def enter_foreign_proceed(self) -> bool:
        """A `proceed()` on another thread starts: False (refused) once the chain closed."""
        with _CHAIN_LOCK:
            if not self.chain_open:
                return False
            self.foreign_proceeds += 1
            return True

    def leave_foreign_proceed(self) -> None:
        """A `proceed()` on another thread returned: wake the chain's end if it was the last."""
        with _CHAIN_LOCK:
            self.foreign_proceeds -= 1
            drained = self.drained if self.foreign_proceeds == 0 else None
        if drained is not None:
            drained.set()

    def foreign_proceeds_drained(self) -> threading.Event | None:
        """After `close_chain`: an event set once the `proceed()` calls still running on other
        threads have all returned, or None if none is left."""
        drained = threading.Event()  # allocated outside the lock, and only when needed
        with _CHAIN_LOCK:
            if self.foreign_proceeds == 0:
                return None
            self.drained = drained
        return drained

    def revoked(self) -> bool:
        """A token live at entry has been cancelled since (the rechecks)."""
        return self.live and self.token.cancelled

    def cancelled_at(self) -> float | None:
        """When the call's token was cancelled (monotonic seconds), or None while live."""
        return _cancelled_at(self.token)

    def body_started(self) -> bool:
        """Whether a body of this call has started (it may still be running)."""
        body = self.body
        return self.dispatched or (body is not None and body._started)

    def __repr__(self) -> str:
        return f"<CallState {self.call.name!r} call_id={self.call.call_id!r} stage={self.stage}>"


class DebugCallState(CallState):
    """The state of a call entered while the `toolreg` logger is at DEBUG: each stage the call
    enters is logged as it is set. Everything else is `CallState`'s, so the stages never check
    whether to log."""

    _stage: Stage = Stage.ENTRY

    @property  # a logged field, read and written as the plain one
    def stage(self) -> Stage:
        return self._stage

    @stage.setter
    def stage(self, stage: Stage) -> None:
        self._stage = stage
        _logger.debug(
            "toolreg: %s %s: %s (token %s)",
            self.call.name,
            self.call.call_id,
            stage.value,
            "cancelled" if self.token.cancelled else "live",
        )
