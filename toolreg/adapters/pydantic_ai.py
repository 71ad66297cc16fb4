"""Registry tools for pydantic-ai (`toolreg[pydantic-ai]`): `RegistryToolset`.

`RegistryToolset(registry)` is an `AbstractToolset` to give an `Agent` (`toolsets=[...]`). Each
call runs through the registry's pipeline as a model-driven call (`start_if_cancelled=False`)
on the asyncio facade, so the event loop is never blocked.

* What the model sees is `result.content`: a success returns it; `INVALID_ARGS` raises
  `ModelRetry(result.content)`, so pydantic-ai asks the model to correct its arguments (within
  the agent's retry budget); any other failure raises `ToolFailed(result.content)`, a failed
  tool return the model adapts to. A call that could not run at all has no result: with the
  registry closed, or its executor refusing the call, `RegistryClosedError` or
  `ExecutorRefusedError` propagates and ends the run.
* The schema is the registry's, marked `strict=False` so no provider's strict mode rewrites it
  (optional fields stay optional). pydantic-ai parses the arguments' JSON but does not validate
  them: the registry does, so bad arguments reach observers as `INVALID_ARGS`. (Text that is
  not JSON at all is refused by pydantic-ai's own parser before any toolset sees it.)
* A tool whose `concurrency_safe` is not exactly True is `sequential` (it runs alone, as a
  barrier); `concurrency_safe=True` tools may overlap.
* Cancelling the run (`AgentRun.cancel()`, `RunContext.cancel()`, or the task running it)
  cancels the tool tasks; each cancels its call's token and waits until the body has settled,
  and pydantic-ai waits for those tasks, so no control returns before the bodies settled.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

try:
    from pydantic_ai import ModelRetry, RunContext, ToolFailed
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
    from pydantic_core import SchemaValidator, core_schema
except ImportError as exc:  # the extra is not installed
    raise ImportError(
        "toolreg.adapters.pydantic_ai needs pydantic-ai-slim: "
        "pip install 'toolreg-quiescent[pydantic-ai]'"
    ) from exc

from .. import CancelToken, ErrorCode, ToolCall, ToolRegistry
from ..aio import AsyncToolRegistry
from ._common import Selected, check_registry, check_token, select_tools

__all__ = ["RegistryToolset"]

# Arguments are parsed from JSON and handed on as they are: validating them is the registry's.
_PASS_THROUGH = SchemaValidator(core_schema.any_schema())


class RegistryToolset(AbstractToolset[Any]):
    """Registry tools as a pydantic-ai toolset.

    `names` picks tools (all of them, sorted by name, for None; unknown or repeated names
    raise `ValueError`); `token` cancels every call the toolset makes; `id` is the toolset's
    id (needed for durable execution, e.g. Temporal). The tools are taken from one catalog
    snapshot: a tool registered later is not among them, and one unregistered since is an
    `UNKNOWN_TOOL` failure the model reads. Each tool may be retried as often as the agent's
    `retries` allow. One toolset may serve many runs at once.

    Example::

        agent = Agent(model, toolsets=[RegistryToolset(registry, ["search"])])
        result = await agent.run("find x")
    """

    def __init__(
        self,
        registry: ToolRegistry,
        names: Iterable[str] | None = None,
        token: CancelToken | None = None,
        *,
        id: str | None = None,
    ) -> None:
        self._registry = check_registry(registry)
        self._token = check_token(token)
        if id is not None and not isinstance(id, str):
            raise TypeError(f"id must be a str or None, got {type(id).__name__}")
        self._id = id
        self._facade = AsyncToolRegistry(registry)
        self._definitions = [_definition(selected) for selected in select_tools(registry, names)]

    @property
    def id(self) -> str | None:
        """The id given to the constructor, if any."""
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """The toolset's tools, by name."""
        return {
            definition.name: ToolsetTool(
                toolset=self,
                tool_def=definition,
                max_retries=ctx.max_retries,
                args_validator=_PASS_THROUGH,
            )
            for definition in self._definitions
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        """Run the call through the registry; returns `result.content` or raises (see module)."""
        call = ToolCall(name, tool_args, call_id=ctx.tool_call_id)
        result = await self._facade.execute(call, token=self._token, start_if_cancelled=False)
        if result.ok:
            return result.content
        if result.code == ErrorCode.INVALID_ARGS:
            raise ModelRetry(result.content)
        raise ToolFailed(result.content)

    def __repr__(self) -> str:
        names = [definition.name for definition in self._definitions]
        return f"<RegistryToolset id={self._id!r} tools={names!r}>"


def _definition(selected: Selected) -> ToolDefinition:
    tool = selected.tool
    return ToolDefinition(
        name=tool.name,
        parameters_json_schema=selected.schema,
        description=tool.description or None,
        strict=False,
        sequential=tool.concurrency_safe is not True,
    )
