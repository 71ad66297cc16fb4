"""Tools and their registration, and the catalog handed to a model or client.

`Tool` definitions are checked when they are built or registered, never at call time
(docs/contract.md 2.5, 2.7); `tools()`, `get()` and `schemas()` are the registry's catalog.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from _registry_helpers import (
    SEARCH_SCHEMA,
    Args,
    Caller,
    Gate,
    echo,
    open_registry,
)

from toolreg import (
    ErrorCode,
    FrozenDict,
    Registration,
    Tool,
    ToolContext,
    ToolFunction,
    ToolRegistry,
)

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


def test_a_body_gets_the_frozen_arguments_and_its_context_positionally(
    registry: ToolRegistry,
) -> None:
    """What `ToolFunction` types: `fn(args, ctx)`, both positional, whatever their names."""
    seen: list[tuple[type, type]] = []

    def body(arguments: Mapping[str, Any], context: ToolContext, /) -> str:
        seen.append((type(arguments), type(context)))
        return "ok"

    fn: ToolFunction = body  # mypy --strict checks the suite: a typed body is a ToolFunction
    registry.register(Tool("positional", fn))
    assert registry.execute("positional", {"a": 1}).content == "ok"
    assert seen == [(FrozenDict, ToolContext)]


def test_the_tool_decorator_asks_for_a_name_when_the_callable_has_none(
    registry: ToolRegistry,
) -> None:
    class Body:
        def __call__(self, args: Mapping[str, Any], ctx: ToolContext) -> str:
            return "ok"

    with pytest.raises(TypeError, match="name="):
        registry.tool(Body())
    registry.tool(Body(), name="named")
    assert registry.execute("named").content == "ok"


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

    def slow(args: Args, ctx: ToolContext) -> str:
        gate.hold()
        return "done"

    registration = registry.register(Tool("slow", slow))
    call = Caller(lambda: registry.execute("slow"))
    gate.wait_reached()
    assert registration.remove() is True
    gate.release()
    assert call.join().value == "done"
    assert registry.execute("slow").code == ErrorCode.UNKNOWN_TOOL


def test_unknown_schema_style_raises_value_error(registry: ToolRegistry) -> None:
    with pytest.raises(ValueError, match="openai"):
        registry.schemas("gemini")  # type: ignore[arg-type]
