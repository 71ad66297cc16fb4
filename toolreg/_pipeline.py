"""The stages of one call, top to bottom, and the cancellation contract they keep.

`execute` runs the entry checks and then `run_stages` (or, for a call with no gate, wrapper
or post hook, `_run_plain`: the same stages without the hooks; also for one whose only wrapper
is the registry's own `TimeoutPolicy`, with its deadline as the body's token), which reads like
the contract:

    gate (pre-execute hooks, approval, guards)
      -> around wrappers | the body
      -> cancellation replaces success
      -> post-execute hooks
      -> finalize (the frozen result: call, dispatched, duration, timeline)
      -> notify (observers, each once)

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

from ._body import BodyHost, Submit, ToolContext, run_body
from ._call import CallState, Stage
from ._cancel import Cancelled, CancelSource, CancelToken, close_token, deadline_token
from ._catalog import CatalogEntry
from ._hooks import Allow, Ask, Deny, Dispatch
from ._interrupts import INTERRUPTS, wait_until
from ._logger import logger
from ._policies import TimeoutPolicy
from ._results import (
    CallTimeline,
    ErrorCode,
    ToolCall,
    ToolError,
    ToolResult,
    failure_content,
    finish_result,
    frozen_call,
    make_result,
    render_content,
)
from ._text import describe, safe_repr, safe_str
from ._tools import FrozenDict, InvalidArguments, freeze_arguments
from ._traces import end_traces

__all__ = ["PipelineHost", "check_entry", "describe", "execute", "never_started"]


_ABORTED = ErrorCode.ABORTED
_BEFORE = ErrorCode.ABORTED_BEFORE_DISPATCH
# Enum members read once: `_BODY` costs a descriptor call on every read (~0.1 us).
_PRE_EXECUTE, _APPROVAL, _GUARDS, _AROUND = (
    Stage.PRE_EXECUTE,
    Stage.APPROVAL,
    Stage.GUARDS,
    Stage.AROUND,
)
_DISPATCH, _BODY, _AFTER_BODY = Stage.DISPATCH, Stage.BODY, Stage.AFTER_BODY
_POST_EXECUTE, _OBSERVERS = Stage.POST_EXECUTE, Stage.OBSERVERS
_TOOL_ERROR = ErrorCode.TOOL_ERROR
_NO_CONTEXTS: tuple[Any, ...] = ()

PROCEEDS_LOCK = threading.Lock()  # guards every CallState's chain_open, foreign_proceeds, drained


class Entries(Protocol):
    entries: dict[str, CatalogEntry]  # replaced whole on every change: read it once


class PipelineHost(BodyHost, Protocol):
    """What the stages need from the dispatcher that runs them."""

    @property
    def tools(self) -> Entries:
        """The catalog: `tools.entries` maps a name to its entry now."""
        ...

    @property
    def submit(self) -> Submit:
        """How to hand a body to a worker."""
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
        failed = _failure(state.call, _BEFORE, "tool call aborted before dispatch")
    if failed is not None:
        return _finish(state, failed)
    if state.hooks.plain and not state.debug:
        return _run_plain(host, state)
    timeout = state.hooks.timeout_only
    if timeout is not None and not state.debug:
        return _run_plain(host, state, timeout)
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
        return _failure(state.call, code, str(problem))
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
    return _finish(state, _failure(state.call, _BEFORE, "tool call aborted before dispatch"))


# -- the stages ----------------------------------------------------------------------------------


def run_stages(host: PipelineHost, state: CallState) -> ToolResult[Any]:
    """gate -> around | body -> cancellation replaces success -> post -> finalize -> notify."""
    hooks = state.hooks
    try:
        live = False  # the call's token read live after the last stage (see `_finish`)
        if hooks.pre_execute or hooks.guards:
            result = _gate(state)
        elif state.live and state.token.cancelled:  # the recheck after an empty stage 2
            result = _aborted(state)
        else:
            result = None
        if result is None:
            result = _around(host, state) if hooks.around else _body(host, state, state.token)
            live = not state.token.cancelled
            if result.ok and state.live and not live:  # `_unless_revoked`, inline
                result = _aborted(state, tuple(result.contexts))
        # The very result the registry made for a broken hook skips the post hooks.
        if hooks.post_execute and result is not state.hook_error:
            result = _post_execute(state, result)
            # Cancellation that won meanwhile replaces a success (a post hook's failure stays);
            # the same read serves the timeline, as nothing runs between it and finalizing.
            live = not state.token.cancelled
            if result.ok and state.live and not live:
                result = _aborted(state, tuple(result.contexts))
    except BaseException as exc:  # landed between guarded spots: cancel, finish, re-raise later
        state.interrupt(exc)
        result = _aborted(state)
        live = False
    return _finish(state, result, live)


def _run_plain(
    host: PipelineHost, state: CallState, timeout: TimeoutPolicy | None = None
) -> ToolResult[Any]:
    """`run_stages` for a call that has no pre-execute hook, guard, wrapper or post hook (a
    batch call, or a direct call on a registry with observers only): the body, the
    late-success check, finalize.

    With `timeout`, the registry's own `TimeoutPolicy` as the only around wrapper: what the
    policy does around the chain, done here with no chain (its deadline, a lazy child of the
    call's token, is the body's token; `TOOL_TIMEOUT` if that deadline is what cancelled it).

    With nothing between the body and the final result, the one read of the call's token
    after the body serves both the late-success check (4.5) and the timeline's `cancelled`.
    """
    budget: CancelToken | None = None
    try:
        if timeout is not None:
            budget = _open_deadline(state, timeout)  # None: this tool has no timeout
        state.stage = _DISPATCH
        # Inline (not joined): already on a thread dedicated to this call; a runner joins its
        # remote body here. Otherwise the body goes to a worker and is joined.
        joined = not state.inline and state.entry.runner is None
        if budget is None:
            ctx = ToolContext(state, state.token, host, joined)
        else:
            ctx = ToolContext(state, budget, host, joined)
            ctx._covers_nested = False
        state.body = ctx
        state.stage = _BODY
        refused = None
        if state.caller_watched:  # inline (a batch's or nested call's)
            ctx._run()  # run_body's inline case, whose only extra is the caller's overdue watch
        else:
            refused = run_body(state, ctx, host.submit if joined else None, state.interrupt)
        contexts = ctx._finish()
        started = ctx._started
        if budget is not None:
            state.mark_body(ctx)
        elif started:  # `state.mark_body(ctx)`: the body's token is the call's own here
            state.dispatched_at = ctx._dispatched_at
            state.settled_at = ctx._settled_at
        if refused is not None:
            result = _failure(state.call, _TOOL_ERROR, refused, contexts)
        elif started and ctx._error is None:  # `_body_result`'s usual case (never debug here)
            state.dispatched = True
            state.stage = _AFTER_BODY
            result = _success(state, ctx._value, ctx._live_on_return, contexts)
        else:
            result = _body_result(state, ctx, contexts)
        if budget is not None:
            result = _close_deadline(state, timeout, budget, result)
            budget = None
        live = not state.token.cancelled
        if not live and result.ok and state.live:
            result = _aborted(state, contexts)
    except BaseException as exc:  # landed between guarded spots: cancel, finish, re-raise later
        if budget is not None:
            close_token(budget)
        state.interrupt(exc)
        result = _aborted(state)
        live = False
    return _finish(state, result, live)


def _open_deadline(state: CallState, timeout: TimeoutPolicy) -> CancelToken | None:
    """`timeout`'s deadline for this call: a lazy child of the call's token; None if none."""
    seconds = timeout._seconds(state.tool)
    if seconds is None:
        return None
    return deadline_token(state.token, seconds, timeout.code)


def _close_deadline(
    state: CallState, timeout: TimeoutPolicy | None, budget: CancelToken, result: ToolResult[Any]
) -> ToolResult[Any]:
    """After the body: `TOOL_TIMEOUT` if the deadline is what cancelled it; the deadline closed
    (after that read: a closed lazy deadline is not resolved again)."""
    try:
        if not TimeoutPolicy._expired(budget, result):
            return result
        assert timeout is not None  # the policy that opened it
        seconds = timeout._seconds(state.tool)
        assert seconds is not None  # it has a deadline
        message = TimeoutPolicy._message(seconds)
        return _failure(state.call, ErrorCode.TOOL_TIMEOUT, message, result.contexts)
    finally:
        close_token(budget)


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
    # `state.revoked()`, inline. A broken hook's result stays HOOK_ERROR. `ask` is None when no
    # hook decided anything, and so is `hook_error` when no hook broke: compare only a result.
    broken = ask is not None and ask is state.hook_error
    if state.live and state.token.cancelled and not broken:
        return _aborted(state)
    if isinstance(ask, ToolResult):
        return ask
    if ask is not None:
        denial = _approve(state, ask)
        if state.revoked():
            return _aborted(state)
        if denial is not None:
            return denial
    return _guards(state)


def _pre_execute(state: CallState) -> ToolResult[Any] | Ask | None:
    first_ask: Ask | None = None
    state.stage = _PRE_EXECUTE  # `state.at(...)`, inline: this runs for every call with the hook
    if state.debug:
        state.log_stage()
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
    state.at(_APPROVAL)
    try:
        approved = approver(state.call, ask.reason, state.token)
    except INTERRUPTS as exc:
        state.interrupt(exc)
        return _aborted(state)
    except Cancelled as exc:
        if state.token.cancelled:
            return _aborted(state)
        logger.warning("toolreg: the approver raised; denying %s", state.call.call_id, exc_info=exc)
        approved = False
    except BaseException as exc:  # an approver that raises refuses (or was cancelled)
        logger.warning("toolreg: the approver raised; denying %s", state.call.call_id, exc_info=exc)
        approved = False
    return None if approved is True else _denied(state, ask.reason)


def _guards(state: CallState) -> ToolResult[Any] | None:
    state.stage = _GUARDS  # `state.at(...)`, inline: this runs for every call with the hook
    if state.debug:
        state.log_stage()
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
    return _failure(state.call, ErrorCode.DENIED, safe_str(reason))


# -- around wrappers ---------------------------------------------------------------------------


def _around(host: PipelineHost, state: CallState) -> ToolResult[Any]:
    dispatch = Dispatch(state.call, state.tool, state.caller, state.token)
    state.stage = _AROUND
    if state.debug:
        state.log_stage()
    if state.hooks.chain_only:  # no proceed() reaches user code: none runs elsewhere or late
        return _proceed_from(host, state, dispatch, 0)
    state.chain_open = True
    result = _proceed_from(host, state, dispatch, 0)
    # The chain returned: refuse new `proceed()` calls, join those still running elsewhere.
    with PROCEEDS_LOCK:
        state.chain_open = False
        elsewhere = state.foreign_proceeds
    if elsewhere:
        _join_foreign_proceeds(state)
    return result


def _proceed_from(
    host: PipelineHost, state: CallState, dispatch: Dispatch, index: int
) -> ToolResult[Any]:
    """Run wrapper `index` (or, past the last, the body); never raises."""
    wrappers = state.hooks.around
    if index == len(wrappers):  # the innermost policy's chain run, or a proceed() elsewhere
        result = state.proceeded = _body(host, state, dispatch._token)
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
        return _raised(state, "around wrapper", exc, dispatch._token)
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
    result = state.proceeded = _body(host, state, dispatch._token)
    return result


def _late_proceed(state: CallState) -> ToolResult[Any]:
    return _hook_failure(state, "around wrapper", "called proceed() after the call ended")


def _proceed_elsewhere(
    host: PipelineHost, state: CallState, dispatch: Dispatch, index: int
) -> ToolResult[Any]:
    """`proceed()` on another thread: counted, so the chain's end waits for it (its body is
    this call's)."""
    with PROCEEDS_LOCK:
        if not state.chain_open:
            refused = True
        else:
            refused = False
            state.foreign_proceeds += 1
    if refused:
        return _late_proceed(state)
    try:
        return _proceed_from(host, state, dispatch, index)
    finally:
        with PROCEEDS_LOCK:
            state.foreign_proceeds -= 1
            drained = state.drained if state.foreign_proceeds == 0 else None
        if drained is not None:
            drained.set()


