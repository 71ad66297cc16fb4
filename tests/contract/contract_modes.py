"""Every way a call enters, driven through public API only, each against the same model.

A driver runs a list of scenarios in one entry mode and returns what each call did
(`contract_harness.outcome_of`), after checking what the entry handed its caller against the
model's `answer` for that mode. Scenarios whose cancellation is close() get a registry each
(close() is final); the others share one, with the hooks of one shape registered at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from contract_harness import (
    ASYNC_TOOL,
    PARENT_TOOL,
    SAFE_TOOL,
    TOOL,
    WAIT,
    Bench,
    Run,
    body,
    closer,
    outcome_of,
)
from contract_model import CLOSE, ENTRY, Outcome, Scenario, answer

from toolreg import ToolCall, ToolRegistry, ToolResult
from toolreg.aio import AsyncToolRegistry

Ran = tuple[Scenario, Outcome]
SyncCall = Callable[[ToolRegistry, Run], Any]
AsyncCall = Callable[[ToolRegistry, Run], Awaitable[Any]]


def by_shape(scenarios: list[Scenario]) -> Iterator[list[Scenario]]:
    """The scenarios that need no registry of their own, grouped by the hooks they need."""
    shared = [s for s in scenarios if not closes(s)]
    for _, group in itertools.groupby(sorted(shared, key=lambda s: s.shape), lambda s: s.shape):
        yield list(group)


def closes(scenario: Scenario) -> bool:
    return scenario.by == CLOSE and scenario.site is not None


def is_result(mode: str, run: Run, returned: Any) -> None:
    """A direct, nested, batch or awaited call hands back the very result the observers saw
    (stage 8)."""
    assert returned is run.observed[0], f"{mode}: returned {returned!r}, observed another"


# -- drivers ---------------------------------------------------------------------------------------


class Driver:
    """Runs scenarios in one entry mode: `make()` a registry, `call(registry, run)` one call."""

    def __init__(
        self,
        mode: str,
        make: Callable[[], contextlib.AbstractContextManager[ToolRegistry]],
        call: SyncCall,
        body_fn: Callable[..., Any] = body,
    ) -> None:
        self.mode = mode
        self.make = make
        self.call = call
        self.body_fn = body_fn

    def run(self, scenarios: list[Scenario], clock: Any) -> list[Ran]:
        ran: list[Ran] = []
        with self.make() as registry:
            bench = Bench(registry, self.body_fn)
            for group in by_shape(scenarios):
                with bench.shaped(group[0]):
                    ran += [self.one(registry, s, clock) for s in group]
        for scenario in filter(closes, scenarios):
            with self.make() as registry:
                start, join = closer(registry)
                with Bench(registry, self.body_fn).shaped(scenario):
                    ran.append(self.one(registry, scenario, clock, start))
                join()
        return ran

    def one(self, registry: ToolRegistry, scenario: Scenario, clock: Any, close: Any = None) -> Ran:
        with Run(scenario, clock) as run:
            run.close = close
            returned = self.call(registry, run)
            is_result(self.mode, run, returned)
            return scenario, outcome_of(run)


class AsyncDriver(Driver):
    """A driver whose calls are awaited, all on one event loop."""

    def __init__(
        self,
        mode: str,
        make: Callable[[], contextlib.AbstractContextManager[ToolRegistry]],
        acall: AsyncCall,
        check: Callable[[str, Run, Any], None] = is_result,
    ) -> None:
        super().__init__(mode, make, lambda registry, run: None)
        self.acall = acall
        self.check = check

    def run(self, scenarios: list[Scenario], clock: Any) -> list[Ran]:
        return asyncio.run(self.arun(scenarios, clock))

    async def arun(self, scenarios: list[Scenario], clock: Any) -> list[Ran]:
        ran: list[Ran] = []
        with self.make() as registry:
            bench = Bench(registry, self.body_fn)
            for group in by_shape(scenarios):
                with bench.shaped(group[0]):
                    for scenario in group:
                        ran.append(await self.aone(registry, scenario, clock))
        for scenario in filter(closes, scenarios):
            with self.make() as registry:
                start, join = closer(registry)
                with Bench(registry, self.body_fn).shaped(scenario):
                    ran.append(await self.aone(registry, scenario, clock, start))
                await asyncio.to_thread(join)
        return ran

    async def aone(
        self, registry: ToolRegistry, scenario: Scenario, clock: Any, close: Any = None
    ) -> Ran:
        with Run(scenario, clock) as run:
            run.close = close
            returned = await self.acall(registry, run)
            self.check(self.mode, run, returned)  # observed already: the call has settled
            return scenario, outcome_of(run)


@contextlib.contextmanager
def own_pool() -> Iterator[ToolRegistry]:
    with ToolRegistry(max_workers=4, thread_name_prefix="contract") as registry:
        yield registry


@contextlib.contextmanager
def given_executor() -> Iterator[ToolRegistry]:
    pool = ThreadPoolExecutor(4, thread_name_prefix="contract-tpe")
    with pool, ToolRegistry(executor=pool) as registry:
        yield registry


@contextlib.contextmanager
def debug_logging() -> Iterator[ToolRegistry]:
    """The toolreg logger at DEBUG (each stage logged, B.17), its records dropped here."""
    logger = logging.getLogger("toolreg")
    level, propagate = logger.level, logger.propagate
    drop = logging.NullHandler()
    logger.addHandler(drop)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        with own_pool() as registry:
            yield registry
    finally:
        logger.removeHandler(drop)
        logger.setLevel(level)
        logger.propagate = propagate


def execute(registry: ToolRegistry, run: Run) -> ToolResult[Any]:
    return registry.execute(TOOL, run.arguments, token=run.source.token)


def execute_model_driven(registry: ToolRegistry, run: Run) -> ToolResult[Any]:
    call = ToolCall(TOOL, run.arguments)
    return registry.execute(call, token=run.source.token, start_if_cancelled=False)


def execute_call(registry: ToolRegistry, run: Run) -> ToolResult[Any]:
    return registry.execute(ToolCall(TOOL, run.arguments), token=run.source.token)


def nested(registry: ToolRegistry, run: Run) -> Any:
    registry.execute(PARENT_TOOL, {"nest": run.id}, token=run.source.token)
    return run.returned


def batch_of(tool: str) -> SyncCall:
    def batch(registry: ToolRegistry, run: Run) -> ToolResult[Any]:
        [result] = registry.execute_batch([ToolCall(tool, run.arguments)], token=run.source.token)
        return result

    return batch


def async_body(registry: ToolRegistry, run: Run) -> ToolResult[Any]:
    return registry.execute(ASYNC_TOOL, run.arguments, token=run.source.token)


async def awaited(registry: ToolRegistry, run: Run) -> ToolResult[Any]:
    return await AsyncToolRegistry(registry).execute(TOOL, run.arguments, token=run.source.token)


#: The main modes: each runs the whole enumeration.
MAIN: dict[str, Callable[[], Driver]] = {
    "execute": lambda: Driver("execute", own_pool, execute),
    "execute_executor": lambda: Driver("execute_executor", given_executor, execute_call),
    "nested": lambda: Driver("nested", own_pool, nested),
    "batch_parallel": lambda: Driver("batch_parallel", own_pool, batch_of(SAFE_TOOL)),
    "batch_exclusive": lambda: Driver("batch_exclusive", own_pool, batch_of(TOOL)),
    "awaited": lambda: AsyncDriver("awaited", own_pool, awaited),
    "async_body": lambda: Driver("async_body", own_pool, async_body),
}

#: Modes that differ from a main mode only in a flag the engine reads: a seeded sample each.
VARIANTS: dict[str, Callable[[], Driver]] = {
    "execute_model_driven": lambda: Driver("execute_model_driven", own_pool, execute_model_driven),
    "execute_debug": lambda: Driver("execute_debug", debug_logging, execute),
}


# -- the slow entries: MCP, the framework adapters, Dask ------------------------------------------


class McpDriver(Driver):
    """tools/call through the MCP server, from the SDK's in-memory client (JSON-RPC over memory
    streams). The caller is the client: it cancels a request by cancelling its own call, which
    sends notifications/cancelled. A call cancelled before entry is made to a server whose
    token is cancelled already. close() is final: not run here (the server is shared)."""

    def __init__(self) -> None:
        super().__init__("mcp", own_pool, execute)

    def run(self, scenarios: list[Scenario], clock: Any) -> list[Ran]:
        assert not any(map(closes, scenarios)), "close() is final: not on a shared server"
        return asyncio.run(self.serve(scenarios, clock))

    async def serve(self, scenarios: list[Scenario], clock: Any) -> list[Ran]:
        from mcp import Client

        from toolreg import CancelSource
        from toolreg.mcp import build_server

        stopped = CancelSource()
        stopped.cancel("the server's token was cancelled")
        ran: list[Ran] = []
        with self.make() as registry:
            bench = Bench(registry)
            live, pre = build_server(registry), build_server(registry, token=stopped.token)
            async with Client(live, mode="legacy") as client, Client(pre, mode="legacy") as late:
                for group in by_shape(scenarios):
                    with bench.shaped(group[0]):
                        for scenario in group:
                            use = late if scenario.site == ENTRY else client
                            ran.append(await self.request(use, scenario, clock))
        return ran

    async def request(self, client: Any, scenario: Scenario, clock: Any) -> Ran:
        import anyio

        with Run(scenario, clock) as run:
            scope = anyio.CancelScope()
            run.cancel_caller = cancel_on(asyncio.get_running_loop(), scope)
            reply = None
            with scope:
                reply = await client.call_tool(TOOL, run.arguments)
            await anyio.to_thread.run_sync(run.observed_event.wait, WAIT)
            outcome = outcome_of(run)
            check_mcp(run, outcome, None if scope.cancel_called else reply)
            return scenario, outcome


def cancel_on(loop: asyncio.AbstractEventLoop, scope: Any) -> Callable[[], object]:
    """The client's cancel of its own call, from a stage's thread (anyio's scope lives on the
    loop)."""
    return lambda: loop.call_soon_threadsafe(scope.cancel)


def check_mcp(run: Run, outcome: Outcome, reply: Any) -> None:
    expected = answer("mcp", outcome, run.caller_cancelled)
    if expected is None:
        assert reply is None, "a request the client cancelled was answered"
        return
    assert reply is not None, "no answer to a request the client did not cancel"
    meta = dict(reply.meta or {})
    got = {
        "isError": reply.is_error,
        "code": meta.get("toolreg/code"),
        "dispatched": meta.get("toolreg/dispatched"),
    }
    assert got == expected, f"MCP answer {got} != {expected}"


def check_langchain(mode: str, run: Run, message: Any) -> None:
    [result] = run.observed
    assert message.artifact is result, "the ToolMessage's artifact is not the observed result"
    expected = answer(mode, outcome_of(run), run.caller_cancelled)
    assert {"content": message.content, "status": message.status} == {
        **expected,
        "content": result.content,
    }


def check_content(mode: str, run: Run, content: Any) -> None:
    [result] = run.observed
    assert content == result.content, f"{mode} handed the model {content!r}"


def check_pydantic(mode: str, run: Run, returned: Any) -> None:
    [result] = run.observed
    outcome = outcome_of(run)
    expected = answer(mode, outcome, run.caller_cancelled)
    assert returned == (expected[0], result.content), f"pydantic-ai: {returned} != {expected}"


def langchain_call(run: Run) -> dict[str, Any]:
    return {"type": "tool_call", "id": f"c{run.id}", "name": TOOL, "args": run.arguments}


async def langchain_sync(registry: ToolRegistry, run: Run) -> Any:
    from toolreg.adapters.langchain import as_langchain_tools

    [tool] = as_langchain_tools(registry, [TOOL], token=run.source.token)
    return await asyncio.to_thread(tool.invoke, langchain_call(run))


async def langchain_async(registry: ToolRegistry, run: Run) -> Any:
    from toolreg.adapters.langchain import as_langchain_tools

    [tool] = as_langchain_tools(registry, [TOOL], token=run.source.token)
    return await tool.ainvoke(langchain_call(run))


async def openai_agents(registry: ToolRegistry, run: Run) -> Any:
    from agents.tool_context import ToolContext as AgentContext

    from toolreg.adapters.openai_agents import AgentToolset

    [tool] = AgentToolset(registry, [TOOL], token=run.source.token).tools
    raw = json.dumps(run.arguments)
    context = AgentContext(None, tool_name=TOOL, tool_call_id=f"c{run.id}", tool_arguments=raw)
    return await tool.on_invoke_tool(context, raw)


async def pydantic_ai(registry: ToolRegistry, run: Run) -> Any:
    from pydantic_ai import ModelRetry, RunContext, ToolFailed
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.usage import RunUsage

    from toolreg.adapters.pydantic_ai import RegistryToolset

    toolset = RegistryToolset(registry, [TOOL], token=run.source.token)
    context = RunContext(deps=None, model=TestModel(), usage=RunUsage(), tool_call_id=f"c{run.id}")
    tools = await toolset.get_tools(context)
    try:
        return ("return", await toolset.call_tool(TOOL, dict(run.arguments), context, tools[TOOL]))
    except ModelRetry as exc:
        return ("retry", exc.message)
    except ToolFailed as exc:
        return ("failed", exc.message)


@contextlib.contextmanager
def dask_registry() -> Iterator[ToolRegistry]:
    """A registry whose scenario body runs on a threads LocalCluster (one worker, two
    threads), started here and closed with the registry."""
    from distributed import Client, LocalCluster

    from toolreg.distributed import DaskBackend

    cluster = LocalCluster(  # type: ignore[no-untyped-call]
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
    )
    client = Client(cluster)  # type: ignore[no-untyped-call]
    with cluster, client, own_pool() as registry:
        DASK_BODIES[id(registry)] = DaskBackend(client).remote(body)
        try:
            yield registry
        finally:
            del DASK_BODIES[id(registry)]


DASK_BODIES: dict[int, Callable[..., Any]] = {}


class DaskDriver(Driver):
    """`execute` of a tool whose body runs on a Dask worker (14.1): the cluster is shared by
    every scenario, so close() scenarios are not run here (close() is final)."""

    def __init__(self) -> None:
        super().__init__("dask", dask_registry, execute)

    def run(self, scenarios: list[Scenario], clock: Any) -> list[Ran]:
        assert not any(map(closes, scenarios)), "close() is final: not on a shared cluster"
        ran: list[Ran] = []
        with self.make() as registry:
            bench = Bench(registry, DASK_BODIES[id(registry)])
            for group in by_shape(scenarios):
                with bench.shaped(group[0]):
                    ran += [self.one(registry, s, clock) for s in group]
        return ran


#: The slow entries, each with the extra it needs; a seeded sample each.
SLOW: dict[str, tuple[str, Callable[[], Driver]]] = {
    "mcp": ("mcp", McpDriver),
    "langchain": (
        "langchain_core",
        lambda: AsyncDriver("langchain", own_pool, langchain_sync, check_langchain),
    ),
    "langchain_async": (
        "langchain_core",
        lambda: AsyncDriver("langchain_async", own_pool, langchain_async, check_langchain),
    ),
    "openai_agents": (
        "agents",
        lambda: AsyncDriver("openai_agents", own_pool, openai_agents, check_content),
    ),
    "pydantic_ai": (
        "pydantic_ai",
        lambda: AsyncDriver("pydantic_ai", own_pool, pydantic_ai, check_pydantic),
    ),
    "dask": ("distributed", DaskDriver),
}
