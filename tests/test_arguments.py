"""Arguments and the entry checks: JSON-compatible, registered, schema-valid, then frozen.

Entry checks run in a fixed order before any hook (docs/contract.md 2.2, 2.3); what passes is
deep-copied and frozen, so no stage can change what another sees.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import fastjsonschema
import pytest
from _registry_helpers import (
    SEARCH_SCHEMA,
    Args,
    Caller,
    Gate,
    Journal,
    Observed,
    Opaque,
    Proceed,
    counting_tool,
    echo,
)

from toolreg import (
    CancelSource,
    Dispatch,
    ErrorCode,
    FrozenDict,
    Tool,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
)


def test_every_stage_sees_the_same_frozen_arguments(registry: ToolRegistry) -> None:
    seen: list[Any] = []

    def body(args: Args, ctx: ToolContext) -> str:
        seen.append(("body", args))
        return "ok"

    registry.tool(name="echo")(body)
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

    def body(args: Args, ctx: ToolContext) -> str:
        seen.append(args)
        return "ok"

    registry.tool(name="echo")(body)
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

    def around(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        journal("around")
        return proceed()

    registry.add_around(around)
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


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON (Expecting property name enclosed in double quotes: "),
        ("", "not valid JSON (Expecting value: line 1 column 1 (char 0))"),
        ('{"a": 1}', "must be a mapping, got str (JSON text: decode it first)"),
        ("null", "a JSON object is expected, got JSON null"),
        ("[1, 2]", "a JSON object is expected, got JSON array"),
        ('"text"', "a JSON object is expected, got JSON string"),
    ],
)
def test_text_arguments_say_whether_they_are_json(
    registry: ToolRegistry, text: str, message: str
) -> None:
    """What a model sends is text: the adapters hand on what is not JSON, so the registry's
    message says so."""
    counting_tool(registry)
    result = registry.execute(ToolCall("work", text))  # type: ignore[arg-type]
    assert result.code == ErrorCode.INVALID_ARGS
    assert result.content.startswith(f"Error: arguments: {message}")


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
    assert isinstance(expected.value, fastjsonschema.JsonSchemaValueException)  # has .message
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
    # A str where a mapping belongs, on purpose: the ignore covers the call and the comparison.
    assert ToolCall("a", "junk").arguments == "junk"  # type: ignore[arg-type, comparison-overlap]
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