def _join_foreign_proceeds(state: CallState) -> None:
    """After the chain closed: wait for the `proceed()` calls still running on other threads."""
    drained = threading.Event()  # allocated outside the lock, and only when needed
    with PROCEEDS_LOCK:
        if state.foreign_proceeds == 0:
            return
        state.drained = drained
    wait_until(drained.is_set, functools.partial(_wait_event, drained), state.interrupt)


def _wait_event(event: threading.Event, timeout: float) -> bool:
    return event.wait(None if timeout < 0 else timeout)


# -- the body ---------------------------------------------------------------------------------


def _body(host: PipelineHost, state: CallState, wrapper_token: object) -> ToolResult[Any]:
    state.stage = _DISPATCH
    if state.debug:
        state.log_stage()
    token = state.token
    fused: CancelSource | None = None
    if wrapper_token is not token:
        if not isinstance(wrapper_token, CancelToken):
            return _hook_failure(state, "around wrapper", "left a non-token in dispatch.token")
        pending = wrapper_token._pending  # `_descends_from`'s first case, without the call
        if (pending is not None and pending[0] is token) or wrapper_token._descends_from(token):
            token = wrapper_token  # a deadline below the call's token, say: nothing to fuse
        else:
            fused = CancelSource(token, wrapper_token)
            token = fused.token
    # Inline (not joined): already on a thread dedicated to this call; a runner joins its
    # remote body here.
    joined = not state.inline and state.entry.runner is None
    ctx = ToolContext(state, token, host, joined)
    if token is not state.token:
        ctx._covers_nested = False  # see `ToolContext._covers_nested`
    state.body = ctx
    state.stage = _BODY
    if state.debug:
        state.log_stage()
    try:
        refused = run_body(state, ctx, host.submit if joined else None, state.interrupt)
    finally:
        if fused is not None:
            fused.close()  # nothing of this body stays linked to the caller's token
    contexts = ctx._finish()
    state.mark_body(ctx)
    if refused is not None:
        return _failure(state.call, _TOOL_ERROR, refused, contexts)
    if ctx._started and ctx._error is None and not state.debug:  # `_body_result`'s usual case
        state.dispatched = True
        state.stage = _AFTER_BODY
        return _success(state, ctx._value, ctx._live_on_return, contexts)
    return _body_result(state, ctx, contexts)


