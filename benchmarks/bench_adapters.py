"""Framework adapters: a call through each adapter against the framework's own tool runner.

The same trivial function (it returns a constant) is run both ways, in one run:

* LangChain (`toolreg[langchain]`): `as_langchain_tools(...)[0].invoke(tool_call)` against
  `@tool`'s `.invoke(tool_call)`, both returning a `ToolMessage`; and the same with `ainvoke`.
* OpenAI Agents SDK (`toolreg[openai-agents]`): `AgentToolset(...).tools[0].on_invoke_tool`
  against `function_tool(...).on_invoke_tool` (which runs a sync function on the event loop,
  no thread hop); and one whole `Runner.run` turn (a scripted model asks for the tool, then
  answers) with each tool.
* pydantic-ai (`toolreg[pydantic-ai]`): one whole `agent.run` (a `FunctionModel` asks for the
  tool, then answers) with `RegistryToolset` against the agent's own function tool (which runs
  a sync function on a worker thread).

Target: each adapter <= 1.30x its framework's own runner. The figure is the median over
interleaved rounds (`_harness.interleaved`) of the time per call, with the cyclic GC off
while timing, and the ratio the median of the per-round ratios; async variants run on one
long-lived event loop, in the main thread (the caller). A framework that is not
installed is reported as skipped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from toolreg import ToolRegistry

from . import _regime
from ._harness import (
    Rounds,
    Row,
    format_time,
    interleaved,
    start_executor_workers,
    start_registry_workers,
    timed_once,
    verdict,
)

TARGET = 1.30
ARGUMENTS: dict[str, Any] = {"q": "quiescent cancellation", "limit": 10}
WORKERS = 4

Measured = tuple[str, Rounds, str, str]  # (what, seconds per call, adapter's key, framework's)


def search(args: Any, ctx: Any) -> str:
    """The registry tool's body."""
    return "ok"


def search_kw(q: str, limit: int) -> str:
    """Search the index."""
    return "ok"


def _registry() -> ToolRegistry:
    """The registry every adapter wraps, all its workers started (in cross, on their CPU)."""
    with _regime.worker_side():
        registry = ToolRegistry(max_workers=WORKERS)
        start_registry_workers(registry, WORKERS)
    registry.tool(
        search,
        description="Search the index.",
        parameters={
            "type": "object",
            "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["q", "limit"],
        },
    )
    return registry


def _loop() -> asyncio.AbstractEventLoop:
    """An event loop whose default executor (where frameworks run sync tools) is started."""
    loop = asyncio.new_event_loop()
    with _regime.worker_side():
        executor = ThreadPoolExecutor(WORKERS)
        loop.set_default_executor(executor)
        start_executor_workers(executor, WORKERS)
    return loop


def _sync(fn: Callable[[], object], calls: int) -> Callable[[], float]:
    def workload(n: int) -> None:
        for _ in range(n):
            fn()

    return lambda: timed_once(workload, calls) / calls


def _async(
    loop: asyncio.AbstractEventLoop, fn: Callable[[], Awaitable[object]], calls: int
) -> Callable[[], float]:
    async def sequence(n: int) -> None:
        for _ in range(n):
            await fn()

    def workload(n: int) -> None:
        loop.run_until_complete(sequence(n))

    return lambda: timed_once(workload, calls) / calls


def _compare(
    variants: dict[str, Callable[[], float]], warm: Callable[[], object], repeats: int
) -> Rounds:
    with _regime.worker_side():  # a thread the warm-up starts (a framework's pool) is a worker
        warm()
    return interleaved(variants, repeats)


def _langchain(quick: bool) -> list[Measured]:
    from langchain_core.tools import tool

    from toolreg.adapters.langchain import as_langchain_tools

    calls, repeats = (200, 5) if quick else (2_000, 15)
    own = tool(search_kw, parse_docstring=False)
    own.name = "search"
    call = {"type": "tool_call", "name": "search", "args": ARGUMENTS, "id": "call-1"}
    loop = _loop()
    registry = _registry()
    try:
        [adapted] = as_langchain_tools(registry)
        medians = _compare(
            {
                "adapter invoke": _sync(lambda: adapted.invoke(call), calls),
                "own invoke": _sync(lambda: own.invoke(call), calls),
                "adapter ainvoke": _async(loop, lambda: adapted.ainvoke(call), calls),
                "own ainvoke": _async(loop, lambda: own.ainvoke(call), calls),
            },
            lambda: (
                [adapted.invoke(call) for _ in range(50)]
                + [loop.run_until_complete(adapted.ainvoke(call)) for _ in range(50)]
            ),
            repeats,
        )
    finally:
        registry.close()
        loop.close()
    return [
        ("LangChain invoke(tool_call)", medians, "adapter invoke", "own invoke"),
        ("LangChain ainvoke(tool_call)", medians, "adapter ainvoke", "own ainvoke"),
    ]


