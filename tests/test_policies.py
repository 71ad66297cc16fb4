"""Tests for toolreg._policies: `TimeoutPolicy`, `RetryPolicy`, and how they compose.

Deadlines that must fire run on a manual clock (the `clock` fixture): they fire exactly when a
test calls `clock.advance(seconds)`, in that thread, and never otherwise, so "the body started
(or returned) before its deadline fired" is a fact of the test's code, not of the machine's
scheduling. Every other ordering between threads is a handshake: a body that must see its
deadline waits on `ctx.token`, a test that must act at a given moment waits on a `Gate` or an
`Event`. `RetryPolicy` backoffs are recorded by an injected `wait` instead of slept. A body
only sleeps to play an uncooperative tool, never to order threads. Deadlines that must not fire
are `LONG`.

Two windows of the "timer fired vs. body returned" race are pinned separately:

* after the body's success was materialized, while a wrapper inside the policy still holds it:
  the success stands (`test_success_materialized_before_the_deadline_stays_a_success`);
* after the body returned, before the joining thread looked at the token: the success stands too
  (`test_deadline_firing_after_the_body_returned_is_not_a_timeout`; the body's thread records
  whether its token was live when it returned).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import signal
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _registry_helpers import (
    ABORTED,
    BEFORE,
    TRACED_FRAMES,
    WAIT,
    Caller,
    Gate,
    Journal,
    Observed,
    gc_paused,
    holds_nothing,
    open_registry,
    traced_ours,
    wait_until,
)

import toolreg._body
from toolreg import (
    Cancelled,
    CancelSource,
    CancelToken,
    Dispatch,
    ErrorCode,
    RetryPolicy,
    TimeoutPolicy,
    TimeoutReason,
    Tool,
    ToolContext,
    ToolRegistry,
    ToolResult,
    deadline,
    timeout_of,
)
from toolreg._cancel import _TIMER
from toolreg._hooks import HookSet
from toolreg._interrupts import MAIN_THREAD_SLICE, MAX_WAIT, slice_for
from toolreg._timer import ManualClock

SHORT = 0.1  # a tool timeout that is meant to fire
SHORT_TEXT = "0.1"  # format(SHORT, "g")
LONG = 30.0  # a tool timeout that must not fire during a test
TIMEOUT = ErrorCode.TOOL_TIMEOUT
TOOL_ERROR = ErrorCode.TOOL_ERROR

Body = Callable[[Any, ToolContext], Any]
Proceed = Callable[[], ToolResult[Any]]


def add_tool(registry: ToolRegistry, fn: Body, timeout: float | None, name: str = "t") -> None:
    registry.register(Tool(name, fn, timeout=timeout))


def wait_for_deadline(ctx: ToolContext) -> object:
    """In a body: block until the token is cancelled (bounded); return the reason."""
    if not ctx.token.wait(WAIT):
        raise RuntimeError("the body's token was never cancelled")
    return ctx.token.reason


class TokenSpy:
    """An around wrapper that records the `dispatch.token` of every pass through it."""

    def __init__(self) -> None:
        self.tokens: list[CancelToken] = []

    def __call__(self, dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        self.tokens.append(dispatch.token)
        return proceed()


@pytest.fixture(autouse=True, params=["alone", "in the chain"])
def timeout_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs twice. A `TimeoutPolicy` that is the only around wrapper is run by
    the registry itself, its deadline the body's token with no chain around the body
    (`HookSet.deadline`); among other wrappers it runs in the chain. Here both ways run the
    same tests: "in the chain" turns the first way off."""
    if request.param == "in the chain":
        monkeypatch.setattr(TimeoutPolicy, "_runs_as_deadline", False)
    return str(request.param)


def test_a_timeout_policy_alone_is_run_by_the_registry_and_only_then(timeout_path: str) -> None:
    policy = TimeoutPolicy()
    alone = timeout_path == "alone"

    def runs_as_deadline(**kinds: Any) -> bool:
        deadline = HookSet(**kinds).deadline
        if deadline is None:
            return False
        open_deadline, close_deadline = deadline
        assert open_deadline == policy._open_deadline  # bound methods of this very policy
        assert close_deadline == policy._close_deadline
        return True

    class Mine(TimeoutPolicy):  # a subclass may change what it does: always the chain
        pass

    registered = functools.partial(policy)  # how the registry keeps a hook
    assert runs_as_deadline(around=(registered,)) is alone
    assert runs_as_deadline(around=(registered,), observers=(print,)) is alone
    assert runs_as_deadline(around=(policy,), call_hooks=(print,)) is alone
    # The gate and the post hooks run around it as around the chain: it still runs as data.
    assert runs_as_deadline(around=(policy,), pre_execute=(print,)) is alone
    assert runs_as_deadline(around=(policy,), guards=(print,)) is alone
    assert runs_as_deadline(around=(policy,), post_execute=(print,)) is alone
    assert not runs_as_deadline(around=(Mine(),))
    assert not runs_as_deadline(around=(policy, policy))
    assert not runs_as_deadline(around=(RetryPolicy(),))
    assert not runs_as_deadline()


class Waits:
    """A `RetryPolicy(wait=...)` that records each backoff and returns at once (not cancelled)."""

    def __init__(self, journal: Journal | None = None) -> None:
        self.seconds: list[float] = []
        self._journal = journal

    def __call__(self, token: CancelToken, seconds: float) -> bool:
        self.seconds.append(seconds)
        if self._journal is not None:
            self._journal(("wait", seconds))
        return token.cancelled


def timed_out_content(seconds: str) -> str:
    return f"Error: tool call timed out after {seconds}s"


# -- TimeoutPolicy: construction -------------------------------------------------------------------