def _body_result(state: CallState, ctx: ToolContext, contexts: tuple[Any, ...]) -> ToolResult[Any]:
    if not ctx._started:
        return _aborted(state)
    state.dispatched = True
    state.stage = _AFTER_BODY
    if state.debug:
        state.log_stage()
    error = ctx._error
    if error is None:
        return _success(state, ctx._value, ctx._live_on_return, contexts)
    if isinstance(error, Cancelled) and ctx.token.cancelled:
        return _aborted(state, contexts)
    return _failure(state.call, _TOOL_ERROR, describe(error), contexts, error)


def _success(
    state: CallState, value: Any, live: bool, contexts: tuple[Any, ...]
) -> ToolResult[Any]:
    # `live`: the body's token as the body's thread saw it on return. A caller that cancelled
    # after that is still caught by the recheck after the wrappers.
    if state.live and not live:
        return _aborted(state, contexts)
    call = state.call
    validator = state.entry.output_validator
    if validator is not None:
        try:
            validator(value)
        except Exception as exc:
            problem = str(getattr(exc, "message", None) or describe(exc))
            message = f"the value does not match the output schema: {problem}"
            return _failure(call, _TOOL_ERROR, message, contexts)
    render = state.tool.render
    try:
        # A str without a render function is its own content (render_content's first case).
        content = value if render is None and type(value) is str else render_content(value, render)
    except INTERRUPTS as exc:
        state.interrupt(exc)
        return _aborted(state, contexts)
    except BaseException as exc:
        message = f"cannot render a {type(value).__name__} result: {describe(exc)}"
        return _failure(call, _TOOL_ERROR, message, contexts, exc)
    result = make_result(call, True, content, value, None, contexts)
    if state.hooks.results_unseen:
        state.own_result = result  # no user code will see it before it is final
    return result


