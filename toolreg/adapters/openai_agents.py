"""Registry tools for the OpenAI Agents SDK (`toolreg[openai-agents]`): `AgentToolset`.

`AgentToolset(registry).tools` is a list of `FunctionTool`s to give an `Agent`. Each call runs
through the registry's pipeline as a model-driven call (`start_if_cancelled=False`) on the
asyncio facade, so the event loop is never blocked, and the model sees `result.content` for
successes and failures alike: a failed call never raises into the run. A call that could not
run at all has no result to show: with the registry closed, or its executor refusing the call,
`on_invoke_tool` raises `RegistryClosedError` or `ExecutorRefusedError`, which the SDK turns
into a `UserError` ending the run.

Cancellation. The SDK cancels the task running a tool when the run is cancelled (a cancelled
`Runner.run` task, `RunResultStreaming.cancel()`), when a sibling tool fails, and when its own
`timeout_seconds` runs out. The toolset turns that into cancelling the call's token, and the
task keeps waiting until the body has settled. On a timeout the SDK waits for that task; on
run cancellation it abandons it and returns at once, with the body possibly still running.
`await toolset.drain()` is the wait the SDK does not do: call it after a cancelled run, before
relying on the tools' side effects having stopped::

    try:
        result = await Runner.run(agent, prompt)
    finally:
        await toolset.drain()

The schema is the registry's, handed over untouched: `strict_json_schema=False` by default,
because the SDK's strict mode rewrites schemas (optional fields become required). With
`strict_json_schema=True` a tool whose schema strict mode would change raises `ValueError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterable
from typing import Any

try:
    from agents import FunctionTool
    from agents.tool_context import ToolContext
except ImportError as exc:  # the extra is not installed
    raise ImportError(
        "toolreg.adapters.openai_agents needs openai-agents: "
        "pip install 'toolreg-quiescent[openai-agents]'"
    ) from exc

from .. import CancelToken, ToolCall, ToolRegistry
from ..aio import AsyncToolRegistry
from ._common import (
    Selected,
    check_registry,
    check_token,
    parse_arguments,
    select_provider_tools,
    wait_settled,
)

__all__ = ["AgentToolset"]


class AgentToolset:
    """Registry tools as OpenAI Agents SDK `FunctionTool`s, and the wait for abandoned calls.

    `names` picks tools (all of them, sorted by name, for None; unknown, repeated, or names
    OpenAI refuses raise `ValueError`); `token` cancels every call the toolset makes. The
    tools are taken from one catalog snapshot: a tool registered later is not among them, and
    one unregistered since is an `UNKNOWN_TOOL` failure the model reads.

    Thread-safety: one toolset may serve many runs, on one or several event loops; `drain()`
    may be awaited on any loop.

    Example::

        toolset = AgentToolset(registry, ["search"])
        agent = Agent(name="assistant", tools=toolset.tools)
        try:
            result = await Runner.run(agent, "find x")
        finally:
            await toolset.drain()
    """

    def __init__(
        self,
        registry: ToolRegistry,
        names: Iterable[str] | None = None,
        token: CancelToken | None = None,
        strict_json_schema: bool = False,
    ) -> None:
        self._registry = check_registry(registry)
        self._token = check_token(token)
        if not isinstance(strict_json_schema, bool):
            raise TypeError("strict_json_schema must be a bool")
        self._facade = AsyncToolRegistry(registry)
        self._lock = threading.Lock()  # guards _abandoned
        # One per call whose task the SDK cancelled and may have abandoned; set when it settled.
        self._abandoned: set[concurrent.futures.Future[None]] = set()
        selection = select_provider_tools(registry, names, "OpenAI")
        self._tools = [self._function_tool(s, strict_json_schema) for s in selection]

    @property
    def tools(self) -> list[FunctionTool]:
        """The `FunctionTool`s, in the order of `names` (a new list each time)."""
        return list(self._tools)

    async def drain(self) -> None:
        """Wait until every call whose task the SDK cancelled has settled.

        Those calls' tokens were cancelled when their tasks were, so a cooperative body ends
        promptly; an uncooperative one is waited for, however long it takes (bound the wait
        with `asyncio.timeout` if you must). Returns at once when there is none. Calls whose
        task was not cancelled (a run still going on) are not waited for.
        """
        with self._lock:
            pending = list(self._abandoned)
        if pending:
            await asyncio.wait([asyncio.wrap_future(settled) for settled in pending])

    def _function_tool(self, selected: Selected, strict: bool) -> FunctionTool:
        name = selected.tool.name

        async def invoke(ctx: ToolContext[Any], raw_arguments: str) -> str:
            return await self._invoke(name, ctx, raw_arguments)

        tool = FunctionTool(
            name=name,
            description=selected.tool.description,
            params_json_schema=selected.schema,
            on_invoke_tool=invoke,
            strict_json_schema=strict,
        )
        if strict and tool.params_json_schema != selected.schema:
            raise ValueError(
                f"tool {name!r}: the SDK's strict mode would rewrite its schema (e.g. make "
                "optional fields required); use strict_json_schema=False, or give the tool a "
                "strict schema (every property required, additionalProperties false)"
            )
        return tool

    async def _invoke(self, name: str, ctx: ToolContext[Any], raw_arguments: str) -> str:
        call = ToolCall(name, parse_arguments(raw_arguments), call_id=ctx.tool_call_id)
        # The call runs as a task of its own, so a cancellation of ours is seen at once (not
        # only once the body has settled) and the call can be counted as abandoned before the
        # SDK walks away from us. The facade's task starts before anything can cancel ours.
        running = asyncio.ensure_future(
            self._facade.execute(call, token=self._token, start_if_cancelled=False)
        )
        try:
            result = await asyncio.shield(running)
        except asyncio.CancelledError:
            self._abandon(running)
            running.cancel()  # the facade cancels the call's token and waits for the body
            await wait_settled(running)
            if not running.cancelled():
                running.exception()  # retrieved: ours is the cancellation that propagates
            raise
        return result.content

    def _abandon(self, running: asyncio.Future[Any]) -> None:
        settled: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            self._abandoned.add(settled)

        def forget(_: object) -> None:
            with self._lock:
                self._abandoned.discard(settled)
            settled.set_result(None)

        running.add_done_callback(forget)

    def __repr__(self) -> str:
        return f"<AgentToolset tools={[tool.name for tool in self._tools]!r}>"