def test_timeout_policy_defaults_to_the_tool_timeout_code_and_no_default_budget() -> None:
    policy = TimeoutPolicy()
    assert policy.code == "TOOL_TIMEOUT"
    assert policy.default is None


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"code": ""}, TypeError),
        ({"code": 5}, TypeError),
        ({"default": 0}, ValueError),
        ({"default": -1.0}, ValueError),
        ({"default": float("nan")}, ValueError),
        ({"default": float("inf")}, ValueError),
        ({"default": "1"}, TypeError),
    ],
)
def test_timeout_policy_rejects_bad_arguments(options: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        TimeoutPolicy(**options)


def test_timeout_policy_rejects_a_bool_default_at_construction() -> None:
    with pytest.raises(TypeError):
        TimeoutPolicy(default=True)


# -- TimeoutPolicy: the deadline it installs -------------------------------------------------------


def test_tool_without_timeout_passes_through_with_the_same_token(registry: ToolRegistry) -> None:
    call_tokens: list[CancelToken] = []
    spy = TokenSpy()
    registry.add_pre_execute(lambda call, token: call_tokens.append(token))
    registry.add_around(TimeoutPolicy())
    registry.add_around(spy)
    add_tool(registry, lambda args, ctx: timeout_of(ctx.token), timeout=None)

    result = registry.execute("t")

    assert result.ok and result.value is None
    assert spy.tokens == call_tokens  # no deadline was put in dispatch.token


@pytest.mark.parametrize("ending", ["returns", "raises Cancelled"])
def test_deadline_firing_makes_tool_timeout_with_exact_content(
    registry: ToolRegistry, clock: ManualClock, ending: str
) -> None:
    seen: list[object] = []

    def body(args: Any, ctx: ToolContext) -> str:
        clock.advance(SHORT)  # the body has started: now the deadline fires
        seen.append(wait_for_deadline(ctx))
        if ending == "raises Cancelled":
            ctx.token.raise_if_cancelled()
        return "too late"

    registry.add_around(TimeoutPolicy())
    add_tool(registry, body, timeout=SHORT)

    result = registry.execute("t")

    assert seen == [TimeoutReason("TOOL_TIMEOUT", SHORT)]
    assert result.code == TIMEOUT and not result.ok and result.value is None
    assert result.content == timed_out_content(SHORT_TEXT)
    assert result.error is not None
    assert result.error.message == f"tool call timed out after {SHORT_TEXT}s"
    assert result.dispatched


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.02, "0.02"), (0.015625, "0.015625"), (2.5e-05, "2.5e-05")]
)
def test_timeout_content_formats_seconds_with_g(
    registry: ToolRegistry, clock: ManualClock, seconds: float, text: str
) -> None:
    def body(args: Any, ctx: ToolContext) -> object:
        clock.advance(seconds)
        return wait_for_deadline(ctx)

    registry.add_around(TimeoutPolicy())
    add_tool(registry, body, timeout=seconds)

    result = registry.execute("t")

    assert result.code == TIMEOUT
    assert result.content == timed_out_content(text) == timed_out_content(format(seconds, "g"))


def test_policy_code_is_the_reason_code_of_its_deadline(
    registry: ToolRegistry, clock: ManualClock
) -> None:
    seen: list[object] = []

    def body(args: Any, ctx: ToolContext) -> None:
        clock.advance(SHORT)
        seen.append(wait_for_deadline(ctx))
        seen.append(timeout_of(ctx.token, "TOOL_TIMEOUT"))

    registry.add_around(TimeoutPolicy(code="BUDGET"))
    add_tool(registry, body, timeout=SHORT)

    result = registry.execute("t")

    assert seen == [TimeoutReason("BUDGET", SHORT), None]
    assert result.code == TIMEOUT  # the result code does not follow the deadline's code


def test_default_budget_applies_only_to_tools_that_declare_none(
    registry: ToolRegistry, clock: ManualClock
) -> None:
    def body(args: Any, ctx: ToolContext) -> object:
        clock.advance(0.04)  # enough for either budget
        return wait_for_deadline(ctx)

    registry.add_around(TimeoutPolicy(default=0.04))
    add_tool(registry, body, timeout=None, name="plain")
    add_tool(registry, body, timeout=0.02, name="own")

    plain = registry.execute("plain")
    own = registry.execute("own")

    assert (plain.code, plain.content) == (TIMEOUT, timed_out_content("0.04"))
    assert (own.code, own.content) == (TIMEOUT, timed_out_content("0.02"))


def test_deadline_is_closed_and_detached_when_the_policy_returns(
    registry: ToolRegistry, clock: ManualClock
) -> None:
    caller = CancelSource()
    call_tokens: list[CancelToken] = []
    spy = TokenSpy()
    registry.add_pre_execute(lambda call, token: call_tokens.append(token))
    registry.add_around(TimeoutPolicy())
    registry.add_around(spy)
    add_tool(registry, lambda args, ctx: "on time", timeout=SHORT)

    result = registry.execute("t", token=caller.token)  # the clock stands still: on time
    clock.advance(3 * SHORT)  # well past the deadline's due time

    assert result.ok
    [budget] = spy.tokens
    assert not budget.cancelled, "the deadline's timer fired after the policy closed it"
    assert holds_nothing(call_tokens[0])
    assert holds_nothing(caller.token)


@pytest.mark.parametrize("eager", [False, True])
def test_the_body_deadline_is_closed_when_the_call_returns(
    registry: ToolRegistry, clock: ManualClock, eager: bool
) -> None:
    # The policy alone: no wrapper sees the deadline, so the body reports the token it got.
    caller = CancelSource()
    seen: list[CancelToken] = []

    def body(args: Any, ctx: ToolContext) -> str:
        seen.append(ctx.token)
        if eager:  # linked to the call's token and armed on the timer from here on
            ctx.token.on_cancel(lambda: None)
        return "on time"

    registry.add_around(TimeoutPolicy())
    add_tool(registry, body, timeout=SHORT)

    result = registry.execute("t", token=caller.token)  # the clock stands still: on time
    clock.advance(3 * SHORT)  # well past the deadline's due time

    assert result.ok
    [budget] = seen
    assert budget._closed, "the deadline was not closed"  # white-box: a lazy one shows nothing
    assert not budget.cancelled, "the deadline's timer fired after the call returned"
    assert holds_nothing(caller.token)


# -- TimeoutPolicy: who cancelled first ------------------------------------------------------------


