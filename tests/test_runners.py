"""The runner seam: a body that runs elsewhere (a cluster) is joined on the stage thread."""

from __future__ import annotations

import threading
from typing import Any

from _registry_helpers import open_registry

from toolreg import CancelSource, ErrorCode, ToolContext
from toolreg._body import NotStarted
from toolreg._catalog import RUNNER_ATTRIBUTE

Args = Any


def remote(runner: Any) -> Any:
    def body(args: Args, ctx: ToolContext) -> Any:
        raise AssertionError("a body with a runner is never called here")

    setattr(body, RUNNER_ATTRIBUTE, runner)
    return body


def test_a_runner_runs_on_the_stage_thread_and_its_value_is_the_result() -> None:
    threads: list[int] = []

    def runner(ctx: ToolContext) -> Any:
        threads.append(threading.get_ident())
        arguments = ctx.call.arguments
        assert arguments is not None  # the executed call's, frozen
        return {"ran": arguments["x"]}

    with open_registry() as registry:
        registry.tool(name="r")(remote(runner))
        result = registry.execute("r", {"x": 1})
    assert result.ok and result.value == {"ran": 1} and result.dispatched
    assert threads == [threading.get_ident()]  # the caller joined it: no pool worker held


def test_a_runner_that_never_started_its_body_is_aborted_before_dispatch() -> None:
    caller = CancelSource()

    def runner(ctx: ToolContext) -> Any:
        caller.cancel("stop")
        raise NotStarted

    with open_registry() as registry:
        registry.tool(name="r")(remote(runner))
        result = registry.execute("r", token=caller.token)
    assert result.code == ErrorCode.ABORTED_BEFORE_DISPATCH and not result.dispatched
    assert result.timeline is not None and result.timeline.dispatched is None


def test_a_runner_success_after_cancellation_is_aborted() -> None:
    caller = CancelSource()

    def runner(ctx: ToolContext) -> str:
        caller.cancel("stop")
        assert ctx.token.cancelled  # the body's token follows the caller
        return "late"

    with open_registry() as registry:
        registry.tool(name="r")(remote(runner))
        result = registry.execute("r", token=caller.token)
    assert result.code == ErrorCode.ABORTED and result.dispatched


def test_a_runner_reports_an_interrupt_that_cancels_the_call() -> None:
    def runner(ctx: ToolContext) -> str:
        assert ctx._interrupt is not None
        ctx._interrupt(KeyboardInterrupt())  # what landed in its join
        assert ctx.token.cancelled
        return "joined"

    with open_registry() as registry:
        registry.tool(name="r")(remote(runner))
        try:
            registry.execute("r")
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the interrupt was not re-raised")
