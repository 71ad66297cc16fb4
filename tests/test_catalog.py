"""The catalog: tool metadata, name rules, schema normalization, one snapshot, change events."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from toolreg import Catalog, ErrorCode, FrozenDict, Tool, ToolContext, ToolRegistry, thaw

WAIT = 10.0  # seconds a registration may take before the test calls it a deadlock

Args = Any


def echo(args: Args, ctx: ToolContext) -> Any:
    return dict(args)


def test_every_tool_field_after_fn_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        Tool("t", echo, "a description")  # type: ignore[call-arg]  # positional on purpose
    tool = Tool("t", echo, description="d", title="T", validate_output=False)
    assert (tool.name, tool.description, tool.title) == ("t", "d", "T")


@pytest.mark.parametrize("name", ["", "has space", "slash/name", "é", "x" * 129, "semi;colon"])
def test_names_outside_the_client_rule_are_refused_at_registration(name: str) -> None:
    with pytest.raises(ValueError, match="must match"):
        Tool(name, echo)


@pytest.mark.parametrize("name", ["a", "A-b_c.d", "x" * 128, "0.1"])
def test_names_inside_the_client_rule_are_accepted(name: str) -> None:
    assert Tool(name, echo).name == name


def test_annotations_are_copied_and_frozen_when_the_tool_is_built() -> None:
    given: dict[str, Any] = {"readOnlyHint": True, "nested": {"k": [1, 2]}}
    tool = Tool("t", echo, annotations=given)
    given["readOnlyHint"] = False
    given["nested"]["k"].append(3)
    assert tool.annotations == {"readOnlyHint": True, "nested": {"k": (1, 2)}}
    assert isinstance(tool.annotations, FrozenDict)
    with pytest.raises(TypeError):
        tool.annotations["readOnlyHint"] = False


def test_annotations_that_are_not_json_are_refused() -> None:
    with pytest.raises(ValueError, match="annotations"):
        Tool("t", echo, annotations={"hint": object()})
    with pytest.raises(TypeError):
        Tool("t", echo, annotations=["not", "a", "mapping"])  # type: ignore[arg-type]


def test_bad_metadata_types_are_refused() -> None:
    with pytest.raises(TypeError):
        Tool("t", echo, title=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Tool("t", echo, validate_output=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs an output_schema"):
        Tool("t", echo, validate_output=True)


def test_a_schema_without_a_root_type_is_advertised_and_enforced_as_an_object() -> None:
    registry = ToolRegistry()
    try:
        registry.register(Tool("t", echo, parameters={"properties": {"q": {"type": "string"}}}))
        (schema,) = registry.schemas("openai")
        parameters = schema["function"]["parameters"]
        assert parameters == {"type": "object", "properties": {"q": {"type": "string"}}}
        assert registry.execute("t", {"q": 1}).code == ErrorCode.INVALID_ARGS
        assert registry.execute("t", {"q": "x"}).ok
    finally:
        registry.close()


@pytest.mark.parametrize("root", ["array", "string", ["object", "null"]])
def test_a_non_object_root_type_is_refused_at_registration(root: Any) -> None:
    registry = ToolRegistry()
    try:
        with pytest.raises(ValueError, match="root type must be 'object'"):
            registry.register(Tool("t", echo, parameters={"type": root}))
        with pytest.raises(ValueError, match="root type must be 'object'"):
            registry.register(Tool("u", echo, output_schema={"type": root}))
        assert registry.tools() == ()
    finally:
        registry.close()


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"n": {"type": "not-a-type"}}},
        {"type": "object", "required": "n"},
        {"type": "object", "properties": {"n": {"minimum": "x"}}},
    ],
    ids=["unknown-type", "required-not-a-list", "minimum-not-a-number"],
)
@pytest.mark.parametrize("validate_output", [False, True])
def test_an_invalid_output_schema_with_an_object_root_is_refused_at_registration(
    schema: dict[str, Any], validate_output: bool
) -> None:
    # 11.4 and 2.5: "compiled at registration", enforced or not; never a failure at call time.
    registry = ToolRegistry()
    try:
        with pytest.raises(ValueError, match="output_schema"):
            registry.register(
                Tool("t", echo, output_schema=schema, validate_output=validate_output)
            )
        assert registry.tools() == ()
    finally:
        registry.close()


def test_a_schema_that_is_not_json_is_refused_at_registration() -> None:
    registry = ToolRegistry()
    try:
        with pytest.raises(ValueError, match="not JSON"):
            registry.register(Tool("t", echo, parameters={"type": "object", "x": {1, 2}}))
    finally:
        registry.close()


def test_output_schema_is_enforced_only_with_validate_output() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    registry = ToolRegistry()
    try:
        registry.register(Tool("loose", lambda a, c: {"n": "x"}, output_schema=schema))
        registry.register(
            Tool("strict", lambda a, c: {"n": "x"}, output_schema=schema, validate_output=True)
        )
        registry.register(
            Tool("good", lambda a, c: {"n": 1}, output_schema=schema, validate_output=True)
        )
        assert registry.execute("loose").ok
        bad = registry.execute("strict")
        assert bad.code == ErrorCode.TOOL_ERROR
        assert "output schema" in bad.error.message  # type: ignore[union-attr]
        assert bad.dispatched
        assert registry.execute("good").value == {"n": 1}
        mcp = {entry["name"]: entry for entry in registry.schemas("mcp")}
        assert "outputSchema" not in mcp["loose"]  # advertised only where it is enforced
        assert mcp["strict"]["outputSchema"] == schema
    finally:
        registry.close()


def test_mcp_catalog_carries_title_and_annotations_only_when_set() -> None:
    registry = ToolRegistry()
    try:
        registry.register(
            Tool("rich", echo, title="Rich", annotations={"readOnlyHint": True}, description="d")
        )
        registry.register(Tool("plain", echo))
        rich, plain = sorted(registry.schemas("mcp"), key=lambda e: e["name"] != "rich")
        assert rich == {
            "name": "rich",
            "title": "Rich",
            "description": "d",
            "inputSchema": {"type": "object", "properties": {}},
            "annotations": {"readOnlyHint": True},
        }
        assert plain == {
            "name": "plain",
            "description": "",
            "inputSchema": {"type": "object", "properties": {}},
        }
    finally:
        registry.close()


@pytest.mark.parametrize("style", ["openai", "anthropic"])
def test_provider_styles_name_every_tool_the_provider_refuses(style: str) -> None:
    registry = ToolRegistry()
    try:
        registry.register(Tool("fine", echo))
        registry.register(Tool("has.dot", echo))
        registry.register(Tool("x" * 65, echo))
        registry.register(Tool("y" * 64, echo))
        with pytest.raises(ValueError) as raised:
            registry.schemas(style)  # type: ignore[arg-type]
        message = str(raised.value)
        assert "'has.dot'" in message and repr("x" * 65) in message
        assert "'fine'" not in message and repr("y" * 64) not in message
        assert len(registry.schemas("mcp")) == 4  # MCP accepts them all
    finally:
        registry.close()


@pytest.mark.parametrize("style", ["openai", "anthropic", "mcp"])
def test_every_catalog_is_json_serializable(style: str) -> None:
    registry = ToolRegistry()
    try:
        registry.register(
            Tool(
                "t",
                echo,
                parameters={"type": "object", "properties": {"e": {"enum": ["a", "b"]}}},
                annotations={"hints": ("x", "y")},
                output_schema={"type": "object"},
                validate_output=True,
                title="T",
            )
        )
        json.dumps(registry.schemas(style))  # type: ignore[arg-type]
    finally:
        registry.close()


def test_catalog_is_one_snapshot_of_tools_and_schemas() -> None:
    registry = ToolRegistry()
    try:
        registry.register(Tool("a", echo))
        catalog = registry.catalog()
        registry.register(Tool("b", echo))
        assert isinstance(catalog, Catalog)
        assert [tool.name for tool in catalog.tools] == ["a"]
        assert [entry["name"] for entry in catalog.schemas("mcp")] == ["a"]
        assert [tool.name for tool in registry.catalog().tools] == ["a", "b"]
    finally:
        registry.close()


def test_on_tools_changed_runs_on_the_registering_thread_after_each_change() -> None:
    registry = ToolRegistry()
    seen: list[tuple[list[str], int | None]] = []
    try:
        registration = registry.on_tools_changed(
            lambda: seen.append(([t.name for t in registry.catalog().tools], threading.get_ident()))
        )
        added = registry.register(Tool("a", echo))
        added.remove()
        assert seen == [(["a"], threading.get_ident()), ([], threading.get_ident())]
        registration.remove()
        registry.register(Tool("b", echo))
        assert len(seen) == 2
    finally:
        registry.close()


def _register_on_a_thread(registry: ToolRegistry, tool: Tool) -> threading.Thread:
    """`registry.register(tool)` on a daemon thread: a deadlock fails the test, never hangs it."""
    thread = threading.Thread(target=registry.register, args=(tool,), daemon=True)
    thread.start()
    thread.join(WAIT)
    return thread


def test_on_tools_changed_may_register_a_tool_from_inside_the_callback() -> None:
    # 11.6: "outside any lock". Registering from the callback takes the registry's lock again,
    # from the same thread: a callback run under that lock would deadlock here.
    registry = ToolRegistry()
    seen: list[list[str]] = []
    try:

        def changed() -> None:
            names = [tool.name for tool in registry.tools()]
            seen.append(names)
            if names == ["a"]:
                registry.register(Tool("b", echo))  # from inside: runs this callback again

        registry.on_tools_changed(changed)
        thread = _register_on_a_thread(registry, Tool("a", echo))
        assert not thread.is_alive(), "register() deadlocked in its on_tools_changed callback"
        assert [tool.name for tool in registry.tools()] == ["a", "b"]
        assert seen == [["a"], ["a", "b"]]
    finally:
        registry.close()


def test_on_tools_changed_may_unregister_a_tool_from_inside_the_callback() -> None:
    registry = ToolRegistry()
    removed: list[bool] = []
    try:
        temporary = registry.register(Tool("temporary", echo))

        def changed() -> None:
            if registry.get("keep") is not None and registry.get("temporary") is not None:
                removed.append(temporary.remove())  # from inside: runs this callback again

        registry.on_tools_changed(changed)
        thread = _register_on_a_thread(registry, Tool("keep", echo))
        assert not thread.is_alive(), "register() deadlocked in its on_tools_changed callback"
        assert removed == [True]
        assert [tool.name for tool in registry.tools()] == ["keep"]
    finally:
        registry.close()


def test_on_tools_changed_exceptions_are_logged_and_registration_still_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = ToolRegistry()
    try:
        registry.on_tools_changed(lambda: 1 / 0)
        registry.register(Tool("a", echo))
        assert registry.get("a") is not None
        assert "on_tools_changed" in caplog.text
    finally:
        registry.close()


def test_thaw_makes_plain_mutable_copies_of_every_container() -> None:
    frozen = FrozenDict({"a": (1, FrozenDict({"b": [2, (3,)]})), "s": "x"})
    plain = thaw(frozen)
    assert plain == {"a": [1, {"b": [2, [3]]}], "s": "x"}
    assert type(plain) is dict and type(plain["a"]) is list and type(plain["a"][1]) is dict
    plain["a"][1]["b"].append(4)
    assert frozen["a"][1]["b"] == [2, (3,)]  # nothing shared with the original
    given = {"k": [1]}
    copied = thaw(given)
    copied["k"].append(2)
    assert given == {"k": [1]}
    marker = object()
    assert thaw(marker) is marker and thaw(7) == 7
