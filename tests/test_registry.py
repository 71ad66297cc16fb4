"""ToolRegistry: tools, registration, catalog, arguments, results, hooks, threads, lifecycle.

The cancellation contract of API.md section 4 is pinned sentence by sentence in
test_contract.py; this file covers everything else the registry promises (sections 2, 3 and 5,
and the decisions README.md records), plus the Ctrl-C and close() batteries, overdue
diagnostics and token hygiene over many calls. Threads are ordered with `Event` handshakes only.
"""

from __future__ import annotations

import _thread
import contextlib
import copy
import dataclasses
import gc
import json
import logging
import math
import sys
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fastjsonschema
import pytest
from _registry_helpers import (
    ABORTED,
    BEFORE,
    WAIT,
    Caller,
    Gate,
    Journal,
    Observed,
    default_sigint,
    holds_nothing,
    main_thread_sleeps,
    open_registry,
    send_ctrl_c_when,
    wait_until,
)

import toolreg
from toolreg import (
    Allow,
    Ask,
    Cancelled,
    CancelSource,
    CancelToken,
    Deny,
    Dispatch,
    ErrorCode,
    FrozenDict,
    Registration,
    Tool,
    ToolCall,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolResult,
)

Args = Any
Proceed = Callable[[], ToolResult[Any]]
TOOLREG_DIR = str(Path(toolreg.__file__).parent)


@pytest.fixture
def registry() -> Iterator[ToolRegistry]:
    with open_registry(max_workers=4) as reg:
        yield reg


@pytest.fixture
def observed(registry: ToolRegistry) -> Observed:
    seen = Observed()
    registry.on_result(seen)
    return seen


def echo(args: Args, ctx: ToolContext) -> Any:
    """Return the arguments as a plain dict."""
    return dict(args)


def counting_tool(registry: ToolRegistry, name: str = "work") -> list[str]:
    starts: list[str] = []

    def body(args: Args, ctx: ToolContext) -> str:
        starts.append(ctx.call.call_id)
        return "ran"

    registry.tool(name=name)(body)
    return starts


# == tools and registration ===================================================================


def test_tool_decorator_returns_the_function_unchanged_with_name_and_docstring(
    registry: ToolRegistry,
) -> None:
    def search(args: Args, ctx: ToolContext) -> str:
        """Search the index."""
        return "hit"

    assert registry.tool(search) is search
    tool = registry.get("search")
    assert tool is not None
    assert tool.fn is search
    assert tool.description == "Search the index."
    assert registry.execute("search").value == "hit"


def test_tool_decorator_options_override_name_and_description(registry: ToolRegistry) -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}

    @registry.tool(
        name="find",
        description="Find things",
        parameters=schema,
        timeout=2.5,
        concurrency_safe=True,
    )
    def anything(args: Args, ctx: ToolContext) -> str:
        return "found"

    tool = registry.get("find")
    assert tool is not None
    assert (tool.name, tool.description, tool.timeout, tool.concurrency_safe) == (
        "find",
        "Find things",
        2.5,
        True,
    )
    assert dict(tool.parameters or {}) == schema
    assert registry.get("anything") is None


def test_register_returns_a_registration_that_removes_the_tool_once(
    registry: ToolRegistry,
) -> None:
    registration = registry.register(Tool("echo", echo))
    assert isinstance(registration, Registration)
    assert registry.execute("echo", {"a": 1}).ok
    assert registration.remove() is True
    assert registration.remove() is False
    assert registry.get("echo") is None
    assert registry.execute("echo").code == ErrorCode.UNKNOWN_TOOL
    registry.register(Tool("echo", echo))  # the name is free again
    assert registry.execute("echo").ok


def test_removing_a_replaced_tools_old_registration_keeps_the_new_tool(
    registry: ToolRegistry,
) -> None:
    old = registry.register(Tool("echo", echo))
    old.remove()
    registry.register(Tool("echo", lambda args, ctx: "new"))
    assert old.remove() is False
    assert registry.execute("echo").value == "new"


def test_duplicate_tool_name_raises_value_error_and_keeps_the_first(
    registry: ToolRegistry,
) -> None:
    registry.register(Tool("echo", echo))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Tool("echo", lambda args, ctx: "second"))
    assert registry.get("echo").fn is echo  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "schema",
    [{"type": "no-such-type"}, {"type": "object", "properties": 5}, {"minLength": "three"}],
)
def test_invalid_schema_fails_register_with_value_error(
    registry: ToolRegistry, schema: dict[str, Any]
) -> None:
    with pytest.raises(ValueError, match="schema"):
        registry.register(Tool("bad", echo, parameters=schema))
    assert registry.get("bad") is None


@pytest.mark.parametrize("timeout", [0, -1, 0.0, math.nan, math.inf, -math.inf])
def test_non_positive_nan_or_infinite_timeout_raises_value_error_at_registration(
    registry: ToolRegistry, timeout: float
) -> None:
    with pytest.raises(ValueError, match="timeout"):
        registry.tool(name="t", timeout=timeout)(echo)
    assert registry.get("t") is None


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: Tool("t", "not callable"), TypeError),  # type: ignore[arg-type]
        (lambda: Tool("", echo), ValueError),
        (lambda: Tool("t", echo, timeout="1"), TypeError),  # type: ignore[arg-type]
        (lambda: Tool("t", echo, parameters=["not", "a", "mapping"]), TypeError),  # type: ignore[arg-type]
    ],
    ids=["body", "name", "timeout-type", "parameters-type"],
)
def test_bad_tool_definitions_raise_before_any_call(
    make: Callable[[], Tool], error: type[Exception]
) -> None:
    with pytest.raises(error):
        make()


def test_register_rejects_something_that_is_not_a_tool(registry: ToolRegistry) -> None:
    with pytest.raises(TypeError, match="Tool"):
        registry.register(echo)  # type: ignore[arg-type]


def test_tool_is_a_frozen_dataclass() -> None:
    tool = Tool("echo", echo)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tool.name = "other"  # type: ignore[misc]
    assert (
        tool.description,
        tool.parameters,
        tool.timeout,
        tool.concurrency_safe,
        tool.render,
    ) == ("", None, None, False, None)


# == catalog ==================================================================================

SEARCH_SCHEMA = {
    "type": "object",
    "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["q"],
}


def _register_catalog(registry: ToolRegistry, order: list[str]) -> None:
    tools = {
        "search": Tool("search", echo, description="Search the index", parameters=SEARCH_SCHEMA),
        "clock": Tool("clock", echo, description="What time is it"),
        "alpha": Tool(
            "alpha", echo, description="First", parameters={"type": "object", "properties": {}}
        ),
    }
    for name in order:
        registry.register(tools[name])


def test_tools_are_sorted_by_name_and_get_finds_each(registry: ToolRegistry) -> None:
    _register_catalog(registry, ["search", "clock", "alpha"])
    assert [tool.name for tool in registry.tools()] == ["alpha", "clock", "search"]
    assert isinstance(registry.tools(), tuple)
    assert registry.get("clock").description == "What time is it"  # type: ignore[union-attr]
    assert registry.get("nope") is None


def test_schemas_have_the_exact_openai_shape(registry: ToolRegistry) -> None:
    _register_catalog(registry, ["search", "clock"])
    assert registry.schemas("openai") == [
        {
            "type": "function",
            "function": {
                "name": "clock",
                "description": "What time is it",
                "parameters": {"type": "object", "properties": {}},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the index",
                "parameters": SEARCH_SCHEMA,
            },
        },
    ]
    assert registry.schemas() == registry.schemas("openai")


def test_schemas_have_the_exact_anthropic_shape(registry: ToolRegistry) -> None:
    _register_catalog(registry, ["search", "clock"])
    assert registry.schemas("anthropic") == [
        {
            "name": "clock",
            "description": "What time is it",
            "input_schema": {"type": "object", "properties": {}},
        },
        {"name": "search", "description": "Search the index", "input_schema": SEARCH_SCHEMA},
    ]


def test_schemas_have_the_exact_mcp_shape(registry: ToolRegistry) -> None:
    _register_catalog(registry, ["search", "clock"])
    assert registry.schemas("mcp") == [
        {
            "name": "clock",
            "description": "What time is it",
            "inputSchema": {"type": "object", "properties": {}},
        },
        {"name": "search", "description": "Search the index", "inputSchema": SEARCH_SCHEMA},
    ]


