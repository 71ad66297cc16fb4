"""The stages of one call, top to bottom, and the cancellation contract they keep.

`execute` runs the entry checks and then `run_stages`, the one path of every call (direct,
nested, batch item, awaited; a local or a remote body), which reads like the contract:

    gate (pre-execute hooks, approval, guards)
      -> around wrappers | the body
      -> cancellation replaces success
      -> post-execute hooks
      -> finalize (the frozen result: call, dispatched, duration, timeline)
      -> notify (observers, each once)

A stage a call does not need is skipped by its data, never by another copy of the path: the
hooks of the call's `HookSet` (an empty tuple when none is registered), no deadline when the
registry's own `TimeoutPolicy` is not the one wrapper (or the tool has no timeout), the body
inline or handed to a worker as the call's `CallMode` and thread say.

The rules they keep (docs/contract.md, sections 3 and 4):

* The caller's token is captured at entry (`CallState.caller`), with whether it was live then,
  read once. Wrappers only ever see a `Dispatch`, so nothing they can reach detaches the caller.
* A token live at entry is rechecked after the pre-execute hooks, after approval, and on the
  body's thread immediately before the body, where the call's token is fused with whatever
  `dispatch.token` holds then (no fusing needed when that token descends from the call's).
  Cancelled at any of those points: `ABORTED_BEFORE_DISPATCH`, and the body never starts. A
  denial returned while the token is cancelled is that cancellation too.
* Once a body starts it is joined, however long it ignores its token (`_body.run_body`).
* Cancellation that wins before the final result is materialized replaces a *success*: `ABORTED`
  if a body started, else `ABORTED_BEFORE_DISPATCH`, keeping deferred contexts. Failures stay.
* Pre-aborted entry (`start_if_cancelled=True` and a cancelled caller token): the call goes
  through and the body's own outcome stands.

Every result that user code hands back (a wrapper's, a post hook's) is checked before it is
used: something that is not a well-formed `ToolResult` fails closed as `HOOK_ERROR`.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Mapping
from threading import get_ident
from typing import Any, Protocol

from ._body import BodyHost, run_body
from ._call import CallState, Stage
from ._cancel import Cancelled, CancelSource, CancelToken, close_token, descends_from
from ._catalog import CatalogEntry, ToolTable
from ._hooks import Allow, Ask, Deadline, Deny, Dispatch
from ._interrupts import INTERRUPTS, wait_until
from ._logger import logger
from ._outcomes import aborted, failure
from ._results import (
    CallTimeline,
    ErrorCode,
    ToolCall,
    ToolError,
    ToolResult,
    finish_result,
    frozen_call,
    make_result,
)
from ._text import describe, safe_repr, safe_str
from ._tools import FrozenDict, InvalidArguments, freeze_arguments
from ._traces import end_traces

__all__ = ["PipelineHost", "check_entry", "describe", "execute", "never_started"]


_BEFORE = ErrorCode.ABORTED_BEFORE_DISPATCH
# Enum members read once: reading `Stage.GUARDS` is a descriptor call every time.
_PRE_EXECUTE, _APPROVAL, _GUARDS, _AROUND = (
    Stage.PRE_EXECUTE,
    Stage.APPROVAL,
    Stage.GUARDS,
    Stage.AROUND,
)
_POST_EXECUTE, _OBSERVERS = Stage.POST_EXECUTE, Stage.OBSERVERS
_NO_CONTEXTS: tuple[Any, ...] = ()


class PipelineHost(BodyHost, Protocol):
    """What the stages need from the dispatcher that runs them."""

    @property
    def tools(self) -> ToolTable:
        """The tool table: `tools.entries` maps a name to its entry now (replaced whole on
        every change: read it once)."""
        ...


# -- entry -------------------------------------------------------------------------------------


def execute(
    host: PipelineHost, state: CallState, admitted: CatalogEntry | None = None
) -> ToolResult[Any]:
    """One call from its entry checks to its observers; the final result.

    `admitted`: the entry checks ran already (a batch classifies its calls with them), and
    `state.call` holds the frozen call. A Ctrl-C (or other asynchronous exception) that landed
    in the call is left in `state.interrupted` for the dispatcher to re-raise.
    """
    if admitted is not None:
        state.entry = admitted
        state.tool = admitted.tool
        failed = None
    else:
        failed = _entry_checks(host, state)
    if failed is None and not state.live and not state.mode.start_if_cancelled:
        # Model-driven dispatch never reopens a cancelled turn: no hook runs, observers see it.
        failed = failure(state.call, _BEFORE, "tool call aborted before dispatch")
    if failed is not None:
        return _finish(state, failed)
    return run_stages(host, state)


def _entry_checks(host: PipelineHost, state: CallState) -> ToolResult[Any] | None:
    """The contract's entry checks, in order; a failed result, or None once admitted."""
    call = state.call
    frozen, entry, problem = check_entry(host.tools.entries, call)
    if frozen is None:
        state.call = frozen_call(call.name, None, call.call_id)
    elif state.owns_call:  # made by the registry from a name, seen by nobody yet: freeze in place
        call.__dict__["arguments"] = frozen
    else:
        state.call = frozen_call(call.name, frozen, call.call_id)
    if entry is None or problem is not None:
        unknown = frozen is not None and entry is None
        code = ErrorCode.UNKNOWN_TOOL if unknown else ErrorCode.INVALID_ARGS
        return failure(state.call, code, str(problem))
    state.entry = entry  # admitted
    state.tool = entry.tool
    return None


