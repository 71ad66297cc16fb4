"""Nested calls and the `ToolContext` a body gets.

docs/contract.md 2.4 and A.5: `ctx.execute` runs a nested call under this call's token and
never deadlocks, even when every worker is busy; after the body settled, the context refuses use.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from _registry_helpers import (
    ABORTED,
    WAIT,
    Args,
    Caller,
    Journal,
    Observed,
    counting_tool,
    open_registry,
)

from toolreg import (
    CancelSource,
    CancelToken,
    ContextSettledError,
    ToolCall,
    ToolContext,
    ToolRegistry,
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
