"""Nested calls and the `ToolContext` a body gets.

docs/contract.md 2.4 and A.5: `ctx.execute` runs a nested call under this call's token and
never deadlocks, even when every worker is busy; after the body settled, the context refuses use.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

import pytest
from _registry_helpers import (
    ABORTED,
    BEFORE,
    WAIT,
    Args,
    Caller,
    Journal,
    Observed,
    counting_tool,
    open_registry,
    wait_until,
)

from toolreg import (
    CancelSource,
    CancelToken,
    ContextSettledError,
    ErrorCode,
    TimeoutPolicy,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
)


def test_nested_calls_do_not_deadlock_when_every_worker_is_busy() -> None:
    with open_registry(max_workers=1) as registry:

        @registry.tool
        def leaf(args: Args, ctx: ToolContext) -> str:
            return f"leaf {args['n']}"

        @registry.tool
        def middle(args: Args, ctx: ToolContext) -> str:
            return ctx.execute("leaf", {"n": args["n"]}).content

        @registry.tool
        def top(args: Args, ctx: ToolContext) -> list[str]:
            return [ctx.execute(ToolCall("middle", {"n": n})).content for n in range(3)]

        assert registry.execute("top").value == ["leaf 0", "leaf 1", "leaf 2"]


def test_nested_calls_do_not_deadlock_when_all_parents_occupy_the_pool() -> None:
    with open_registry(max_workers=2) as registry:
        barrier = threading.Barrier(2, timeout=WAIT)

        @registry.tool
        def leaf(args: Args, ctx: ToolContext) -> str:
            return "leaf"

        @registry.tool
        def parent(args: Args, ctx: ToolContext) -> str:
            barrier.wait()  # both workers are now held by parents
            return ctx.execute("leaf").content

        callers = [Caller(lambda: registry.execute("parent")) for _ in range(2)]
        assert [c.join().value for c in callers] == ["leaf", "leaf"]


def test_registry_execute_from_inside_a_body_does_not_deadlock_on_a_busy_pool() -> None:
    with open_registry(max_workers=1) as registry:
        escape = CancelSource()  # lets the test unwind the deadlock it is looking for

        @registry.tool
        def leaf(args: Args, ctx: ToolContext) -> str:
            return "leaf"

        @registry.tool
        def parent(args: Args, ctx: ToolContext) -> str:
            return registry.execute("leaf", token=escape.token).content

        call = Caller(lambda: registry.execute("parent"))
        finished = call.done.wait(WAIT)  # a bound on a call that needs microseconds
        escape.cancel("the test gives up on a deadlock")
        result = call.join()
        assert finished, "the inner call waited for the worker its own parent holds"
        assert result.value == "leaf"


def test_nested_call_runs_its_own_hooks_and_inherits_the_parent_calls_token(
    registry: ToolRegistry, observed: Observed
) -> None:
    journal = Journal()
    started = threading.Event()
    registry.add_pre_execute(lambda call, token: journal(("pre", call.name)))

    @registry.tool
    def child(args: Args, ctx: ToolContext) -> str:
        started.set()
        journal(("child saw cancel", ctx.token.wait(WAIT)))
        ctx.token.raise_if_cancelled()
        return "unreachable"

    @registry.tool
    def parent(args: Args, ctx: ToolContext) -> str:
        nested = ctx.execute("child")
        journal(("nested", nested.code))
        return "parent done"

    caller = CancelSource()
    call = Caller(lambda: registry.execute("parent", token=caller.token))
    assert started.wait(WAIT)
    caller.cancel("stop")
    result = call.join()
    assert result.code == ABORTED
    assert journal.entries == [
        ("pre", "parent"),
        ("pre", "child"),
        ("child saw cancel", True),
        ("nested", ABORTED),
    ]
    assert [r.call.name for r in observed.results] == ["child", "parent"]


def test_context_methods_raise_after_the_body_settled(registry: ToolRegistry) -> None:
    kept: list[ToolContext] = []
    counting_tool(registry)

    @registry.tool
    def leak(args: Args, ctx: ToolContext) -> str:
        kept.append(ctx)
        return "ok"

    assert registry.execute("leak").ok
    with pytest.raises(ContextSettledError) as raised:
        kept[0].defer_context("late")
    assert isinstance(raised.value, RuntimeError)  # 2.4: a RuntimeError, as 17.1 draws it
    with pytest.raises(ContextSettledError):
        kept[0].execute("work")
    with pytest.raises(ContextSettledError):
        kept[0].report_progress(1)


def test_tool_context_shows_the_call_and_a_live_token(registry: ToolRegistry) -> None:
    seen: list[Any] = []

    @registry.tool
    def look(args: Args, ctx: ToolContext) -> str:
        seen.extend([ctx.call, ctx.token])
        return "ok"

    result = registry.execute(ToolCall("look", {"a": 1}, call_id="c1"))
    call, token = seen
    assert call.call_id == "c1"
    assert call.arguments == {"a": 1}
    assert isinstance(token, CancelToken)
    assert not token.cancelled
    assert result.call == call


# -- the overdue watch of a nested body ------------------------------------------------------------


def _overdue_names(records: list[logging.LogRecord]) -> list[str]:
    return [
        name
        for r in records
        if "has not settled" in r.getMessage()
        for name in ("'parent'", "'stubborn'")
        if name in r.getMessage()
    ]


def _add_stubborn(
    registry: ToolRegistry, started: threading.Event, release: threading.Event
) -> None:
    """The tool `stubborn`: it says it started, then ignores its token until `release`."""

    @registry.tool
    def stubborn(args: Args, ctx: ToolContext) -> str:
        started.set()
        release.wait(WAIT)
        return "late"


@pytest.mark.parametrize("parent_runs", ["on a worker", "in a batch", "under a TimeoutPolicy"])
@pytest.mark.parametrize("cancelled_by", ["the caller", "close()"])
def test_a_nested_body_outlasting_its_parents_cancellation_gets_the_overdue_warning(
    caplog: pytest.LogCaptureFixture, parent_runs: str, cancelled_by: str
) -> None:
    caplog.set_level(logging.WARNING, logger="toolreg")
    registry = ToolRegistry(max_workers=2, overdue_after=0.05)
    started = threading.Event()
    release = threading.Event()
    try:
        if parent_runs == "under a TimeoutPolicy":
            registry.add_around(TimeoutPolicy())

        @registry.tool(timeout=60.0)  # never reached: the caller or close() cancels first
        def parent(args: Args, ctx: ToolContext) -> str:
            return ctx.execute("stubborn").content

        _add_stubborn(registry, started, release)

        caller = CancelSource()
        if parent_runs == "in a batch":
            call = Caller(lambda: registry.execute_batch([ToolCall("parent")], token=caller.token))
        else:
            call = Caller(lambda: registry.execute("parent", token=caller.token))
        assert started.wait(WAIT)
        closing = None
        if cancelled_by == "the caller":
            caller.cancel("stop")
        else:
            closing = Caller(registry.close)
        wait_until(lambda: "'stubborn'" in _overdue_names(caplog.records), "the nested warning")
        assert call.still_blocked()
    finally:
        release.set()
    call.join()
    if closing is not None:
        closing.join()
    registry.close()
    names = _overdue_names(caplog.records)
    assert names.count("'stubborn'") == 1  # once, however many paths lead to it


@pytest.mark.parametrize("parent_runs", ["on a worker", "in a batch"])
def test_a_nested_call_registers_nothing_on_its_parents_token(parent_runs: str) -> None:
    # The parent's own overdue watch starts the nested body's: no listener per nested call.
    listeners: list[int] = []
    parent_token = CancelToken.never()
    with open_registry(max_workers=2) as registry:

        @registry.tool
        def leaf(args: Args, ctx: ToolContext) -> str:
            listeners.append(len(parent_token._listeners or ()))  # white-box: the parent's, now
            return "leaf"

        @registry.tool
        def parent(args: Args, ctx: ToolContext) -> str:
            nonlocal parent_token
            parent_token = ctx.token
            ctx.token.on_cancel(lambda: None).remove()  # eager: a listener would show
            return ctx.execute("leaf").content

        caller = CancelSource()
        if parent_runs == "in a batch":
            [result] = registry.execute_batch([ToolCall("parent")], token=caller.token)
        else:
            result = registry.execute("parent", token=caller.token)
    assert result.ok and result.value == "leaf"
    assert listeners == [0]


@pytest.mark.parametrize(
    "inner_runs", ["nested", "nested, with a wrapper", "registry.execute on the worker"]
)
def test_an_inline_body_claimed_back_just_before_it_starts_never_starts(inner_runs: str) -> None:
    # An inline body has no joiner (and nothing to release for one): a canceller that wins its
    # claim in the last window before the body's own claim settles it as never started. The
    # window is held deterministically: the cancellation runs on the body's thread as
    # `ToolContext._run` is entered.
    ran: list[str] = []
    inner_results: list[ToolResult[Any]] = []
    with open_registry(max_workers=2) as registry:
        if inner_runs == "nested, with a wrapper":
            registry.add_around(lambda dispatch, proceed: proceed())

        @registry.tool
        def inner(args: Args, ctx: ToolContext) -> str:
            ran.append("inner")
            return "inner"

        def cancel_as_the_body_starts(frame: Any, event: str, arg: Any) -> Any:
            if event == "call" and frame.f_code is ToolContext._run.__code__:
                body = frame.f_locals["self"]
                if body.call.name == "inner":
                    for entry in list(registry._dispatcher._calls.values()):
                        if getattr(entry, "call", None) == body.call:  # the inner call's state
                            entry.cancel("cancelled in the window")  # white-box: close()'s step
            return None

        @registry.tool
        def outer(args: Args, ctx: ToolContext) -> str:
            sys.settrace(cancel_as_the_body_starts)
            try:
                if inner_runs == "registry.execute on the worker":
                    inner_results.append(registry.execute("inner", token=ctx.token))
                else:
                    inner_results.append(ctx.execute("inner"))
            finally:
                sys.settrace(None)
            return "outer"

        result = registry.execute("outer")
    assert result.ok, result.content
    [inner_result] = inner_results
    assert ran == []
    assert inner_result.error is not None
    assert inner_result.error.code is BEFORE and not inner_result.dispatched


def test_a_nested_call_made_on_another_thread_of_the_body_keeps_its_own_watch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Only a nested call on the body's own thread is covered by the body's watch: one made on
    # a thread the body started may overlap the body's own nested calls.
    caplog.set_level(logging.WARNING, logger="toolreg")
    started = threading.Event()
    quick_done = threading.Event()
    release = threading.Event()
    with open_registry(max_workers=2, overdue_after=0.05) as registry:
        _add_stubborn(registry, started, release)

        @registry.tool
        def quick(args: Args, ctx: ToolContext) -> str:
            quick_done.set()
            return "quick"

        @registry.tool
        def parent(args: Args, ctx: ToolContext) -> str:
            helper = threading.Thread(target=ctx.execute, args=("stubborn",))
            helper.start()
            started.wait(WAIT)
            ctx.execute("quick")  # on the body's own thread, after the helper's began
            helper.join()
            return "done"

        caller = CancelSource()
        call = Caller(lambda: registry.execute("parent", token=caller.token))
        try:
            assert started.wait(WAIT)
            assert quick_done.wait(WAIT)
            caller.cancel("stop")
            wait_until(lambda: "'stubborn'" in _overdue_names(caplog.records), "the warning")
        finally:
            release.set()
        call.join()


@pytest.mark.parametrize(
    "wrappers", ["TimeoutPolicy, kept", "TimeoutPolicy, removed", "it and a wrapper, removed"]
)
def test_a_nested_body_under_an_inline_parents_fired_deadline_gets_the_overdue_warning(
    caplog: pytest.LogCaptureFixture, wrappers: str
) -> None:
    # The parent (a batch call, inline) got TimeoutPolicy's deadline as its token, and nothing
    # watches such a parent when only that deadline fires (contract 4.4): its nested call keeps
    # a listener of its own, also when the wrappers are removed before it is made (it then has
    # no around wrapper, which alone would let the parent's watch cover it).
    caplog.set_level(logging.WARNING, logger="toolreg")
    started = threading.Event()
    release = threading.Event()
    with open_registry(max_workers=2, overdue_after=0.05) as registry:
        added = [registry.add_around(TimeoutPolicy())]
        if wrappers == "it and a wrapper, removed":
            added.append(registry.add_around(lambda dispatch, proceed: proceed()))

        @registry.tool(timeout=0.05)
        def parent(args: Args, ctx: ToolContext) -> str:
            if wrappers != "TimeoutPolicy, kept":
                for registration in added:
                    registration.remove()
            return ctx.execute("stubborn").content

        _add_stubborn(registry, started, release)

        batch = Caller(lambda: registry.execute_batch([ToolCall("parent")]))
        try:
            assert started.wait(WAIT)
            wait_until(lambda: "'stubborn'" in _overdue_names(caplog.records), "the warning")
        finally:
            release.set()
        [result] = batch.join()
    assert result.error is not None and result.error.code is ErrorCode.TOOL_TIMEOUT