def check_entry(
    entries: Mapping[str, CatalogEntry], call: ToolCall
) -> tuple[FrozenDict | None, CatalogEntry | None, str | None]:
    """The entry checks of `call`: its frozen arguments, its tool's entry, and what failed.

    In order: the arguments are frozen (None: they are not JSON), the tool is looked up (None:
    unknown), the arguments are validated against its schema. The message says what failed;
    None when the call passed. The batch classifies its calls with this too.
    """
    try:
        frozen = freeze_arguments(call.arguments)
    except InvalidArguments as exc:
        return None, None, str(exc)
    name = call.name
    entry = entries.get(name) if type(name) is str else None
    if entry is None:
        return frozen, None, f"unknown tool {safe_repr(name)}"
    if entry.validator is not None:
        try:
            entry.validator(frozen)
        except Exception as exc:  # the compiled validator's JsonSchemaException
            return frozen, entry, str(getattr(exc, "message", exc))
    return frozen, entry, None


def never_started(state: CallState) -> ToolResult[Any]:
    """A batch or awaited call that never started: `ABORTED_BEFORE_DISPATCH`, observed.

    Whatever its tool or arguments: no check ran, no hook ran. The result carries the frozen
    arguments, or None if they are not JSON.
    """
    call = state.call
    try:
        arguments: Mapping[str, Any] | None = freeze_arguments(call.arguments)
    except InvalidArguments:
        arguments = None
    state.call = frozen_call(call.name, arguments, call.call_id)
    return _finish(state, failure(state.call, _BEFORE, "tool call aborted before dispatch"))


# -- the stages ----------------------------------------------------------------------------------


def run_stages(host: PipelineHost, state: CallState) -> ToolResult[Any]:
    """gate -> around | body -> cancellation replaces success -> post -> finalize -> notify.

    With nothing between the body and the final result, the one read of the call's token
    after the body serves both the late-success check (4.5) and the timeline's `cancelled`.
    """
    hooks = state.hooks
    try:
        if hooks.bare:  # no gate, no wrapper: the body's own recheck (as it starts) is all
            result = run_body(host, state, state.token)
        else:
            deadline = hooks.deadline
            if hooks.gated:
                stopped = _gate(state)
            elif deadline is None and state.revoked():
                # The recheck of an empty stage 2, before any wrapper runs (a deadline alone
                # runs none: its body's own recheck is all).
                stopped = aborted(state)
            else:
                stopped = None
            if stopped is not None:
                result = stopped
            elif deadline is not None:
                result = _body_under_deadline(host, state, deadline)
            elif hooks.around:
                result = _around(host, state)
            else:
                result = run_body(host, state, state.token)
        # The call's token read live after the last stage (see `_finish`). A result the gate
        # made is never a success: only the body's is replaced here.
        live = not state.token.cancelled
        if result.ok and state.live and not live:
            result = aborted(state, tuple(result.contexts))
        # The very result the registry made for a broken hook skips the post hooks.
        if hooks.post_execute and result is not state.hook_error:
            result = _post_execute(state, result)
            # Cancellation that won meanwhile replaces a success (a post hook's failure stays);
            # the same read serves the timeline, as nothing runs between it and finalizing.
            live = not state.token.cancelled
            if result.ok and state.live and not live:
                result = aborted(state, tuple(result.contexts))
    except BaseException as exc:  # landed between guarded spots: cancel, finish, re-raise later
        state.interrupt(exc)
        result = aborted(state)
        live = False
    return _finish(state, result, live)


