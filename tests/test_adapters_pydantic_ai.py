"""`toolreg.adapters.pydantic_ai`: `RegistryToolset` under pydantic-ai's own agent loop.

Skipped without the `pydantic-ai` extra (pydantic-ai-slim). The models are pydantic-ai's own
test doubles (`FunctionModel`, `TestModel`); no network. Runs use `asyncio.run(agent.run(...))`,
never `run_sync`, which leaves an event loop open on the thread for the rest of the session.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from _adapter_helpers import ADD_SCHEMA, scenario, still_pending, wait_event
from _registry_helpers import ABORTED, BEFORE, WAIT, open_registry
from pydantic_ai import Agent, CancellationToken
from pydantic_ai.exceptions import RunCancelled
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from toolreg import CancelSource, ErrorCode, RegistryClosedError
from toolreg.adapters import pydantic_ai as module
from toolreg.adapters.pydantic_ai import RegistryToolset


def test_the_public_names_are_pinned() -> None:
    assert module.__all__ == ["RegistryToolset"]


def _returns(messages: list[ModelMessage]) -> dict[str, tuple[str, Any]]:
    """The tool returns in the last request the model got: call id -> (outcome, content)."""
    request = messages[-1]
    assert isinstance(request, ModelRequest)
    return {
        part.tool_call_id: (part.outcome, part.content)
        for part in request.parts
        if isinstance(part, ToolReturnPart)
    }


class Script:
    """A `FunctionModel` function: answers in turn, keeping what the model was shown."""

    def __init__(self, *responses: list[Any]) -> None:
        self._responses = list(responses)
        self.shown: list[dict[str, tuple[str, Any]]] = []
        self.calls = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        if self.calls > 1:
            self.shown.append(_returns(messages))
        return ModelResponse(parts=self._responses.pop(0))


def test_a_run_shows_the_model_content_retries_bad_arguments_and_fails_errors() -> None:
    script = Script(
        [
            ToolCallPart("add", {"a": 1}, tool_call_id="c1"),
            ToolCallPart("boom", {}, tool_call_id="c2"),
            ToolCallPart("add", {"a": "one"}, tool_call_id="c3"),
        ],
        [ToolCallPart("add", {"a": 2, "b": 3}, tool_call_id="c4")],
        [TextPart("the sums are 3 and 5")],
    )
    with scenario() as s:
        agent = Agent(FunctionModel(script), toolsets=[RegistryToolset(s.registry)])
        result = asyncio.run(agent.run("add"))
    assert result.output == "the sums are 3 and 5"
    first, second = script.shown
    assert first["c1"] == ("success", "3")
    assert first["c2"] == ("failed", "Error: RuntimeError: kaput")  # ToolFailed
    outcome, content = first["c3"]
    assert outcome == "retried" and str(content).startswith("Error: ")  # ModelRetry
    assert second == {"c4": ("success", "5")}
    codes = {r.call.call_id: r.code for r in s.observed.results}
    assert codes == {
        "c1": None,
        "c2": ErrorCode.TOOL_ERROR,
        "c3": ErrorCode.INVALID_ARGS,
        "c4": None,
    }


def test_definitions_carry_the_schema_untouched_and_concurrency_as_sequential() -> None:
    with scenario() as s:
        model = TestModel(call_tools=[])
        agent = Agent(model, toolsets=[RegistryToolset(s.registry, ["add", "boom"])])
        asyncio.run(agent.run("hello"))
    assert model.last_model_request_parameters is not None
    definitions = {d.name: d for d in model.last_model_request_parameters.function_tools}
    add, boom = definitions["add"], definitions["boom"]
    assert add.parameters_json_schema == ADD_SCHEMA and add.description == "Add a and b."
    assert boom.parameters_json_schema == {"type": "object", "properties": {}}
    assert add.strict is False and boom.strict is False  # no provider strict-mode rewriting
    assert (add.sequential, boom.sequential) == (False, True)


def test_test_model_calls_every_tool_through_the_registry() -> None:
    with scenario() as s:
        agent = Agent(TestModel(call_tools=["add"]), toolsets=[RegistryToolset(s.registry)])
        asyncio.run(agent.run("hello"))
    assert [r.call.name for r in s.observed.results] == ["add"]
    assert [r.code for r in s.observed.results] == [None]


def test_concurrency_safe_tools_overlap_and_the_others_run_alone() -> None:
    both_inside = threading.Barrier(2, timeout=WAIT)
    active, overlapped = [0], [False]
    lock = threading.Lock()  # guards active and overlapped
    second_entered = threading.Event()

    with open_registry(max_workers=4) as registry:

        @registry.tool(concurrency_safe=True)
        def safe(args: Any, ctx: Any) -> str:
            both_inside.wait()  # raises BrokenBarrierError unless the two calls overlap
            return "ok"

        @registry.tool
        def exclusive(args: Any, ctx: Any) -> str:
            with lock:
                active[0] += 1
                if active[0] > 1:
                    overlapped[0] = True
                    second_entered.set()
            # A chance for a second call to enter, if it could (a bounded check, not ordering).
            second_entered.wait(0.1)
            with lock:
                active[0] -= 1
            return "ok"

        script = Script(
            [
                ToolCallPart("safe", {}, tool_call_id="s1"),
                ToolCallPart("safe", {}, tool_call_id="s2"),
                ToolCallPart("exclusive", {}, tool_call_id="x1"),
                ToolCallPart("exclusive", {}, tool_call_id="x2"),
            ],
            [TextPart("done")],
        )
        agent = Agent(FunctionModel(script), toolsets=[RegistryToolset(registry)])
        asyncio.run(agent.run("go"))
    assert {call_id: shown[0] for call_id, shown in script.shown[0].items()} == dict.fromkeys(
        ("s1", "s2", "x1", "x2"), "success"
    )
    assert overlapped == [False]


def test_a_call_that_cannot_run_raises_into_the_run() -> None:
    """13.1: a closed registry leaves no result to show the model."""
    script = Script([ToolCallPart("add", {"a": 1}, tool_call_id="c1")], [TextPart("never")])
    with scenario() as s:
        toolset = RegistryToolset(s.registry)
    agent = Agent(FunctionModel(script), toolsets=[toolset])  # the registry is closed now
    with pytest.raises(RegistryClosedError):
        asyncio.run(agent.run("add"))
    assert script.calls == 1 and s.observed.results == []


def test_a_cancelled_toolset_token_starts_no_body() -> None:
    stop = CancelSource()
    stop.cancel("turn over")
    script = Script([ToolCallPart("add", {"a": 1}, tool_call_id="c1")], [TextPart("ok")])
    with scenario() as s:
        toolset = RegistryToolset(s.registry, token=stop.token)
        asyncio.run(Agent(FunctionModel(script), toolsets=[toolset]).run("add"))
    assert script.shown == [{"c1": ("failed", "Error: tool call aborted before dispatch")}]
    assert s.bodies_run == []
    assert [r.code for r in s.observed.results] == [BEFORE]


def test_the_toolset_token_cancels_a_running_call() -> None:
    turn = CancelSource()
    script = Script([ToolCallPart("cooperative", {}, tool_call_id="c1")], [TextPart("stopped")])
    with scenario() as s:
        toolset = RegistryToolset(s.registry, ["cooperative"], token=turn.token)
        agent = Agent(FunctionModel(script), toolsets=[toolset])

        async def main() -> Any:
            run = asyncio.create_task(agent.run("go"))
            await wait_event(s.started)
            turn.cancel("turn over")
            return await asyncio.wait_for(run, WAIT)

        result = asyncio.run(main())
    assert result.output == "stopped"
    assert script.shown == [{"c1": ("failed", "Error: tool call aborted")}]
    assert [r.code for r in s.observed.results] == [ABORTED]
    assert s.journal.entries == ["body saw cancel"]


@pytest.mark.parametrize("body", ["cooperative", "stubborn"])
@pytest.mark.parametrize("how", ["task", "cancellation-token"])
def test_a_run_cancelled_mid_tool_returns_only_after_the_body_settled(body: str, how: str) -> None:
    script = Script([ToolCallPart(body, {}, tool_call_id="c1")], [TextPart("never")])
    with scenario() as s:
        agent = Agent(FunctionModel(script), toolsets=[RegistryToolset(s.registry)])

        async def main() -> None:
            stop = CancellationToken()
            run = asyncio.create_task(agent.run("go", cancellation_token=stop))
            await wait_event(s.started)
            if how == "task":
                run.cancel()
            else:
                stop.cancel()
            if body == "stubborn":
                assert await still_pending(run)  # pydantic-ai waits for the cancelled call
                s.release.set()
            expected = asyncio.CancelledError if how == "task" else RunCancelled
            with pytest.raises(expected) as raised:
                await asyncio.wait_for(run, WAIT)
            s.journal("run returned")
            assert s.registry.in_flight() == []
            if how == "cancellation-token":
                assert isinstance(raised.value, RunCancelled)
                assert "late" not in repr(raised.value.all_messages())

        asyncio.run(main())
    expected = ["body saw cancel", "run returned"]
    if body == "stubborn":
        expected.insert(1, "body returned")
    assert s.journal.entries == expected
    assert [r.code for r in s.observed.results] == [ABORTED]
    assert script.calls == 1  # no late success ever reached the model


def test_a_run_cancelled_while_the_model_thinks_starts_no_body() -> None:
    with scenario() as s:

        async def main() -> None:
            thinking = asyncio.Event()

            async def think(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
                thinking.set()
                await asyncio.Event().wait()  # the model never answers; the run is cancelled
                return ModelResponse(parts=[ToolCallPart("add", {"a": 1})])

            agent = Agent(FunctionModel(think), toolsets=[RegistryToolset(s.registry)])
            run = asyncio.create_task(agent.run("go"))
            await asyncio.wait_for(thinking.wait(), WAIT)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run

        asyncio.run(main())
    assert s.bodies_run == [] and s.observed.results == []


def test_misuse_is_refused_at_construction() -> None:
    with scenario() as s:
        with pytest.raises(ValueError, match="no tool named 'nope'"):
            RegistryToolset(s.registry, ["nope"])
        with pytest.raises(TypeError, match="CancelToken"):
            RegistryToolset(s.registry, token="stop")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="id must be"):
            RegistryToolset(s.registry, id=3)  # type: ignore[arg-type]
        toolset = RegistryToolset(s.registry, ["add"], id="registry")
        assert toolset.id == "registry"
        assert "add" in repr(toolset)