@pytest.mark.parametrize("style", ["openai", "anthropic", "mcp"])
def test_schemas_are_byte_stable_whatever_the_registration_order(style: str) -> None:
    with open_registry(max_workers=1) as first, open_registry(max_workers=1) as second:
        _register_catalog(first, ["search", "clock", "alpha"])
        _register_catalog(second, ["alpha", "search", "clock"])
        assert json.dumps(first.schemas(style)) == json.dumps(second.schemas(style))  # type: ignore[arg-type]


def test_schemas_return_fresh_copies(registry: ToolRegistry) -> None:
    _register_catalog(registry, ["search"])
    schemas = registry.schemas("mcp")
    schemas[0]["inputSchema"]["properties"]["q"]["type"] = "integer"
    assert registry.schemas("mcp")[0]["inputSchema"] == SEARCH_SCHEMA
    assert registry.execute("search", {"q": "still a string"}).ok


def test_schemas_keep_the_schema_that_was_compiled_at_registration(
    registry: ToolRegistry,
) -> None:
    schema = copy.deepcopy(SEARCH_SCHEMA)
    registry.register(Tool("search", echo, parameters=schema))
    schema["properties"]["q"]["type"] = "integer"  # the caller reuses its dict afterwards
    advertised = registry.schemas("mcp")[0]["inputSchema"]
    assert advertised == SEARCH_SCHEMA
    assert registry.execute("search", {"q": "text"}).ok


def test_tool_removed_while_its_call_is_in_flight_finishes_that_call(
    registry: ToolRegistry,
) -> None:
    gate = Gate()
    registration = registry.register(Tool("slow", lambda args, ctx: gate.hold() or "done"))
    call = Caller(lambda: registry.execute("slow"))
    gate.wait_reached()
    assert registration.remove() is True
    gate.release()
    assert call.join().value == "done"
    assert registry.execute("slow").code == ErrorCode.UNKNOWN_TOOL


def test_unknown_schema_style_raises_value_error(registry: ToolRegistry) -> None:
    with pytest.raises(ValueError, match="openai"):
        registry.schemas("gemini")  # type: ignore[arg-type]


# == arguments and entry checks ===============================================================


def test_every_stage_sees_the_same_frozen_arguments(registry: ToolRegistry) -> None:
    seen: list[Any] = []
    registry.tool(name="echo")(lambda args, ctx: seen.append(("body", args)) or "ok")
    registry.add_pre_execute(lambda call, token: seen.append(("pre", call.arguments)))
    registry.add_guard(lambda call: seen.append(("guard", call.arguments)))

    def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        seen.append(("around", dispatch.call.arguments))
        return proceed()

    registry.add_around(wrapper)
    registry.add_post_execute(lambda result, token: seen.append(("post", result.call.arguments)))
    registry.on_result(lambda result: seen.append(("observer", result.call.arguments)))
    original = {"q": "x", "tags": ["a", "b"], "opts": {"deep": [1, {"k": None}]}}
    result = registry.execute("echo", original)
    assert [stage for stage, _ in seen] == ["pre", "guard", "around", "body", "post", "observer"]
    expected = {"q": "x", "tags": ("a", "b"), "opts": {"deep": (1, {"k": None})}}
    for _, arguments in seen:
        assert type(arguments) is FrozenDict
        assert arguments == expected
        assert type(arguments["opts"]) is FrozenDict
        assert type(arguments["tags"]) is tuple
        assert type(arguments["opts"]["deep"][1]) is FrozenDict
    assert result.call.arguments == expected
    assert seen[0][1] is not original


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.__setitem__("q", 1),
        lambda d: d.__delitem__("q"),
        lambda d: d.clear(),
        lambda d: d.pop("q"),
        lambda d: d.popitem(),
        lambda d: d.setdefault("new", 1),
        lambda d: d.update(q=2),
        lambda d: d.__ior__({"q": 3}),
    ],
    ids=["setitem", "delitem", "clear", "pop", "popitem", "setdefault", "update", "ior"],
)
def test_frozen_arguments_refuse_every_mutator_with_type_error(
    registry: ToolRegistry, mutate: Callable[[FrozenDict], object]
) -> None:
    outcomes: list[str] = []

    @registry.tool
    def tamper(args: Args, ctx: ToolContext) -> str:
        try:
            mutate(args)
        except TypeError:
            outcomes.append("refused")
        return "done"

    assert registry.execute("tamper", {"q": "x"}).ok
    assert outcomes == ["refused"]


def test_frozen_dict_is_a_json_friendly_dict_and_copies_stay_frozen() -> None:
    frozen = FrozenDict({"a": 1})
    assert isinstance(frozen, dict)
    assert json.dumps(frozen) == '{"a": 1}'
    assert copy.copy(frozen) == frozen
    assert copy.deepcopy(frozen) == frozen
    with pytest.raises(TypeError):
        copy.deepcopy(frozen)["b"] = 2
    plain = dict(frozen)
    plain["b"] = 2  # a plain copy is the documented way to change them
    assert frozen == {"a": 1}


def test_caller_mutating_its_arguments_after_entry_changes_nothing(
    registry: ToolRegistry,
) -> None:
    gate = Gate()
    seen: list[Any] = []
    registry.tool(name="echo")(lambda args, ctx: seen.append(args) or "ok")
    registry.add_pre_execute(lambda call, token: gate.hold())
    arguments: dict[str, Any] = {"q": "before", "tags": ["a"], "opts": {"n": 1}}
    call = Caller(lambda: registry.execute("echo", arguments))
    gate.wait_reached()  # entry is done: the call is in its first hook
    arguments["q"] = "after"
    arguments["tags"].append("b")
    arguments["opts"]["n"] = 2
    arguments["extra"] = True
    gate.release()
    result = call.join()
    expected = {"q": "before", "tags": ("a",), "opts": {"n": 1}}
    assert seen == [expected]
    assert result.call.arguments == expected


class Opaque:
    pass


def _cycle_list() -> dict[str, Any]:
    items: list[Any] = []
    items.append(items)
    return {"x": items}


def _cycle_dict() -> dict[str, Any]:
    inner: dict[str, Any] = {}
    inner["self"] = inner
    return {"x": inner}


def _nested(levels: int) -> dict[str, Any]:
    """Arguments with `levels` containers in all, the top-level mapping included."""
    value: Any = 1
    for _ in range(levels - 1):
        value = [value]
    return {"x": value}


@pytest.mark.parametrize(
    "arguments",
    [
        {"x": {1, 2}},
        {"x": Opaque()},
        {"x": math.nan},
        {"x": math.inf},
        {"x": [1, -math.inf]},
        {1: "non-str key"},
        {"x": {(1, 2): "tuple key"}},
        {"x": b"bytes"},
        _cycle_list(),
        _cycle_dict(),
        _nested(65),
        _nested(10_000),
        ["not", "a", "mapping"],
        "not a mapping",
    ],
    ids=[
        "set",
        "object",
        "nan",
        "inf",
        "nested-inf",
        "int-key",
        "tuple-key",
        "bytes",
        "list-cycle",
        "dict-cycle",
        "depth-65",
        "depth-10000",
        "list",
        "str",
    ],
)
def test_non_json_arguments_are_invalid_args_before_any_hook(
    registry: ToolRegistry, observed: Observed, arguments: Any
) -> None:
    journal = Journal()
    starts = counting_tool(registry)
    registry.add_pre_execute(lambda call, token: journal("pre"))
    registry.add_post_execute(lambda result, token: journal("post"))
    registry.add_around(lambda dispatch, proceed: journal("around") or proceed())
    result = registry.execute(ToolCall("work", arguments))
    assert result.code == ErrorCode.INVALID_ARGS
    assert result.call.arguments is None
    assert not result.dispatched
    assert result.content.startswith("Error: arguments")
    assert journal.entries == []
    assert starts == []
    assert observed.results == [result]


def test_invalid_argument_message_locates_the_bad_value(registry: ToolRegistry) -> None:
    counting_tool(registry)
    result = registry.execute("work", {"a": [1, {"b": {3}}]})
    assert result.error is not None
    assert "['a'][1]['b']" in result.error.message
    assert "set" in result.error.message


