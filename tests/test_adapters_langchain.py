"""`toolreg.adapters.langchain`: registry tools as LangChain tools, and LangChain tools imported.

Skipped without the `langchain` extra (langchain-core). The tool-calling loop is driven by
langchain-core's own `GenericFakeChatModel`; no network.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from _adapter_helpers import ADD_SCHEMA, scenario, still_pending, wait_event
from _registry_helpers import ABORTED, BEFORE, WAIT, Caller, open_registry
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException, tool
from langchain_core.utils.function_calling import convert_to_openai_tool

from toolreg import (
    CancelSource,
    CancelToken,
    ErrorCode,
    FrozenDict,
    RegistryClosedError,
    ToolResult,
)
from toolreg.adapters import langchain as module
from toolreg.adapters.langchain import TOKEN_KEY, as_langchain_tools, from_langchain


def _call(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"type": "tool_call", "name": name, "args": args, "id": call_id}


def _by_name(tools: list[BaseTool]) -> dict[str, BaseTool]:
    return {lc_tool.name: lc_tool for lc_tool in tools}


def _token_config(token: CancelToken) -> RunnableConfig:
    return {"configurable": {TOKEN_KEY: token}}


def test_the_public_names_are_pinned() -> None:
    assert module.__all__ == ["TOKEN_KEY", "as_langchain_tools", "from_langchain"]


# -- registry tools in a LangChain tool-calling loop ---------------------------------------------


def _loop(tools: list[BaseTool], mode: str) -> list[BaseMessage]:
    """The agent loop: ask the model, run its tool calls, hand the messages back, until done."""
    model = GenericFakeChatModel(
        messages=iter(
            [
                AIMessage(
                    content="",
                    tool_calls=[
                        _call("add", {"a": 1}, "c1"),
                        _call("boom", {}, "c2"),
                        _call("add", {"a": "one"}, "c3"),
                    ],
                ),
                AIMessage(content="the sum is 3"),
            ]
        )
    )
    by_name = _by_name(tools)
    messages: list[BaseMessage] = [HumanMessage(content="add 1 and 2")]

    async def run_calls(calls: list[Any]) -> list[Any]:
        return list(await asyncio.gather(*(by_name[c["name"]].ainvoke(c) for c in calls)))

    while True:
        reply = model.invoke(messages)
        assert isinstance(reply, AIMessage)
        messages.append(reply)
        if not reply.tool_calls:
            return messages
        if mode == "invoke":
            messages.extend(by_name[c["name"]].invoke(c) for c in reply.tool_calls)
        else:
            messages.extend(asyncio.run(run_calls(list(reply.tool_calls))))


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_tool_calling_loop_gets_content_status_and_the_result_as_artifact(mode: str) -> None:
    with scenario() as s:
        messages = _loop(as_langchain_tools(s.registry, ["add", "boom"]), mode)
    replies = [m for m in messages if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.status, m.content) for m in replies] == [
        ("c1", "success", "3"),
        ("c2", "error", "Error: RuntimeError: kaput"),
        ("c3", "error", replies[2].content),
    ]
    assert str(replies[2].content).startswith("Error: ")
    artifacts = [m.artifact for m in replies]
    assert all(isinstance(artifact, ToolResult) for artifact in artifacts)
    assert [a.code for a in artifacts] == [None, ErrorCode.TOOL_ERROR, ErrorCode.INVALID_ARGS]
    assert artifacts[0].value == 3
    # Every call went through the pipeline under the model's tool call id.
    assert sorted((r.call.call_id, r.code) for r in s.observed.results) == [
        ("c1", None),
        ("c2", ErrorCode.TOOL_ERROR),
        ("c3", ErrorCode.INVALID_ARGS),
    ]
    assert messages[-1].content == "the sum is 3"


def test_the_schema_reaches_langchain_untouched() -> None:
    with scenario() as s:
        [add] = as_langchain_tools(s.registry, ["add"])
        shape = convert_to_openai_tool(add)["function"]
    assert shape == {"name": "add", "description": "Add a and b.", "parameters": ADD_SCHEMA}


def test_invoked_with_plain_arguments_it_returns_the_content() -> None:
    with scenario() as s:
        add = _by_name(as_langchain_tools(s.registry))["add"]
        assert add.invoke({"a": 1, "b": 5}) == "6"
        assert add.invoke({"a": "one"}).startswith("Error: ")
        assert asyncio.run(add.ainvoke({"a": 2})) == "4"
    assert [r.code for r in s.observed.results] == [None, ErrorCode.INVALID_ARGS, None]


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_text_arguments_go_through_the_registry_json_or_not(mode: str) -> None:
    """13.1: LangChain refuses text for a JSON Schema tool; the adapter hands it on instead."""
    with scenario() as s:
        add = _by_name(as_langchain_tools(s.registry))["add"]

        def invoke(value: Any) -> Any:
            return add.invoke(value) if mode == "invoke" else asyncio.run(add.ainvoke(value))

        assert invoke('{"a": 1}') == "3"
        assert invoke("not json") == (
            "Error: arguments: not valid JSON (Expecting value: line 1 column 1 (char 0)); "
            "a JSON object is expected"
        )
        good = invoke({"type": "tool_call", "id": "c1", "name": "add", "args": '{"a": 4}'})
        bad = invoke({"type": "tool_call", "id": "c2", "name": "add", "args": "not json"})
    assert (good.tool_call_id, good.status, good.content) == ("c1", "success", "6")
    assert (bad.tool_call_id, bad.status) == ("c2", "error")
    assert bad.artifact.code == ErrorCode.INVALID_ARGS
    assert [r.code for r in s.observed.results] == [None, ErrorCode.INVALID_ARGS] * 2
    assert [r.call.call_id for r in s.observed.results][2:] == ["c1", "c2"]
    assert s.bodies_run == [("add", {"a": 1}), ("add", {"a": 4})]


def test_arguments_named_like_langchain_internals_reach_the_registry_intact() -> None:
    with open_registry() as registry:
        seen: list[dict[str, Any]] = []
        registry.tool(lambda args, ctx: seen.append(dict(args)), name="echo")
        [echo] = as_langchain_tools(registry)
        arguments = {"self": 1, "config": 2, "run_manager": 3, "callbacks": 4, "tool_call_id": 5}
        message = echo.invoke(_call("echo", arguments, "c1"))
    assert message.status == "success"
    assert seen == [arguments]


# -- cancellation -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
@pytest.mark.parametrize("whose", ["invocation", "adapter"])
def test_a_token_cancelled_before_the_call_starts_no_body(mode: str, whose: str) -> None:
    cancelled = CancelSource()
    cancelled.cancel("stop")
    with scenario() as s:
        adapter_token = cancelled.token if whose == "adapter" else None
        add = _by_name(as_langchain_tools(s.registry, token=adapter_token))["add"]
        config = _token_config(cancelled.token) if whose == "invocation" else None
        call = _call("add", {"a": 1}, "c1")
        if mode == "invoke":
            message = add.invoke(call, config)
        else:
            message = asyncio.run(add.ainvoke(call, config))
    assert message.status == "error"
    assert message.content == "Error: tool call aborted before dispatch"
    assert s.bodies_run == []
    assert [r.code for r in s.observed.results] == [BEFORE]


def test_the_invocation_token_cancels_a_running_sync_call() -> None:
    source = CancelSource()
    with scenario() as s:
        tools = _by_name(as_langchain_tools(s.registry))
        caller = Caller(
            lambda: tools["cooperative"].invoke(
                _call("cooperative", {}, "c1"), _token_config(source.token)
            )
        )
        assert s.started.wait(WAIT)
        source.cancel("user pressed stop")
        message = caller.join()
    assert (message.status, message.content) == ("error", "Error: tool call aborted")
    assert message.artifact.code == ABORTED
    assert [r.code for r in s.observed.results] == [ABORTED]


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_the_adapter_token_cancels_a_running_call(mode: str) -> None:
    turn = CancelSource()
    with scenario() as s:
        [lc_tool] = as_langchain_tools(s.registry, ["cooperative"], token=turn.token)
        call = _call("cooperative", {}, "c1")
        caller = Caller(
            lambda: lc_tool.invoke(call) if mode == "invoke" else asyncio.run(lc_tool.ainvoke(call))
        )
        assert s.started.wait(WAIT)
        turn.cancel("turn over")
        message = caller.join()
    assert (message.status, message.content) == ("error", "Error: tool call aborted")
    assert message.artifact.code == ABORTED
    assert [r.code for r in s.observed.results] == [ABORTED]
    assert s.journal.entries == ["body saw cancel"]


def test_a_sync_invoke_waits_for_a_body_that_ignores_cancellation() -> None:
    source = CancelSource()
    with scenario() as s:
        tools = _by_name(as_langchain_tools(s.registry))
        caller = Caller(
            lambda: tools["stubborn"].invoke(
                _call("stubborn", {}, "c1"), _token_config(source.token)
            )
        )
        assert s.started.wait(WAIT)
        source.cancel("stop")
        assert caller.still_blocked(0.1)
        s.release.set()
        message = caller.join()
        s.journal("invoke returned")
    assert s.journal.entries == ["body saw cancel", "body returned", "invoke returned"]
    assert message.status == "error" and "late" not in str(message.content)
    assert [r.code for r in s.observed.results] == [ABORTED]


@pytest.mark.parametrize("body", ["cooperative", "stubborn"])
def test_cancelling_the_ainvoke_task_cancels_the_call_and_joins_it(body: str) -> None:
    with scenario() as s:
        [lc_tool] = as_langchain_tools(s.registry, [body])

        async def main() -> None:
            task = asyncio.create_task(lc_tool.ainvoke(_call(body, {}, "c1")))
            await wait_event(s.started)
            task.cancel()
            if body == "stubborn":
                assert await still_pending(task)
                s.release.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            s.journal("task raised")
            assert s.registry.in_flight() == []  # settled, observers included
            assert [r.code for r in s.observed.results] == [ABORTED]

        asyncio.run(main())
    expected = ["body saw cancel", "task raised"]
    if body == "stubborn":
        expected.insert(1, "body returned")
    assert s.journal.entries == expected


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_call_that_cannot_run_raises_what_execute_raises(mode: str) -> None:
    """13.1: a closed registry leaves no result to show the model."""
    with scenario() as s:
        add = _by_name(as_langchain_tools(s.registry))["add"]
    call = _call("add", {"a": 1}, "c1")  # the scenario's registry is closed now
    with pytest.raises(RegistryClosedError):
        add.invoke(call) if mode == "invoke" else asyncio.run(add.ainvoke(call))
    assert s.observed.results == []


def test_a_token_that_is_not_a_cancel_token_is_a_type_error() -> None:
    with scenario() as s:
        add = _by_name(as_langchain_tools(s.registry))["add"]
        config: Any = {"configurable": {TOKEN_KEY: "stop"}}
        with pytest.raises(TypeError, match="toolreg_token"):
            add.invoke(_call("add", {"a": 1}, "c1"), config)
        with pytest.raises(TypeError, match="CancelToken"):
            as_langchain_tools(s.registry, token="stop")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="ToolRegistry"):
            as_langchain_tools(object())  # type: ignore[arg-type]
    assert s.observed.results == []


def test_unknown_names_are_refused() -> None:
    with scenario() as s, pytest.raises(ValueError, match="no tool named 'nope'"):
        as_langchain_tools(s.registry, ["add", "nope"])


# -- from_langchain ------------------------------------------------------------------------------


def test_a_langchain_tool_becomes_a_registry_tool_with_langchain_s_schema() -> None:
    received: list[Any] = []

    @tool
    def scale(values: list[int], options: dict[str, int], factor: int = 2) -> list[int]:
        """Scale values."""
        received.append((values, options))
        return [v * factor for v in values]

    with open_registry() as registry:
        from_langchain(registry, scale)
        registered = registry.get("scale")
        assert registered is not None
        assert registered.description == "Scale values."
        assert registered.parameters == convert_to_openai_tool(scale)["function"]["parameters"]
        result = registry.execute("scale", {"values": [1, 2], "options": {"k": 1}})
    assert result.ok and result.value == "[2, 4]"  # the LangChain message's content
    [(values, options)] = received
    assert type(values) is list and type(options) is dict  # thawed: plain Python
    assert not isinstance(options, FrozenDict)


def test_tool_kwargs_override_and_extend_the_definition() -> None:
    @tool
    def search(q: str) -> str:
        """Search."""
        return q

    with open_registry() as registry:
        registration = from_langchain(
            registry, search, name="find", description="Find things.", timeout=5.0
        )
        found = registry.get("find")
        assert found is not None and (found.description, found.timeout) == ("Find things.", 5.0)
        assert registration.remove()
        assert registry.get("find") is None
        with pytest.raises(TypeError, match="BaseTool"):
            from_langchain(registry, lambda q: q)  # type: ignore[arg-type]


def test_langchain_failures_are_tool_errors() -> None:
    def handled(q: str) -> str:
        """Fails, handled."""
        raise ToolException(f"no results for {q}")

    def raised(q: str) -> str:
        """Fails, raised."""
        raise ValueError("bad index")

    with open_registry() as registry:
        from_langchain(
            registry,
            StructuredTool.from_function(handled, name="handled", handle_tool_error=True),
        )
        from_langchain(registry, StructuredTool.from_function(raised, name="raised"))
        first = registry.execute("handled", {"q": "x"})
        second = registry.execute("raised", {"q": "x"})
    assert first.code == ErrorCode.TOOL_ERROR
    assert first.content == "Error: ToolException: no results for x"
    assert second.code == ErrorCode.TOOL_ERROR
    assert isinstance(second.error and second.error.exception, ValueError)


def test_a_sync_langchain_tool_sees_the_call_s_token_in_its_config() -> None:
    started = threading.Event()

    @tool
    def wait_for_stop(config: RunnableConfig) -> str:
        """Wait until stopped."""
        token = config["configurable"][TOKEN_KEY]
        assert isinstance(token, CancelToken)
        started.set()
        return "stopped" if token.wait(WAIT) else "never stopped"

    source = CancelSource()
    with open_registry() as registry:
        from_langchain(registry, wait_for_stop)
        caller = Caller(lambda: registry.execute("wait_for_stop", {}, token=source.token))
        assert started.wait(WAIT)
        source.cancel("stop")
        result = caller.join()
    assert result.code == ABORTED  # a success after cancellation is replaced


def test_an_async_langchain_tool_is_cancelled_with_the_call_and_joined() -> None:
    started, finished = threading.Event(), threading.Event()
    seen: list[str] = []

    @tool
    async def slow_search(q: str) -> str:
        """Search slowly."""
        started.set()
        try:
            await asyncio.wait_for(asyncio.Event().wait(), WAIT)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            finished.set()
        return q

    source = CancelSource()
    with open_registry() as registry:
        from_langchain(registry, slow_search)
        caller = Caller(lambda: registry.execute("slow_search", {"q": "x"}, token=source.token))
        assert started.wait(WAIT)
        source.cancel("stop")
        result = caller.join()
        assert finished.is_set()  # joined: the coroutine ended before execute returned
    assert result.code == ABORTED and seen == ["cancelled"]


def test_an_imported_tool_goes_back_out_to_langchain() -> None:
    @tool
    async def double(n: int) -> int:
        """Double n."""
        return n * 2

    with open_registry() as registry:
        from_langchain(registry, double)
        [lc_tool] = as_langchain_tools(registry)
        message = asyncio.run(lc_tool.ainvoke(_call("double", {"n": 4}, "c1")))
    assert (message.status, message.content) == ("success", "8")
