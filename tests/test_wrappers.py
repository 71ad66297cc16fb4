"""Around wrappers: their nesting, `proceed()`, and the `dispatch.token` slot.

docs/contract.md section 3, stage 5: wrappers nest in registration order (first outermost);
`proceed()` never raises and may run again (each run joins the body it starts); a wrapper may
answer without the body; whatever a wrapper does, every started body is joined.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import pytest
from _registry_helpers import (
    Args,
    Caller,
    Gate,
    Journal,
    Proceed,
    counting_tool,
)

from toolreg import (
    AroundWrapper,
    Dispatch,
    ErrorCode,
    RetryPolicy,
    TimeoutPolicy,
    Tool,
    ToolContext,
    ToolRegistry,
    ToolResult,
)
from toolreg._hooks import HookSet, HookTable


def test_wrappers_nest_in_registration_order_first_outermost(registry: ToolRegistry) -> None:
    journal = Journal()

    def body(args: Args, ctx: ToolContext) -> str:
        journal("body")
        return "ok"

    registry.tool(name="work")(body)

    def make(label: str) -> Callable[[Dispatch, Proceed], ToolResult[Any]]:
        def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
            journal(f"{label} before")
            result = proceed()
            journal(f"{label} after")
            return result

        return wrapper

    for label in ("a", "b", "c"):
        registry.add_around(make(label))
    assert registry.execute("work").ok
    assert journal.entries == [
        "a before",
        "b before",
        "c before",
        "body",
        "c after",
        "b after",
        "a after",
    ]


def test_proceed_again_reruns_the_rest_of_the_chain_and_joins_each_body(
    registry: ToolRegistry,
) -> None:
    journal = Journal()
    attempts: list[int] = []

    @registry.tool
    def flaky(args: Args, ctx: ToolContext) -> str:
        attempts.append(len(attempts) + 1)
        threading.Event().wait(0.01)  # simulated work: the join must outlast it
        journal(f"body {len(attempts)} returned")
        if len(attempts) == 1:
            raise ConnectionError("transient")
        return "ok"

    def retry(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        first = proceed()
        journal(f"retry saw {first.code}")
        second = proceed()
        journal(f"retry saw {second.code}")
        return second

    def inner(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        journal("inner")
        return proceed()

    registry.add_around(retry)
    registry.add_around(inner)
    result = registry.execute("flaky")
    assert result.ok
    assert result.dispatched
    assert journal.entries == [
        "inner",
        "body 1 returned",
        "retry saw TOOL_ERROR",
        "inner",
        "body 2 returned",
        "retry saw None",
    ]


def test_proceed_never_raises_inner_failures_come_back_as_results(
    registry: ToolRegistry,
) -> None:
    seen: list[ToolResult[Any]] = []

    @registry.tool
    def fail(args: Args, ctx: ToolContext) -> str:
        raise RuntimeError("body broke")

    def outer(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        seen.append(proceed())
        return seen[-1]

    def inner(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        if dispatch.call.arguments["break"]:  # type: ignore[index]
            raise LookupError("inner wrapper broke")
        return proceed()

    registry.add_around(outer)
    registry.add_around(inner)
    assert registry.execute("fail", {"break": False}).code == ErrorCode.TOOL_ERROR
    assert registry.execute("fail", {"break": True}).code == ErrorCode.HOOK_ERROR
    assert [r.code for r in seen] == [ErrorCode.TOOL_ERROR, ErrorCode.HOOK_ERROR]
    assert isinstance(seen[1].error.exception, LookupError)  # type: ignore[union-attr]


def test_wrapper_may_answer_without_running_the_body(registry: ToolRegistry) -> None:
    starts = counting_tool(registry)
    registry.add_around(
        lambda dispatch, proceed: ToolResult.success(dispatch.call, "cached", ("cache",))
    )
    result = registry.execute("work")
    assert (result.ok, result.value, result.contexts, result.dispatched) == (
        True,
        "cached",
        ("cache",),
        False,
    )
    assert starts == []


def test_wrapper_leaving_a_non_token_in_dispatch_token_is_a_hook_error(
    registry: ToolRegistry,
) -> None:
    starts = counting_tool(registry)

    def spoil(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        dispatch.token = None  # type: ignore[assignment]
        return proceed()

    registry.add_around(spoil)
    assert registry.execute("work").code == ErrorCode.HOOK_ERROR
    assert starts == []


def test_wrapper_deleting_dispatch_token_fails_closed_without_raising(
    registry: ToolRegistry,
) -> None:
    starts = counting_tool(registry)
    proceed_raised: list[BaseException] = []

    def remove_slot(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        del dispatch.token
        try:
            return proceed()
        except BaseException as exc:
            proceed_raised.append(exc)
            raise

    registry.add_around(remove_slot)
    result = registry.execute("work")  # "execute never raises for a tool-level problem"
    assert proceed_raised == []  # "proceed() ... never raises"
    assert not result.ok
    assert starts == []


def test_proceed_called_after_the_call_settled_starts_no_body(registry: ToolRegistry) -> None:
    starts = counting_tool(registry)
    kept: list[Proceed] = []

    def keep(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        kept.append(proceed)
        return ToolResult.success(dispatch.call, "cached")

    registry.add_around(keep)
    assert registry.execute("work").ok
    with contextlib.suppress(RuntimeError):  # refusing loudly is fine too
        kept[0]()
    assert starts == []


def test_body_started_by_a_proceed_on_another_thread_is_still_joined(
    registry: ToolRegistry,
) -> None:
    gate = Gate()
    background: list[Caller] = []

    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        gate.hold()
        return "done"

    def fire_and_forget(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        background.append(Caller(proceed, name="background-proceed"))
        gate.wait_reached()  # the body is running
        return ToolResult.success(dispatch.call, "answered early")

    registry.add_around(fire_and_forget)
    call = Caller(lambda: registry.execute("work"))
    try:
        gate.wait_reached()
        assert call.still_blocked(), "execute returned while a body of its call was running"
    finally:
        gate.release()
        result = call.join()
        background[0].join()
    assert result.dispatched


@pytest.mark.parametrize("inner", [None, TimeoutPolicy(), RetryPolicy()], ids=repr)
def test_a_result_a_wrapper_keeps_stays_as_it_saw_it(
    registry: ToolRegistry, inner: AroundWrapper | None
) -> None:
    """The registry finishes a result in place only when no user code has seen it: a wrapper
    that keeps what proceed() gave it must not see that object change afterwards."""
    registry.tool(name="work", timeout=30.0)(lambda args, ctx: "done")
    kept: list[tuple[ToolResult[Any], tuple[object, ...]]] = []

    def keeping(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        result = proceed()
        kept.append((result, (result.dispatched, result.duration, result.timeline)))
        return result

    registry.add_around(keeping)
    if inner is not None:
        registry.add_around(inner)
    final = registry.execute("work")
    assert final.ok and final.dispatched
    result, seen = kept[0]
    assert (result.dispatched, result.duration, result.timeline) == seen
    assert final is not result  # the final result is a copy, made after the wrapper returned


def test_only_toolregs_own_policies_let_a_result_be_finished_in_place() -> None:
    class Subclassed(TimeoutPolicy):  # may override __call__ and keep the result: not trusted
        pass

    def around(*wrappers: AroundWrapper, post: bool = False) -> bool:
        hooks = HookSet(around=wrappers, post_execute=(lambda r, t: None,) if post else ())
        return hooks.results_unseen

    assert around()
    assert around(TimeoutPolicy(), RetryPolicy())
    assert not around(TimeoutPolicy(), lambda d, p: p())
    assert not around(Subclassed())
    assert not around(TimeoutPolicy(), post=True)
    trusted = HookSet(around=(TimeoutPolicy(),))
    assert not trusted.replace(around=(lambda d, p: p(),)).results_unseen


def test_a_registered_policy_is_still_known_as_the_registrys_own() -> None:
    """Registration keeps a partial of each hook: the trust above and the chain run must see
    through it (they did not, so a registered TimeoutPolicy's results were always copied)."""
    table = HookTable()
    table.add("around", TimeoutPolicy())
    table.add("around", RetryPolicy())
    before = table.current  # a set each: mypy would keep `table.current.…` narrowed past add()
    assert before.results_unseen and before.chain_only
    assert all(run is not None for run in before.chain_runs)
    table.add("around", lambda d, p: p())
    after = table.current
    assert not after.results_unseen and not after.chain_only
    assert after.chain_runs[-1] is None


def test_a_policy_subclass_runs_through_its_own_call_with_a_proceed(
    registry: ToolRegistry,
) -> None:
    """The registry runs its own policies without a `proceed()` of their own; a subclass may
    override `__call__`, so it gets the ordinary call, and its deadline still works."""
    seen: list[bool] = []

    class Watched(TimeoutPolicy):
        def __call__(self, dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
            seen.append(callable(proceed))
            return super().__call__(dispatch, proceed)

    def body(args: object, ctx: ToolContext) -> str:
        ctx.token.wait()  # until the deadline cancels it
        return "late"

    registry.register(Tool("slow", body, timeout=0.01))
    registry.add_around(Watched())
    result = registry.execute("slow")
    assert seen == [True]
    assert result.error is not None and result.error.code == ErrorCode.TOOL_TIMEOUT


@pytest.mark.parametrize("elsewhere", ["outer", "inner"])
def test_a_proceed_on_another_thread_at_either_depth_of_a_chain_runs_and_joins_the_body(
    registry: ToolRegistry, elsewhere: str
) -> None:
    """`proceed()` called on another thread, from the outer wrapper (the rest of the chain) or
    the innermost one (the body): it runs what is left, and execute returns its result."""
    journal = Journal()

    def work(args: Args, ctx: ToolContext) -> str:
        journal(threading.current_thread().name)
        return "ok"

    registry.tool(name="work")(work)

    def make(label: str) -> AroundWrapper:
        def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
            journal(label)
            if label != elsewhere:
                return proceed()
            box: list[ToolResult[Any]] = []
            helper = threading.Thread(target=lambda: box.append(proceed()), name="helper")
            helper.start()
            helper.join()
            return box[0]

        return wrapper

    registry.add_around(make("outer"))
    registry.add_around(make("inner"))
    result = registry.execute("work")
    assert result.ok and result.content == "ok" and result.dispatched
    outer, inner, body = journal.entries  # each wrapper once, then the body once
    assert (outer, inner) == ("outer", "inner")
    assert body.startswith("toolreg-")  # handed to a pool worker, as from the call's own thread