def _body_under_deadline(
    host: PipelineHost, state: CallState, deadline: Deadline
) -> ToolResult[Any]:
    """The body under the deadline of the registry's own `TimeoutPolicy`, its one wrapper: what
    the policy does around the chain, done here with no chain (its deadline, a lazy child of
    the call's token, is the body's token; `TOOL_TIMEOUT` if that deadline cancelled it)."""
    open_deadline, close_deadline = deadline
    budget = open_deadline(state.tool, state.token)
    if budget is None:  # this tool has no timeout
        return run_body(host, state, state.token)
    state.stage = _AROUND
    try:
        result = run_body(host, state, budget)
    except BaseException:
        close_token(budget)
        raise
    return close_deadline(state.tool, budget, result)


def _finish(state: CallState, result: ToolResult[Any], live: bool = False) -> ToolResult[Any]:
    """Finalize (the frozen result: call, dispatched, duration, timeline), trace, notify.

    `live`: the caller has just read the call's token and found it live, so only the token
    the body observed can have been cancelled (as far as the timeline is concerned).
    """
    finished = time.monotonic()
    entered = state.entered
    duration = finished - entered
    cancelled = state.body_cancelled_at if live else state.first_cancelled_at()
    dispatched, settled = state.dispatched_at, state.settled_at
    timeline = _new_timeline(
        (
            state.wall,
            None if dispatched is None else dispatched - entered,
            None if cancelled is None else max(0.0, cancelled - entered),
            None if settled is None else settled - entered,
            duration,
        )
    )
    if result is state.own_result:  # made by the registry in this call, unseen: finish in place
        finish_result(result, state.dispatched, duration, timeline)
        final = result
    else:
        final = make_result(
            state.call,
            result.ok,
            result.content,
            result.value,
            result.error,
            tuple(result.contexts),
            state.dispatched,
            duration,
            timeline,
        )
    if state.traces:
        try:
            end_traces(state.traces, final)
        except INTERRUPTS as exc:  # the observers still see the result first
            state.interrupt(exc)
    if state.hooks.observers:
        _notify(state, final)
    return final


# A plain tuple.__new__ (C-level: no keyword handling, no Python frame per call); `_finish`
# always passes all five fields.
_new_timeline = functools.partial(tuple.__new__, CallTimeline)


# -- gate: pre-execute hooks, approval, guards ---------------------------------------------------


def _gate(state: CallState) -> ToolResult[Any] | None:
    """A result if the call stops before the wrappers, else None."""
    # A denial returned while the call's token is cancelled is the cancellation: the hook or
    # approver that said no may have said it *because* its turn was cancelled.
    ask = _pre_execute(state)
    # A broken hook's result stays HOOK_ERROR. `ask` is None when no hook decided anything, and
    # so is `hook_error` when no hook broke: compare only a result.
    broken = ask is not None and ask is state.hook_error
    if not broken and state.revoked():
        return aborted(state)
    if isinstance(ask, ToolResult):
        return ask
    if ask is not None:
        denial = _approve(state, ask)
        if state.revoked():
            return aborted(state)
        if denial is not None:
            return denial
    return _guards(state)


def _pre_execute(state: CallState) -> ToolResult[Any] | Ask | None:
    first_ask: Ask | None = None
    state.stage = _PRE_EXECUTE
    for hook in state.hooks.pre_execute:
        try:
            decision: object = hook(state.call, state.token)
        except BaseException as exc:
            return _raised(state, "pre-execute hook", exc, state.token)
        if decision is None or isinstance(decision, Allow):
            continue
        if isinstance(decision, Deny):
            return _denied(state, decision.reason)
        if isinstance(decision, Ask):
            first_ask = first_ask or decision
            continue
        return _hook_failure(state, "pre-execute hook", f"returned {type(decision).__name__}")
    return first_ask


def _approve(state: CallState, ask: Ask) -> ToolResult[Any] | None:
    approver = state.hooks.approver
    if approver is None:
        return _denied(state, ask.reason)
    state.stage = _APPROVAL
    try:
        approved = approver(state.call, ask.reason, state.token)
    except INTERRUPTS as exc:
        state.interrupt(exc)
        return aborted(state)
    except Cancelled as exc:
        if state.token.cancelled:
            return aborted(state)
        logger.warning("toolreg: the approver raised; denying %s", state.call.call_id, exc_info=exc)
        approved = False
    except BaseException as exc:  # an approver that raises refuses (or was cancelled)
        logger.warning("toolreg: the approver raised; denying %s", state.call.call_id, exc_info=exc)
        approved = False
    return None if approved is True else _denied(state, ask.reason)


