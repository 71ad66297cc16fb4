"""`toolreg.adapters.openai_agents`: `AgentToolset` under the Agents SDK's own runner.

Skipped without the `openai-agents` extra. The model is the SDK's own test double
(`agents.testing.ScriptedModel`); tracing is disabled, so nothing touches the network.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("agents")

from _adapter_helpers import ADD_SCHEMA, scenario, still_pending, wait_event
from _registry_helpers import ABORTED, BEFORE, WAIT, open_registry
from agents import Agent, FunctionTool, RunConfig, Runner, UserError
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from toolreg import CancelSource, ErrorCode, RegistryClosedError
from toolreg.adapters import openai_agents as module
from toolreg.adapters.openai_agents import AgentToolset

NO_TRACING = RunConfig(tracing_disabled=True)


def test_the_public_names_are_pinned() -> None:
    assert module.__all__ == ["AgentToolset"]


def _agent(tools: Sequence[FunctionTool], steps: list[Any]) -> tuple[Agent[Any], ScriptedModel]:
    model = ScriptedModel(steps)
    return Agent(name="assistant", model=model, tools=list(tools)), model


def _outputs(call: ModelCall) -> dict[str, str]:
    """The tool outputs the model was handed in this call, by call id."""
    items = call.input if isinstance(call.input, list) else []
    return {
        item["call_id"]: item["output"]
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


def test_a_run_hands_the_model_each_result_s_content() -> None:
    with scenario() as s:
        toolset = AgentToolset(s.registry, ["add", "boom"])
        agent, model = _agent(
            toolset.tools,
            [
                [
                    function_call("add", {"a": 1}, call_id="c1"),
                    function_call("boom", {}, call_id="c2"),
                    function_call("add", {"a": "one"}, call_id="c3"),
                    function_call("add", "{not json", call_id="c4"),
                ],
                [assistant_message("the sum is 3")],
            ],
        )
        result = asyncio.run(Runner.run(agent, "add 1 and 2", run_config=NO_TRACING))
    assert result.final_output == "the sum is 3"
    outputs = _outputs(model.calls[1])
    assert outputs["c1"] == "3"
    assert outputs["c2"] == "Error: RuntimeError: kaput"
    assert outputs["c3"].startswith("Error: ")
    assert outputs["c4"] == (  # says what is wrong with the text, not that it is a str
        "Error: arguments: not valid JSON (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)); a JSON object is expected"
    )
    codes = {r.call.call_id: r.code for r in s.observed.results}
    assert codes == {
        "c1": None,
        "c2": ErrorCode.TOOL_ERROR,
        "c3": ErrorCode.INVALID_ARGS,
        "c4": ErrorCode.INVALID_ARGS,
    }
    assert s.bodies_run == [("add", {"a": 1})]


def test_the_model_is_given_the_registry_schema_untouched() -> None:
    with scenario() as s:
        toolset = AgentToolset(s.registry, ["add"])
        agent, model = _agent(toolset.tools, [[assistant_message("hi")]])
        asyncio.run(Runner.run(agent, "hello", run_config=NO_TRACING))
    [given] = model.calls[0].tools
    assert isinstance(given, FunctionTool)
    assert (given.name, given.description) == ("add", "Add a and b.")
    assert given.params_json_schema == ADD_SCHEMA  # "b" stays optional
    assert given.strict_json_schema is False


def test_strict_mode_is_refused_where_it_would_rewrite_the_schema() -> None:
    strict_schema = {
        "type": "object",
        "properties": {"q": {"type": "string"}},
        "required": ["q"],
        "additionalProperties": False,
    }
    with scenario() as s:
        s.registry.tool(lambda args, ctx: args["q"], name="search", parameters=strict_schema)
        with pytest.raises(ValueError, match=r"'add'.*strict mode would rewrite"):
            AgentToolset(s.registry, ["add"], strict_json_schema=True)
        [search] = AgentToolset(s.registry, ["search"], strict_json_schema=True).tools
    assert search.strict_json_schema is True
    assert search.params_json_schema == strict_schema


def test_names_openai_refuses_and_misuse_are_errors_at_construction() -> None:
    with open_registry() as registry:
        registry.tool(lambda args, ctx: 1, name="ns.search")
        registry.tool(lambda args, ctx: 1, name="plain")
        with pytest.raises(ValueError, match=r"'ns\.search'"):
            AgentToolset(registry)
        assert [t.name for t in AgentToolset(registry, ["plain"]).tools] == ["plain"]
        with pytest.raises(TypeError, match="CancelToken"):
            AgentToolset(registry, token=object())  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="strict_json_schema"):
            AgentToolset(registry, strict_json_schema="yes")  # type: ignore[arg-type]


def test_a_call_that_cannot_run_raises_into_the_run() -> None:
    """13.1: a closed registry leaves no result to show the model; the SDK ends the run."""
    with scenario() as s:
        toolset = AgentToolset(s.registry, ["add"])
    agent, model = _agent(  # the scenario's registry is closed now
        toolset.tools, [[function_call("add", {"a": 1}, call_id="c1")], [assistant_message("")]]
    )
    with pytest.raises(UserError) as raised:
        asyncio.run(Runner.run(agent, "add", run_config=NO_TRACING))
    assert isinstance(raised.value.__cause__, RegistryClosedError)
    assert len(model.calls) == 1 and s.observed.results == []


def test_a_cancelled_toolset_token_starts_no_body() -> None:
    stop = CancelSource()
    stop.cancel("turn over")
    with scenario() as s:
        toolset = AgentToolset(s.registry, ["add"], token=stop.token)
        agent, model = _agent(
            toolset.tools,
            [[function_call("add", {"a": 1}, call_id="c1")], [assistant_message("ok")]],
        )
        asyncio.run(Runner.run(agent, "add", run_config=NO_TRACING))
    assert _outputs(model.calls[1]) == {"c1": "Error: tool call aborted before dispatch"}
    assert s.bodies_run == []
    assert [r.code for r in s.observed.results] == [BEFORE]


def test_the_toolset_token_cancels_a_running_call() -> None:
    turn = CancelSource()
    with scenario() as s:
        toolset = AgentToolset(s.registry, ["cooperative"], token=turn.token)
        agent, model = _agent(
            toolset.tools,
            [[function_call("cooperative", {}, call_id="c1")], [assistant_message("stopped")]],
        )

        async def main() -> Any:
            run = asyncio.create_task(Runner.run(agent, "go", run_config=NO_TRACING))
            await wait_event(s.started)
            turn.cancel("turn over")
            return await asyncio.wait_for(run, WAIT)

        result = asyncio.run(main())
    assert result.final_output == "stopped"
    assert _outputs(model.calls[1]) == {"c1": "Error: tool call aborted"}
    assert [r.code for r in s.observed.results] == [ABORTED]
    assert s.journal.entries == ["body saw cancel"]


@pytest.mark.parametrize("body", ["cooperative", "stubborn"])
def test_a_cancelled_run_abandons_the_tool_and_drain_waits_for_its_body(body: str) -> None:
    with scenario() as s:
        toolset = AgentToolset(s.registry)
        agent, model = _agent(
            toolset.tools,
            [[function_call(body, {}, call_id="c1")], [assistant_message("never")]],
        )

        async def main() -> None:
            run = asyncio.create_task(Runner.run(agent, "go", run_config=NO_TRACING))
            await wait_event(s.started)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            drained = asyncio.create_task(toolset.drain())
            if body == "stubborn":
                # The SDK has returned, the body is still running: drain() is the wait.
                assert await still_pending(drained)
                s.release.set()
            await asyncio.wait_for(drained, WAIT)
            s.journal("drained")
            assert s.registry.in_flight() == []
            await asyncio.wait_for(toolset.drain(), WAIT)  # nothing left: returns at once

        asyncio.run(main())
    expected = ["body saw cancel", "drained"]
    if body == "stubborn":
        expected.insert(1, "body returned")
    assert s.journal.entries == expected
    assert [r.code for r in s.observed.results] == [ABORTED]
    assert len(model.calls) == 1  # no late success ever reached the model


def test_a_streamed_run_cancelled_mid_tool_is_drained() -> None:
    with scenario() as s:
        toolset = AgentToolset(s.registry)
        agent, model = _agent(
            toolset.tools,
            [[function_call("stubborn", {}, call_id="c1")], [assistant_message("never")]],
        )

        async def main() -> None:
            streamed = Runner.run_streamed(agent, "go", run_config=NO_TRACING)

            async def consume() -> None:
                async for _ in streamed.stream_events():
                    pass

            consumer = asyncio.create_task(consume())
            await wait_event(s.started)
            streamed.cancel()
            await asyncio.wait_for(consumer, WAIT)
            drained = asyncio.create_task(toolset.drain())
            assert await still_pending(drained)
            s.release.set()
            await asyncio.wait_for(drained, WAIT)
            s.journal("drained")

        asyncio.run(main())
    assert s.journal.entries == ["body saw cancel", "body returned", "drained"]
    assert [r.code for r in s.observed.results] == [ABORTED]
    assert len(model.calls) == 1


def test_a_run_cancelled_while_the_model_thinks_starts_no_body() -> None:
    with scenario() as s:
        toolset = AgentToolset(s.registry)

        async def main() -> None:
            thinking = asyncio.Event()

            async def respond(call: ModelCall) -> Any:
                thinking.set()
                await asyncio.Event().wait()  # the model never answers; the run is cancelled
                return [function_call("add", {"a": 1}, call_id="c1")]

            agent, _ = _agent(toolset.tools, [ModelStep.respond(respond)])
            run = asyncio.create_task(Runner.run(agent, "go", run_config=NO_TRACING))
            await asyncio.wait_for(thinking.wait(), WAIT)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            await asyncio.wait_for(toolset.drain(), WAIT)

        asyncio.run(main())
    assert s.bodies_run == [] and s.observed.results == []


@pytest.mark.parametrize("body", ["cooperative", "stubborn"])
def test_the_sdk_timeout_cancels_the_call_and_the_run_goes_on_only_once_it_settled(
    body: str,
) -> None:
    with scenario() as s:
        [tool] = AgentToolset(s.registry, [body]).tools
        timed = dataclasses.replace(tool, timeout_seconds=0.05)
        codes_when_model_resumed: list[Any] = []

        def resume(call: ModelCall) -> Any:
            codes_when_model_resumed.extend(r.code for r in s.observed.results)
            codes_when_model_resumed.append(_outputs(call)["c1"])
            return [assistant_message("gave up")]

        agent, _ = _agent(
            [timed], [[function_call(body, {}, call_id="c1")], ModelStep.respond(resume)]
        )

        async def main() -> None:
            run = asyncio.create_task(Runner.run(agent, "go", run_config=NO_TRACING))
            if body == "stubborn":
                await wait_event(s.saw_cancel)
                assert await still_pending(run)  # the SDK waits for the cancelled call
                s.release.set()
            result = await asyncio.wait_for(run, WAIT)
            assert result.final_output == "gave up"

        asyncio.run(main())
    assert codes_when_model_resumed == [ABORTED, f"Tool '{body}' timed out after 0.05 seconds."]


def test_one_toolset_serves_runs_on_separate_event_loops() -> None:
    with scenario() as s:
        toolset = AgentToolset(s.registry, ["add"])
        for call_id in ("c1", "c2"):
            agent, model = _agent(
                toolset.tools,
                [[function_call("add", {"a": 2}, call_id=call_id)], [assistant_message("ok")]],
            )
            asyncio.run(Runner.run(agent, "add", run_config=NO_TRACING))
            assert _outputs(model.calls[1]) == {call_id: "4"}
    assert [r.code for r in s.observed.results] == [None, None]