def test_sixty_four_levels_of_nesting_are_accepted(registry: ToolRegistry) -> None:
    registry.tool(name="echo")(lambda args, ctx: "ok")
    assert registry.execute("echo", _nested(64)).ok
    assert registry.execute("echo", _nested(65)).code == ErrorCode.INVALID_ARGS


def test_tuples_and_mappings_are_accepted_as_json_arrays_and_objects(
    registry: ToolRegistry,
) -> None:
    registry.register(Tool("echo", echo))
    result = registry.execute("echo", {"t": (1, 2), "m": FrozenDict({"k": True}), "f": 1.5})
    assert result.ok
    assert result.value == {"t": (1, 2), "m": {"k": True}, "f": 1.5}


def test_invalid_arguments_win_over_an_unknown_name(registry: ToolRegistry) -> None:
    assert registry.execute("nope", {"x": {1}}).code == ErrorCode.INVALID_ARGS


def test_unknown_tool_is_reported_with_its_name_and_no_hook_runs(
    registry: ToolRegistry, observed: Observed
) -> None:
    journal = Journal()
    registry.add_pre_execute(lambda call, token: journal("pre"))
    registry.add_post_execute(lambda result, token: journal("post"))
    result = registry.execute("nope", {"x": 1})
    assert result.code == ErrorCode.UNKNOWN_TOOL
    assert "'nope'" in result.content
    assert result.call.arguments == {"x": 1}
    assert journal.entries == []
    assert observed.results == [result]


def test_schema_violation_is_invalid_args_with_the_validators_message(
    registry: ToolRegistry, observed: Observed
) -> None:
    journal = Journal()
    registry.register(Tool("search", echo, parameters=SEARCH_SCHEMA))
    registry.add_pre_execute(lambda call, token: journal("pre"))
    registry.add_post_execute(lambda result, token: journal("post"))
    bad = {"q": 3}
    with pytest.raises(fastjsonschema.JsonSchemaException) as expected:
        fastjsonschema.compile(SEARCH_SCHEMA)(bad)
    result = registry.execute("search", bad)
    assert result.code == ErrorCode.INVALID_ARGS
    assert result.error is not None
    assert result.error.message == expected.value.message
    assert result.content == f"Error: {expected.value.message}"
    assert journal.entries == []
    assert observed.results == [result]
    assert registry.execute("search", {"limit": 3}).code == ErrorCode.INVALID_ARGS  # required


def test_schema_with_arrays_validates_arguments_given_as_tuples(registry: ToolRegistry) -> None:
    schema = {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 2,
                "uniqueItems": True,
            },
            "pairs": {"type": "array", "items": {"type": "array", "maxItems": 2}},
            "exact": {"const": [1, [2]]},
        },
    }
    registry.register(Tool("tag", echo, parameters=schema))
    ok = registry.execute("tag", {"tags": ("a", "b"), "pairs": ((1, 2), [3]), "exact": (1, (2,))})
    assert ok.ok, ok.content
    assert registry.execute("tag", {"tags": ("a",)}).code == ErrorCode.INVALID_ARGS
    assert registry.execute("tag", {"tags": ("a", "a")}).code == ErrorCode.INVALID_ARGS
    assert registry.execute("tag", {"pairs": ((1, 2, 3),)}).code == ErrorCode.INVALID_ARGS


