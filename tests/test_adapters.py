"""What every adapter shares, tested without any framework installed.

Importing `toolreg` or `toolreg.adapters` never imports a framework; an adapter whose extra is
missing says which extra to install; the tool selection, token checks and fusion behave alike
for all three adapters (`toolreg.adapters._common`).
"""

from __future__ import annotations

import asyncio

import pytest
from _adapter_helpers import run_python
from _registry_helpers import open_registry

from toolreg import CancelSource, CancelToken
from toolreg.adapters._common import (
    call_token,
    check_registry,
    check_token,
    parse_arguments,
    select_tools,
    wait_settled,
)

FRAMEWORKS = ("langchain_core", "langchain", "agents", "openai", "pydantic_ai", "pydantic")


def test_importing_toolreg_and_its_adapters_package_imports_no_framework() -> None:
    done = run_python(
        f"""
        import sys
        import toolreg, toolreg.adapters, toolreg.aio, toolreg.log
        loaded = sorted(name for name in sys.modules
                        if name.split(".")[0] in {FRAMEWORKS!r})
        print(loaded)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("langchain", "langchain_core", "langchain"),
        ("openai_agents", "agents", "openai-agents"),
        ("pydantic_ai", "pydantic_ai", "pydantic-ai"),
    ],
)
def test_an_adapter_without_its_extra_names_the_extra_to_install(
    module: str, blocked: str, extra: str
) -> None:
    done = run_python(
        f"""
        import sys
        sys.modules[{blocked!r}] = None  # as if it were not installed
        try:
            import toolreg.adapters.{module}
        except ImportError as exc:
            print(exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert f"pip install 'toolreg-quiescent[{extra}]'" in done.stdout


def test_selection_is_every_tool_sorted_by_name_with_the_advertised_schema() -> None:
    with open_registry() as registry:
        registry.tool(lambda args, ctx: 1, name="zeta", parameters={"properties": {}})
        registry.tool(lambda args, ctx: 1, name="alpha")
        selected = select_tools(registry, None)
        assert [s.tool.name for s in selected] == ["alpha", "zeta"]
        # The catalog's normalized schemas: an object root, nothing else changed.
        assert selected[0].schema == {"type": "object", "properties": {}}
        assert selected[1].schema == {"type": "object", "properties": {}}
        assert [s.tool.name for s in select_tools(registry, ["zeta", "alpha"])] == [
            "zeta",
            "alpha",
        ]


def test_selection_refuses_unknown_repeated_and_non_string_names() -> None:
    with open_registry() as registry:
        registry.tool(lambda args, ctx: 1, name="search")
        with pytest.raises(ValueError, match=r"no tool named 'find'.*registered: 'search'"):
            select_tools(registry, ["find"])
        with pytest.raises(ValueError, match="more than once: 'search'"):
            select_tools(registry, ["search", "search"])
        with pytest.raises(TypeError, match="not a single string"):
            select_tools(registry, "search")
        with pytest.raises(TypeError, match="tool names are str"):
            select_tools(registry, [1])  # type: ignore[list-item]


def test_the_schema_handed_out_is_a_private_copy() -> None:
    with open_registry() as registry:
        registry.tool(lambda args, ctx: 1, name="search", parameters={"type": "object"})
        select_tools(registry, None)[0].schema["properties"] = {"x": {}}
        assert select_tools(registry, None)[0].schema == {"type": "object"}


def test_misused_arguments_raise_type_errors() -> None:
    with pytest.raises(TypeError, match="ToolRegistry"):
        check_registry(object())
    with pytest.raises(TypeError, match="CancelToken or None"):
        check_token("stop")
    assert check_token(None) is None


def test_call_token_fuses_only_when_there_are_two() -> None:
    one = CancelSource()
    with call_token(None, None) as token:
        assert token is None
    with call_token(None, one.token) as token:
        assert token is one.token
    other = CancelSource()
    with call_token(one.token, other.token) as token:
        assert isinstance(token, CancelToken)
        before = token.cancelled  # read into a local: mypy would narrow the property for good
        assert not before
        other.cancel("stop")
        assert token.cancelled and token.reason == "stop"
    assert not one.token.cancelled


def test_call_token_leaves_no_registration_on_a_long_lived_token() -> None:
    turn = CancelSource()
    for _ in range(3):
        with call_token(turn.token, CancelSource().token):
            pass
    assert not turn.token._listeners and not turn.token._children


def test_arguments_that_are_not_json_are_handed_on_for_the_registry_to_refuse() -> None:
    assert parse_arguments('{"a": [1, 2]}') == {"a": [1, 2]}
    assert parse_arguments("") == {}
    assert parse_arguments("  ") == {}
    assert parse_arguments("[1]") == [1]
    assert parse_arguments("{nope") == "{nope"
    assert parse_arguments("null") == "null"  # not None, which a ToolCall reads as {}


def test_wait_settled_absorbs_cancellation_until_the_task_is_done() -> None:
    async def main() -> list[str]:
        release = asyncio.Event()
        seen: list[str] = []

        async def work() -> None:
            await release.wait()

        async def waiter() -> None:
            task = asyncio.ensure_future(work())
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                seen.append("cancelled")
                await wait_settled(task)
                seen.append("settled" if task.done() else "not settled")
                raise

        outer = asyncio.ensure_future(waiter())
        await asyncio.sleep(0)  # let it start (not ordering threads: one loop, one step)
        outer.cancel()
        for _ in range(3):
            await asyncio.sleep(0)
            outer.cancel()  # cancelled again while waiting: still waits
        assert not outer.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await outer
        return seen

    assert asyncio.run(main()) == ["cancelled", "settled"]
