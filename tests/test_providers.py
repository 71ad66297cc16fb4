"""`toolreg.providers.openai` and `.anthropic` without the SDKs: responses as plain dicts.

The dicts are the APIs' own wire format (the fake server's canned replies), so everything here
holds for a conversation stored as JSON; `test_providers_openai.py` and
`test_providers_anthropic.py` run the same functions on the real SDKs' objects, in full loops
against a fake API server. Each promise is checked for all three shapes (Chat Completions,
Responses, Anthropic Messages) where it applies: exactly one result item per tool call, in
order, whatever happened; one model-driven batch; no body started once the turn's token is
cancelled; every started body joined before the items are returned.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
from _adapter_helpers import Scenario, cancel_while_stubborn, run_python, scenario
from _fake_provider import Body, Call, chat_reply, message_reply, responses_reply
from _registry_helpers import ABORTED, BEFORE, WAIT, Caller, Journal, open_registry

from toolreg import (
    CancelSource,
    Deny,
    ErrorCode,
    RegistryClosedError,
    TimeoutPolicy,
    ToolCall,
    ToolRegistry,
)
from toolreg.aio import AsyncToolRegistry
from toolreg.providers import anthropic as anthropic_provider
from toolreg.providers import openai as openai_provider

SDKS = ("openai", "anthropic")


@dataclass(frozen=True)
class Shape:
    """One API's wire format: a response asking for calls, and reading a result item back."""

    name: str
    module: ModuleType
    reply: Callable[[Sequence[Call]], Body]
    json_text: bool  # arguments travel as JSON text (OpenAI) or as a JSON value (Anthropic)
    id_key: str
    text_key: str

    def source(self, calls: Sequence[tuple[str, str, Any]]) -> Body:
        """A response asking for `calls` ((id, name, arguments as Python))."""
        return self.reply([(cid, name, self.encode(args)) for cid, name, args in calls])

    def encode(self, arguments: Any) -> Any:
        return json.dumps(arguments) if self.json_text else arguments

    def read(self, items: list[Any]) -> list[tuple[str, str]]:
        """(provider id, text) of each result item."""
        return [(item[self.id_key], item[self.text_key]) for item in items]

    def run(self, registry: ToolRegistry, source: object, **options: Any) -> list[Any]:
        items: list[Any] = self.module.run_tool_calls(registry, source, **options)
        return items


CHAT = Shape("chat", openai_provider, chat_reply, True, "tool_call_id", "content")
RESPONSES = Shape("responses", openai_provider, responses_reply, True, "call_id", "output")
MESSAGES = Shape("anthropic", anthropic_provider, message_reply, False, "tool_use_id", "content")
SHAPES = [CHAT, RESPONSES, MESSAGES]


@pytest.fixture(params=SHAPES, ids=[shape.name for shape in SHAPES])
def shape(request: pytest.FixtureRequest) -> Shape:
    chosen: Shape = request.param
    return chosen


# -- imports ------------------------------------------------------------------------------------