def test_schema_is_compiled_once_at_registration(
    registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled: list[Any] = []
    real_compile = fastjsonschema.compile

    def counting_compile(*args: Any, **kwargs: Any) -> Any:
        compiled.append(args[0])
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(fastjsonschema, "compile", counting_compile)
    registry.register(Tool("search", echo, parameters=SEARCH_SCHEMA))
    assert len(compiled) == 1
    for n in range(5):
        assert registry.execute("search", {"q": str(n)}).ok
    assert registry.execute("search", {"q": 1}).code == ErrorCode.INVALID_ARGS
    assert len(compiled) == 1


def test_schema_defaults_are_not_written_into_the_arguments(registry: ToolRegistry) -> None:
    schema = {"type": "object", "properties": {"limit": {"type": "integer", "default": 10}}}
    registry.register(Tool("search", echo, parameters=schema))
    result = registry.execute("search", {})
    assert result.ok, result.content
    assert result.value == {}


def test_tool_call_fills_in_arguments_and_a_fresh_id_and_never_raises() -> None:
    first, second = ToolCall("a"), ToolCall("a")
    assert first.arguments == {}
    assert first.call_id and second.call_id and first.call_id != second.call_id
    assert ToolCall("a", None, call_id="mine").call_id == "mine"
    assert ToolCall("a", {"x": {1, 2}}).arguments == {"x": {1, 2}}  # checked by execute
    assert ToolCall("a", "junk").arguments == "junk"  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.name = "b"  # type: ignore[misc]


def test_result_call_keeps_the_call_id_and_holds_the_frozen_copy(registry: ToolRegistry) -> None:
    registry.register(Tool("echo", echo))
    call = ToolCall("echo", {"x": [1]}, call_id="abc")
    result = registry.execute(call)
    assert result.call.call_id == "abc"
    assert result.call.name == "echo"
    assert type(result.call.arguments) is FrozenDict
    assert result.call.arguments == {"x": (1,)}
    assert call.arguments == {"x": [1]}  # the caller's call is untouched


@pytest.mark.parametrize(
    ("invoke", "match"),
    [
        (lambda r: r.execute(42), "ToolCall or a tool name"),
        (lambda r: r.execute(ToolCall("echo"), {"x": 1}), "inside the ToolCall"),
        (lambda r: r.execute("echo", token=CancelSource()), "source.token"),
        (lambda r: r.execute("echo", token="soon"), "CancelToken"),
    ],
    ids=["not-a-call", "arguments-beside-call", "source-not-token", "str-token"],
)
def test_misuse_of_execute_raises_type_error(
    registry: ToolRegistry, invoke: Callable[[ToolRegistry], Any], match: str
) -> None:
    registry.register(Tool("echo", echo))
    with pytest.raises(TypeError, match=match):
        invoke(registry)


# == results and content ======================================================================


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


def _wrapper_made(registry: ToolRegistry) -> ToolResult[Any]:
    def fake(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        made = ToolResult.success(ToolCall("forged", {"f": 1}), "cached")
        return dataclasses.replace(made, dispatched=True, duration=-1.0)

    registry.add_around(fake)
    return registry.execute("work", {"x": 1})


def _post_made(registry: ToolRegistry) -> ToolResult[Any]:
    def forge(result: ToolResult[Any], token: CancelToken) -> ToolResult[Any]:
        failed = ToolResult.failure(ToolCall("forged"), "TOOL_ERROR", "post says no")
        return dataclasses.replace(failed, dispatched=False, duration=1e9)

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
    if result.code != ErrorCode.UNKNOWN_TOOL:
        assert result.call.name == "work"
        assert result.call.arguments == {"x": 1}


def test_duration_covers_entry_to_result(registry: ToolRegistry) -> None:
    @registry.tool
    def slow(args: Args, ctx: ToolContext) -> str:
        threading.Event().wait(0.05)  # simulated work, not ordering
        return "done"

    assert registry.execute("slow").duration >= 0.05


# == hooks ====================================================================================


def _registrations(registry: ToolRegistry, journal: Journal) -> dict[str, Registration]:
    return {
        "pre": registry.add_pre_execute(lambda call, token: journal("pre") or Ask("?")),
        "approver": registry.set_approver(lambda call, reason, token: journal("approver") or True),
        "guard": registry.add_guard(lambda call: journal("guard")),
        "around": registry.add_around(lambda dispatch, proceed: journal("around") or proceed()),
        "post": registry.add_post_execute(lambda result, token: journal("post")),
        "observer": registry.on_result(lambda result: journal("observer")),
    }


def test_every_hook_runs_once_in_stage_order(registry: ToolRegistry) -> None:
    journal = Journal()
    registry.tool(name="work")(lambda args, ctx: journal("body") or "ok")
    _registrations(registry, journal)
    assert registry.execute("work").ok
    assert journal.entries == ["pre", "approver", "guard", "around", "body", "post", "observer"]


@pytest.mark.parametrize("kind", ["pre", "approver", "guard", "around", "post", "observer"])
def test_each_registration_removes_its_hook_once(registry: ToolRegistry, kind: str) -> None:
    journal = Journal()
    counting_tool(registry)
    registrations = _registrations(registry, journal)
    assert all(isinstance(r, Registration) for r in registrations.values())
    assert registrations[kind].remove() is True
    assert registrations[kind].remove() is False
    result = registry.execute("work")
    everything = ["pre", "approver", "guard", "around", "post", "observer"]
    if kind == "pre":  # nobody asks: the approver is not consulted
        assert journal.entries == ["guard", "around", "post", "observer"]
    elif kind == "approver":  # an Ask without an approver is a denial
        assert journal.entries == ["pre", "post", "observer"]
        assert result.code == ErrorCode.DENIED
    else:
        assert journal.entries == [entry for entry in everything if entry != kind]


def test_hooks_registered_during_a_call_serve_only_later_calls(registry: ToolRegistry) -> None:
    journal = Journal()
    counting_tool(registry)
    late: list[Registration] = []

    def first(call: ToolCall, token: CancelToken) -> None:
        journal(("first", call.call_id))
        if not late:
            late.append(registry.add_pre_execute(lambda c, t: journal(("late-pre", c.call_id))))
            late.append(
                registry.add_around(lambda d, p: journal(("late-around", d.call.call_id)) or p())
            )
            late.append(
                registry.add_post_execute(lambda r, t: journal(("late-post", r.call.call_id)))
            )
            late.append(registry.on_result(lambda r: journal(("late-observer", r.call.call_id))))
            late.append(registry.add_guard(lambda c: journal(("late-guard", c.call_id))))

    registry.add_pre_execute(first)
    one = registry.execute(ToolCall("work", call_id="one"))
    assert journal.entries == [("first", "one")]
    registry.execute(ToolCall("work", call_id="two"))
    assert journal.entries[1:] == [
        ("first", "two"),
        ("late-pre", "two"),
        ("late-guard", "two"),
        ("late-around", "two"),
        ("late-post", "two"),
        ("late-observer", "two"),
    ]
    assert one.ok


def test_hooks_removed_during_a_call_still_serve_that_call(registry: ToolRegistry) -> None:
    journal = Journal()
    counting_tool(registry)
    registrations: dict[str, Registration] = {}

    def remover(call: ToolCall, token: CancelToken) -> None:
        for registration in registrations.values():
            registration.remove()

    registry.add_pre_execute(remover)
    registrations["post"] = registry.add_post_execute(lambda r, t: journal("post"))
    registrations["observer"] = registry.on_result(lambda r: journal("observer"))
    registry.execute("work")
    assert journal.entries == ["post", "observer"]
    registry.execute("work")
    assert journal.entries == ["post", "observer"]


def test_hook_lists_can_change_while_calls_are_in_flight(registry: ToolRegistry) -> None:
    counting_tool(registry)
    stop = threading.Event()

    def churn() -> int:
        rounds = 0
        while not (rounds and stop.is_set()):  # at least one round, however late it starts
            registrations = [
                registry.add_pre_execute(lambda call, token: None),
                registry.add_around(lambda dispatch, proceed: proceed()),
                registry.add_post_execute(lambda result, token: None),
                registry.on_result(lambda result: None),
                registry.add_guard(lambda call: None),
            ]
            for registration in reversed(registrations):
                assert registration.remove() is True
            rounds += 1
        return rounds

    churner = Caller(churn, name="hook-churn")
    try:
        results = [registry.execute("work") for _ in range(300)]
    finally:
        stop.set()
    assert churner.join() > 0
    assert all(result.ok for result in results)


def test_wrappers_nest_in_registration_order_first_outermost(registry: ToolRegistry) -> None:
    journal = Journal()
    registry.tool(name="work")(lambda args, ctx: journal("body") or "ok")

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


PRE_MALFORMED = ["yes", True, 1, Deny, {"allow": True}]
GUARD_MALFORMED = [42, True, b"no", ["no"]]
WRAPPER_MALFORMED = [None, "ok", {"ok": True}, 0]
POST_MALFORMED = ["x", True, {"ok": False}, 0]


def _malformed_cases() -> list[Any]:
    cases: list[Any] = []
    for value in PRE_MALFORMED:
        cases.append(pytest.param("pre", value, id=f"pre-{value!r}"))
    for value in GUARD_MALFORMED:
        cases.append(pytest.param("guard", value, id=f"guard-{value!r}"))
    for value in WRAPPER_MALFORMED:
        cases.append(pytest.param("around", value, id=f"around-{value!r}"))
    for value in POST_MALFORMED:
        cases.append(pytest.param("post", value, id=f"post-{value!r}"))
    return cases


@pytest.mark.parametrize(("kind", "value"), _malformed_cases())
def test_malformed_hook_return_fails_closed_with_hook_error(
    registry: ToolRegistry, observed: Observed, kind: str, value: Any
) -> None:
    journal = Journal()
    counting_tool(registry)
    if kind == "pre":
        registry.add_pre_execute(lambda call, token: value)
    elif kind == "guard":
        registry.add_guard(lambda call: value)
    elif kind == "around":
        registry.add_around(lambda dispatch, proceed: value)
    else:
        registry.add_post_execute(lambda result, token: value)
    registry.add_post_execute(lambda result, token: journal(("post", result.code)))
    result = registry.execute("work")
    assert result.code == ErrorCode.HOOK_ERROR
    assert type(value).__name__ in result.error.message  # type: ignore[union-attr]
    assert journal.entries == []  # a registry-made HOOK_ERROR skips the (later) post hooks
    assert observed.results == [result]


@pytest.mark.parametrize("kind", ["pre", "guard", "around", "post"])
def test_hook_exception_becomes_hook_error_with_the_exception(
    registry: ToolRegistry, observed: Observed, kind: str
) -> None:
    boom = LookupError("hook broke")

    def fail(*args: Any) -> Any:
        raise boom

    counting_tool(registry)
    {
        "pre": registry.add_pre_execute,
        "guard": registry.add_guard,
        "around": registry.add_around,
        "post": registry.add_post_execute,
    }[kind](fail)
    result = registry.execute("work")
    assert result.code == ErrorCode.HOOK_ERROR
    assert result.error.exception is boom  # type: ignore[union-attr]
    assert "hook broke" in result.content
    assert observed.results == [result]


@pytest.mark.parametrize("kind", ["pre", "guard", "around", "post"])
def test_hook_raising_cancelled_while_the_token_is_live_is_a_hook_error(
    registry: ToolRegistry, kind: str
) -> None:
    def fail(*args: Any) -> Any:
        raise Cancelled("not ours")

    counting_tool(registry)
    {
        "pre": registry.add_pre_execute,
        "guard": registry.add_guard,
        "around": registry.add_around,
        "post": registry.add_post_execute,
    }[kind](fail)
    assert registry.execute("work", token=CancelSource().token).code == ErrorCode.HOOK_ERROR


@pytest.mark.parametrize(
    ("kind", "code"),
    [("pre", BEFORE), ("guard", BEFORE), ("around", BEFORE), ("post", ABORTED)],
)
def test_hook_raising_cancelled_once_the_call_is_cancelled_is_cancellation(
    registry: ToolRegistry, kind: str, code: ErrorCode
) -> None:
    caller = CancelSource()

    def give_up(*args: Any) -> Any:
        caller.cancel("stop")
        raise Cancelled("stop")

    counting_tool(registry)
    {
        "pre": registry.add_pre_execute,
        "guard": registry.add_guard,
        "around": registry.add_around,
        "post": registry.add_post_execute,
    }[kind](give_up)
    assert registry.execute("work", token=caller.token).code == code


@pytest.mark.parametrize("answer", [False, None, 1, "yes", [True], Allow()])
def test_approver_answer_other_than_true_denies(registry: ToolRegistry, answer: Any) -> None:
    starts = counting_tool(registry)
    registry.add_pre_execute(lambda call, token: Ask("delete everything?"))
    registry.set_approver(lambda call, reason, token: answer)
    result = registry.execute("work")
    assert result.code == ErrorCode.DENIED
    assert result.error.message == "delete everything?"  # type: ignore[union-attr]
    assert starts == []


def test_approver_exception_denies(registry: ToolRegistry) -> None:
    starts = counting_tool(registry)
    registry.add_pre_execute(lambda call, token: Ask("confirm?"))

    def broken(call: ToolCall, reason: str, token: CancelToken) -> bool:
        raise OSError("approval service down")

    registry.set_approver(broken)
    assert registry.execute("work").code == ErrorCode.DENIED
    assert starts == []


def test_ask_without_an_approver_is_denied_with_its_reason(registry: ToolRegistry) -> None:
    starts = counting_tool(registry)
    registry.add_pre_execute(lambda call, token: Ask("needs a human"))
    result = registry.execute("work")
    assert result.code == ErrorCode.DENIED
    assert result.content == "Error: needs a human"
    assert starts == []


def test_approver_is_called_once_with_the_first_asks_reason(registry: ToolRegistry) -> None:
    counting_tool(registry)
    calls: list[tuple[str, str, CancelToken]] = []
    hook_tokens: list[CancelToken] = []
    registry.add_pre_execute(lambda call, token: hook_tokens.append(token) or Ask("first"))
    registry.add_pre_execute(lambda call, token: Allow())
    registry.add_pre_execute(lambda call, token: Ask("second"))
    registry.set_approver(
        lambda call, reason, token: calls.append((call.name, reason, token)) or True
    )
    assert registry.execute("work").ok
    assert [(name, reason) for name, reason, _ in calls] == [("work", "first")]
    assert calls[0][2] is hook_tokens[0]  # the call's token


def test_first_deny_stops_the_stage_and_skips_the_approver(registry: ToolRegistry) -> None:
    journal = Journal()
    starts = counting_tool(registry)
    registry.add_pre_execute(lambda call, token: journal("ask") or Ask("?"))
    registry.add_pre_execute(lambda call, token: journal("deny") or Deny("policy"))
    registry.add_pre_execute(lambda call, token: journal("never"))
    registry.set_approver(lambda call, reason, token: journal("approver") or True)
    registry.add_guard(lambda call: journal("guard"))
    result = registry.execute("work")
    assert result.code == ErrorCode.DENIED
    assert result.content == "Error: policy"
    assert journal.entries == ["ask", "deny"]
    assert starts == []


def test_set_approver_replaces_the_previous_one(registry: ToolRegistry) -> None:
    journal = Journal()
    counting_tool(registry)
    registry.add_pre_execute(lambda call, token: Ask("?"))
    first = registry.set_approver(lambda call, reason, token: journal("first") or False)
    second = registry.set_approver(lambda call, reason, token: journal("second") or True)
    assert registry.execute("work").ok
    assert journal.entries == ["second"]
    assert first.remove() is False  # it was replaced already: nothing to remove
    assert registry.execute("work").ok  # ... and removing it did not remove the second
    assert second.remove() is True
    assert registry.execute("work").code == ErrorCode.DENIED


def test_guard_string_denies_with_that_reason(registry: ToolRegistry) -> None:
    starts = counting_tool(registry)
    registry.add_guard(lambda call: None)
    registry.add_guard(lambda call: f"{call.name} is off limits")
    result = registry.execute("work")
    assert result.code == ErrorCode.DENIED
    assert result.content == "Error: work is off limits"
    assert starts == []


@pytest.mark.parametrize("denial", ["pre", "guard", "approver"])
def test_post_hook_cannot_turn_a_denial_into_success(registry: ToolRegistry, denial: str) -> None:
    counting_tool(registry)
    if denial == "pre":
        registry.add_pre_execute(lambda call, token: Deny("no"))
    elif denial == "guard":
        registry.add_guard(lambda call: "no")
    else:
        registry.add_pre_execute(lambda call, token: Ask("?"))
        registry.set_approver(lambda call, reason, token: False)
    seen: list[ErrorCode | None] = []

    def launder(result: ToolResult[Any], token: CancelToken) -> ToolResult[Any]:
        seen.append(result.code)
        return ToolResult.success(result.call, "allowed after all")

    registry.add_post_execute(launder)
    result = registry.execute("work")
    assert seen == [ErrorCode.DENIED]
    assert result.code == ErrorCode.HOOK_ERROR
    assert not result.dispatched


def test_post_hook_cannot_turn_a_tool_error_into_success(registry: ToolRegistry) -> None:
    registry.tool(name="fail")(lambda args, ctx: 1 / 0)
    registry.add_post_execute(lambda result, token: ToolResult.success(result.call, "fine"))
    assert registry.execute("fail").code == ErrorCode.HOOK_ERROR


def test_post_hook_may_turn_a_success_into_a_failure_and_none_keeps_it(
    registry: ToolRegistry,
) -> None:
    registry.register(Tool("echo", echo))
    seen: list[Any] = []
    registry.add_post_execute(lambda result, token: seen.append(result.value))
    registry.add_post_execute(
        lambda result, token: (
            ToolResult.failure(result.call, "TOOL_ERROR", "output rejected")
            if result.value.get("secret")
            else None
        )
    )
    registry.add_post_execute(lambda result, token: seen.append(result.code))
    assert registry.execute("echo", {"secret": False}).ok
    rejected = registry.execute("echo", {"secret": True})
    assert rejected.code == ErrorCode.TOOL_ERROR
    assert rejected.content == "Error: output rejected"
    assert seen == [{"secret": False}, None, {"secret": True}, ErrorCode.TOOL_ERROR]


def test_post_hook_may_replace_a_success_with_another_success(registry: ToolRegistry) -> None:
    registry.register(Tool("echo", echo))
    registry.add_post_execute(
        lambda result, token: ToolResult.success(result.call, {"redacted": True})
    )
    result = registry.execute("echo", {"password": "hunter2"})
    assert result.ok
    assert result.value == {"redacted": True}
    assert result.dispatched


def _success(registry: ToolRegistry) -> ToolResult[Any]:
    return registry.execute("work")


def _tool_error(registry: ToolRegistry) -> ToolResult[Any]:
    return registry.execute("fail")


def _denied(registry: ToolRegistry) -> ToolResult[Any]:
    registry.add_guard(lambda call: "no")
    return registry.execute("work")


def _aborted_in_pre_hook(registry: ToolRegistry) -> ToolResult[Any]:
    caller = CancelSource()
    registry.add_pre_execute(lambda call, token: caller.cancel() and None)
    return registry.execute("work", token=caller.token)


def _invalid_args(registry: ToolRegistry) -> ToolResult[Any]:
    return registry.execute("work", {"x": {1}})


def _unknown(registry: ToolRegistry) -> ToolResult[Any]:
    return registry.execute("nope")


def _schema_violation(registry: ToolRegistry) -> ToolResult[Any]:
    return registry.execute("typed", {"n": "one"})


def _hook_error(registry: ToolRegistry) -> ToolResult[Any]:
    registry.add_guard(lambda call: 1 / 0)
    return registry.execute("work")


def _model_driven_abort(registry: ToolRegistry) -> ToolResult[Any]:
    caller = CancelSource()
    caller.cancel()
    return registry.execute("work", token=caller.token, start_if_cancelled=False)


@pytest.mark.parametrize(
    ("scenario", "code", "post_sees_it"),
    [
        (_success, None, True),
        (_tool_error, ErrorCode.TOOL_ERROR, True),
        (_denied, ErrorCode.DENIED, True),
        (_aborted_in_pre_hook, BEFORE, True),
        (_invalid_args, ErrorCode.INVALID_ARGS, False),
        (_unknown, ErrorCode.UNKNOWN_TOOL, False),
        (_schema_violation, ErrorCode.INVALID_ARGS, False),
        (_hook_error, ErrorCode.HOOK_ERROR, False),
        (_model_driven_abort, BEFORE, False),
    ],
)
def test_post_hooks_see_outcomes_denials_and_aborts_but_not_entry_or_registry_errors(
    registry: ToolRegistry,
    observed: Observed,
    scenario: Callable[[ToolRegistry], ToolResult[Any]],
    code: ErrorCode | None,
    post_sees_it: bool,
) -> None:
    counting_tool(registry)
    registry.tool(name="fail")(lambda args, ctx: 1 / 0)
    registry.register(
        Tool("typed", echo, parameters={"type": "object", "properties": {"n": {"type": "integer"}}})
    )
    post_saw: list[ErrorCode | None] = []
    registry.add_post_execute(lambda result, token: post_saw.append(result.code))
    result = scenario(registry)
    assert result.code == code
    assert post_saw == ([code] if post_sees_it else [])
    assert observed.results == [result]


def test_observers_see_the_returned_frozen_result_exactly_once(registry: ToolRegistry) -> None:
    counting_tool(registry)
    first, second = Observed(), Observed()
    registry.on_result(first)
    registry.on_result(second)
    results = [registry.execute("work"), registry.execute("nope"), registry.execute("work")]
    assert len(first.results) == len(second.results) == 3
    for returned, one, two in zip(results, first.results, second.results, strict=True):
        assert returned is one
        assert returned is two
        with pytest.raises(dataclasses.FrozenInstanceError):
            one.content = "changed"  # type: ignore[misc]


def test_observer_exceptions_are_logged_not_raised(
    registry: ToolRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    counting_tool(registry)
    after = Observed()

    def broken(result: ToolResult[Any]) -> None:
        raise RuntimeError("observer broke")

    registry.on_result(broken)
    registry.on_result(after)
    with caplog.at_level(logging.ERROR, logger="toolreg"):
        ok = registry.execute("work")
        unknown = registry.execute("nope")
    assert ok.ok
    assert unknown.code == ErrorCode.UNKNOWN_TOOL
    assert after.results == [ok, unknown]
    logged = [r for r in caplog.records if r.name == "toolreg" and r.exc_info]
    assert len(logged) == 2
    assert all("observer broke" in str(r.exc_info[1]) for r in logged)  # type: ignore[index]


def test_hooks_are_checked_callable_at_registration(registry: ToolRegistry) -> None:
    for add in (
        registry.add_pre_execute,
        registry.add_guard,
        registry.add_around,
        registry.add_post_execute,
        registry.on_result,
        registry.set_approver,
    ):
        with pytest.raises(TypeError, match="callable"):
            add("not callable")  # type: ignore[arg-type]


# == threads, executors and nested calls ======================================================


def test_body_runs_on_a_pool_thread_named_toolreg_and_the_caller_joins(
    registry: ToolRegistry,
) -> None:
    threads: list[threading.Thread] = []
    registry.tool(name="where")(lambda args, ctx: threads.append(threading.current_thread()))
    registry.add_pre_execute(lambda call, token: threads.append(threading.current_thread()))
    registry.execute("where")
    caller_thread, body_thread = threads
    assert caller_thread is threading.current_thread()
    assert body_thread is not caller_thread
    assert body_thread.name.startswith("toolreg")


def test_thread_name_prefix_names_the_pool_threads() -> None:
    with open_registry(max_workers=1, thread_name_prefix="my-tools") as registry:
        registry.tool(name="where")(lambda args, ctx: threading.current_thread().name)
        assert registry.execute("where").value.startswith("my-tools")


def test_given_thread_pool_runs_the_bodies_and_survives_close() -> None:
    pool = ThreadPoolExecutor(2, thread_name_prefix="given-pool")
    try:
        with ToolRegistry(executor=pool) as registry:
            registry.tool(name="where")(lambda args, ctx: threading.current_thread().name)
            assert registry.execute("where").value.startswith("given-pool")
        assert registry.closed
        assert pool.submit(lambda: "still open").result(WAIT) == "still open"
    finally:
        pool.shutdown(wait=True)


class InlineExecutor(Executor):
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def test_process_pool_and_other_non_thread_executors_are_rejected_with_type_error() -> None:
    processes = ProcessPoolExecutor(max_workers=1)
    try:
        with pytest.raises(TypeError, match="ThreadPoolExecutor"):
            ToolRegistry(executor=processes)
    finally:
        processes.shutdown(wait=True)
    with pytest.raises(TypeError):
        ToolRegistry(executor=InlineExecutor())


class RecordingPool(ThreadPoolExecutor):
    """Hands the registry futures that record `cancel()` and report 'done' at once."""

    def __init__(self) -> None:
        super().__init__(1, thread_name_prefix="recording-pool")
        self.cancel_calls = 0
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        super().submit(fn, *args, **kwargs)
        self.submitted += 1
        pool = self

        class LyingFuture(Future):  # type: ignore[type-arg]
            def cancel(self) -> bool:
                pool.cancel_calls += 1
                return super().cancel()

        lie: Future[Any] = LyingFuture()
        lie.set_result(None)  # claims the work finished before it even started
        return lie


def test_joining_waits_for_the_body_never_for_the_future_and_never_cancels_it() -> None:
    pool = RecordingPool()
    gate = Gate()
    try:
        with ToolRegistry(executor=pool) as registry:

            @registry.tool
            def slow(args: Args, ctx: ToolContext) -> str:
                gate.hold()
                return "done"

            blocker = Caller(lambda: registry.execute("slow"))
            gate.wait_reached()
            caller = CancelSource()
            queued = Caller(lambda: registry.execute("slow", token=caller.token))
            wait_until(lambda: pool.submitted == 2, "the second body to be queued")
            assert blocker.still_blocked()  # its future says done; the body is not
            caller.cancel("stop")
            assert queued.join().code == BEFORE
            gate.release()
            assert blocker.join().ok
        assert pool.cancel_calls == 0
    finally:
        pool.shutdown(wait=True)


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
    with pytest.raises(RuntimeError):
        kept[0].defer_context("late")
    with pytest.raises(RuntimeError):
        kept[0].execute("work")


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


# == close() ==================================================================================


def test_context_manager_closes_and_close_is_idempotent() -> None:
    with ToolRegistry(max_workers=1) as registry:
        counting_tool(registry)
        assert registry.execute("work").ok
        assert not registry.closed
    assert registry.closed
    registry.close()
    assert registry.closed
    with pytest.raises(RuntimeError, match="closed"):
        registry.execute(ToolCall("work"))


def test_new_calls_are_refused_while_close_waits_for_in_flight_ones() -> None:
    registry = ToolRegistry(max_workers=2)
    gate = Gate()
    cancelled = threading.Event()

    @registry.tool
    def stubborn(args: Args, ctx: ToolContext) -> str:
        ctx.token.on_cancel(cancelled.set)
        gate.hold()
        return "late"

    call = Caller(lambda: registry.execute("stubborn"))
    gate.wait_reached()
    closer = Caller(registry.close)
    assert cancelled.wait(WAIT)  # close() has begun
    with pytest.raises(RuntimeError, match="closed"):
        registry.execute("stubborn")
    gate.release()
    closer.join()
    assert call.join().code == ABORTED


def test_ctrl_c_in_close_cancels_waits_for_the_calls_then_reraises() -> None:
    # Like an interrupted execute: the calls are cancelled already, so close() keeps waiting
    # for them (never abandoning a body), finishes, and only then re-raises.
    registry = ToolRegistry(max_workers=1, thread_name_prefix="interrupted-close")
    gate = Gate()
    registry.tool(name="slow")(lambda args, ctx: gate.hold() or "late")
    call = Caller(lambda: registry.execute("slow"))
    gate.wait_reached()
    with default_sigint():
        presser = send_ctrl_c_when(gate.reached)  # close() blocks waiting for the body
        releaser = Caller(lambda: (presser.join(), gate.release()))
        with pytest.raises(KeyboardInterrupt):
            registry.close()
        releaser.join()
    assert call.join().code == ABORTED
    assert registry.closed
    registry.close()  # idempotent
    leaked = [t for t in threading.enumerate() if t.name.startswith("interrupted-close")]
    assert leaked == []


def test_close_leaves_the_callers_token_alone(registry: ToolRegistry) -> None:
    gate = Gate()
    registry.add_pre_execute(lambda call, token: gate.hold())
    counting_tool(registry)
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    closer = Caller(registry.close)
    wait_until(lambda: registry.in_flight()[0].cancelled, "close() to cancel the call")
    gate.release()
    closer.join()
    assert call.join().code == BEFORE
    assert not caller.token.cancelled
    assert holds_nothing(caller.token)


# == in_flight() and overdue diagnostics ======================================================


def test_in_flight_snapshots_each_held_call_with_its_stage() -> None:
    with open_registry(max_workers=2) as registry:
        gates = {stage: Gate() for stage in ("pre_execute", "approval", "guards", "around", "body")}

        def pre(call: ToolCall, token: CancelToken) -> Ask | None:
            if call.call_id == "pre_execute":
                gates["pre_execute"].hold()
            return Ask("?") if call.call_id == "approval" else None

        def approver(call: ToolCall, reason: str, token: CancelToken) -> bool:
            gates["approval"].hold()
            return True

        def guard(call: ToolCall) -> None:
            if call.call_id == "guards":
                gates["guards"].hold()

        def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
            if dispatch.call.call_id == "around":
                gates["around"].hold()
            return proceed()

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            if ctx.call.call_id == "body":
                gates["body"].hold()
            return "ok"

        registry.add_pre_execute(pre)
        registry.set_approver(approver)
        registry.add_guard(guard)
        registry.add_around(wrapper)
        assert registry.in_flight() == []
        callers = []
        for stage, gate in gates.items():
            callers.append(
                Caller(
                    lambda stage=stage: registry.execute(  # type: ignore[misc]
                        ToolCall("work", call_id=stage)
                    )
                )
            )
            gate.wait_reached()
        snapshot = registry.in_flight()
        assert [(c.call.call_id, c.stage) for c in snapshot] == [(s, s) for s in gates]
        assert [c.started for c in snapshot] == sorted(c.started for c in snapshot)
        assert not any(c.cancelled for c in snapshot)
        assert all(c.cancelled_at is None for c in snapshot)
        for gate in gates.values():
            gate.release()
        assert all(c.join().ok for c in callers)
        assert registry.in_flight() == []


def test_in_flight_reports_a_running_body_as_dispatched(registry: ToolRegistry) -> None:
    gate = Gate()

    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        gate.hold()
        return "ok"

    call = Caller(lambda: registry.execute("work"))
    gate.wait_reached()
    try:
        (entry,) = registry.in_flight()
        assert entry.stage == "body"
        assert entry.dispatched
    finally:
        gate.release()
        call.join()


def test_in_flight_records_when_a_call_was_cancelled_in_a_hook(registry: ToolRegistry) -> None:
    gate = Gate()
    counting_tool(registry)
    registry.add_pre_execute(lambda call, token: gate.hold())
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    caller.cancel("stop")
    try:
        (entry,) = registry.in_flight()
        assert entry.cancelled
        assert entry.cancelled_at is not None
    finally:
        gate.release()
        assert call.join().code == BEFORE


def test_in_flight_records_when_a_running_body_was_cancelled(registry: ToolRegistry) -> None:
    gate = Gate()

    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        gate.hold()
        return "ok"

    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    caller.cancel("stop")
    (entry,) = registry.in_flight()
    assert entry.cancelled
    assert entry.cancelled_at is not None
    assert entry.cancelled_at >= entry.started
    gate.release()
    assert call.join().code == ABORTED


def test_uncooperative_body_logs_exactly_one_overdue_warning_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="toolreg")
    with open_registry(max_workers=1, overdue_after=0.05) as registry:
        release = threading.Event()
        started = threading.Event()

        @registry.tool
        def stubborn(args: Args, ctx: ToolContext) -> str:
            started.set()
            release.wait(WAIT)  # ignores ctx.token until the test saw the warning
            return "late"

        def overdue() -> list[logging.LogRecord]:
            return [
                r for r in caplog.records if r.name == "toolreg" and r.levelno == logging.WARNING
            ]

        caller = CancelSource()
        call = Caller(
            lambda: registry.execute(ToolCall("stubborn", call_id="call-42"), token=caller.token)
        )
        assert started.wait(WAIT)
        caller.cancel("stop")
        wait_until(lambda: bool(overdue()), "the overdue warning")
        assert call.still_blocked()
        release.set()
        assert call.join().code == ABORTED
    warnings = overdue()
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "stubborn" in message
    assert "call-42" in message


def test_body_that_settles_promptly_after_cancel_logs_no_overdue_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="toolreg")
    with open_registry(max_workers=1, overdue_after=2.0) as registry:
        started = threading.Event()

        @registry.tool
        def polite(args: Args, ctx: ToolContext) -> str:
            started.set()
            ctx.token.wait(WAIT)
            return "stopped"

        caller = CancelSource()
        call = Caller(lambda: registry.execute("polite", token=caller.token))
        assert started.wait(WAIT)
        caller.cancel("stop")
        assert call.join().code == ABORTED
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_pre_aborted_uncooperative_body_also_gets_the_overdue_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="toolreg")
    with open_registry(max_workers=1, overdue_after=0.05) as registry:
        release = threading.Event()

        @registry.tool
        def stubborn(args: Args, ctx: ToolContext) -> str:
            release.wait(WAIT)  # ignores its (already cancelled) token
            return "late"

        def warned() -> bool:
            return any(
                r.levelno == logging.WARNING and "stubborn" in r.getMessage()
                for r in caplog.records
            )

        caller = CancelSource()
        caller.cancel("before the call")
        call = Caller(lambda: registry.execute("stubborn", token=caller.token))
        try:
            wait_until(warned, "the overdue warning")
        finally:
            release.set()
            call.join()