def _guards(state: CallState) -> ToolResult[Any] | None:
    state.stage = _GUARDS
    for guard in state.hooks.guards:
        try:
            verdict: object = guard(state.call)
        except BaseException as exc:
            return _raised(state, "guard", exc, state.token)
        if verdict is None:
            continue
        if isinstance(verdict, str):
            return _denied(state, verdict)
        return _hook_failure(state, "guard", f"returned {type(verdict).__name__}")
    return None


def _denied(state: CallState, reason: object) -> ToolResult[Any]:
    return failure(state.call, ErrorCode.DENIED, safe_str(reason))


# -- around wrappers ---------------------------------------------------------------------------


def _around(host: PipelineHost, state: CallState) -> ToolResult[Any]:
    dispatch = Dispatch(state.call, state.tool, state.caller, state.token)
    state.stage = _AROUND
    if state.hooks.chain_only:  # no proceed() reaches user code: none runs elsewhere or late
        return _proceed_from(host, state, dispatch, 0)
    state.chain_open = True  # no proceed() exists yet: no other thread reads it before this
    result = _proceed_from(host, state, dispatch, 0)
    # The chain returned: refuse new `proceed()` calls, join those still running elsewhere.
    if state.close_chain():
        _join_foreign_proceeds(state)
    return result


def _proceed_from(
    host: PipelineHost, state: CallState, dispatch: Dispatch, index: int
) -> ToolResult[Any]:
    """Run wrapper `index` (or, past the last, the body); never raises."""
    wrappers = state.hooks.around
    if index == len(wrappers):  # the innermost policy's chain run, or a proceed() elsewhere
        result = state.proceeded = _chain_body(host, state, dispatch.token)
        return result
    run = state.hooks.chain_runs[index]
    try:
        if run is not None:
            # One of the registry's own policies, which calls on only on this thread while the
            # chain is open: what a proceed() would check holds, so none is made for it.
            returned: object = run(dispatch, _proceed_from, host, state, dispatch, index + 1)
        elif index + 1 == len(wrappers):  # the innermost wrapper's proceed() runs the body
            proceed = functools.partial(_proceed_to_body, host, state, dispatch)
            returned = wrappers[index](dispatch, proceed)
        else:
            proceed = functools.partial(_proceed, host, state, dispatch, index + 1)
            returned = wrappers[index](dispatch, proceed)
    except BaseException as exc:
        return _raised(state, "around wrapper", exc, dispatch.token)
    # What its proceed() returned, handed on as it is (a pass-through, TimeoutPolicy on time),
    # was made or checked by the registry already.
    if returned is None or returned is not state.proceeded:
        problem = _malformed(returned)
        if problem is not None:
            return _hook_failure(state, "around wrapper", problem)
        assert isinstance(returned, ToolResult)
        state.proceeded = returned
    return returned  # type: ignore[return-value]  # checked above, or the registry's own


def _proceed(
    host: PipelineHost, state: CallState, dispatch: Dispatch, index: int
) -> ToolResult[Any]:
    """What a wrapper calls as `proceed()`: the rest of the chain, joined; never raises."""
    if get_ident() != state.thread:
        return _proceed_elsewhere(host, state, dispatch, index)
    if not state.chain_open:
        return _late_proceed(state)
    return _proceed_from(host, state, dispatch, index)


def _proceed_to_body(host: PipelineHost, state: CallState, dispatch: Dispatch) -> ToolResult[Any]:
    """`_proceed` for the innermost wrapper, one frame shorter: the body, joined."""
    if get_ident() != state.thread:
        return _proceed_elsewhere(host, state, dispatch, len(state.hooks.around))
    if not state.chain_open:
        return _late_proceed(state)
    result = state.proceeded = _chain_body(host, state, dispatch.token)
    return result


def _late_proceed(state: CallState) -> ToolResult[Any]:
    return _hook_failure(state, "around wrapper", "called proceed() after the call ended")


def _proceed_elsewhere(
    host: PipelineHost, state: CallState, dispatch: Dispatch, index: int
) -> ToolResult[Any]:
    """`proceed()` on another thread: counted, so the chain's end waits for it (its body is
    this call's)."""
    if not state.enter_foreign_proceed():
        return _late_proceed(state)
    try:
        return _proceed_from(host, state, dispatch, index)
    finally:
        state.leave_foreign_proceed()


def _join_foreign_proceeds(state: CallState) -> None:
    """After the chain closed: wait for the `proceed()` calls still running on other threads."""
    drained = state.foreign_proceeds_drained()
    if drained is not None:
        wait_until(drained.is_set, functools.partial(_wait_event, drained), state.interrupt)