def test_importing_toolreg_and_the_provider_modules_imports_no_sdk() -> None:
    done = run_python(
        f"""
        import sys
        import toolreg, toolreg.providers, toolreg.providers.openai, toolreg.providers.anthropic
        print(sorted(name for name in sys.modules if name.split(".")[0] in {SDKS!r}))
        print("toolreg.aio" in sys.modules)  # nor the asyncio facade: a sync loop needs none
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "False"]


def test_without_the_sdks_dicts_work_and_the_toolset_names_the_extra() -> None:
    done = run_python(
        """
        import sys
        sys.modules["openai"] = sys.modules["anthropic"] = None  # as if not installed
        from toolreg import ToolRegistry
        from toolreg.providers import anthropic, openai
        registry = ToolRegistry(max_workers=1)
        registry.tool(name="one")(lambda args, ctx: 1)
        call = {"id": "c1", "type": "function", "function": {"name": "one", "arguments": "{}"}}
        print(openai.run_tool_calls(registry, {"role": "assistant", "tool_calls": [call]}))
        block = {"type": "tool_use", "id": "t1", "name": "one", "input": {}}
        print(anthropic.run_tool_calls(registry, {"role": "assistant", "content": [block]}))
        try:
            anthropic.RegistryToolset(registry)
        except ImportError as exc:
            print(exc)
        registry.close()
        """
    )
    assert done.returncode == 0, done.stderr
    chat, blocks, refusal = done.stdout.strip().splitlines()
    assert chat == "[{'role': 'tool', 'tool_call_id': 'c1', 'content': '1'}]"
    assert "'tool_use_id': 't1', 'content': '1', 'is_error': False" in blocks
    assert "pip install 'toolreg-quiescent[anthropic]'" in refusal


# -- tools(): the definitions in each API's shape -----------------------------------------------


def test_tools_are_each_api_s_definition_with_the_registry_schema(s: Scenario) -> None:
    schema = s.registry.catalog().schemas("mcp")[0]["inputSchema"]
    assert openai_provider.tools(s.registry, ["add"]) == [
        {
            "type": "function",
            "function": {"name": "add", "description": "Add a and b.", "parameters": schema},
        }
    ]
    assert openai_provider.tools(s.registry, ["add"], api="responses") == [
        {
            "type": "function",
            "name": "add",
            "description": "Add a and b.",
            "parameters": schema,
            "strict": False,
        }
    ]
    assert anthropic_provider.tools(s.registry, ["add"]) == [
        {"name": "add", "description": "Add a and b.", "input_schema": schema}
    ]


def test_tools_are_all_tools_by_name_or_the_named_ones_in_order(s: Scenario) -> None:
    every = [d["function"]["name"] for d in openai_provider.tools(s.registry)]
    assert every == ["add", "boom", "cooperative", "stubborn"]
    picked = [d["name"] for d in anthropic_provider.tools(s.registry, ["stubborn", "add"])]
    assert picked == ["stubborn", "add"]


def test_tools_are_fresh_json_serializable_copies(s: Scenario) -> None:
    first = openai_provider.tools(s.registry, ["add"])
    json.dumps(first)
    first[0]["function"]["parameters"]["properties"].clear()  # a caller may change its copy
    again = openai_provider.tools(s.registry, ["add"])
    assert again[0]["function"]["parameters"]["properties"] != {}


def test_tools_refuse_unknown_names_and_names_the_providers_refuse() -> None:
    with open_registry(max_workers=1) as registry:
        registry.tool(name="ns.search")(lambda args, ctx: 1)
        registry.tool(name="ok")(lambda args, ctx: 1)
        with pytest.raises(ValueError, match=r"OpenAI refuses .*'ns\.search'"):
            openai_provider.tools(registry)
        with pytest.raises(ValueError, match=r"Anthropic refuses .*'ns\.search'"):
            anthropic_provider.tools(registry)
        assert len(openai_provider.tools(registry, ["ok"])) == 1  # only the named ones count
        with pytest.raises(ValueError, match="no tool named 'nope'"):
            anthropic_provider.tools(registry, ["nope"])
        with pytest.raises(ValueError, match="api must be"):
            openai_provider.tools(registry, api="completions")  # type: ignore[arg-type]


# -- tool_calls(): parsing never raises on what a model sent -------------------------------------


def test_tool_calls_keep_the_provider_ids_in_order(shape: Shape) -> None:
    source = shape.source([("c1", "add", {"a": 1}), ("c2", "boom", {}), ("c3", "add", {"a": 2})])
    calls = shape.module.tool_calls(source)
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [
        ("c1", "add", {"a": 1}),
        ("c2", "boom", {}),
        ("c3", "add", {"a": 2}),
    ]


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", "3", '"text"', "null"])
def test_openai_arguments_that_are_not_a_json_object_are_refused_when_run(
    s: Scenario, raw: str
) -> None:
    chat = chat_reply([("c1", "add", raw), ("c2", "add", '{"a": 1}')])
    [first, second] = openai_provider.tool_calls(chat)  # parsing never raises
    assert first.call_id == "c1" and second.arguments == {"a": 1}
    for shape in (CHAT, RESPONSES):
        items = shape.run(s.registry, shape.reply([("c1", "add", raw), ("c2", "add", '{"a": 1}')]))
        [(bad_id, refusal), good] = shape.read(items)
        assert bad_id == "c1" and refusal.startswith("Error: arguments: ")
        assert "JSON object is expected" in refusal or "must be a mapping" in refusal
        assert good == ("c2", "3")
    assert [r.code for r in s.observed.results] == [ErrorCode.INVALID_ARGS, None] * 2
    assert s.bodies_run == [("add", {"a": 1})] * 2


def test_openai_empty_arguments_mean_no_arguments(s: Scenario) -> None:
    items = openai_provider.run_tool_calls(s.registry, chat_reply([("c1", "boom", "")]))
    assert items[0]["content"] == "Error: RuntimeError: kaput"  # it ran


@pytest.mark.parametrize("tool_input", [None, [1], "{}", 7])
def test_anthropic_input_that_is_not_a_json_object_is_refused_when_run(
    s: Scenario, tool_input: Any
) -> None:
    message = message_reply([("t1", "add", tool_input)])
    assert len(anthropic_provider.tool_calls(message)) == 1
    [item] = anthropic_provider.run_tool_calls(s.registry, message)
    assert item["is_error"] is True and item["content"].startswith("Error: arguments")
    assert s.observed.codes == [ErrorCode.INVALID_ARGS] and s.bodies_run == []


def test_only_function_calls_are_collected() -> None:
    chat = chat_reply([("c1", "add", "{}")])
    chat["choices"][0]["message"]["tool_calls"].insert(
        0, {"id": "x1", "type": "custom", "custom": {"name": "grammar", "input": "text"}}
    )
    assert [c.call_id for c in openai_provider.tool_calls(chat)] == ["c1"]
    response = responses_reply([("c1", "add", "{}")], text="thinking aloud")
    response["output"][:0] = [
        {"type": "custom_tool_call", "call_id": "x1", "name": "grammar", "input": "text"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
    ]
    assert [c.call_id for c in openai_provider.tool_calls(response)] == ["c1"]
    message = message_reply([("t1", "add", {})], text="let me look")
    message["content"][:0] = [
        {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}},
        {"type": "tool_use", "id": "b1", "name": "go", "input": {}, "toolset_name": "browser"},
    ]
    assert [c.call_id for c in anthropic_provider.tool_calls(message)] == ["t1"]


def test_a_response_without_tool_calls_gives_no_calls_and_no_items(
    shape: Shape, s: Scenario
) -> None:
    answer = shape.reply([])
    assert shape.module.tool_calls(answer) == []
    assert shape.run(s.registry, answer) == []
    assert s.observed.results == []  # nothing entered the registry


def test_every_source_shape_is_read() -> None:
    chat = chat_reply([("c1", "add", "{}")])
    message = chat["choices"][0]["message"]
    assert [c.call_id for c in openai_provider.tool_calls(message)] == ["c1"]
    assert openai_provider.tool_calls({"choices": []}) == []
    assert openai_provider.tool_calls({"role": "assistant", "content": "hi"}) == []
    assert anthropic_provider.tool_calls({"role": "assistant", "content": "hi"}) == []


@pytest.mark.parametrize("module", [openai_provider, anthropic_provider])
@pytest.mark.parametrize("source", [None, "text", 3, {"id": "x"}, [1, 2]])
def test_something_that_is_not_a_response_is_a_type_error(module: ModuleType, source: Any) -> None:
    with pytest.raises(TypeError, match="expected"):
        module.tool_calls(source)


def test_a_tool_call_without_its_id_is_a_type_error() -> None:
    chat = chat_reply([("", "add", "{}")])
    with pytest.raises(TypeError, match="no 'id'"):
        openai_provider.tool_calls(chat)
    response = responses_reply([("c1", "add", "{}")])
    del response["output"][0]["call_id"]
    with pytest.raises(TypeError, match="no 'call_id'"):
        openai_provider.tool_calls(response)
    with pytest.raises(TypeError, match="no 'id'"):
        anthropic_provider.tool_calls(message_reply([(None, "add", {})]))  # type: ignore[list-item]


# -- run_tool_calls(): exactly one item per call, in order, whatever happened --------------------


def test_one_item_per_call_in_order_whatever_happened(shape: Shape) -> None:
    with scenario() as s:
        s.registry.add_around(TimeoutPolicy())
        s.registry.add_guard(lambda call: "not today" if call.name == "denied" else None)
        s.registry.tool(name="denied")(lambda args, ctx: "never")

        @s.registry.tool(name="slow", timeout=0.05)
        def slow(args: Any, ctx: Any) -> str:
            ctx.token.wait(WAIT)
            return "late"

        source = shape.source(
            [
                ("c1", "add", {"a": 1}),
                ("c2", "missing", {}),
                ("c3", "add", {"a": "one"}),
                ("c4", "denied", {}),
                ("c5", "slow", {}),
                ("c6", "boom", {}),
                ("c7", "add", {"a": 2, "b": 5}),
            ]
        )
        items = shape.run(s.registry, source)
    assert shape.read(items) == [
        ("c1", "3"),
        ("c2", "Error: unknown tool 'missing'"),
        ("c3", "Error: data.a must be integer"),
        ("c4", "Error: not today"),
        ("c5", "Error: tool call timed out after 0.05s"),
        ("c6", "Error: RuntimeError: kaput"),
        ("c7", "7"),
    ]
    codes = [r.code for r in s.observed.results]
    failures = [ErrorCode.UNKNOWN_TOOL, ErrorCode.INVALID_ARGS, ErrorCode.DENIED]
    failures += [ErrorCode.TOOL_TIMEOUT, ErrorCode.TOOL_ERROR]
    assert sorted(codes, key=str) == sorted([None, *failures, None], key=str)
    if shape is MESSAGES:
        assert [item["is_error"] for item in items] == [False, *[True] * 5, False]
    first = {
        "chat": {"role": "tool", "tool_call_id": "c1", "content": "3"},
        "responses": {"type": "function_call_output", "call_id": "c1", "output": "3"},
        "anthropic": {
            "type": "tool_result",
            "tool_use_id": "c1",
            "content": "3",
            "is_error": False,
        },
    }
    assert items[0] == first[shape.name]


def test_the_calls_run_as_one_model_driven_batch_under_the_provider_ids(shape: Shape) -> None:
    with scenario() as s:
        seen: list[tuple[str, str]] = []
        s.registry.add_pre_execute(lambda call, token: seen.append((call.call_id, call.name)))
        turn = CancelSource()
        turn.cancel("the user stopped the turn")
        source = shape.source([("c1", "add", {"a": 1}), ("c2", "add", {"a": 2})])
        items = shape.run(s.registry, source, token=turn.token)
        assert shape.read(items) == [
            ("c1", "Error: tool call aborted before dispatch"),
            ("c2", "Error: tool call aborted before dispatch"),
        ]
        assert s.observed.codes == [BEFORE, BEFORE] and seen == [] and s.bodies_run == []
        # Model-driven: a cancelled turn never reopens; a live one runs through every hook.
        items = shape.run(s.registry, source, token=CancelSource().token)
    assert shape.read(items) == [("c1", "3"), ("c2", "4")]
    assert sorted(seen) == [("c1", "add"), ("c2", "add")]  # `add` is safe: the two overlap
    assert sorted(r.call.call_id for r in s.observed.results[2:]) == ["c1", "c2"]


def test_a_turn_cancelled_mid_batch_starts_no_further_body(shape: Shape) -> None:
    turn = CancelSource()
    with scenario() as s:

        @s.registry.tool(name="stop_turn")
        def stop_turn(args: Any, ctx: Any) -> str:
            s.journal("stop_turn")
            turn.cancel("the model went off the rails")
            return "stopped"

        calls = [("c1", "add", {"a": 1}), ("c2", "stop_turn", {}), ("c3", "add", {"a": 2})]
        source = shape.source([*calls, ("c4", "boom", {})])
        items = shape.run(s.registry, source, token=turn.token)
    assert shape.read(items) == [
        ("c1", "3"),
        ("c2", "Error: tool call aborted"),  # its success came after the cancel: replaced
        ("c3", "Error: tool call aborted before dispatch"),
        ("c4", "Error: tool call aborted before dispatch"),
    ]
    assert s.journal.entries == [("add", {"a": 1}), "stop_turn"]
    assert s.observed.codes == [None, ABORTED, BEFORE, BEFORE]


def test_items_come_back_only_after_a_started_body_has_settled(shape: Shape) -> None:
    turn = CancelSource()
    with scenario() as s:
        source = shape.source([("c1", "stubborn", {}), ("c2", "add", {"a": 1})])
        caller = Caller(lambda: shape.run(s.registry, source, token=turn.token))
        assert s.started.wait(WAIT)
        turn.cancel("stop")
        assert s.saw_cancel.wait(WAIT)
        assert caller.still_blocked()  # the body ignores its token: the turn waits for it
        s.release.set()
        items = caller.join()
        assert s.journal.entries[-1] == "body returned"
    assert shape.read(items) == [
        ("c1", "Error: tool call aborted"),  # its late success never reaches the model
        ("c2", "Error: tool call aborted before dispatch"),
    ]
    assert s.bodies_run == []


def test_concurrency_safe_calls_overlap(shape: Shape) -> None:
    barrier = threading.Barrier(3, timeout=WAIT)  # broken, and a TOOL_ERROR, unless all 3 meet
    with open_registry(max_workers=4) as registry:

        @registry.tool(name="meet", concurrency_safe=True)
        def meet(args: Any, ctx: Any) -> str:
            return f"met {barrier.wait()}"

        source = shape.source([(f"c{n}", "meet", {}) for n in range(3)])
        items = shape.run(registry, source, max_parallel=3)
    texts = [text for _, text in shape.read(items)]
    assert sorted(texts) == ["met 0", "met 1", "met 2"]


def test_calls_that_are_not_concurrency_safe_run_one_at_a_time_in_order(shape: Shape) -> None:
    journal = Journal()
    with open_registry(max_workers=4) as registry:

        @registry.tool(name="step")
        def step(args: Any, ctx: Any) -> str:
            journal(("start", args["n"]))
            journal(("end", args["n"]))
            return "ok"

        shape.run(registry, shape.source([(f"c{n}", "step", {"n": n}) for n in range(4)]))
    assert journal.entries == [(edge, n) for n in range(4) for edge in ("start", "end")]


def test_repeated_provider_ids_still_get_one_item_each(shape: Shape, s: Scenario) -> None:
    source = shape.source([("dup", "add", {"a": 1}), ("dup", "add", {"a": 2})])
    items = shape.run(s.registry, source)
    assert shape.read(items) == [("dup", "3"), ("dup", "4")]
    calls = sorted((r.call.call_id, dict(r.call.arguments or {})) for r in s.observed.results)
    assert calls == [("dup", {"a": 1}), ("dup#2", {"a": 2})]  # distinct in the batch, in order


def test_misuse_is_refused_before_anything_runs(shape: Shape, s: Scenario) -> None:
    source = shape.source([("c1", "add", {"a": 1})])
    for calls in (source, shape.reply([])):  # with or without tool calls alike
        with pytest.raises(TypeError, match="token"):
            shape.run(s.registry, calls, token="turn")
        with pytest.raises(ValueError, match="max_parallel"):
            shape.run(s.registry, calls, max_parallel=0)
        with pytest.raises(TypeError, match="ToolRegistry"):
            shape.run(object(), calls)  # type: ignore[arg-type]
    assert s.observed.results == []
    s.registry.close()
    with pytest.raises(RegistryClosedError):
        shape.run(s.registry, source)


# -- arun_tool_calls(): the same through the asyncio facade ---------------------------------------


@pytest.mark.usefixtures("no_leaked_threads_or_fds")
def test_arun_tool_calls_gives_the_same_items_on_either_registry(shape: Shape) -> None:
    source = shape.source([("c1", "add", {"a": 1}), ("c2", "missing", {}), ("c3", "boom", {})])
    expected = [
        ("c1", "3"),
        ("c2", "Error: unknown tool 'missing'"),
        ("c3", "Error: RuntimeError: kaput"),
    ]

    async def main(registry: ToolRegistry) -> tuple[list[Any], list[Any], list[Any]]:
        plain = await shape.module.arun_tool_calls(registry, source)
        async with AsyncToolRegistry(registry) as areg:
            facade = await shape.module.arun_tool_calls(areg, source, max_parallel=2)
        empty = await shape.module.arun_tool_calls(registry, shape.reply([]))
        return plain, facade, empty

    with scenario() as s:
        plain, facade, empty = asyncio.run(main(s.registry))
    assert shape.read(plain) == shape.read(facade) == expected
    assert empty == []


def test_arun_tool_calls_closes_the_facade_it_made_and_only_that_one(
    shape: Shape, s: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[AsyncToolRegistry] = []
    aclose = AsyncToolRegistry.aclose

    async def recording_aclose(self: AsyncToolRegistry) -> None:
        closed.append(self)
        await aclose(self)

    monkeypatch.setattr(AsyncToolRegistry, "aclose", recording_aclose)
    source = shape.source([("c1", "add", {"a": 1})])

    before = set(threading.enumerate())

    async def main() -> None:
        await shape.module.arun_tool_calls(s.registry, source)
        made = closed[:]  # the facade made for the call: closed before the call returned
        areg = AsyncToolRegistry(s.registry)
        await shape.module.arun_tool_calls(areg, source)
        assert closed == made  # the caller's facade is the caller's to close
        assert len(made) == 1 and made[0] is not areg
        await aclose(areg)

    asyncio.run(main())
    started = set(threading.enumerate()) - before
    assert [t.name for t in started if "aio-batch" in t.name] == []  # joined by aclose()


@pytest.mark.usefixtures("no_leaked_threads_or_fds")
def test_cancelling_the_awaiting_task_cancels_the_calls_and_joins_them(shape: Shape) -> None:
    async def main(s: Scenario) -> None:
        source = shape.source([("c1", "stubborn", {}), ("c2", "add", {"a": 1})])
        task = asyncio.ensure_future(shape.module.arun_tool_calls(s.registry, source))
        await cancel_while_stubborn(s, task)

    with scenario() as s:
        asyncio.run(main(s))
    assert s.journal.entries == ["body saw cancel", "body returned", "task cancelled"]
    assert s.observed.codes == [ABORTED, BEFORE] and s.bodies_run == []


def test_arun_tool_calls_refuses_what_is_not_a_registry(shape: Shape) -> None:
    source = shape.source([("c1", "add", {"a": 1})])
    with pytest.raises(TypeError, match=r"ToolRegistry or a toolreg\.aio\.AsyncToolRegistry"):
        asyncio.run(shape.module.arun_tool_calls(object(), source))


def test_a_call_and_a_tool_call_id_are_what_observers_log(shape: Shape, s: Scenario) -> None:
    shape.run(s.registry, shape.source([("call_abc", "add", {"a": 1})]))
    [result] = s.observed.results
    assert result.call == ToolCall("add", {"a": 1}, call_id="call_abc")


def test_denials_by_a_pre_execute_hook_read_as_failures(shape: Shape, s: Scenario) -> None:
    s.registry.add_pre_execute(lambda call, token: Deny("policy says no"))
    items = shape.run(s.registry, shape.source([("c1", "add", {"a": 1})]))
    assert shape.read(items) == [("c1", "Error: policy says no")]
    assert s.observed.codes == [ErrorCode.DENIED] and s.bodies_run == []


# -- stress: random turns under random cancellation ------------------------------------------------

STRESS_ROUNDS = 30
STRESS_KINDS = ("quick", "safe", "wait", "bad", "unknown", "boom")


@pytest.mark.stress
def test_random_turns_under_random_cancellation_keep_one_item_per_call(shape: Shape) -> None:
    """Each round: a turn of 1-24 random calls (quick and concurrency-safe bodies, bodies that
    wait for their token, bad arguments, unknown tools, errors), cancelled once a random number
    of results was observed or a body started to wait for its token (an Event handshake), or
    never (then no body waits). Invariants: one item per call, in order, carrying its id and the
    text of that call's observed result; a body ran exactly for the results that say so; nothing
    still runs when the items are returned. `STRESS_SEED=<n>` replays a failure's mix."""
    seed = int(os.environ.get("STRESS_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    running = Journal()  # +1 / -1 as bodies start and end
    ran = Journal()  # call ids of the bodies that started
    enough = threading.Event()  # set: the canceller cancels the round's turn

    def body(args: Any, ctx: Any) -> str:
        running(1)
        ran(ctx.call.call_id)
        try:
            if args.get("wait"):
                enough.set()
                if not ctx.token.wait(WAIT):
                    ran("the turn was never cancelled")
            if args.get("boom"):
                raise RuntimeError("boom")
            return "ok"
        finally:
            running(-1)

    with open_registry(max_workers=4) as registry:
        registry.tool(name="work", parameters={"type": "object"})(body)
        registry.tool(name="work_safe", concurrency_safe=True)(body)
        for round_ in range(STRESS_ROUNDS):
            context = f"seed {seed}, round {round_}"
            calls, cancel_after = _random_turn(rng, f"r{round_}c")
            enough.clear()
            items, observed = _cancelled_turn(shape, registry, calls, cancel_after, enough)
            assert sum(running.entries) == 0, f"a body still runs ({context})"
            assert [cid for cid, _ in shape.read(items)] == [c for c, _, _ in calls], context
            for cid, text in shape.read(items):
                assert text == observed[cid].content, context
            dispatched = {cid for cid, result in observed.items() if result.dispatched}
            assert {cid for cid in ran.entries if cid.startswith(f"r{round_}c")} == dispatched
            before = {cid for cid, result in observed.items() if result.code == BEFORE}
            assert not before & dispatched, context
    assert "the turn was never cancelled" not in ran.entries, f"seed {seed}"


def _random_turn(rng: random.Random, prefix: str) -> tuple[list[tuple[str, str, Any]], int]:
    """Random calls, and after how many results the turn is cancelled (more than all: never)."""
    size = rng.randint(1, 24)
    cancel_after = rng.randint(0, size + 1)
    never = tuple(kind for kind in STRESS_KINDS if kind != "wait")
    kinds = STRESS_KINDS if cancel_after <= size else never
    calls = []
    for n in range(size):
        kind = rng.choice(kinds)
        name = {"safe": "work_safe", "unknown": "nowhere"}.get(kind, "work")
        args: Any = [1] if kind == "bad" else {"wait": kind == "wait", "boom": kind == "boom"}
        calls.append((f"{prefix}{n}", name, args))
    return calls, cancel_after


def _cancelled_turn(
    shape: Shape,
    registry: ToolRegistry,
    calls: list[tuple[str, str, Any]],
    cancel_after: int,
    enough: threading.Event,
) -> tuple[list[Any], dict[str, Any]]:
    """The turn's items, cancelled by another thread once `enough` is set (here, once
    `cancel_after` results were observed), and every result observed, by call id."""
    observed: dict[str, Any] = {}

    def observe(result: Any) -> None:
        observed[result.call.call_id] = result
        if len(observed) >= cancel_after:
            enough.set()

    turn = CancelSource()
    observation = registry.on_result(observe)
    canceller = Caller(lambda: enough.wait(WAIT) and turn.cancel("stop"))
    try:
        items = shape.run(registry, shape.source(calls), token=turn.token, max_parallel=4)
    finally:
        enough.set()
        canceller.join()
        observation.remove()
    return items, observed