@pytest.mark.parametrize("value", [0, -1.0, math.nan])
def test_overdue_after_must_be_positive(value: float) -> None:
    with pytest.raises(ValueError, match="overdue_after"):
        ToolRegistry(max_workers=1, overdue_after=value)


# == Ctrl-C ===================================================================================


class CtrlCScene:
    """One registry where a KeyboardInterrupt lands at a chosen spot of a call."""

    def __init__(self, registry: ToolRegistry) -> None:
        self.registry = registry
        self.journal = Journal()
        self.observed = Observed()
        self.call_tokens: list[CancelToken] = []
        self.body_started = threading.Event()
        self.body_mode = "quick"
        self.release = threading.Event()
        registry.on_result(self.observed)
        registry.tool(name="work")(self._body)

    def _body(self, args: Args, ctx: ToolContext) -> str:
        self.call_tokens.append(ctx.token)
        self.journal("body start")
        self.body_started.set()
        if self.body_mode == "cooperative":
            ctx.token.wait(WAIT)
        elif self.body_mode == "uncooperative":
            self.release.wait(WAIT)  # ignores ctx.token
        self.journal("body end")
        return "done"

    def keep_token(self, token: CancelToken) -> None:
        self.call_tokens.append(token)


def _interrupt_in_pre_hook(scene: CtrlCScene) -> None:
    def hook(call: ToolCall, token: CancelToken) -> None:
        scene.keep_token(token)
        raise KeyboardInterrupt

    scene.registry.add_pre_execute(hook)