def _wait_event(event: threading.Event, timeout: float) -> bool:
    return event.wait(None if timeout < 0 else timeout)


# -- the body ---------------------------------------------------------------------------------


def _chain_body(host: PipelineHost, state: CallState, wrapper_token: object) -> ToolResult[Any]:
    """The body at the end of the around chain, under the call's token fused with whatever the
    wrappers left in `dispatch.token` (no fusing when that token descends from the call's)."""
    token = state.token
    if wrapper_token is token:
        return run_body(host, state, token)
    if not isinstance(wrapper_token, CancelToken):
        return _hook_failure(state, "around wrapper", "left a non-token in dispatch.token")
    if descends_from(wrapper_token, token):  # a deadline below the call's token, say
        return run_body(host, state, wrapper_token)
    fused = CancelSource(token, wrapper_token)
    try:
        return run_body(host, state, fused.token)
    finally:
        fused.close()  # nothing of this body stays linked to the caller's token


# -- after the wrappers --------------------------------------------------------------------------


def _post_execute(state: CallState, result: ToolResult[Any]) -> ToolResult[Any]:
    """The post-execute hooks in order; the caller then lets cancellation replace a success."""
    state.stage = _POST_EXECUTE
    for hook in state.hooks.post_execute:
        try:
            replaced: object = hook(result, state.token)
        except BaseException as exc:
            if not _is_cancellation(state, exc, state.token):
                return _hook_failure(state, "post-execute hook", f"raised {describe(exc)}", exc)
            return result if not result.ok else aborted(state, tuple(result.contexts))
        if replaced is None:
            continue
        problem = _malformed(replaced)
        if problem is not None:
            return _hook_failure(state, "post-execute hook", problem)
        assert isinstance(replaced, ToolResult)
        if replaced.ok and not result.ok:
            return _hook_failure(state, "post-execute hook", "turned a failure into a success")
        result = replaced
    return result


def _notify(state: CallState, result: ToolResult[Any]) -> None:
    """Each observer sees the final result once; exceptions are logged, never raised."""
    observers = state.hooks.observers
    if not observers:
        return
    state.stage = _OBSERVERS
    for observer in observers:
        try:
            observer(result)
        except INTERRUPTS as exc:
            state.interrupt(exc)
        except BaseException:
            logger.exception("toolreg: result observer %r raised", observer)


# -- results -------------------------------------------------------------------------------------


def _hook_failure(
    state: CallState, what: str, problem: str, exc: BaseException | None = None
) -> ToolResult[Any]:
    if exc is not None:
        logger.error("toolreg: %s failed for %s", what, state.call.call_id, exc_info=exc)
    result = failure(state.call, ErrorCode.HOOK_ERROR, f"{what} {problem}", _NO_CONTEXTS, exc)
    state.hook_error = result
    return result


def _raised(state: CallState, what: str, exc: BaseException, token: CancelToken) -> ToolResult[Any]:
    """The result of a hook or wrapper that raised `exc`."""
    if _is_cancellation(state, exc, token):
        return aborted(state)
    return _hook_failure(state, what, f"raised {describe(exc)}", exc)


def _is_cancellation(state: CallState, exc: BaseException, token: CancelToken) -> bool:
    """A Ctrl-C or SystemExit (the call is cancelled now), or `Cancelled` once cancelled."""
    if isinstance(exc, INTERRUPTS):
        state.interrupt(exc)
        return True
    return isinstance(exc, Cancelled) and (state.token.cancelled or token.cancelled)


def _malformed(result: object) -> str | None:
    """Why `result` is not a well-formed `ToolResult`, or None if it is."""
    if not isinstance(result, ToolResult):
        return f"returned {type(result).__name__}"
    # Read as plain objects: a wrapper can build a ToolResult with anything in its fields.
    ok: object = result.ok
    error: object = result.error
    content: object = result.content
    contexts: object = result.contexts
    if type(ok) is not bool:
        return "returned a ToolResult whose ok is not a bool"
    if not isinstance(content, str):
        return "returned a ToolResult whose content is not a str"
    if not isinstance(contexts, (tuple, list)):
        return "returned a ToolResult whose contexts are not a tuple"
    if ok and error is not None:
        return "returned a success that carries an error"
    if not ok:
        if not isinstance(error, ToolError):
            return "returned a failure without a ToolError"
        code: object = error.code
        message: object = error.message
        if not isinstance(code, ErrorCode) or not isinstance(message, str):
            return "returned a failure whose ToolError has no ErrorCode or message"
    return None
