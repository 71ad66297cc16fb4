"""`toolreg.providers.openai` with the real `openai` SDK against a scripted fake API server.

Skipped without the `openai` extra. Each test runs whole loops: the model (the fake server's
script) asks for several tools, the results go back, the model answers. The server checks every
request it receives: one result per tool call id, in order (`_fake_provider`), so
`server.problems == []` is the provider accepting the conversation.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai", reason="the openai extra is not installed")

from _adapter_helpers import Scenario, cancel_while_stubborn, scenario
from _fake_provider import FakeProvider, chat_reply, responses_reply, run_example, serving
from _registry_helpers import ABORTED, BEFORE, WAIT
from openai import AsyncOpenAI, OpenAI, omit
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from toolreg import CancelSource, CancelToken, ErrorCode, ToolRegistry
from toolreg.providers import openai as tp

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "openai_loop.py"
MODEL = "fake-model"

pytestmark = pytest.mark.usefixtures("no_leaked_threads_or_fds")


def _client(server: FakeProvider) -> OpenAI:
    return OpenAI(api_key="test-key", base_url=server.openai_base_url, max_retries=0)


def chat_loop(
    client: OpenAI, registry: ToolRegistry, prompt: str, token: CancelToken | None = None
) -> str | None:
    """A plain Chat Completions loop: ask, run the tool calls, send the results, repeat."""
    messages: list[Any] = [{"role": "user", "content": prompt}]
    while True:
        completion = client.chat.completions.create(
            model=MODEL, messages=messages, tools=tp.tools(registry)
        )
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content
        messages.extend(tp.run_tool_calls(registry, completion, token=token))


def responses_loop(client: OpenAI, registry: ToolRegistry, prompt: str, chained: bool) -> str:
    """A Responses loop: by `previous_response_id` (chained) or sending the whole history."""
    history: list[Any] = [{"role": "user", "content": prompt}]
    items: list[Any] = list(history)
    previous: str | None = None
    while True:
        response = client.responses.create(
            model=MODEL,
            input=items,
            tools=tp.tools(registry, api="responses"),
            previous_response_id=previous or omit,
        )
        outputs = tp.run_tool_calls(registry, response)
        if not outputs:
            return response.output_text
        history += [item.model_dump(exclude_none=True) for item in response.output] + outputs
        items, previous = (outputs, response.id) if chained else (history, None)


def test_a_chat_loop_answers_every_call_and_the_model_answers(s: Scenario) -> None:
    script = [
        chat_reply(
            [
                ("call_1", "add", '{"a": 1}'),
                ("call_2", "missing", "{}"),
                ("call_3", "add", '{"a": 1'),  # cut short: not JSON
                ("call_4", "boom", "{}"),
                ("call_5", "add", '{"a": 2, "b": 3}'),
            ]
        ),
        chat_reply([("call_6", "add", '{"a": 10}')]),
        chat_reply(text="3, then 5, then 12"),
    ]
    with serving("chat", script) as server, _client(server) as client:
        answer = chat_loop(client, s.registry, "add things")
    assert server.problems == [] and answer == "3, then 5, then 12"
    assert server.requests[0]["tools"] == tp.tools(s.registry)
    sent = [(m["tool_call_id"], m["content"]) for m in server.requests[1]["messages"][2:]]
    assert sent == [
        ("call_1", "3"),
        ("call_2", "Error: unknown tool 'missing'"),
        (
            "call_3",
            "Error: arguments: not valid JSON (Expecting ',' delimiter: line 1 column 8 (char 7)); "
            "a JSON object is expected",
        ),
        ("call_4", "Error: RuntimeError: kaput"),
        ("call_5", "5"),
    ]
    assert server.requests[2]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_6",
        "content": "12",
    }
    codes = [ErrorCode.UNKNOWN_TOOL, ErrorCode.INVALID_ARGS, ErrorCode.TOOL_ERROR, None, None]
    assert sorted(map(str, s.observed.codes)) == sorted(map(str, [None, *codes]))


@pytest.mark.parametrize("chained", [True, False], ids=["previous_response_id", "full-input"])
def test_a_responses_loop_answers_every_call(s: Scenario, chained: bool) -> None:
    script = [
        responses_reply([("fc_1", "add", '{"a": 1}'), ("fc_2", "nope", "[]")]),
        responses_reply([("fc_3", "boom", "{}")], text="one more"),
        responses_reply(text="done: 3"),
    ]
    with serving("responses", script) as server, _client(server) as client:
        answer = responses_loop(client, s.registry, "add", chained)
    assert server.problems == [] and answer == "done: 3"
    outputs = {  # the full-input loop sends each output again: the first time counts
        item["call_id"]: item["output"]
        for request in server.requests
        for item in request["input"]
        if item.get("type") == "function_call_output"
    }
    assert list(outputs.items()) == [
        ("fc_1", "3"),
        ("fc_2", "Error: arguments: must be a mapping, got list"),
        ("fc_3", "Error: RuntimeError: kaput"),
    ]
    assert ("previous_response_id" in server.requests[1]) is chained


def test_the_fake_server_refuses_a_conversation_with_an_unanswered_call(s: Scenario) -> None:
    # The check the loops pass: leave one result out and the provider refuses the request.
    import openai

    script = [chat_reply([("call_1", "add", '{"a": 1}'), ("call_2", "add", '{"a": 2}')])]
    with serving("chat", script) as server, _client(server) as client:
        completion = client.chat.completions.create(model=MODEL, messages=[])
        messages: list[Any] = [completion.choices[0].message.model_dump(exclude_none=True)]
        messages += tp.run_tool_calls(s.registry, completion)[:1]
        with pytest.raises(openai.BadRequestError, match="were not answered"):
            client.chat.completions.create(model=MODEL, messages=messages)
    assert len(server.problems) == 1


def test_a_turn_cancelled_mid_batch_still_answers_every_call(s: Scenario) -> None:
    turn = CancelSource()

    @s.registry.tool(name="give_up")
    def give_up(args: Any, ctx: Any) -> str:
        turn.cancel("the user pressed stop")
        return "gave up"

    script = [
        chat_reply(
            [
                ("call_1", "add", '{"a": 1}'),
                ("call_2", "give_up", "{}"),
                ("call_3", "add", '{"a": 2}'),
                ("call_4", "boom", "{}"),
            ]
        ),
        chat_reply(text="stopped as asked"),
    ]
    with serving("chat", script) as server, _client(server) as client:
        answer = chat_loop(client, s.registry, "go", token=turn.token)
    assert server.problems == [] and answer == "stopped as asked"
    sent = [m["content"] for m in server.requests[1]["messages"][2:]]
    assert sent == [
        "3",
        "Error: tool call aborted",
        "Error: tool call aborted before dispatch",
        "Error: tool call aborted before dispatch",
    ]
    assert s.bodies_run == [("add", {"a": 1})]  # nothing started after the cancel
    assert s.observed.codes == [None, ABORTED, BEFORE, BEFORE]


def test_concurrency_safe_calls_overlap_in_a_loop() -> None:
    barrier = threading.Barrier(3, timeout=WAIT)  # broken, a TOOL_ERROR, unless all 3 meet
    with scenario() as s:

        @s.registry.tool(name="fetch", concurrency_safe=True)
        def fetch(args: Any, ctx: Any) -> str:
            barrier.wait()
            return f"page {args['n']}"

        calls = [(f"call_{n}", "fetch", f'{{"n": {n}}}') for n in range(3)]
        script = [chat_reply(calls), chat_reply(text="read all three")]
        with serving("chat", script) as server, _client(server) as client:
            assert chat_loop(client, s.registry, "fetch") == "read all three"
    assert server.problems == []
    sent = [m["content"] for m in server.requests[1]["messages"][2:]]
    assert sent == ["page 0", "page 1", "page 2"]


def test_tool_calls_read_the_sdk_objects_as_their_dicts() -> None:
    chat = chat_reply([("call_1", "add", '{"a": 1}'), ("call_2", "add", "{oops")])
    completion = ChatCompletion.model_validate(chat)
    response = Response.model_validate(responses_reply([("fc_1", "add", "null")], text="hm"))
    assert tp.tool_calls(completion) == tp.tool_calls(chat)
    assert tp.tool_calls(completion.choices[0].message) == tp.tool_calls(chat)
    assert tp.tool_calls(response) == tp.tool_calls(response.model_dump())
    assert [c.arguments for c in tp.tool_calls(completion)] == [{"a": 1}, "{oops"]


def test_the_async_loop_answers_every_call(s: Scenario) -> None:
    async def main(server: FakeProvider) -> str | None:
        async with AsyncOpenAI(
            api_key="test-key", base_url=server.openai_base_url, max_retries=0
        ) as client:
            messages: list[Any] = [{"role": "user", "content": "add"}]
            while True:
                completion = await client.chat.completions.create(model=MODEL, messages=messages)
                message = completion.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    return message.content
                messages += await tp.arun_tool_calls(s.registry, completion)

    script = [
        chat_reply([("call_1", "add", '{"a": 1}'), ("call_2", "boom", "{}")]),
        chat_reply(text="3"),
    ]
    with serving("chat", script) as server:
        assert asyncio.run(main(server)) == "3"
    assert server.problems == []
    sent = [m["content"] for m in server.requests[1]["messages"][2:]]
    assert sent == ["3", "Error: RuntimeError: kaput"]


def test_cancelling_the_async_turn_joins_the_bodies_before_cancelled_error(s: Scenario) -> None:
    async def main(server: FakeProvider) -> None:
        async with AsyncOpenAI(
            api_key="test-key", base_url=server.openai_base_url, max_retries=0
        ) as client:
            completion = await client.chat.completions.create(model=MODEL, messages=[])
            task = asyncio.ensure_future(tp.arun_tool_calls(s.registry, completion))
            await cancel_while_stubborn(s, task)

    script = [chat_reply([("call_1", "stubborn", "{}"), ("call_2", "add", '{"a": 1}')])]
    with serving("chat", script) as server:
        asyncio.run(main(server))
    assert s.journal.entries == ["body saw cancel", "body returned", "task cancelled"]
    assert s.observed.codes == [ABORTED, BEFORE] and s.bodies_run == []


# -- the example ----------------------------------------------------------------------------------


def _run_example(server: FakeProvider, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "OPENAI_API_KEY": "test-key",
        "OPENAI_BASE_URL": server.openai_base_url,
        "OPENAI_MODEL": MODEL,
    }
    return run_example(EXAMPLE, env, *args)


def test_the_example_runs_a_chat_loop_against_the_api() -> None:
    script = [
        chat_reply(
            [
                ("call_1", "add", '{"a": 2, "b": 3}'),
                ("call_2", "word_count", '{"text": "quiescent cancellation"}'),
                ("call_3", "weather", "{}"),
            ]
        ),
        chat_reply(text="2 + 3 = 5, and that is 2 words."),
    ]
    with serving("chat", script) as server:
        done = _run_example(server, "What is 2 + 3?")
    assert done.returncode == 0, done.stderr
    assert server.problems == [] and server.pending == 0
    assert done.stdout.strip().endswith("2 + 3 = 5, and that is 2 words.")
    sent = [m["content"] for m in server.requests[1]["messages"][-3:]]
    assert sent == ["5", "2", "Error: unknown tool 'weather'"]
    assert server.requests[0]["messages"][-1] == {"role": "user", "content": "What is 2 + 3?"}


def test_the_example_runs_a_responses_loop_against_the_api() -> None:
    script = [
        responses_reply([("fc_1", "add", '{"a": 1, "b": 1}')]),
        responses_reply(text="1 + 1 = 2"),
    ]
    with serving("responses", script) as server:
        done = _run_example(server, "--api", "responses", "What is 1 + 1?")
    assert done.returncode == 0, done.stderr
    assert server.problems == [] and server.pending == 0
    assert done.stdout.strip().endswith("1 + 1 = 2")
    assert server.requests[1]["input"][-1] == {
        "type": "function_call_output",
        "call_id": "fc_1",
        "output": "2",
    }