@pytest.mark.parametrize(("where", "code"), [("before the body", BEFORE), ("in the body", ABORTED)])
def test_caller_cancel_first_stays_cancellation_after_the_deadline_passes(
    registry: ToolRegistry, clock: ManualClock, where: str, code: ErrorCode
) -> None:
    caller = CancelSource()
    reasons: list[object] = []

    def cancel_then_overrun(token: CancelToken) -> None:
        caller.cancel("user stop")
        reasons.append(token.reason)
        clock.advance(1.5 * SHORT)  # uncooperative: the deadline's due time passes meanwhile

    def in_wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        if where == "before the body":
            cancel_then_overrun(dispatch.token)
        return proceed()

    def body(args: Any, ctx: ToolContext) -> str:
        cancel_then_overrun(ctx.token)
        return "finished anyway"

    registry.add_around(TimeoutPolicy())
    registry.add_around(in_wrapper)
    add_tool(registry, body, timeout=SHORT)

    result = registry.execute("t", token=caller.token)

    assert reasons[0] == "user stop"  # the caller won: the deadline inherited its reason
    assert result.code == code
    assert result.dispatched is (code == ABORTED)


def test_caller_cancel_while_the_body_waits_is_aborted(registry: ToolRegistry) -> None:
    caller = CancelSource()
    started = threading.Event()

    def body(args: Any, ctx: ToolContext) -> object:
        started.set()
        return wait_for_deadline(ctx)

    registry.add_around(TimeoutPolicy())
    add_tool(registry, body, timeout=LONG)
    call = Caller(lambda: registry.execute("t", token=caller.token))
    assert started.wait(WAIT)
    caller.cancel("user stop")
    result = call.join()

    assert (result.code, result.content) == (ABORTED, "Error: tool call aborted")


@pytest.mark.parametrize("ending", ["returns", "raises Cancelled"])
def test_deadline_first_then_caller_cancel_stays_tool_timeout(
    registry: ToolRegistry, clock: ManualClock, ending: str
) -> None:
    caller = CancelSource()
    gate = Gate()
    seen: list[object] = []

    def body(args: Any, ctx: ToolContext) -> str:
        clock.advance(SHORT)
        seen.append(wait_for_deadline(ctx))
        gate.hold()  # the caller cancels here, after the deadline fired
        seen.append(caller.token.reason)
        if ending == "raises Cancelled":
            raise Cancelled(caller.token.reason)
        return "late"

    registry.add_around(TimeoutPolicy())
    add_tool(registry, body, timeout=SHORT)
    call = Caller(lambda: registry.execute("t", token=caller.token))
    gate.wait_reached()
    caller.cancel("user stop")
    gate.release()
    result = call.join()

    assert seen == [TimeoutReason("TOOL_TIMEOUT", SHORT), "user stop"]
    assert (result.code, result.content) == (TIMEOUT, timed_out_content(SHORT_TEXT))


