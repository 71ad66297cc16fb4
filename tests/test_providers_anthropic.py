"""`toolreg.providers.anthropic` with the real `anthropic` SDK against a scripted fake API server.

Skipped without the `anthropic` extra. Whole loops, written out with `run_tool_calls` and driven
by the SDK's own tool runner over `RegistryToolset`: the model (the fake server's script) asks
for several tools, the results go back, the model answers. The server checks every request: the
next user message opens with one `tool_result` per `tool_use`, in order (`_fake_provider`), so
`server.problems == []` is the provider accepting the conversation.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("anthropic", reason="the anthropic extra is not installed")

from _adapter_helpers import Scenario, cancel_while_stubborn, scenario
from _fake_provider import FakeProvider, message_reply, run_example, serving
from _registry_helpers import ABORTED, BEFORE, WAIT
from anthropic import Anthropic, AsyncAnthropic
from anthropic.lib.tools import BetaAsyncBuiltinFunctionTool, BetaBuiltinFunctionTool
from anthropic.types import Message

from toolreg import CancelSource, CancelToken, ErrorCode, RegistryClosedError, ToolRegistry
from toolreg.providers import anthropic as tp
from toolreg.providers.anthropic import RegistryToolset

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "anthropic_loop.py"
MODEL = "fake-model"

pytestmark = pytest.mark.usefixtures("no_leaked_threads_or_fds")


def _client(server: FakeProvider) -> Anthropic:
    return Anthropic(api_key="test-key", base_url=server.base_url, max_retries=0)


def _async_client(server: FakeProvider) -> AsyncAnthropic:
    return AsyncAnthropic(api_key="test-key", base_url=server.base_url, max_retries=0)


def messages_loop(
    client: Anthropic, registry: ToolRegistry, prompt: str, token: CancelToken | None = None
) -> str:
    """The loop written out: the reply, then all its tool results in one user message."""
    messages: list[Any] = [{"role": "user", "content": prompt}]
    while True:
        message = client.messages.create(
            model=MODEL, max_tokens=100, messages=messages, tools=tp.tools(registry)
        )
        messages.append({"role": "assistant", "content": message.content})
        results = tp.run_tool_calls(registry, message, token=token)
        if not results:
            return "".join(block.text for block in message.content if block.type == "text")
        messages.append({"role": "user", "content": results})


def _results(request: dict[str, Any]) -> list[tuple[str, Any, bool]]:
    """(tool_use_id, content, is_error) of the tool results a request sent last."""
    return [
        (block["tool_use_id"], block["content"], block.get("is_error", False))
        for block in request["messages"][-1]["content"]
        if block["type"] == "tool_result"
    ]


def test_a_messages_loop_answers_every_call_and_the_model_answers(s: Scenario) -> None:
    script = [
        message_reply(
            [
                ("toolu_1", "add", {"a": 1}),
                ("toolu_2", "missing", {}),
                ("toolu_3", "add", {"a": "one"}),  # the API sends an object, maybe a wrong one
                ("toolu_4", "boom", {}),
                ("toolu_5", "add", {"a": 2, "b": 3}),
            ],
            text="Let me work that out.",
        ),
        message_reply([("toolu_6", "add", {"a": 10})]),
        message_reply(text="3, then 5, then 12"),
    ]
    with serving("anthropic", script) as server, _client(server) as client:
        answer = messages_loop(client, s.registry, "add things")
    assert server.problems == [] and answer == "3, then 5, then 12"
    assert server.requests[0]["tools"] == tp.tools(s.registry)
    assert _results(server.requests[1]) == [
        ("toolu_1", "3", False),
        ("toolu_2", "Error: unknown tool 'missing'", True),
        ("toolu_3", "Error: data.a must be integer", True),
        ("toolu_4", "Error: RuntimeError: kaput", True),
        ("toolu_5", "5", False),
    ]
    assert _results(server.requests[2]) == [("toolu_6", "12", False)]


def test_the_fake_server_refuses_a_conversation_with_an_unanswered_call(s: Scenario) -> None:
    import anthropic

    script = [message_reply([("toolu_1", "add", {"a": 1}), ("toolu_2", "add", {"a": 2})])]
    with serving("anthropic", script) as server, _client(server) as client:
        message = client.messages.create(model=MODEL, max_tokens=100, messages=[])
        results = tp.run_tool_calls(s.registry, message)[::-1]  # out of order
        messages: list[Any] = [
            {"role": "assistant", "content": message.content},
            {"role": "user", "content": results},
        ]
        with pytest.raises(anthropic.BadRequestError, match="answered by"):
            client.messages.create(model=MODEL, max_tokens=100, messages=messages)
    assert len(server.problems) == 1


def test_a_turn_cancelled_mid_batch_still_answers_every_call(s: Scenario) -> None:
    turn = CancelSource()

    @s.registry.tool(name="give_up")
    def give_up(args: Any, ctx: Any) -> str:
        turn.cancel("the user pressed stop")
        return "gave up"

    script = [
        message_reply(
            [("toolu_1", "add", {"a": 1}), ("toolu_2", "give_up", {}), ("toolu_3", "add", {"a": 2})]
        ),
        message_reply(text="stopped as asked"),
    ]
    with serving("anthropic", script) as server, _client(server) as client:
        answer = messages_loop(client, s.registry, "go", token=turn.token)
    assert server.problems == [] and answer == "stopped as asked"
    assert _results(server.requests[1]) == [
        ("toolu_1", "3", False),
        ("toolu_2", "Error: tool call aborted", True),
        ("toolu_3", "Error: tool call aborted before dispatch", True),
    ]
    assert s.bodies_run == [("add", {"a": 1})]
    assert s.observed.codes == [None, ABORTED, BEFORE]


def test_concurrency_safe_calls_overlap_in_a_loop() -> None:
    barrier = threading.Barrier(3, timeout=WAIT)  # broken, a TOOL_ERROR, unless all 3 meet
    with scenario() as s:

        @s.registry.tool(name="fetch", concurrency_safe=True)
        def fetch(args: Any, ctx: Any) -> str:
            barrier.wait()
            return f"page {args['n']}"

        calls = [(f"toolu_{n}", "fetch", {"n": n}) for n in range(3)]
        script = [message_reply(calls), message_reply(text="read all three")]
        with serving("anthropic", script) as server, _client(server) as client:
            assert messages_loop(client, s.registry, "fetch") == "read all three"
    assert server.problems == []
    assert [c for _, c, _ in _results(server.requests[1])] == ["page 0", "page 1", "page 2"]


def test_tool_calls_read_the_sdk_message_as_its_dict() -> None:
    reply = message_reply([("toolu_1", "add", {"a": 1}), ("toolu_2", "boom", {})], text="hm")
    message = Message.model_validate(reply)
    assert tp.tool_calls(message) == tp.tool_calls(reply)
    assert [(c.call_id, c.arguments) for c in tp.tool_calls(message)] == [
        ("toolu_1", {"a": 1}),
        ("toolu_2", {}),
    ]


def test_the_async_loop_answers_every_call(s: Scenario) -> None:
    async def main(server: FakeProvider) -> None:
        async with _async_client(server) as client:
            message = await client.messages.create(model=MODEL, max_tokens=100, messages=[])
            results = await tp.arun_tool_calls(s.registry, message)
            await client.messages.create(
                model=MODEL,
                max_tokens=100,
                messages=[
                    {"role": "assistant", "content": message.content},
                    {"role": "user", "content": results},
                ],
            )

    script = [
        message_reply([("toolu_1", "add", {"a": 1}), ("toolu_2", "boom", {})]),
        message_reply(text="3"),
    ]
    with serving("anthropic", script) as server:
        asyncio.run(main(server))
    assert server.problems == []
    assert _results(server.requests[1]) == [
        ("toolu_1", "3", False),
        ("toolu_2", "Error: RuntimeError: kaput", True),
    ]


def test_cancelling_the_async_turn_joins_the_bodies_before_cancelled_error(s: Scenario) -> None:
    async def main(server: FakeProvider) -> None:
        async with _async_client(server) as client:
            message = await client.messages.create(model=MODEL, max_tokens=100, messages=[])
            task = asyncio.ensure_future(tp.arun_tool_calls(s.registry, message))
            await cancel_while_stubborn(s, task)

    script = [message_reply([("toolu_1", "stubborn", {}), ("toolu_2", "add", {"a": 1})])]
    with serving("anthropic", script) as server:
        asyncio.run(main(server))
    assert s.journal.entries == ["body saw cancel", "body returned", "task cancelled"]
    assert s.observed.codes == [ABORTED, BEFORE] and s.bodies_run == []


# -- the SDK's tool runner over RegistryToolset ----------------------------------------------------


def test_the_tool_runner_drives_a_whole_loop_through_the_registry(s: Scenario) -> None:
    script = [
        message_reply(
            [("toolu_1", "add", {"a": 1}), ("toolu_2", "boom", {}), ("toolu_3", "add", {})],
            text="Working.",
        ),
        message_reply([("toolu_4", "add", {"a": 20})]),
        message_reply(text="all done"),
    ]
    toolset = RegistryToolset(s.registry, ["add", "boom"])
    with serving("anthropic", script) as server, _client(server) as client:
        runner = client.beta.messages.tool_runner(
            model=MODEL,
            max_tokens=100,
            messages=[{"role": "user", "content": "add"}],
            tools=[*toolset],
        )
        final = runner.until_done()
    assert server.problems == [] and server.pending == 0
    assert [block.text for block in final.content if block.type == "text"] == ["all done"]
    assert server.requests[0]["tools"] == tp.tools(s.registry, ["add", "boom"])
    assert _results(server.requests[1]) == [
        ("toolu_1", "3", False),
        ("toolu_2", "Error: RuntimeError: kaput", True),
        ("toolu_3", "Error: data must contain ['a'] properties", True),
    ]
    assert _results(server.requests[2]) == [("toolu_4", "22", False)]
    codes = [ErrorCode.TOOL_ERROR, ErrorCode.INVALID_ARGS, None]
    assert s.observed.codes == [None, *codes]


def test_the_tool_runner_s_calls_are_model_driven_under_the_toolset_token(s: Scenario) -> None:
    session = CancelSource()
    session.cancel("session over")
    script = [message_reply([("toolu_1", "add", {"a": 1})]), message_reply(text="ok")]
    with serving("anthropic", script) as server, _client(server) as client:
        runner = client.beta.messages.tool_runner(
            model=MODEL,
            max_tokens=100,
            messages=[{"role": "user", "content": "add"}],
            tools=RegistryToolset(s.registry, token=session.token),
        )
        runner.until_done()
    assert server.problems == []
    assert _results(server.requests[1]) == [
        ("toolu_1", "Error: tool call aborted before dispatch", True)
    ]
    assert s.observed.codes == [BEFORE] and s.bodies_run == []


def test_the_tool_runner_answers_a_tool_it_does_not_have_itself(s: Scenario) -> None:
    script = [
        message_reply([("toolu_1", "missing", {}), ("toolu_2", "add", {"a": 1})]),
        message_reply(text="ok"),
    ]
    with serving("anthropic", script) as server, _client(server) as client:
        runner = client.beta.messages.tool_runner(
            model=MODEL,
            max_tokens=100,
            messages=[{"role": "user", "content": "go"}],
            tools=[*RegistryToolset(s.registry)],
        )
        with pytest.warns(UserWarning, match="not found in tool runner"):
            runner.until_done()
    assert server.problems == []
    [(_, missing, missing_error), second] = _results(server.requests[1])
    assert missing_error is True and "not found" in missing
    assert second == ("toolu_2", "3", False)


def test_the_async_tool_runner_drives_a_loop_and_its_cancellation_joins_the_body(
    s: Scenario,
) -> None:
    async def main(server: FakeProvider) -> None:
        toolset = RegistryToolset(s.registry)
        async with _async_client(server) as client:
            runner = client.beta.messages.tool_runner(
                model=MODEL,
                max_tokens=100,
                messages=[{"role": "user", "content": "add"}],
                tools=toolset.async_tools,
            )
            final = await runner.until_done()
            assert [block.type for block in final.content] == ["text"]
            runner = client.beta.messages.tool_runner(
                model=MODEL,
                max_tokens=100,
                messages=[{"role": "user", "content": "wait"}],
                tools=toolset.async_tools,
            )
            task = asyncio.ensure_future(runner.until_done())
            await cancel_while_stubborn(s, task)

    script = [
        message_reply([("toolu_1", "add", {"a": 1}), ("toolu_2", "boom", {})]),
        message_reply(text="3"),
        message_reply([("toolu_3", "stubborn", {})]),
    ]
    with serving("anthropic", script) as server:
        asyncio.run(main(server))
    assert server.problems == [] and server.pending == 0
    assert _results(server.requests[1]) == [
        ("toolu_1", "3", False),
        ("toolu_2", "Error: RuntimeError: kaput", True),
    ]
    assert s.journal.entries[-3:] == ["body saw cancel", "body returned", "task cancelled"]
    assert s.observed.codes == [None, ErrorCode.TOOL_ERROR, ABORTED]


def test_the_toolset_gives_the_sdk_s_tool_classes_with_the_registry_definitions(
    s: Scenario,
) -> None:
    toolset = RegistryToolset(s.registry, ["stubborn", "add"])
    assert [tool.name for tool in toolset] == ["stubborn", "add"] and len(toolset) == 2
    assert all(isinstance(tool, BetaBuiltinFunctionTool) for tool in toolset.tools)
    assert all(isinstance(tool, BetaAsyncBuiltinFunctionTool) for tool in toolset.async_tools)
    definitions: list[Any] = [tool.to_dict() for tool in toolset]
    assert definitions == tp.tools(s.registry, ["stubborn", "add"])
    definitions[1]["input_schema"]["properties"].clear()
    assert toolset.tools[1].to_dict() == tp.tools(s.registry, ["add"])[0]  # a fresh copy
    assert repr(toolset) == "<RegistryToolset tools=['stubborn', 'add']>"
    assert repr(toolset.tools[1]) == "<RegistryTool 'add'>"


def test_a_toolset_tool_on_a_closed_registry_raises_what_execute_raises(s: Scenario) -> None:
    toolset = RegistryToolset(s.registry, ["add"])
    s.registry.close()
    with pytest.raises(RegistryClosedError):
        toolset.tools[0].call({"a": 1})
    assert s.observed.results == []


def test_the_toolset_refuses_misuse_when_built(s: Scenario) -> None:
    with pytest.raises(ValueError, match="no tool named 'nope'"):
        RegistryToolset(s.registry, ["nope"])
    with pytest.raises(TypeError, match="token"):
        RegistryToolset(s.registry, token="session")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ToolRegistry"):
        RegistryToolset(object())  # type: ignore[arg-type]


# -- the example ----------------------------------------------------------------------------------


def _run_example(server: FakeProvider, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "ANTHROPIC_API_KEY": "test-key",
        "ANTHROPIC_BASE_URL": server.base_url,
        "ANTHROPIC_MODEL": MODEL,
    }
    return run_example(EXAMPLE, env, *args)


@pytest.mark.parametrize("mode", [[], ["--runner"]], ids=["messages", "runner"])
def test_the_example_runs_a_loop_against_the_api(mode: list[str]) -> None:
    script = [
        message_reply(
            [
                ("toolu_1", "add", {"a": 2, "b": 3}),
                ("toolu_2", "word_count", {"text": "quiescent cancellation"}),
                ("toolu_3", "add", {"a": "two"}),
            ]
        ),
        message_reply(text="2 + 3 = 5, and that is 2 words."),
    ]
    with serving("anthropic", script) as server:
        done = _run_example(server, *mode, "What is 2 + 3?")
    assert done.returncode == 0, done.stderr
    assert server.problems == [] and server.pending == 0
    assert done.stdout.strip().endswith("2 + 3 = 5, and that is 2 words.")
    [(_, five, _), (_, two, _), (_, refusal, is_error)] = _results(server.requests[1])
    assert (five, two, is_error) == ("5", "2", True) and refusal.startswith("Error: data")