def _signal_during_pre_hook_wait(scene: CtrlCScene) -> threading.Event:
    waiting = threading.Event()

    def hook(call: ToolCall, token: CancelToken) -> None:
        scene.keep_token(token)
        waiting.set()
        threading.Event().wait(WAIT)  # Ctrl-C arrives while the hook blocks here

    scene.registry.add_pre_execute(hook)
    return waiting


def _interrupt_in_approver(scene: CtrlCScene) -> None:
    scene.registry.add_pre_execute(lambda call, token: Ask("?"))

    def approver(call: ToolCall, reason: str, token: CancelToken) -> bool:
        scene.keep_token(token)
        raise KeyboardInterrupt

    scene.registry.set_approver(approver)


def _interrupt_in_guard(scene: CtrlCScene) -> None:
    scene.registry.add_pre_execute(lambda call, token: scene.keep_token(token))

    def guard(call: ToolCall) -> None:
        raise KeyboardInterrupt

    scene.registry.add_guard(guard)


def _interrupt_in_wrapper_before_proceed(scene: CtrlCScene) -> None:
    def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        scene.keep_token(dispatch.token)
        raise KeyboardInterrupt

    scene.registry.add_around(wrapper)


def _interrupt_in_wrapper_after_proceed(scene: CtrlCScene) -> None:
    def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        proceed()
        scene.keep_token(dispatch.token)
        raise KeyboardInterrupt

    scene.registry.add_around(wrapper)