@pytest.mark.parametrize("outer_code", ["OUTER", "TOOL_TIMEOUT"])
def test_outer_deadline_reads_as_plain_cancellation(
    registry: ToolRegistry, clock: ManualClock, outer_code: str
) -> None:
    """Only the policy's own timer makes TOOL_TIMEOUT, even if an outer one uses the same code."""
    seen: list[object] = []
    observed = Observed()

    def outer_deadline(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        previous = dispatch.token
        with deadline(previous, 0.05, code=outer_code) as outer:
            dispatch.token = outer.token
            try:
                return proceed()
            finally:
                dispatch.token = previous

    def body(args: Any, ctx: ToolContext) -> str:
        clock.advance(0.05)  # the outer deadline's time; the policy's is LONG
        seen.append(wait_for_deadline(ctx))
        return "late"

    registry.add_around(outer_deadline)
    registry.add_around(TimeoutPolicy())  # inner, with a longer timeout
    registry.on_result(observed)
    add_tool(registry, body, timeout=LONG)

    result = registry.execute("t")

    assert seen == [TimeoutReason(outer_code, 0.05)]
    assert (result.code, result.content) == (ABORTED, "Error: tool call aborted")
    assert observed.results == [result]


def test_nested_call_under_the_parent_deadline_is_aborted_and_the_parent_times_out(
    registry: ToolRegistry, clock: ManualClock
) -> None:
    """For the nested call the parent's deadline is an outer one: plain cancellation."""
    observed = Observed()

    def inner(args: Any, ctx: ToolContext) -> object:
        clock.advance(SHORT)  # the parent's deadline; the nested call's own is LONG
        return wait_for_deadline(ctx)

    registry.on_result(observed)
    registry.add_around(TimeoutPolicy())
    add_tool(registry, inner, timeout=LONG, name="inner")
    add_tool(registry, lambda args, ctx: ctx.execute("inner").code, timeout=SHORT, name="outer")

    result = registry.execute("outer")

    assert [(r.call.name, r.code) for r in observed.results] == [
        ("inner", ABORTED),
        ("outer", TIMEOUT),
    ]
    assert result is observed.results[-1]


# -- TimeoutPolicy: restoring the token ------------------------------------------------------------


@pytest.mark.parametrize("inner", ["on time", "timed out", "inner wrapper raises"])
def test_outer_wrappers_and_post_hooks_get_their_own_token_back(
    registry: ToolRegistry, clock: ManualClock, inner: str
) -> None:
    journal = Journal()
    strays: list[CancelSource] = []

    def outer(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        journal(("outer before", dispatch.token))
        result = proceed()
        journal(("outer after", dispatch.token))
        return result

    def replaces_and_never_restores(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        if inner == "inner wrapper raises":
            dispatch.token = CancelSource().token
            raise ValueError("inner wrapper broke")
        stray = CancelSource(dispatch.token)  # still follows the deadline
        strays.append(stray)
        dispatch.token = stray.token
        return proceed()

    def body(args: Any, ctx: ToolContext) -> str:
        if inner == "timed out":
            clock.advance(SHORT)
            wait_for_deadline(ctx)
        return "done"

    registry.add_pre_execute(lambda call, token: journal(("pre", token)))
    registry.add_around(outer)
    registry.add_around(TimeoutPolicy())
    registry.add_around(replaces_and_never_restores)
    registry.add_post_execute(lambda result, token: journal(("post", token, token.cancelled)))
    add_tool(registry, body, timeout=SHORT if inner == "timed out" else LONG)

    result = registry.execute("t")

    expected = {"on time": None, "timed out": TIMEOUT, "inner wrapper raises": ErrorCode.HOOK_ERROR}
    assert result.code == expected[inner]
    entries = dict((entry[0], entry[1:]) for entry in journal.entries)
    call_token = entries["pre"][0]
    assert entries["outer before"][0] is call_token
    assert entries["outer after"][0] is call_token
    if inner != "inner wrapper raises":  # a registry-made HOOK_ERROR skips the post hooks
        assert entries["post"] == (call_token, False)
    assert [entry[0] for entry in journal.entries] == [
        "pre",
        "outer before",
        "outer after",
        *(["post"] if inner != "inner wrapper raises" else []),
    ]


# -- TimeoutPolicy: joining, and the timer-vs-completion race --------------------------------------


def test_uncooperative_body_is_joined_before_tool_timeout_is_returned(
    registry: ToolRegistry, clock: ManualClock
) -> None:
    journal = Journal()

    def body(args: Any, ctx: ToolContext) -> str:
        clock.advance(SHORT)
        wait_for_deadline(ctx)
        time.sleep(0.1)  # ignores the cancellation it has seen
        journal(("body ended", time.monotonic()))
        return "ignored the deadline"

    registry.add_around(TimeoutPolicy())
    registry.on_result(lambda result: journal(("observer", result.code)))
    add_tool(registry, body, timeout=SHORT)

    with gc_paused():  # the CPU time measured is the join's, not a collection's
        began = time.thread_time()
        result = registry.execute("t")
        returned = time.monotonic()

    assert result.code == TIMEOUT and result.dispatched
    # Joined by blocking: the manual clock's due time is no monotonic time to wake at.
    assert time.thread_time() - began < 0.05
    (_, ended), observer = journal.entries
    assert observer == ("observer", TIMEOUT)
    assert ended <= returned
    assert result.duration >= 0.1  # the body's own overrun, after its (manual) deadline


def test_a_caller_joining_a_body_past_its_deadline_blocks_without_spinning(
    registry: ToolRegistry,
) -> None:
    # The joiner wakes once at the deadline's due time to cancel the body; after that it must
    # block until the body returns, not keep waking (it used to spin on a zero timeout).
    running, release = threading.Event(), threading.Event()
    tokens: list[CancelToken] = []

    def body(args: Any, ctx: ToolContext) -> str:
        tokens.append(ctx.token)
        running.set()
        release.wait(WAIT)  # ignores its token
        return "late"

    registry.add_around(TimeoutPolicy())
    add_tool(registry, body, timeout=0.05)
    results: list[ToolResult[Any]] = []
    cpu: list[float] = []

    def call() -> None:
        with gc_paused():  # the CPU time measured is the join's, not a collection's
            began = time.thread_time()
            results.append(registry.execute("t"))
            cpu.append(time.thread_time() - began)

    caller = Caller(call, name="joiner")
    assert running.wait(WAIT)
    # A read, not a wait: a wait would make the deadline eager and the timer would push it.
    wait_until(lambda: tokens[0].cancelled, "the deadline to pass")
    threading.Event().wait(0.3)  # a window to measure the joiner's CPU in; orders nothing
    release.set()
    caller.join()
    assert results[0].code == TIMEOUT
    assert cpu[0] < 0.1  # spinning for the 0.3 s window took about all of it


def test_a_wait_slice_never_exceeds_what_lock_acquire_accepts() -> None:
    far = time.monotonic() + 1e10  # a valid tool timeout, far beyond threading.TIMEOUT_MAX
    assert slice_for(False, far) == MAX_WAIT <= threading.TIMEOUT_MAX
    assert slice_for(True, far) == MAIN_THREAD_SLICE
    assert slice_for(False, None) == -1.0
    assert slice_for(False, time.monotonic() - 1.0) == 0.0


def test_success_materialized_before_the_deadline_stays_a_success(
    registry: ToolRegistry, clock: ManualClock
) -> None:
    """A wrapper inside the policy holds the body's success until the deadline has fired."""
    journal = Journal()

    def holds_after_proceed(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        result = proceed()
        journal(("proceed returned", result.ok, dispatch.token.cancelled))
        clock.advance(SHORT)
        fired = dispatch.token.wait(WAIT)
        journal(("deadline fired", fired, dispatch.token.reason))
        return result

    registry.add_around(TimeoutPolicy())
    registry.add_around(holds_after_proceed)
    registry.add_post_execute(lambda result, token: journal(("post", result.ok)))
    add_tool(registry, lambda args, ctx: "on time", timeout=SHORT)

    result = registry.execute("t")

    assert journal.entries == [
        ("proceed returned", True, False),
        ("deadline fired", True, TimeoutReason("TOOL_TIMEOUT", SHORT)),
        ("post", True),
    ]
    assert result.ok and result.value == "on time" and result.content == "on time"


class _PreconditionFailed(Exception):
    """Not an AssertionError: a broken set-up must not pass as the expected failure."""


def test_deadline_firing_after_the_body_returned_is_not_a_timeout(
    registry: ToolRegistry, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The joining thread is held after the body returned, until the deadline fired.

    This is the descheduling that happens for real under load: a body returning 0.3 ms before
    a 5 ms deadline is reported as TOOL_TIMEOUT about once in fifty calls.
    """
    held = threading.Event()
    live_at_return: list[bool] = []
    real_join = toolreg._body._join  # the hand-over and join of a body: replaced below

    def join_then_linger(state: Any, ctx: ToolContext, submit: Any, interrupted: Any) -> Any:
        refused = real_join(state, ctx, submit, interrupted)
        if ctx._started and ctx._error is None:
            clock.advance(SHORT)  # the body has returned: now the deadline fires
            if not ctx.token.wait(WAIT):
                raise _PreconditionFailed("the deadline never fired")
            held.set()
        return refused

    monkeypatch.setattr(toolreg._body, "_join", join_then_linger)

    def body(args: Any, ctx: ToolContext) -> str:
        live_at_return.append(not ctx.token.cancelled)
        return "on time"

    registry.add_around(TimeoutPolicy())
    add_tool(registry, body, timeout=SHORT)

    result = registry.execute("t")

    if not (live_at_return == [True] and held.is_set()):
        raise _PreconditionFailed(f"live at return: {live_at_return}, held: {held.is_set()}")
    assert result.ok, result.content


def test_deadline_while_queued_is_tool_timeout_and_the_body_never_starts(
    clock: ManualClock,
) -> None:
    blocker = Gate()
    journal = Journal()

    with open_registry(max_workers=1) as registry:
        add_tool(registry, lambda args, ctx: blocker.hold(), timeout=None, name="blocker")
        add_tool(registry, lambda args, ctx: journal("timed body ran"), timeout=SHORT)
        registry.add_around(TimeoutPolicy())
        occupying = Caller(lambda: registry.execute("blocker"))
        blocker.wait_reached()  # the only worker is busy: the timed body can only queue
        timed = Caller(lambda: registry.execute("t"))
        wait_until(
            lambda: any(c.call.name == "t" and c.stage == "body" for c in registry.in_flight()),
            "the timed call to reach its body",
        )
        clock.advance(SHORT)

        result = timed.join()

        blocker.release()
        assert occupying.join().ok
    assert (result.code, result.content) == (TIMEOUT, timed_out_content(SHORT_TEXT))
    assert not result.dispatched
    assert journal.entries == []


def test_failure_the_body_reports_after_the_deadline_stays(
    registry: ToolRegistry, clock: ManualClock
) -> None:
    def body(args: Any, ctx: ToolContext) -> None:
        clock.advance(SHORT)
        wait_for_deadline(ctx)
        raise ValueError("disk full")

    registry.add_around(TimeoutPolicy())
    add_tool(registry, body, timeout=SHORT)

    result = registry.execute("t")

    assert (result.code, result.content) == (TOOL_ERROR, "Error: ValueError: disk full")


@pytest.mark.parametrize("ending", ["returns", "raises Cancelled"])
def test_deferred_contexts_are_kept_in_the_timeout(
    registry: ToolRegistry, clock: ManualClock, ending: str
) -> None:
    def body(args: Any, ctx: ToolContext) -> str:
        ctx.defer_context("before")
        clock.advance(SHORT)
        wait_for_deadline(ctx)
        ctx.defer_context({"after": True})
        if ending == "raises Cancelled":
            ctx.token.raise_if_cancelled()
        return "late"

    registry.add_around(TimeoutPolicy())
    add_tool(registry, body, timeout=SHORT)

    result = registry.execute("t")

    assert result.code == TIMEOUT
    assert result.contexts == ("before", {"after": True})


def test_pre_aborted_entry_keeps_the_body_outcome_not_a_timeout(registry: ToolRegistry) -> None:
    caller = CancelSource()
    caller.cancel("turn over")
    seen: list[object] = []
    spy = TokenSpy()

    def body(args: Any, ctx: ToolContext) -> str:
        seen.append(ctx.token.reason)
        return "cleaned up"

    registry.add_around(TimeoutPolicy())
    registry.add_around(spy)
    add_tool(registry, body, timeout=SHORT)

    direct = registry.execute("t", token=caller.token)
    model_driven = registry.execute("t", token=caller.token, start_if_cancelled=False)

    assert direct.ok and direct.value == "cleaned up"
    assert seen == ["turn over"]  # the deadline inherited the caller's cancellation
    assert (model_driven.code, model_driven.dispatched) == (BEFORE, False)
    assert len(spy.tokens) == 1  # no wrapper ran for the model-driven call


# -- RetryPolicy: construction and backoff ---------------------------------------------------------


def test_retry_policy_defaults() -> None:
    policy = RetryPolicy()
    assert (policy.attempts, policy.backoff, policy.retry_on) == (3, 0.1, (Exception,))
    assert RetryPolicy(retry_on=KeyError).retry_on == (KeyError,)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"attempts": 0}, ValueError),
        ({"attempts": -1}, ValueError),
        ({"attempts": 2.0}, TypeError),
        ({"attempts": True}, TypeError),
        ({"attempts": "3"}, TypeError),
        ({"backoff": -0.1}, ValueError),
        ({"backoff": float("nan")}, ValueError),
        ({"backoff": float("inf")}, ValueError),
        ({"backoff": "0.1"}, TypeError),
        ({"backoff": None}, TypeError),
        ({"backoff": True}, TypeError),
        ({"retry_on": 42}, TypeError),
        ({"retry_on": int}, TypeError),
        ({"retry_on": (ValueError, "KeyError")}, TypeError),
    ],
)
def test_retry_policy_rejects_bad_arguments(options: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        RetryPolicy(**options)


def test_backoff_doubles_each_retry_or_comes_from_the_callable() -> None:
    assert [RetryPolicy(backoff=0.01).delay(n) for n in (1, 2, 3, 4)] == [0.01, 0.02, 0.04, 0.08]
    assert [RetryPolicy(backoff=lambda n: n / 100).delay(n) for n in (1, 2, 3)] == [
        0.01,
        0.02,
        0.03,
    ]


def test_waits_the_doubling_backoff_between_attempts(registry: ToolRegistry) -> None:
    journal = Journal()
    waits = Waits(journal)

    def body(args: Any, ctx: ToolContext) -> None:
        journal("start")
        journal("end")
        raise ValueError("flaky")

    registry.add_around(RetryPolicy(attempts=3, backoff=0.01, wait=waits))
    add_tool(registry, body, timeout=None)

    result = registry.execute("t")

    assert result.code == TOOL_ERROR
    assert journal.entries == [
        *("start", "end", ("wait", 0.01)),
        *("start", "end", ("wait", 0.02)),
        *("start", "end"),
    ]


def test_the_default_wait_sleeps_on_the_token_for_the_backoff() -> None:
    source = CancelSource()
    policy = RetryPolicy(backoff=0.01)
    started = time.monotonic()
    assert policy.wait(source.token, 0.01) is False
    assert time.monotonic() - started >= 0.01 - 1e-3
    source.cancel("stop")
    assert policy.wait(source.token, LONG) is True  # a cancelled token ends it at once


def test_wait_must_be_callable() -> None:
    with pytest.raises(TypeError, match="wait"):
        RetryPolicy(wait=0.1)  # type: ignore[arg-type]


# -- RetryPolicy: what is retried ------------------------------------------------------------------


def test_retries_tool_errors_until_a_success(registry: ToolRegistry) -> None:
    retries: list[int] = []
    attempts: list[int] = []

    def body(args: Any, ctx: ToolContext) -> str:
        attempts.append(len(attempts) + 1)
        ctx.defer_context(f"attempt {len(attempts)}")
        if len(attempts) < 3:
            raise ConnectionError("flaky")
        return "third time lucky"

    def no_wait(retry: int) -> float:
        retries.append(retry)
        return 0.0

    registry.add_around(RetryPolicy(attempts=3, backoff=no_wait))
    add_tool(registry, body, timeout=None)

    result = registry.execute("t")

    assert result.ok and result.value == "third time lucky" and result.dispatched
    assert attempts == [1, 2, 3]
    assert retries == [1, 2]
    assert result.contexts == ("attempt 3",)  # the last attempt's result stands


def test_the_last_attempt_result_stands_when_all_fail(registry: ToolRegistry) -> None:
    attempts: list[int] = []

    def body(args: Any, ctx: ToolContext) -> None:
        attempts.append(len(attempts) + 1)
        raise ValueError(f"attempt {len(attempts)}")

    registry.add_around(RetryPolicy(attempts=4, backoff=0))
    add_tool(registry, body, timeout=None)

    result = registry.execute("t")

    assert attempts == [1, 2, 3, 4]
    assert (result.code, result.content) == (TOOL_ERROR, "Error: ValueError: attempt 4")
    assert result.error is not None and isinstance(result.error.exception, ValueError)


@pytest.mark.parametrize(
    ("raised", "runs"), [(KeyError, 1), (ValueError, 3), (UnicodeDecodeError, 3)]
)
def test_only_exceptions_matching_retry_on_are_retried(
    registry: ToolRegistry, raised: type[Exception], runs: int
) -> None:
    journal = Journal()

    def body(args: Any, ctx: ToolContext) -> None:
        journal("run")
        if raised is UnicodeDecodeError:  # a subclass of ValueError
            b"\xff".decode("utf-8")
        raise raised("boom")

    registry.add_around(RetryPolicy(attempts=3, backoff=0, retry_on=ValueError))
    add_tool(registry, body, timeout=None)

    result = registry.execute("t")

    assert result.code == TOOL_ERROR
    assert len(journal.entries) == runs


def test_a_single_attempt_never_retries(registry: ToolRegistry) -> None:
    journal = Journal()

    def body(args: Any, ctx: ToolContext) -> None:
        journal("run")
        raise ValueError("once")

    registry.add_around(RetryPolicy(attempts=1, backoff=0))
    add_tool(registry, body, timeout=None)

    assert registry.execute("t").code == TOOL_ERROR
    assert journal.entries == ["run"]


def _wrapper_result(kind: str, dispatch: Dispatch) -> ToolResult[Any]:
    if kind == "HOOK_ERROR":
        raise ValueError("wrapper broke")  # an Exception, so retry_on would match it
    if kind == "TOOL_ERROR without exception":
        return ToolResult.failure(dispatch.call, TOOL_ERROR, "made by a wrapper")
    return ToolResult.failure(dispatch.call, kind, "made by a wrapper")


@pytest.mark.parametrize(
    "kind",
    [
        "ABORTED",
        "ABORTED_BEFORE_DISPATCH",
        "TOOL_TIMEOUT",
        "DENIED",
        "HOOK_ERROR",
        "TOOL_ERROR without exception",
    ],
)
def test_never_retries_results_other_than_matching_tool_errors(
    registry: ToolRegistry, kind: str
) -> None:
    journal = Journal()

    def inner(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        journal("inner wrapper")
        return _wrapper_result(kind, dispatch)

    registry.add_around(RetryPolicy(attempts=3, backoff=0))
    registry.add_around(inner)
    add_tool(registry, lambda args, ctx: "never runs", timeout=None)

    result = registry.execute("t")

    assert journal.entries == ["inner wrapper"]
    assert result.code == kind.split(" ")[0]


def test_a_real_tool_timeout_is_not_retried(registry: ToolRegistry, clock: ManualClock) -> None:
    journal = Journal()

    def body(args: Any, ctx: ToolContext) -> None:
        journal("run")
        clock.advance(SHORT)
        wait_for_deadline(ctx)

    registry.add_around(RetryPolicy(attempts=3, backoff=0))
    registry.add_around(TimeoutPolicy())
    add_tool(registry, body, timeout=SHORT)

    result = registry.execute("t")

    assert result.code == TIMEOUT
    assert journal.entries == ["run"]


def test_a_body_aborted_by_the_caller_is_not_retried(registry: ToolRegistry) -> None:
    caller = CancelSource()
    started = threading.Event()
    journal = Journal()

    def body(args: Any, ctx: ToolContext) -> None:
        journal("run")
        started.set()
        wait_for_deadline(ctx)
        ctx.token.raise_if_cancelled()

    registry.add_around(RetryPolicy(attempts=3, backoff=0, retry_on=BaseException))
    add_tool(registry, body, timeout=None)
    call = Caller(lambda: registry.execute("t", token=caller.token))
    assert started.wait(WAIT)
    caller.cancel("user stop")
    result = call.join()

    assert result.code == ABORTED
    assert journal.entries == ["run"]


def test_never_retries_once_the_caller_cancelled(registry: ToolRegistry) -> None:
    caller = CancelSource()
    journal = Journal()

    def body(args: Any, ctx: ToolContext) -> None:
        journal("run")
        caller.cancel("user stop")
        raise ValueError("failed while being cancelled")  # retryable, but cancelled

    registry.add_around(RetryPolicy(attempts=3, backoff=0))
    add_tool(registry, body, timeout=None)

    result = registry.execute("t", token=caller.token)

    assert journal.entries == ["run"]
    # A failure is more specific than the cancellation and stays (docs/contract.md, section 4).
    assert (result.code, result.content) == (
        TOOL_ERROR,
        "Error: ValueError: failed while being cancelled",
    )


def test_pre_aborted_entry_runs_one_attempt_only(registry: ToolRegistry) -> None:
    caller = CancelSource()
    caller.cancel("turn over")
    journal = Journal()

    def body(args: Any, ctx: ToolContext) -> None:
        journal(("run", ctx.token.cancelled))
        raise ValueError("cleanup failed")

    registry.add_around(RetryPolicy(attempts=3, backoff=0))
    add_tool(registry, body, timeout=None)

    result = registry.execute("t", token=caller.token)

    assert journal.entries == [("run", True)]
    assert result.code == TOOL_ERROR


def test_every_attempt_body_is_joined_before_the_next_starts(registry: ToolRegistry) -> None:
    journal = Journal()

    def body(args: Any, ctx: ToolContext) -> None:
        attempt = sum(1 for entry in journal.entries if entry[0] == "start") + 1
        journal(("start", attempt))
        time.sleep(0.02)  # slow, and not looking at its token
        journal(("end", attempt))
        raise ValueError("flaky")

    registry.add_around(RetryPolicy(attempts=3, backoff=0))
    add_tool(registry, body, timeout=None)

    registry.execute("t")

    assert journal.entries == [(kind, n) for n in (1, 2, 3) for kind in ("start", "end")]


# -- RetryPolicy: cancellation during the backoff --------------------------------------------------


class SlowBackoff:
    """A callable backoff that says when the wait begins."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.waiting = threading.Event()

    def __call__(self, retry: int) -> float:
        self.waiting.set()
        return self.seconds


def test_cancel_during_a_long_backoff_returns_at_once(registry: ToolRegistry) -> None:
    caller = CancelSource()
    backoff = SlowBackoff(LONG)
    journal = Journal()

    def body(args: Any, ctx: ToolContext) -> None:
        journal("run")
        raise ValueError("flaky")

    registry.add_around(RetryPolicy(attempts=3, backoff=backoff))
    add_tool(registry, body, timeout=None)
    call = Caller(lambda: registry.execute("t", token=caller.token))
    assert backoff.waiting.wait(WAIT)
    cancelled_at = time.monotonic()
    caller.cancel("user stop")
    result = call.join()

    assert time.monotonic() - cancelled_at < 2.0  # against a 30 s backoff
    assert journal.entries == ["run"]  # no further attempt
    assert (result.code, result.content) == (TOOL_ERROR, "Error: ValueError: flaky")


def test_close_during_a_long_backoff_returns_at_once() -> None:
    backoff = SlowBackoff(LONG)
    journal = Journal()

    def body(args: Any, ctx: ToolContext) -> None:
        journal("run")
        raise ValueError("flaky")

    with open_registry(max_workers=2) as registry:
        registry.add_around(RetryPolicy(attempts=3, backoff=backoff))
        add_tool(registry, body, timeout=None)
        call = Caller(lambda: registry.execute("t"))
        assert backoff.waiting.wait(WAIT)
        closing_at = time.monotonic()
        registry.close()
        closed_after = time.monotonic() - closing_at
    assert closed_after < 2.0
    assert call.join().code == TOOL_ERROR
    assert journal.entries == ["run"]


@contextlib.contextmanager
def ctrl_c_pressed_when(event: threading.Event) -> Iterator[None]:
    """Once `event` is set, press Ctrl-C (SIGINT to the main thread) until one is handled.

    Only the first press becomes a `KeyboardInterrupt`. Pressing again every 50 ms covers a
    CPython race that one press hits about half the time here: a SIGINT that lands after the
    main thread released the GIL but before it blocked in `lock.acquire(timeout)` interrupts
    nothing, and is only handled when that wait ends (30 s later). `_registry_helpers`'
    `send_ctrl_c_when` presses once, right when the waiter is woken -- the worst moment.
    """
    assert threading.current_thread() is threading.main_thread()
    main = threading.main_thread().ident
    assert main is not None
    handled = threading.Event()
    done = threading.Event()

    def once(signum: int, frame: object) -> None:
        if not handled.is_set():
            handled.set()
            raise KeyboardInterrupt

    def press() -> None:
        if not event.wait(WAIT):
            return
        while not (handled.is_set() or done.is_set()):
            signal.pthread_kill(main, signal.SIGINT)
            handled.wait(0.05)

    previous = signal.signal(signal.SIGINT, once)
    presser = Caller(press, name="ctrl-c")
    try:
        yield
    finally:
        done.set()
        presser.join()
        # A press made just before `handled` was set may still be pending (presses may merge
        # into one). raise_signal() runs every pending handler before it returns, in `once`,
        # which ignores them from now on: none can reach the previous handler.
        handled.set()
        signal.raise_signal(signal.SIGINT)
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_a_long_backoff_ends_it_without_another_attempt(
    registry: ToolRegistry,
) -> None:
    backoff = SlowBackoff(LONG)
    journal = Journal()
    observed = Observed()
    caller = CancelSource()

    def body(args: Any, ctx: ToolContext) -> None:
        journal("run")
        raise ValueError("flaky")

    registry.add_around(RetryPolicy(attempts=3, backoff=backoff))
    registry.on_result(observed)
    add_tool(registry, body, timeout=None)
    with ctrl_c_pressed_when(backoff.waiting):
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            registry.execute("t", token=caller.token)
    assert time.monotonic() - started < 2.0  # against a 30 s backoff
    assert journal.entries == ["run"]
    assert observed.codes == [ABORTED]  # the interrupted wrapper: cancellation, once
    assert not caller.token.cancelled


def test_close_ends_the_backoff_under_a_wrapper_that_replaced_the_token() -> None:
    backoff = SlowBackoff(1.0)
    unrelated = CancelSource()

    def replaces_token(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        previous, dispatch.token = dispatch.token, unrelated.token
        try:
            return proceed()
        finally:
            dispatch.token = previous

    def body(args: Any, ctx: ToolContext) -> None:
        raise ValueError("flaky")

    with open_registry(max_workers=2) as registry:
        registry.add_around(replaces_token)
        registry.add_around(RetryPolicy(attempts=2, backoff=backoff))
        add_tool(registry, body, timeout=None)
        call = Caller(lambda: registry.execute("t"))
        if not backoff.waiting.wait(WAIT):
            raise _PreconditionFailed("the backoff never began")
        closing_at = time.monotonic()
        registry.close()
        closed_after = time.monotonic() - closing_at
    call.join()
    assert closed_after < 0.5, f"close() waited {closed_after:.2f}s for a 1 s backoff"


def test_a_huge_backoff_waits_until_cancelled(registry: ToolRegistry) -> None:
    try:
        policy = RetryPolicy(attempts=2, backoff=1e10)
    except ValueError:
        return  # rejected up front: a fine fix too
    caller = CancelSource()
    failed = threading.Event()

    def body(args: Any, ctx: ToolContext) -> None:
        failed.set()
        raise ValueError("flaky")

    registry.add_around(policy)
    add_tool(registry, body, timeout=None)
    call = Caller(lambda: registry.execute("t", token=caller.token))
    assert failed.wait(WAIT)
    call.still_blocked(0.2)  # give a broken backoff time to end the call; never orders threads
    caller.cancel("user stop")
    assert call.join().code == TOOL_ERROR


# -- composition -----------------------------------------------------------------------------------


def test_timeout_per_attempt_when_retry_is_outside(
    registry: ToolRegistry, clock: ManualClock
) -> None:
    """Retry registered first (outer), Timeout inner: each attempt gets a deadline of its own.

    Each attempt uses 60% of the budget: one shared deadline would fire in the second attempt,
    one per attempt does not. The first attempt fails; its deadline is closed with it and never
    fires, even once the clock is far past its due time, and the second attempt runs under a new
    one. (A timed-out attempt, though, is final: see test_a_real_tool_timeout_is_not_retried.)
    """
    spy = TokenSpy()

    def body(args: Any, ctx: ToolContext) -> str:
        clock.advance(0.6 * SHORT)
        if len(spy.tokens) == 1:
            raise ValueError("flaky")
        return "second attempt"

    registry.add_around(RetryPolicy(attempts=3, backoff=0))
    registry.add_around(TimeoutPolicy())
    registry.add_around(spy)
    add_tool(registry, body, timeout=SHORT)

    result = registry.execute("t")
    clock.advance(3 * SHORT)

    assert result.ok and result.value == "second attempt"
    first, second = spy.tokens
    assert first is not second  # a deadline per attempt
    assert not first.cancelled and not second.cancelled  # closed: they never fire


def test_timeout_over_all_attempts_when_retry_is_inside(
    registry: ToolRegistry, clock: ManualClock
) -> None:
    """Timeout registered first (outer), Retry inner: the attempts share one deadline.

    Each attempt uses 60% of the budget. The first fails; the second runs under the same
    deadline, which fires during it: the second attempt does not get a fresh budget (a fresh
    one would still have 40% left, and the body would wait for it in vain).
    """
    spy = TokenSpy()
    journal = Journal()

    def body(args: Any, ctx: ToolContext) -> str:
        clock.advance(0.6 * SHORT)
        if len(spy.tokens) == 1:
            raise ValueError("flaky")
        journal(wait_for_deadline(ctx))
        return "too late"

    registry.add_around(TimeoutPolicy())
    registry.add_around(RetryPolicy(attempts=3, backoff=0))
    registry.add_around(spy)
    add_tool(registry, body, timeout=SHORT)

    result = registry.execute("t")

    assert (result.code, result.content) == (TIMEOUT, timed_out_content(SHORT_TEXT))
    first, second = spy.tokens
    assert first is second  # one deadline for every attempt
    assert journal.entries == [TimeoutReason("TOOL_TIMEOUT", SHORT)]


def test_budget_expiring_during_the_backoff_returns_the_last_error(
    registry: ToolRegistry, clock: ManualClock
) -> None:
    """Timeout outer, Retry inner: the shared deadline ends the backoff at once.

    What comes back is the last attempt's TOOL_ERROR, not TOOL_TIMEOUT: the policy only
    reclassifies a cancellation, and the retry returned the failure it had.
    """
    journal = Journal()
    backoff = SlowBackoff(LONG)

    def body(args: Any, ctx: ToolContext) -> None:
        journal("run")
        raise ValueError("flaky")

    registry.add_around(TimeoutPolicy())
    registry.add_around(RetryPolicy(attempts=3, backoff=backoff))
    add_tool(registry, body, timeout=SHORT)
    call = Caller(lambda: registry.execute("t"))
    assert backoff.waiting.wait(WAIT)  # the backoff begins (or is about to): now it expires
    clock.advance(SHORT)

    result = call.join()

    assert journal.entries == ["run"]
    assert (result.code, result.content) == (TOOL_ERROR, "Error: ValueError: flaky")
    assert result.duration < 2.0  # against a 30 s backoff


# -- resources -------------------------------------------------------------------------------------


# It took about 28 s on this project's 2-core VM (2026-12-02): more room than the suite's 60 s
# before a slow machine reads as a hang.
@pytest.mark.stress
@pytest.mark.timeout(180)
def test_memory_stays_flat_over_many_timed_calls_on_one_caller_token() -> None:
    """20,000 traced calls (tracemalloc makes each ~3x slower; 100,000 would take ~30 s)."""
    warmup, settle, calls = 2_000, 3_000, 17_000
    caller = CancelSource()

    with open_registry(max_workers=2) as registry:
        add_tool(registry, lambda args, ctx: 1, timeout=LONG)
        registry.add_around(TimeoutPolicy())

        def run(count: int) -> int:
            largest_heap = 0
            for n in range(count):
                if not registry.execute("t", token=caller.token).ok:
                    raise AssertionError(f"call {n} failed")
                if n % 250 == 0:
                    largest_heap = max(largest_heap, len(_TIMER._heap))
            return largest_heap

        heap_before = len(_TIMER._heap)  # other tests' live deadlines may still be queued
        run(warmup)
        gc.collect()
        tracemalloc.start(TRACED_FRAMES)
        try:
            run(settle)
            gc.collect()
            before = traced_ours()
            largest_heap = run(calls)
            gc.collect()
            after = traced_ours()
        finally:
            tracemalloc.stop()

    assert after - before < 64 * 1024, f"grew {after - before} bytes over {calls} calls"
    assert holds_nothing(caller.token)
    assert largest_heap <= heap_before + 512, f"the timer heap grew to {largest_heap} entries"
