"""docs/contract.md section 4, the cancellation contract, sentence by sentence.

Each group of tests quotes the sentence it pins. Every race is decided deterministically: a
thread is held on an `Event` (a `Gate`) exactly at the window under test, the other side acts,
then the gate opens. Nothing here sleeps to order threads.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from _registry_helpers import (
    ABORTED,
    BEFORE,
    WAIT,
    Caller,
    Gate,
    Journal,
    Observed,
    Proceed,
    default_sigint,
    holds_nothing,
    open_registry,
    send_ctrl_c_when,
    wait_until,
)

from toolreg import (
    Ask,
    Cancelled,
    CancelSource,
    CancelToken,
    Deny,
    Dispatch,
    ErrorCode,
    InsideCallError,
    RegistryClosedError,
    Tool,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
    _body,
    deadline,
)

Args = Any


def add_waiting_tool(registry: ToolRegistry, name: str = "work") -> dict[str, Any]:
    """A cooperative body: signals `started`, waits for its token, reports what it saw."""
    state: dict[str, Any] = {"started": threading.Event(), "saw_cancel": None, "runs": 0}

    def body(args: Args, ctx: ToolContext) -> str:
        state["runs"] += 1
        state["started"].set()
        state["saw_cancel"] = ctx.token.wait(WAIT)
        return "finished"

    registry.tool(name=name)(body)
    return state


def at_body_stage(registry: ToolRegistry, name: str) -> bool:
    """True once a call of `name` is handing its body to the pool (or queued there)."""
    return any(c.call.name == name and c.stage == "body" for c in registry.in_flight())


def add_counting_tool(registry: ToolRegistry, name: str = "work") -> list[str]:
    """A body that only records that it started (by call id)."""
    starts: list[str] = []

    def body(args: Args, ctx: ToolContext) -> str:
        starts.append(ctx.call.call_id)
        return "ran"

    registry.tool(name=name)(body)
    return starts


# -- "The caller's token is captured at entry, outside anything a wrapper can change." ---------


@pytest.mark.parametrize(
    "replacement",
    [lambda: CancelSource().token, CancelToken.never],
    ids=["unrelated-source", "never"],
)
def test_caller_cancel_reaches_body_whatever_token_a_wrapper_substitutes(
    registry: ToolRegistry, replacement: Callable[[], CancelToken]
) -> None:
    state = add_waiting_tool(registry)

    def detach(dispatch: Dispatch, proceed: Callable[[], ToolResult[Any]]) -> ToolResult[Any]:
        dispatch.token = replacement()
        return proceed()

    registry.add_around(detach)
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    assert state["started"].wait(WAIT)
    caller.cancel("user pressed stop")
    result = call.join()
    assert state["saw_cancel"] is True
    assert result.code == ABORTED
    assert result.dispatched


def test_dispatch_caller_token_is_the_callers_and_read_only(registry: ToolRegistry) -> None:
    add_counting_tool(registry)
    seen: list[Any] = []

    def wrapper(dispatch: Dispatch, proceed: Callable[[], ToolResult[Any]]) -> ToolResult[Any]:
        seen.append(dispatch.caller_token)
        for attribute in ("caller_token", "call", "tool"):
            try:
                setattr(dispatch, attribute, CancelSource().token)
            except AttributeError:
                seen.append(attribute)
        return proceed()

    registry.add_around(wrapper)
    caller = CancelSource()
    assert registry.execute("work", token=caller.token).ok
    assert seen == [caller.token, "caller_token", "call", "tool"]


def test_stages_after_the_wrappers_get_the_call_token_back_whatever_a_wrapper_left(
    registry: ToolRegistry,
) -> None:
    add_counting_tool(registry)
    stranger = CancelSource()
    stranger.cancel("not this call's business")
    hook_tokens: list[CancelToken] = []

    def leave_cancelled_token(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
        result = proceed()
        dispatch.token = stranger.token  # never restored
        return result

    registry.add_around(leave_cancelled_token)
    registry.add_post_execute(lambda result, token: hook_tokens.append(token))
    result = registry.execute("work")
    assert result.ok
    assert hook_tokens[0] is not stranger.token
    assert not hook_tokens[0].cancelled


def test_hooks_receive_a_token_cancelled_whenever_the_callers_is(registry: ToolRegistry) -> None:
    add_counting_tool(registry)
    gate = Gate()
    tokens: list[CancelToken] = []

    def hook(call: ToolCall, token: CancelToken) -> None:
        tokens.append(token)
        gate.hold()

    registry.add_pre_execute(hook)
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    cancelled_at_first = tokens[0].cancelled  # a name: mypy would keep it False past cancel()
    assert not cancelled_at_first
    caller.cancel("stop")
    assert tokens[0].cancelled
    assert tokens[0].reason == "stop"
    gate.release()
    assert call.join().code == BEFORE


def recording_wrapper(ran: list[str]) -> Callable[[Dispatch, Proceed], ToolResult[Any]]:
    """An around wrapper that notes in `ran` that it ran, then proceeds."""

    def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        ran.append("wrapper")
        return proceed()

    return wrapper


# -- "A token that was live at entry is rechecked after pre-execute hooks, after approval, and on
#    the worker immediately before the body ... Cancelled at any of those points ->
#    ABORTED_BEFORE_DISPATCH, and the body never starts." -------------------------------------


def test_cancel_while_pre_execute_hook_runs_aborts_before_dispatch(
    registry: ToolRegistry, observed: Observed
) -> None:
    starts = add_counting_tool(registry)
    gate = Gate()
    registry.add_pre_execute(lambda call, token: gate.hold())
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    caller.cancel("stop")
    gate.release()
    result = call.join()
    assert result.code == BEFORE
    assert result.content == "Error: tool call aborted before dispatch"
    assert not result.dispatched
    assert starts == []
    assert observed.results == [result]


def test_a_pre_execute_hook_that_cancels_and_returns_none_stops_the_call_before_the_guards(
    registry: ToolRegistry, observed: Observed
) -> None:
    """The recheck after the pre-execute hooks does not depend on what the hooks returned: a
    hook that returns None (no decision at all) after its turn was cancelled still ends the call
    there, and neither the guards nor any wrapper runs (issue 33)."""
    starts = add_counting_tool(registry)
    caller = CancelSource()
    ran: list[str] = []

    def stop(call: ToolCall, token: CancelToken) -> None:
        caller.cancel("user pressed stop")  # and no decision

    def guard(call: ToolCall) -> None:
        ran.append("guard")

    registry.add_pre_execute(stop)
    registry.add_guard(guard)
    registry.add_around(recording_wrapper(ran))
    result = registry.execute("work", token=caller.token)
    assert result.code == BEFORE
    assert (ran, starts) == ([], [])
    assert observed.results == [result]


def test_a_call_cancelled_before_its_first_stage_runs_no_wrapper_even_without_pre_hooks(
    registry: ToolRegistry, observed: Observed
) -> None:
    """The recheck after the pre-execute stage is made when that stage is empty too: a call
    whose token a call hook saw cancelled runs no guard, no wrapper (it ran every wrapper, and
    only the body's recheck refused it, when no pre-execute hook was registered)."""
    starts = add_counting_tool(registry)
    caller = CancelSource()
    ran: list[str] = []

    def stop(call: ToolCall, token: CancelToken) -> None:
        caller.cancel("stop")

    registry.add_call_hook(stop)
    registry.add_around(recording_wrapper(ran))
    result = registry.execute("work", token=caller.token)
    assert result.code == BEFORE
    assert (ran, starts) == ([], [])
    assert observed.results == [result]


def test_cancel_while_approver_runs_aborts_before_dispatch_even_if_it_approves(
    registry: ToolRegistry,
) -> None:
    starts = add_counting_tool(registry)
    gate = Gate()
    registry.add_pre_execute(lambda call, token: Ask("confirm?"))

    def approver(call: ToolCall, reason: str, token: CancelToken) -> bool:
        gate.hold()
        return True

    registry.set_approver(approver)
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    caller.cancel("stop")
    gate.release()
    result = call.join()
    assert result.code == BEFORE
    assert starts == []


def test_cancel_while_guard_runs_is_caught_by_the_check_before_the_body(
    registry: ToolRegistry,
) -> None:
    starts = add_counting_tool(registry)
    gate = Gate()

    def guard(call: ToolCall) -> None:
        gate.hold()

    registry.add_guard(guard)
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    caller.cancel("stop")
    gate.release()
    assert call.join().code == BEFORE
    assert starts == []


def test_cancel_while_queued_behind_busy_pool_returns_at_once_and_body_never_runs() -> None:
    with open_registry(max_workers=1) as registry:
        gate = Gate()

        @registry.tool
        def blocker(args: Args, ctx: ToolContext) -> str:
            gate.hold()
            return "done"

        starts = add_counting_tool(registry, "queued")
        busy = Caller(lambda: registry.execute("blocker"))
        gate.wait_reached()  # the only worker is busy from here on
        caller = CancelSource()
        queued = Caller(lambda: registry.execute("queued", token=caller.token))
        wait_until(lambda: at_body_stage(registry, "queued"), "the queued call to reach the pool")
        caller.cancel("stop")
        result = queued.join()  # returns while the worker is still held: promptly
        assert not gate.released.is_set()
        assert result.code == BEFORE
        assert not result.dispatched
        gate.release()
        assert busy.join().ok
        # The pool is FIFO with one worker: once this later call ran, the queued job has too.
        assert registry.execute("queued").ok
        assert len(starts) == 1
        assert result.call.call_id not in starts


class ListenSpy:
    """Records when the join registers who wakes it on cancellation (`_body._listen`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.registered = threading.Event()
        real = _body._listen

        def listen(state: Any, ctx: Any, due: Any) -> Any:
            self.calls += 1
            registration = real(state, ctx, due)
            self.registered.set()
            return registration

        monkeypatch.setattr(_body, "_listen", listen)


def test_a_body_an_idle_worker_took_and_that_settles_at_once_registers_no_listener(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker that took the body starts it, or refuses it at its token check, by itself:
    within the first wait the caller's token gets no listener (contract A.1)."""
    monkeypatch.setattr(_body, "LISTEN_AFTER", WAIT)  # the first wait outlasts the body
    spy = ListenSpy(monkeypatch)
    with open_registry(max_workers=1) as registry:
        registry.register(Tool("quick", lambda args, ctx: "done"))
        caller = CancelSource()
        assert registry.execute("quick", token=caller.token).ok
        assert spy.calls == 0
        assert not caller.token._listeners  # white-box: nothing was ever registered on it


def test_a_body_that_outlasts_the_first_wait_gets_its_listener_and_its_cancellation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the first wait the join registers the listener while the body runs; the caller's
    cancellation then reaches the call, and nothing stays on the caller's token."""
    monkeypatch.setattr(_body, "LISTEN_AFTER", 0.001)
    spy = ListenSpy(monkeypatch)
    with open_registry(max_workers=1) as registry:

        def body(args: Args, ctx: ToolContext) -> str:
            assert spy.registered.wait(WAIT)  # held until the join has registered
            caller.cancel("stop")
            return "late"

        registry.register(Tool("slow", body))
        caller = CancelSource()
        result = registry.execute("slow", token=caller.token)
        assert spy.calls == 1
        assert result.code == ABORTED and result.dispatched
        assert not caller.token._listeners  # white-box: removed after the join


def test_wrapper_deadline_expired_before_proceed_aborts_before_dispatch(
    registry: ToolRegistry,
) -> None:
    starts = add_counting_tool(registry)

    def expired_deadline(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
        previous = dispatch.token
        with deadline(previous, 0.001, "TOOL_TIMEOUT") as budget:
            assert budget.token.wait(WAIT)  # the deadline has fired before proceed()
            dispatch.token = budget.token
            try:
                return proceed()
            finally:
                dispatch.token = previous

    registry.add_around(expired_deadline)
    caller = CancelSource()
    result = registry.execute("work", token=caller.token)
    assert result.code == BEFORE
    assert not result.dispatched
    assert starts == []
    assert not caller.token.cancelled


def test_wrapper_token_cancelled_before_proceed_aborts_before_dispatch(
    registry: ToolRegistry,
) -> None:
    starts = add_counting_tool(registry)

    def cancelled_scope(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
        scope = CancelSource(dispatch.token)
        scope.cancel("wrapper gave up")
        dispatch.token = scope.token
        return proceed()

    registry.add_around(cancelled_scope)
    assert registry.execute("work", token=CancelSource().token).code == BEFORE
    assert starts == []


# -- "A body that raises Cancelled while its fused token is cancelled, or returns success after
#    its fused token was cancelled (by the caller or by a wrapper's token), has been cancelled:
#    ABORTED. Cancelled raised while the token is live is an ordinary TOOL_ERROR." --------------


def test_body_raising_cancelled_after_caller_cancel_is_aborted(registry: ToolRegistry) -> None:
    started = threading.Event()

    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        started.set()
        ctx.token.wait(WAIT)
        ctx.token.raise_if_cancelled()
        return "unreachable"

    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    assert started.wait(WAIT)
    caller.cancel("stop")
    result = call.join()
    assert result.code == ABORTED
    assert result.content == "Error: tool call aborted"
    assert result.dispatched


def test_body_returning_success_after_caller_cancel_is_aborted(registry: ToolRegistry) -> None:
    state = add_waiting_tool(registry)
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    assert state["started"].wait(WAIT)
    caller.cancel("stop")
    result = call.join()
    assert state["saw_cancel"] is True
    assert result.code == ABORTED
    assert result.value is None


def test_body_returning_success_after_wrapper_token_cancel_is_aborted(
    registry: ToolRegistry,
) -> None:
    state = add_waiting_tool(registry)
    scopes: list[CancelSource] = []

    def scoped(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
        previous = dispatch.token
        with CancelSource(previous) as scope:
            scopes.append(scope)
            dispatch.token = scope.token
            try:
                return proceed()
            finally:
                dispatch.token = previous

    registry.add_around(scoped)
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    assert state["started"].wait(WAIT)
    scopes[0].cancel("wrapper's own reason")
    result = call.join()
    assert result.code == ABORTED
    assert not caller.token.cancelled


def test_body_raising_cancelled_while_token_live_is_tool_error(registry: ToolRegistry) -> None:
    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        raise Cancelled("a cancellation of the tool's own, not ours")

    result = registry.execute("work", token=CancelSource().token)
    assert result.code == ErrorCode.TOOL_ERROR
    assert result.error is not None
    assert isinstance(result.error.exception, Cancelled)
    assert result.dispatched


# -- "Once a body starts, the registry waits for it to return or raise. It never abandons it,
#    even if it ignores its token: execute stays blocked, by design." --------------------------


def test_uncooperative_body_keeps_execute_blocked_until_it_returns(registry: ToolRegistry) -> None:
    gate = Gate()
    journal = Journal()

    @registry.tool
    def stubborn(args: Args, ctx: ToolContext) -> str:
        gate.hold()  # ignores ctx.token
        journal("body returned")
        return "late"

    registry.on_result(lambda result: journal("observer"))
    caller = CancelSource()
    call = Caller(lambda: registry.execute("stubborn", token=caller.token))
    gate.wait_reached()
    caller.cancel("stop")
    assert call.still_blocked()
    gate.release()
    result = call.join()
    journal("execute returned")
    assert result.code == ABORTED
    assert journal.entries == ["body returned", "observer", "execute returned"]


# -- "Cancellation that wins before the final result is materialized replaces every successful
#    outcome: ABORTED if the body started, ABORTED_BEFORE_DISPATCH if it never did ... A failure
#    ... is more specific and stays. Deferred contexts are kept in the replacement." ------------


def add_deferring_tool(registry: ToolRegistry) -> None:
    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        ctx.defer_context({"note": "searched"})
        ctx.defer_context("second")
        return "found"


def test_cancel_while_wrapper_holds_after_body_success_gives_aborted_with_contexts(
    registry: ToolRegistry,
) -> None:
    add_deferring_tool(registry)
    gate = Gate()

    def slow_wrapper(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
        result = proceed()
        gate.hold()
        return result

    registry.add_around(slow_wrapper)
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    caller.cancel("stop")
    gate.release()
    result = call.join()
    assert result.code == ABORTED
    assert result.dispatched
    assert result.contexts == ({"note": "searched"}, "second")


def test_cancel_while_post_hook_holds_on_success_gives_aborted_with_contexts(
    registry: ToolRegistry,
) -> None:
    add_deferring_tool(registry)
    gate = Gate()
    registry.add_post_execute(lambda result, token: gate.hold())
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    caller.cancel("stop")
    gate.release()
    result = call.join()
    assert result.code == ABORTED
    assert result.contexts == ({"note": "searched"}, "second")


def test_wrapper_success_without_body_overtaken_by_cancel_is_aborted_before_dispatch(
    registry: ToolRegistry,
) -> None:
    starts = add_counting_tool(registry)
    gate = Gate()

    def cache(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
        gate.hold()
        return ToolResult.success(dispatch.call, "cached", contexts=("from cache",))

    registry.add_around(cache)
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    caller.cancel("stop")
    gate.release()
    result = call.join()
    assert result.code == BEFORE
    assert not result.dispatched
    assert result.contexts == ("from cache",)
    assert starts == []


def _hold_in_body(registry: ToolRegistry, gate: Gate) -> None:
    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        gate.hold()
        raise ValueError("the tool's own failure")


def _hold_in_wrapper_then_time_out(registry: ToolRegistry, gate: Gate) -> None:
    add_counting_tool(registry)

    def wrapper(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
        proceed()
        gate.hold()
        return ToolResult.failure(
            dispatch.call, ErrorCode.TOOL_TIMEOUT, "tool call timed out after 1s"
        )

    registry.add_around(wrapper)


def _hold_in_wrapper_then_raise(registry: ToolRegistry, gate: Gate) -> None:
    add_counting_tool(registry)

    def wrapper(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
        proceed()
        gate.hold()
        raise ValueError("wrapper broke")

    registry.add_around(wrapper)


def _hold_in_post_hook_on_failure(registry: ToolRegistry, gate: Gate) -> None:
    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        raise ValueError("the tool's own failure")

    registry.add_post_execute(lambda result, token: gate.hold())


def _hold_in_pre_hook_then_deny(registry: ToolRegistry, gate: Gate) -> None:
    add_counting_tool(registry)

    def hook(call: ToolCall, token: CancelToken) -> Deny:
        gate.hold()
        return Deny("policy says no")

    registry.add_pre_execute(hook)


def _hold_in_approver_then_refuse(registry: ToolRegistry, gate: Gate) -> None:
    add_counting_tool(registry)
    registry.add_pre_execute(lambda call, token: Ask("confirm?"))

    def approver(call: ToolCall, reason: str, token: CancelToken) -> bool:
        gate.hold()
        return False

    registry.set_approver(approver)


def _hold_in_approver_then_raise_cancelled(registry: ToolRegistry, gate: Gate) -> None:
    # The approver's turn was cancelled and it says so the usual way: Cancelled.
    add_counting_tool(registry)
    registry.add_pre_execute(lambda call, token: Ask("confirm?"))

    def approver(call: ToolCall, reason: str, token: CancelToken) -> bool:
        gate.hold()
        token.raise_if_cancelled()
        return True

    registry.set_approver(approver)


def _hold_in_approver_then_raise(registry: ToolRegistry, gate: Gate) -> None:
    # An approver whose prompt broke off (its UI went away, say) raises something else.
    add_counting_tool(registry)
    registry.add_pre_execute(lambda call, token: Ask("confirm?"))

    def approver(call: ToolCall, reason: str, token: CancelToken) -> bool:
        gate.hold()
        raise ConnectionError("the approval prompt went away")

    registry.set_approver(approver)


def _hold_in_pre_hook_then_return_a_wrong_type(registry: ToolRegistry, gate: Gate) -> None:
    add_counting_tool(registry)

    def hook(call: ToolCall, token: CancelToken) -> Any:
        gate.hold()
        return "allow"  # not None, Allow, Deny or Ask: a malfunction

    registry.add_pre_execute(hook)


def _hold_in_pre_hook_then_raise(registry: ToolRegistry, gate: Gate) -> None:
    add_counting_tool(registry)

    def hook(call: ToolCall, token: CancelToken) -> None:
        gate.hold()
        raise ValueError("hook broke")

    registry.add_pre_execute(hook)


def _hold_in_guard_then_deny(registry: ToolRegistry, gate: Gate) -> None:
    add_counting_tool(registry)

    def guard(call: ToolCall) -> str:
        gate.hold()
        return "guard says no"

    registry.add_guard(guard)


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        (_hold_in_body, ErrorCode.TOOL_ERROR),
        (_hold_in_wrapper_then_time_out, ErrorCode.TOOL_TIMEOUT),
        (_hold_in_wrapper_then_raise, ErrorCode.HOOK_ERROR),
        (_hold_in_post_hook_on_failure, ErrorCode.TOOL_ERROR),
        (_hold_in_guard_then_deny, ErrorCode.DENIED),
        # 4.11: a pre-execute hook that malfunctions after the cancel stays HOOK_ERROR.
        (_hold_in_pre_hook_then_return_a_wrong_type, ErrorCode.HOOK_ERROR),
        (_hold_in_pre_hook_then_raise, ErrorCode.HOOK_ERROR),
    ],
    ids=[
        "tool-error",
        "timeout",
        "wrapper-error",
        "post-on-failure",
        "guard",
        "pre-wrong-type",
        "pre-raises",
    ],
)
def test_failure_stays_when_cancellation_arrives_before_the_final_result(
    registry: ToolRegistry, setup: Callable[[ToolRegistry, Gate], None], code: ErrorCode
) -> None:
    gate = Gate()
    setup(registry, gate)
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    caller.cancel("stop")
    gate.release()
    assert call.join().code == code


@pytest.mark.parametrize(
    "setup",
    [
        _hold_in_pre_hook_then_deny,
        _hold_in_approver_then_refuse,
        _hold_in_approver_then_raise_cancelled,
        _hold_in_approver_then_raise,
    ],
    ids=["pre", "approver", "approver-raises-cancelled", "approver-raises"],
)
def test_cancellation_wins_over_a_denial_returned_after_it(
    registry: ToolRegistry, setup: Callable[[ToolRegistry, Gate], None]
) -> None:
    # A pre-execute hook or approver that says no once its turn was cancelled refused nothing.
    gate = Gate()
    setup(registry, gate)
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    caller.cancel("stop")
    gate.release()
    result = call.join()
    assert result.code == ErrorCode.ABORTED_BEFORE_DISPATCH
    assert not result.dispatched


@pytest.mark.parametrize(
    "setup",
    [_hold_in_pre_hook_then_deny, _hold_in_approver_then_refuse, _hold_in_approver_then_raise],
    ids=["pre", "approver", "approver-raises"],
)
def test_a_denial_made_while_the_token_is_live_stays_denied(
    registry: ToolRegistry, setup: Callable[[ToolRegistry, Gate], None]
) -> None:
    gate = Gate()
    setup(registry, gate)
    call = Caller(lambda: registry.execute("work", token=CancelSource().token))
    gate.wait_reached()
    gate.release()
    assert call.join().code == ErrorCode.DENIED


def test_body_success_after_cancel_keeps_its_deferred_contexts(registry: ToolRegistry) -> None:
    started = threading.Event()

    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        ctx.defer_context("before cancel")
        started.set()
        ctx.token.wait(WAIT)
        ctx.defer_context("after cancel")
        return "done anyway"

    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    assert started.wait(WAIT)
    caller.cancel("stop")
    result = call.join()
    assert result.code == ABORTED
    assert result.contexts == ("before cancel", "after cancel")


# -- "Pre-aborted entry (... already cancelled, and start_if_cancelled=True, the default) ...
#    reaches the body, which sees a cancelled token ...; the body's own outcome is what the
#    caller gets (none of the rechecks or success replacements above apply; a body raising
#    Cancelled is still ABORTED)." ----------------------------------------------------------


@pytest.fixture
def cancelled_token() -> CancelToken:
    source = CancelSource()
    source.cancel("cancelled before the call")
    return source.token


def test_pre_aborted_direct_call_goes_through_hooks_and_reaches_the_body(
    registry: ToolRegistry, cancelled_token: CancelToken
) -> None:
    journal = Journal()

    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        journal(("body", ctx.token.cancelled))
        return "cleaned up"

    registry.add_pre_execute(lambda call, token: journal("pre"))
    registry.add_guard(lambda call: journal("guard"))

    def wrapper(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
        journal("around")
        return proceed()

    registry.add_around(wrapper)
    registry.add_post_execute(lambda result, token: journal("post"))
    result = registry.execute("work", token=cancelled_token)
    assert journal.entries == ["pre", "guard", "around", ("body", True), "post"]
    assert result.ok  # no success replacement for a pre-aborted direct call
    assert result.value == "cleaned up"
    assert result.dispatched


def test_pre_aborted_body_failure_stands(
    registry: ToolRegistry, cancelled_token: CancelToken
) -> None:
    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        raise PermissionError("translated cancellation")

    result = registry.execute("work", token=cancelled_token)
    assert result.code == ErrorCode.TOOL_ERROR
    assert isinstance(result.error.exception, PermissionError)  # type: ignore[union-attr]


def test_pre_aborted_body_raising_cancelled_is_aborted(
    registry: ToolRegistry, cancelled_token: CancelToken
) -> None:
    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        ctx.defer_context("cleanup done")
        ctx.token.raise_if_cancelled()
        return "unreachable"

    result = registry.execute("work", token=cancelled_token)
    assert result.code == ABORTED
    assert result.dispatched
    assert result.contexts == ("cleanup done",)


def test_pre_aborted_rechecks_do_not_stop_a_call_whose_hooks_wait(
    registry: ToolRegistry, cancelled_token: CancelToken
) -> None:
    starts = add_counting_tool(registry)
    registry.add_pre_execute(lambda call, token: Ask("confirm?"))
    registry.set_approver(lambda call, reason, token: True)
    result = registry.execute("work", token=cancelled_token)
    assert result.ok
    assert len(starts) == 1


# -- "Model-driven dispatch never reopens this way: registry.execute(...,
#    start_if_cancelled=False), ctx.execute ... start no body under an already-cancelled token
#    (ABORTED_BEFORE_DISPATCH, no hook runs, observers still see it)" ---------------------------


def add_every_hook(registry: ToolRegistry, journal: Journal) -> None:
    def pre(call: ToolCall, token: CancelToken) -> Ask:
        journal(("pre", call.name))
        return Ask("?")

    def approver(call: ToolCall, reason: str, token: CancelToken) -> bool:
        journal(("approver", call.name))
        return True

    registry.add_pre_execute(pre)
    registry.set_approver(approver)
    registry.add_guard(lambda call: journal(("guard", call.name)))

    def wrapper(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
        journal(("around", dispatch.call.name))
        return proceed()

    registry.add_around(wrapper)
    registry.add_post_execute(lambda result, token: journal(("post", result.call.name)))


def test_model_driven_call_under_cancelled_token_starts_nothing(
    registry: ToolRegistry, observed: Observed, cancelled_token: CancelToken
) -> None:
    starts = add_counting_tool(registry)
    journal = Journal()
    add_every_hook(registry, journal)
    result = registry.execute("work", token=cancelled_token, start_if_cancelled=False)
    assert result.code == BEFORE
    assert not result.dispatched
    assert journal.entries == []
    assert starts == []
    assert observed.results == [result]


def test_nested_call_under_cancelled_parent_starts_nothing(
    registry: ToolRegistry, observed: Observed
) -> None:
    starts = add_counting_tool(registry, "inner")
    journal = Journal()
    started = threading.Event()

    @registry.tool
    def outer(args: Args, ctx: ToolContext) -> str:
        started.set()
        assert ctx.token.wait(WAIT)
        nested = ctx.execute("inner")
        return str(nested.code)

    caller = CancelSource()
    call = Caller(lambda: registry.execute("outer", token=caller.token))
    assert started.wait(WAIT)
    add_every_hook(registry, journal)  # hooks present at the nested call's entry
    caller.cancel("stop")
    result = call.join()
    assert result.code == ABORTED  # the outer body returned success after cancellation
    assert starts == []
    assert journal.entries == []  # the nested call entered no hook
    inner = [r for r in observed.results if r.call.name == "inner"]
    assert [r.code for r in inner] == [BEFORE]
    assert not inner[0].dispatched


def test_batch_under_cancelled_token_starts_nothing(
    registry: ToolRegistry, observed: Observed, cancelled_token: CancelToken
) -> None:
    starts = add_counting_tool(registry)
    journal = Journal()
    add_every_hook(registry, journal)
    calls = [ToolCall("work", {"n": n}) for n in range(3)]
    results = registry.execute_batch(calls, token=cancelled_token)
    assert [r.code for r in results] == [BEFORE] * 3
    assert [r.call.call_id for r in results] == [c.call_id for c in calls]
    assert not any(r.dispatched for r in results)
    assert journal.entries == []
    assert starts == []
    assert sorted(r.call.call_id for r in observed.results) == sorted(c.call_id for c in calls)


def test_asyncio_facade_starts_no_body_once_it_cancelled_the_call_itself(
    registry: ToolRegistry, observed: Observed
) -> None:
    from toolreg.aio import AsyncToolRegistry

    starts = add_counting_tool(registry)
    gate = Gate()
    hook_tokens: list[CancelToken] = []

    def hook(call: ToolCall, token: CancelToken) -> None:
        hook_tokens.append(token)
        gate.hold()

    registry.add_pre_execute(hook)
    areg = AsyncToolRegistry(registry)

    async def scenario() -> None:
        task = asyncio.ensure_future(areg.execute("work"))
        await asyncio.to_thread(gate.wait_reached)
        task.cancel()
        await asyncio.to_thread(
            wait_until, lambda: hook_tokens[0].cancelled, "the facade to cancel the call"
        )
        gate.release()
        with pytest.raises(asyncio.CancelledError):
            await task
        await areg.aclose()
        await asyncio.to_thread(registry.close)

    asyncio.run(scenario())
    assert starts == []
    assert observed.codes == [BEFORE]
    assert not observed.results[0].dispatched


# -- "Dispatch-scoped listeners are removed when the body settles: after execute returns, the
#    caller's token holds no registration from that call." -----------------------------------


def _plain(registry: ToolRegistry, token: CancelToken) -> None:
    assert registry.execute("work", token=token).ok


def _raising(registry: ToolRegistry, token: CancelToken) -> None:
    assert registry.execute("fail", token=token).code == ErrorCode.TOOL_ERROR


def _wrapper_scope_cancelled(registry: ToolRegistry, token: CancelToken) -> None:
    cancellers: list[threading.Thread] = []

    def scoped(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
        scope = CancelSource(dispatch.token)  # never closed: the registry must still clean up
        dispatch.token = scope.token
        canceller = threading.Thread(target=scope.cancel)
        cancellers.append(canceller)
        canceller.start()  # lands before or during the body: either way it is cancellation
        return proceed()

    registration = registry.add_around(scoped)
    assert registry.execute("wait", token=token).code in (ABORTED, BEFORE)
    cancellers[0].join()
    registration.remove()


def _nested(registry: ToolRegistry, token: CancelToken) -> None:
    assert registry.execute("outer", token=token).ok


def _wrapper_scope_cancelled_before_proceed(registry: ToolRegistry, token: CancelToken) -> None:
    def scoped(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
        scope = CancelSource(dispatch.token)
        scope.cancel("wrapper")
        dispatch.token = scope.token
        return proceed()

    registration = registry.add_around(scoped)
    assert registry.execute("work", token=token).code == BEFORE
    registration.remove()


@pytest.mark.parametrize(
    "scenario",
    [_plain, _raising, _wrapper_scope_cancelled, _nested, _wrapper_scope_cancelled_before_proceed],
)
def test_callers_token_holds_no_registration_after_execute_returns(
    registry: ToolRegistry, scenario: Callable[[ToolRegistry, CancelToken], None]
) -> None:
    add_counting_tool(registry)

    @registry.tool
    def fail(args: Args, ctx: ToolContext) -> str:
        raise ValueError("boom")

    @registry.tool
    def wait(args: Args, ctx: ToolContext) -> str:
        ctx.token.wait(WAIT)
        return "late"

    @registry.tool
    def outer(args: Args, ctx: ToolContext) -> str:
        return ctx.execute("work").content

    root = CancelSource()
    caller = CancelSource(root.token)
    scenario(registry, caller.token)
    assert holds_nothing(caller.token)
    assert not caller.token.cancelled
    caller.close()
    assert holds_nothing(root.token)


# -- "Ctrl-C: a KeyboardInterrupt anywhere inside execute (a hook, the approver, the join)
#    cancels that call's token (never the caller's), completes the pipeline -- joining any
#    started body and notifying observers once -- then re-raises." ---------------------------


def test_ctrl_c_in_pre_execute_hook_cancels_the_call_not_the_caller_then_reraises(
    registry: ToolRegistry, observed: Observed
) -> None:
    starts = add_counting_tool(registry)
    tokens: list[CancelToken] = []

    def hook(call: ToolCall, token: CancelToken) -> None:
        tokens.append(token)
        raise KeyboardInterrupt

    registry.add_pre_execute(hook)
    caller = CancelSource()
    with pytest.raises(KeyboardInterrupt):
        registry.execute("work", token=caller.token)
    assert tokens[0].cancelled
    assert not caller.token.cancelled
    assert starts == []
    assert observed.codes == [BEFORE]


def test_ctrl_c_in_approver_cancels_the_call_not_the_caller_then_reraises(
    registry: ToolRegistry, observed: Observed
) -> None:
    starts = add_counting_tool(registry)
    tokens: list[CancelToken] = []
    registry.add_pre_execute(lambda call, token: Ask("confirm?"))

    def approver(call: ToolCall, reason: str, token: CancelToken) -> bool:
        tokens.append(token)
        raise KeyboardInterrupt

    registry.set_approver(approver)
    caller = CancelSource()
    with pytest.raises(KeyboardInterrupt):
        registry.execute("work", token=caller.token)
    assert tokens[0].cancelled
    assert not caller.token.cancelled
    assert starts == []
    assert observed.codes == [BEFORE]


def test_ctrl_c_while_joining_the_body_cancels_the_call_joins_it_then_reraises(
    registry: ToolRegistry, observed: Observed
) -> None:
    state = add_waiting_tool(registry)
    journal = Journal()
    registry.on_result(lambda result: journal(("observer", state["saw_cancel"])))
    caller = CancelSource()
    with default_sigint():
        presser = send_ctrl_c_when(state["started"])
        with pytest.raises(KeyboardInterrupt):
            registry.execute("work", token=caller.token)
        presser.join()
    assert state["saw_cancel"] is True  # the body saw the call's token cancelled and returned
    assert journal.entries == [("observer", True)]  # observers ran after the body, once
    assert not caller.token.cancelled
    assert observed.codes == [ABORTED]
    assert observed.results[0].dispatched


# -- "registry.close() cancels every in-flight call, waits for all of them, then shuts down an
#    executor it owns. New calls after close raise RuntimeError; close() from inside one of the
#    registry's own calls raises RuntimeError instead of waiting for itself." (4.10 and 17.1
#    name the subclasses: RegistryClosedError and InsideCallError.) --------------------------


def test_close_cancels_every_in_flight_call_waits_for_them_and_shuts_down_its_pool() -> None:
    registry = ToolRegistry(max_workers=1, thread_name_prefix="closing-pool")
    try:
        running = add_waiting_tool(registry, "running")
        queued_starts = add_counting_tool(registry, "queued")
        add_counting_tool(registry, "held")
        hook_reached = threading.Event()

        def hook(call: ToolCall, token: CancelToken) -> None:
            if call.name == "held":
                hook_reached.set()
                token.wait(WAIT)

        registry.add_pre_execute(hook)
        first = Caller(lambda: registry.execute("running"))
        assert running["started"].wait(WAIT)
        second = Caller(lambda: registry.execute("queued"))
        wait_until(lambda: at_body_stage(registry, "queued"), "the queued call to reach the pool")
        third = Caller(lambda: registry.execute("held"))
        assert hook_reached.wait(WAIT)
    finally:
        registry.close()
    assert registry.in_flight() == []
    assert first.join().code == ABORTED
    assert second.join().code == BEFORE
    assert third.join().code == BEFORE
    assert queued_starts == []
    assert [t for t in threading.enumerate() if t.name.startswith("closing-pool")] == []


def test_close_waits_for_an_uncooperative_body() -> None:
    registry = ToolRegistry(max_workers=2)
    gate = Gate()
    journal = Journal()

    @registry.tool
    def stubborn(args: Args, ctx: ToolContext) -> str:
        gate.hold()
        journal("body returned")
        return "late"

    call = Caller(lambda: registry.execute("stubborn"))
    gate.wait_reached()
    closer = Caller(registry.close)
    wait_until(lambda: bool(registry.in_flight()[0].cancelled), "close() to cancel the call")
    assert closer.still_blocked()
    gate.release()
    closer.join()
    journal("close returned")
    assert journal.entries == ["body returned", "close returned"]
    assert call.join().code == ABORTED


def test_execute_after_close_raises_registry_closed_error() -> None:
    registry = ToolRegistry(max_workers=1)
    add_counting_tool(registry)
    registry.close()
    with pytest.raises(RegistryClosedError, match="closed") as raised:
        registry.execute("work")
    assert isinstance(raised.value, RuntimeError)  # 17.1: the tree's RuntimeError branch


def _close_from_body(registry: ToolRegistry, attempt: Callable[[], None]) -> None:
    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        attempt()
        return "ok"


def _close_from_pre_hook(registry: ToolRegistry, attempt: Callable[[], None]) -> None:
    add_counting_tool(registry)
    registry.add_pre_execute(lambda call, token: attempt())


def _close_from_approver(registry: ToolRegistry, attempt: Callable[[], None]) -> None:
    add_counting_tool(registry)
    registry.add_pre_execute(lambda call, token: Ask("?"))

    def approver(call: ToolCall, reason: str, token: CancelToken) -> bool:
        attempt()
        return True

    registry.set_approver(approver)


def _close_from_guard(registry: ToolRegistry, attempt: Callable[[], None]) -> None:
    add_counting_tool(registry)
    registry.add_guard(lambda call: attempt())


def _close_from_wrapper(registry: ToolRegistry, attempt: Callable[[], None]) -> None:
    add_counting_tool(registry)

    def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        attempt()
        return proceed()

    registry.add_around(wrapper)


def _close_from_post_hook(registry: ToolRegistry, attempt: Callable[[], None]) -> None:
    add_counting_tool(registry)
    registry.add_post_execute(lambda result, token: attempt())


def _close_from_observer(registry: ToolRegistry, attempt: Callable[[], None]) -> None:
    add_counting_tool(registry)
    registry.on_result(lambda result: attempt())


@pytest.mark.parametrize(
    "where",
    [
        _close_from_body,
        _close_from_pre_hook,
        _close_from_approver,
        _close_from_guard,
        _close_from_wrapper,
        _close_from_post_hook,
        _close_from_observer,
    ],
)
def test_close_from_inside_a_call_raises_inside_call_error_instead_of_waiting(
    where: Callable[[ToolRegistry, Callable[[], None]], None],
) -> None:
    errors: list[BaseException] = []
    with open_registry(max_workers=1) as registry:

        def attempt() -> None:
            try:
                registry.close()
            except Exception as exc:  # the exact class is asserted below
                errors.append(exc)

        where(registry, attempt)
        result = registry.execute("work")
        assert result.ok
        assert len(errors) == 1
        assert type(errors[0]) is InsideCallError
        assert isinstance(errors[0], RuntimeError)
        assert "inside" in str(errors[0])
        assert not registry.closed
        assert registry.execute("work").ok  # the registry is still open


def test_cancel_between_entry_reads_cannot_skip_the_rechecks() -> None:
    """Regression: "live at entry" was read twice (once for start_if_cancelled, once for the
    rechecks); a caller cancelled between the two reads got neither, and its body started after
    its hooks had seen the cancellation (found by the batch stress test)."""
    from toolreg._cancel import _cancel, _new_token

    class CancelledRightAfterFirstRead(CancelToken):
        __slots__ = ()

        @property
        def cancelled(self) -> bool:
            was = self._cancelled
            if not was:
                _cancel(self, "between the reads")
            return was

    ran: list[str] = []
    with ToolRegistry(max_workers=1) as registry:
        registry.add_pre_execute(lambda call, token: ran.append(f"hook {token.cancelled}"))
        registry.register(Tool("t", lambda args, ctx: ran.append("body")))
        token = _new_token(CancelledRightAfterFirstRead)
        result = registry.execute("t", token=token, start_if_cancelled=False)
    assert result.code == ErrorCode.ABORTED_BEFORE_DISPATCH
    assert ran == ["hook True"]