# -- after the wrappers --------------------------------------------------------------------------


def _post_execute(state: CallState, result: ToolResult[Any]) -> ToolResult[Any]:
    """The post-execute hooks in order; the caller then lets cancellation replace a success."""
    state.stage = _POST_EXECUTE  # `state.at(...)`, inline: this runs for every call with the hook
    if state.debug:
        state.log_stage()
    for hook in state.hooks.post_execute:
        try:
            replaced: object = hook(result, state.token)
        except BaseException as exc:
            if not _is_cancellation(state, exc, state.token):
                return _hook_failure(state, "post-execute hook", f"raised {describe(exc)}", exc)
            return result if not result.ok else _aborted(state, tuple(result.contexts))
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
    state.stage = _OBSERVERS  # `state.at(...)`, inline: this runs for every call with the hook
    if state.debug:
        state.log_stage()
    for observer in observers:
        try:
            observer(result)
        except INTERRUPTS as exc:
            state.interrupt(exc)
        except BaseException:
            logger.exception("toolreg: result observer %r raised", observer)


# -- results -------------------------------------------------------------------------------------


def _aborted(state: CallState, contexts: tuple[Any, ...] = _NO_CONTEXTS) -> ToolResult[Any]:
    if state.dispatched:
        return _failure(state.call, _ABORTED, "tool call aborted", contexts)
    return _failure(state.call, _BEFORE, "tool call aborted before dispatch", contexts)


def _failure(
    call: ToolCall,
    code: ErrorCode,
    message: str,
    contexts: tuple[Any, ...] = _NO_CONTEXTS,
    exception: BaseException | None = None,
) -> ToolResult[Any]:
    error = ToolError(code, message, exception)
    return make_result(call, False, failure_content(code, message), None, error, contexts)


def _hook_failure(
    state: CallState, what: str, problem: str, exc: BaseException | None = None
) -> ToolResult[Any]:
    if exc is not None:
        logger.error("toolreg: %s failed for %s", what, state.call.call_id, exc_info=exc)
    result = _failure(state.call, ErrorCode.HOOK_ERROR, f"{what} {problem}", _NO_CONTEXTS, exc)
    state.hook_error = result
    return result


def _raised(state: CallState, what: str, exc: BaseException, token: CancelToken) -> ToolResult[Any]:
    """The result of a hook or wrapper that raised `exc`."""
    if _is_cancellation(state, exc, token):
        return _aborted(state)
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