def _interrupt_in_post_hook(scene: CtrlCScene) -> None:
    def post(result: ToolResult[Any], token: CancelToken) -> None:
        scene.keep_token(token)
        raise KeyboardInterrupt

    scene.registry.add_post_execute(post)


def _signal_while_joining_cooperative_body(scene: CtrlCScene) -> threading.Event:
    scene.body_mode = "cooperative"
    return scene.body_started


def _signal_while_joining_uncooperative_body(scene: CtrlCScene) -> threading.Event:
    scene.body_mode = "uncooperative"

    def release_once_cancelled() -> None:
        assert scene.body_started.wait(WAIT)
        wait_until(lambda: scene.call_tokens[0].cancelled, "Ctrl-C to cancel the call")
        scene.release.set()

    Caller(release_once_cancelled, name="releaser")
    return scene.body_started


@pytest.mark.parametrize(
    ("setup", "code", "body_ran"),
    [
        (_interrupt_in_pre_hook, BEFORE, False),
        (_signal_during_pre_hook_wait, BEFORE, False),
        (_interrupt_in_approver, BEFORE, False),
        (_interrupt_in_guard, BEFORE, False),
        (_interrupt_in_wrapper_before_proceed, BEFORE, False),
        (_interrupt_in_wrapper_after_proceed, ABORTED, True),
        (_interrupt_in_post_hook, ABORTED, True),
        (_signal_while_joining_cooperative_body, ABORTED, True),
        (_signal_while_joining_uncooperative_body, ABORTED, True),
    ],
    ids=lambda value: value.__name__.strip("_") if callable(value) else None,
)
def test_ctrl_c_cancels_only_the_call_finishes_the_pipeline_then_reraises(
    registry: ToolRegistry,
    setup: Callable[[CtrlCScene], threading.Event | None],
    code: ErrorCode,
    body_ran: bool,
) -> None:
    scene = CtrlCScene(registry)
    moment = setup(scene)
    caller = CancelSource()
    with default_sigint():
        presser = send_ctrl_c_when(moment) if moment is not None else None
        with pytest.raises(KeyboardInterrupt):
            registry.execute("work", token=caller.token)
        if presser is not None:
            presser.join()
    assert not caller.token.cancelled
    assert scene.call_tokens and all(token.cancelled for token in scene.call_tokens)
    assert scene.observed.codes == [code]
    assert scene.observed.results[0].dispatched is body_ran
    assert scene.journal.entries == (["body start", "body end"] if body_ran else [])
    assert holds_nothing(caller.token)
    assert registry.in_flight() == []