def _openai_agents(quick: bool) -> list[Measured]:
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call
    from agents.tool_context import ToolContext

    from toolreg.adapters.openai_agents import AgentToolset

    calls, repeats = (200, 5) if quick else (2_000, 15)
    turns = 20 if quick else 200
    own = function_tool(search_kw, name_override="search", strict_mode=False)
    payload = json.dumps(ARGUMENTS)
    loop = _loop()
    registry = _registry()
    config = RunConfig(tracing_disabled=True)

    def context() -> Any:
        return ToolContext(
            context=None, tool_name="search", tool_call_id="call-1", tool_arguments=payload
        )

    def turn(tool: Any) -> Callable[[], Awaitable[object]]:
        def start() -> Awaitable[object]:
            model = ScriptedModel(
                [[function_call("search", payload, call_id="call-1")], [assistant_message("ok")]]
            )
            agent = Agent(name="bench", model=model, tools=[tool])
            return Runner.run(agent, "search", run_config=config)

        return start

    try:
        [adapted] = AgentToolset(registry).tools
        medians = _compare(
            {
                "adapter invoke": _async(
                    loop, lambda: adapted.on_invoke_tool(context(), payload), calls
                ),
                "own invoke": _async(loop, lambda: own.on_invoke_tool(context(), payload), calls),
                "adapter turn": _async(loop, turn(adapted), turns),
                "own turn": _async(loop, turn(own), turns),
            },
            lambda: [loop.run_until_complete(turn(adapted)()) for _ in range(5)],
            repeats,
        )
    finally:
        registry.close()
        loop.close()
    return [
        ("Agents on_invoke_tool", medians, "adapter invoke", "own invoke"),
        ("Agents Runner.run turn", medians, "adapter turn", "own turn"),
    ]


def _pydantic_ai(quick: bool) -> list[Measured]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from toolreg.adapters.pydantic_ai import RegistryToolset

    turns, repeats = (20, 5) if quick else (200, 15)

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("search", dict(ARGUMENTS))])
        return ModelResponse(parts=[TextPart("ok")])

    loop = _loop()
    registry = _registry()
    try:
        adapted = Agent(FunctionModel(script), toolsets=[RegistryToolset(registry)])
        own = Agent(FunctionModel(script))
        own.tool_plain(name="search")(search_kw)
        medians = _compare(
            {
                "adapter": _async(loop, lambda: adapted.run("search"), turns),
                "own": _async(loop, lambda: own.run("search"), turns),
            },
            lambda: [loop.run_until_complete(adapted.run("search")) for _ in range(5)],
            repeats,
        )
    finally:
        registry.close()
        loop.close()
    return [("pydantic-ai agent.run turn", medians, "adapter", "own")]


def run(quick: bool) -> list[Row]:
    """Measure every installed framework; return the table's rows."""
    rows: list[Row] = []
    for framework, measure in (
        ("langchain", _langchain),
        ("openai-agents", _openai_agents),
        ("pydantic-ai", _pydantic_ai),
    ):
        try:
            measured = measure(quick)
        except ImportError:
            rows.append(Row(f"{framework}: not installed, skipped", "-"))
            continue
        for what, m, adapter, own in measured:
            factor = m.ratio(adapter, own)
            rows.append(Row(f"{what}, framework's own (baseline)", f"{format_time(m[own])}/call"))
            rows.append(
                Row(
                    f"{what}, toolreg adapter",
                    f"{format_time(m[adapter])}/call",
                    f"{factor:.2f}x",
                    f"<= {TARGET:.2f}x",
                    verdict(factor, TARGET),
                )
            )
    return rows


if __name__ == "__main__":
    import sys

    from .__main__ import main

    sys.exit(main(["--only", "adapters", *sys.argv[1:]]))
