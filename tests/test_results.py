"""Results: content, error codes, the builders, and what the registry sets on every result.

docs/contract.md section 5. Failures carry their code and an `Error: ...` content; the registry
sets `call`, `dispatched` and `duration` on the final result, whatever a hook or wrapper made.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from _registry_helpers import (
    WAIT,
    Args,
    Opaque,
    Proceed,
    counting_tool,
    echo,
)

from toolreg import (
    CallTimeline,
    CancelSource,
    CancelToken,
    Dispatch,
    ErrorCode,
    Tool,
    ToolCall,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolResult,
)


@pytest.mark.parametrize(
    "value",
    [
        "plain text",
        "",
        "ünïcode ✓",
        {"k": "ü", "n": [1, 2.5, None, True]},
        [1, "two"],
        42,
        -7,
        2.5,
        None,
        True,
        False,
        (1, 2),
    ],
)
def test_content_is_a_str_as_is_else_json_without_ascii_escapes(
    registry: ToolRegistry, value: Any
) -> None:
    registry.tool(name="value")(lambda args, ctx: value)
    result = registry.execute("value")
    assert result.ok
    expected = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    assert result.content == expected
    assert result.value is value


def test_content_uses_the_tools_render(registry: ToolRegistry) -> None:
    registry.register(
        Tool("hits", lambda args, ctx: {"hits": [1, 2]}, render=lambda v: f"{len(v['hits'])} hits")
    )
    result = registry.execute("hits")
    assert result.content == "2 hits"
    assert result.value == {"hits": [1, 2]}


@pytest.mark.parametrize(
    ("value", "render", "type_name"),
    [
        ({1, 2}, None, "set"),
        (Opaque(), None, "Opaque"),
        ({"x": object()}, None, "dict"),
        ({"x": 1}, lambda v: 42, "dict"),
        ([1], lambda v: 1 / 0, "list"),
    ],
    ids=["set", "object", "nested-object", "render-returns-int", "render-raises"],
)
def test_unrenderable_value_makes_a_tool_error_naming_its_type(
    registry: ToolRegistry, value: Any, render: Callable[[Any], str] | None, type_name: str
) -> None:
    registry.register(Tool("odd", lambda args, ctx: value, render=render))
    result = registry.execute("odd")
    assert result.code == ErrorCode.TOOL_ERROR
    assert result.error is not None
    assert type_name in result.error.message
    assert result.dispatched
    assert result.value is None


def test_body_exception_is_a_tool_error_keeping_the_exception(registry: ToolRegistry) -> None:
    boom = ValueError("boom")

    @registry.tool
    def fail(args: Args, ctx: ToolContext) -> str:
        ctx.defer_context("partial")
        raise boom

    result = registry.execute("fail")
    assert result.code == ErrorCode.TOOL_ERROR
    assert result.error is not None
    assert result.error.exception is boom
    assert "boom" in result.error.message
    assert result.content == f"Error: {result.error.message}"
    assert result.contexts == ("partial",)
    assert result.dispatched


def test_results_and_errors_are_frozen_dataclasses(registry: ToolRegistry) -> None:
    registry.register(Tool("echo", echo))
    result = registry.execute("echo")
    assert dataclasses.is_dataclass(result)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.ok = False  # type: ignore[misc]
    error = ToolError(ErrorCode.DENIED, "no")
    with pytest.raises(dataclasses.FrozenInstanceError):
        error.message = "yes"  # type: ignore[misc]
    assert dataclasses.replace(result, content="other").content == "other"


def test_success_and_failure_builders() -> None:
    call = ToolCall("t", {})
    success = ToolResult.success(call, {"k": "é"}, contexts=["c"])  # type: ignore[arg-type]
    assert (success.ok, success.value, success.error, success.contexts) == (
        True,
        {"k": "é"},
        None,
        ("c",),
    )
    assert success.content == '{"k": "é"}'
    assert ToolResult.success(call, "text").content == "text"
    failure = ToolResult.failure(call, "DENIED", "not allowed", contexts=("c",))
    assert (failure.ok, failure.value, failure.contexts) == (False, None, ("c",))
    assert failure.error == ToolError(ErrorCode.DENIED, "not allowed")
    assert failure.code is ErrorCode.DENIED
    assert failure.content == "Error: not allowed"


@pytest.mark.parametrize(
    ("code", "content"),
    [
        (ErrorCode.ABORTED, "Error: tool call aborted"),
        (ErrorCode.ABORTED_BEFORE_DISPATCH, "Error: tool call aborted before dispatch"),
        (ErrorCode.TOOL_TIMEOUT, "Error: tool call timed out after 2.5s"),
        (ErrorCode.HOOK_ERROR, "Error: tool call timed out after 2.5s"),
    ],
)
def test_failure_content_follows_section_5(code: ErrorCode, content: str) -> None:
    result = ToolResult.failure(ToolCall("t"), code, "tool call timed out after 2.5s")
    assert result.content == content


def test_error_codes_equal_their_names() -> None:
    names = [
        "ABORTED",
        "ABORTED_BEFORE_DISPATCH",
        "TOOL_TIMEOUT",
        "UNKNOWN_TOOL",
        "INVALID_ARGS",
        "DENIED",
        "TOOL_ERROR",
        "HOOK_ERROR",
    ]
    assert sorted(member.name for member in ErrorCode) == sorted(names)
    for name in names:
        member = getattr(ErrorCode, name)
        assert member == name
        assert str(member) == name
        assert ErrorCode(name) is member


def _entry_failure(registry: ToolRegistry) -> ToolResult[Any]:
    return registry.execute("nope")


FORGED_TIMELINE = CallTimeline(0.0, 7.0, 7.0, 8.0, 9.0)  # what a hook might pass along


def _wrapper_made(registry: ToolRegistry) -> ToolResult[Any]:
    def fake(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        made = ToolResult.success(ToolCall("forged", {"f": 1}), "cached")
        return dataclasses.replace(made, dispatched=True, duration=-1.0)

    registry.add_around(fake)
    return registry.execute("work", {"x": 1})


def _post_made(registry: ToolRegistry) -> ToolResult[Any]:
    def forge(result: ToolResult[Any], token: CancelToken) -> ToolResult[Any]:
        failed = ToolResult.failure(ToolCall("forged"), "TOOL_ERROR", "post says no")
        return dataclasses.replace(failed, dispatched=False, duration=1e9, timeline=FORGED_TIMELINE)

    registry.add_post_execute(forge)
    return registry.execute("work", {"x": 1})


def _aborted_before(registry: ToolRegistry) -> ToolResult[Any]:
    source = CancelSource()
    source.cancel()
    return registry.execute("work", {"x": 1}, token=source.token, start_if_cancelled=False)


@pytest.mark.parametrize(
    ("scenario", "dispatched"),
    [(_entry_failure, False), (_wrapper_made, False), (_post_made, True), (_aborted_before, False)],
)
def test_registry_sets_call_dispatched_and_duration_on_every_final_result(
    registry: ToolRegistry,
    scenario: Callable[[ToolRegistry], ToolResult[Any]],
    dispatched: bool,
) -> None:
    counting_tool(registry)
    result = scenario(registry)
    assert result.dispatched is dispatched
    assert isinstance(result.duration, float)
    assert 0.0 <= result.duration < WAIT
    # 5.2: the timeline too, on results made by a wrapper or a post hook (forged or left None).
    timeline = result.timeline
    assert isinstance(timeline, CallTimeline) and timeline != FORGED_TIMELINE
    assert timeline.finished == result.duration
    assert (timeline.dispatched is not None) is dispatched
    assert (timeline.settled is not None) is dispatched
    if result.code != ErrorCode.UNKNOWN_TOOL:
        assert result.call.name == "work"
        assert result.call.arguments == {"x": 1}


def test_duration_covers_entry_to_result(registry: ToolRegistry) -> None:
    @registry.tool
    def slow(args: Args, ctx: ToolContext) -> str:
        threading.Event().wait(0.05)  # simulated work, not ordering
        return "done"

    assert registry.execute("slow").duration >= 0.05