def _main_thread_waits_in_toolreg() -> bool:
    """The main thread is blocked, and its innermost frame (past threading.py) is toolreg's."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    while frame is not None and frame.f_code.co_filename == threading.__file__:
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(TOOLREG_DIR):
        return False
    return main_thread_sleeps()


def test_ctrl_c_handled_as_the_body_returns_is_reraised_not_hung(registry: ToolRegistry) -> None:
    """`_thread.interrupt_main()` makes Ctrl-C pending without waking the blocked caller: it is
    handled right after the join's wait returns -- where a real SIGINT lands when it arrives
    just as the body finishes (or just before the caller blocked)."""
    observed = Observed()
    registry.on_result(observed)
    returned = threading.Event()
    finished = threading.Event()
    rescued = threading.Event()

    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        pause = threading.Event()
        streak = 0
        for _ in range(300):  # until the caller sits in the join (bounded: 3 s)
            streak = streak + 1 if _main_thread_waits_in_toolreg() else 0
            if streak >= 5:
                break
            pause.wait(0.01)
        _thread.interrupt_main()
        returned.set()
        return "done"

    def rescue() -> None:
        # Unblocks a hung caller so that the suite goes on (the test then fails, as it should).
        assert returned.wait(WAIT)
        if finished.wait(2.0):  # a bound on a call that needs microseconds after its body
            return
        rescued.set()
        for state in list(registry._calls.values()):
            done = getattr(state.body_run, "_done", None)
            if done is not None and done.locked():
                done.release()

    with default_sigint():
        rescuer = Caller(rescue, name="rescuer")
        try:
            with pytest.raises(KeyboardInterrupt):
                registry.execute("work")
        finally:
            finished.set()
            rescuer.join()
    assert not rescued.is_set(), "execute() hung after the body returned"
    assert observed.codes == [ABORTED]


def test_ctrl_c_in_an_observer_still_notifies_the_others_then_reraises(
    registry: ToolRegistry,
) -> None:
    counting_tool(registry)
    first, last = Observed(), Observed()
    registry.on_result(first)

    def interrupted(result: ToolResult[Any]) -> None:
        raise KeyboardInterrupt

    registry.on_result(interrupted)
    registry.on_result(last)
    caller = CancelSource()
    with pytest.raises(KeyboardInterrupt):
        registry.execute("work", token=caller.token)
    assert first.codes == last.codes == [None]
    assert first.results[0] is last.results[0]
    assert not caller.token.cancelled


# == token hygiene over many calls ============================================================

MANY_CALLS = 100_000
TRACED_CALLS = 20_000


def test_long_lived_caller_token_holds_nothing_after_100000_calls_and_memory_is_flat() -> None:
    """100,000 calls on one caller token; memory traced over the last 20,000 of them."""
    with open_registry(max_workers=2) as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> int:
            return args["n"]

        session = CancelSource()
        token = session.token
        untraced = MANY_CALLS - TRACED_CALLS
        for n in range(untraced):
            result = registry.execute("work", {"n": n}, token=token)
        assert result.value == untraced - 1
        assert holds_nothing(token)
        gc.collect()
        tracemalloc.start()
        try:
            half = TRACED_CALLS // 2
            for n in range(half):
                registry.execute("work", {"n": n}, token=token)
            gc.collect()
            middle = tracemalloc.get_traced_memory()[0]
            for n in range(half):
                registry.execute("work", {"n": n}, token=token)
            gc.collect()
            end = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert holds_nothing(token)
        # Per-call state would grow by hundreds of bytes per call: 10,000 calls -> megabytes.
        assert end - middle < 64 * 1024, f"grew {end - middle} bytes over {half} calls"


def test_concurrent_calls_leave_nothing_on_a_shared_caller_token() -> None:
    with open_registry(max_workers=4) as registry:
        counting_tool(registry)
        session = CancelSource()
        callers = [
            Caller(lambda: [registry.execute("work", token=session.token) for _ in range(300)])
            for _ in range(4)
        ]
        for caller in callers:
            assert all(result.ok for result in caller.join())
        assert holds_nothing(session.token)


def test_each_stage_is_logged_at_debug_and_nothing_below_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with toolreg.ToolRegistry(max_workers=1) as registry:
        registry.add_pre_execute(lambda call, token: None)
        registry.add_around(lambda dispatch, proceed: proceed())
        registry.add_post_execute(lambda result, token: None)
        registry.register(toolreg.Tool("t", lambda args, ctx: "ok"))
        with caplog.at_level(logging.INFO, logger="toolreg"):
            registry.execute(toolreg.ToolCall("t", call_id="quiet"))
        assert [r for r in caplog.records if "quiet" in r.getMessage()] == []
        with caplog.at_level(logging.DEBUG, logger="toolreg"):
            registry.execute(toolreg.ToolCall("t", call_id="loud"))
    stages = [
        r.getMessage().split(": ")[2].split(" ")[0]
        for r in caplog.records
        if "loud" in r.getMessage() and r.levelno == logging.DEBUG
    ]
    assert stages == [
        "pre_execute",
        "guards",
        "around",
        "dispatch",
        "body",
        "after_body",
        "post_execute",
        "observers",
    ]
    assert not logging.getLogger("toolreg").handlers  # the library adds no handlers


def test_a_finalizer_removing_a_hook_during_registration_does_not_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: hook and tool sets were rebuilt while holding the registry lock; a cyclic
    collection triggered by those allocations ran finalizers, and one that removed a
    registration took the same lock: a self-deadlock. Sets are now built outside the lock.
    The collection is forced exactly where the hook set is rebuilt."""
    registry = toolreg.ToolRegistry(max_workers=1)
    removed: list[bool] = []

    class Owner:
        def __init__(self) -> None:
            self.cycle = self
            self.registration = registry.add_guard(lambda call: None)

        def __del__(self) -> None:
            removed.append(self.registration.remove())

    rebuild = dataclasses.replace

    def rebuild_with_a_collection(*args: Any, **kwargs: Any) -> Any:
        gc.collect()  # what an allocation can trigger at any moment
        return rebuild(*args, **kwargs)

    def register() -> None:
        Owner()  # cyclic garbage whose finalizer needs the registry
        monkeypatch.setattr(toolreg._hooks.dataclasses, "replace", rebuild_with_a_collection)
        registry.add_pre_execute(lambda call, token: None)

    worker = threading.Thread(target=register, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "deadlocked: a finalizer waited for the registry lock"
    monkeypatch.undo()
    assert removed == [True]
    registry.close()
