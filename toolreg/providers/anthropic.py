"""Run the tool calls of an Anthropic message through a registry (`toolreg[anthropic]`).

Messages, one `tool_result` per `tool_use`, always::

    from toolreg.providers import anthropic as tp

    message = client.messages.create(model=model, max_tokens=1024, messages=messages,
                                     tools=tp.tools(registry))
    messages.append({"role": "assistant", "content": message.content})
    results = tp.run_tool_calls(registry, message, token=turn.token)
    if results:
        messages.append({"role": "user", "content": results})

* `tools(registry, names=None)`: the definitions, `{"name", "description", "input_schema"}`.
* `tool_calls(source)`: the `tool_use` blocks of a `Message` (or the same as a dict), in
  order, each a `ToolCall` whose `call_id` is the block's id.
* `run_tool_calls(registry, source, token=None, max_parallel=8)`: runs them as one
  model-driven `execute_batch` and returns exactly one `{"type": "tool_result", "tool_use_id",
  "content", "is_error"}` block per call, in order (`is_error` true for every failure). Send
  them together, as the content of one `user` message.
* `arun_tool_calls(...)`: the same through the asyncio facade.
* `RegistryToolset(registry, names=None, token=None)`: the registry's tools for the SDK's tool
  runner, `client.beta.messages.tool_runner(tools=[*toolset], ...)` (`toolset.async_tools` for
  an `AsyncAnthropic` client's runner). Every call goes through the registry as a model-driven
  call under `token`.

This module does not import the `anthropic` package: sources may be the SDK's objects or plain
dicts of the same shape, with or without the SDK installed. Only `RegistryToolset` needs it,
and raises `ImportError` naming the extra without it. Only client tools' calls are collected:
`server_tool_use` blocks run on Anthropic's side, and a `tool_use` block carrying a
`toolset_name` (a browser or computer toolset's member) is that toolset's to answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .. import CancelToken, ToolCall, ToolRegistry, ToolResult
from ..adapters._common import Selected, check_registry, check_token, select_provider_tools
from ._common import arun_turn, field, items_of, object_arguments, provider_id, run_turn, text_of

if TYPE_CHECKING:
    from ..aio import AsyncToolRegistry
    from ._anthropic_runner import AsyncRegistryTool, RegistryTool

__all__ = ["RegistryToolset", "arun_tool_calls", "run_tool_calls", "tool_calls", "tools"]


def tools(registry: ToolRegistry, names: Iterable[str] | None = None) -> list[Any]:
    """The registry's tools as Anthropic tool definitions (a fresh, JSON-serializable list).

    `names` picks tools, in that order (all of them, sorted by name, for None); unknown or
    repeated names, and names Anthropic refuses (over 64 characters, or a `.`), raise
    `ValueError`. Typed `Any` so the list goes into the SDK's typed `tools=` parameter
    without a cast.

    Example::

        client.messages.create(model=model, max_tokens=1024, messages=messages,
                               tools=tools(registry))
    """
    return [_definition(s) for s in select_provider_tools(registry, names, "Anthropic")]


def _definition(selected: Selected) -> dict[str, Any]:
    tool = selected.tool
    return {"name": tool.name, "description": tool.description, "input_schema": selected.schema}


def tool_calls(source: object) -> list[ToolCall]:
    """The client tool calls (`tool_use` blocks) `source` asked for, in order.

    `source`: a `Message` (a `BetaMessage` too) or a message as a dict (`{"role":
    "assistant", "content": [...]}`); string content has no tool calls. Each `ToolCall`
    carries the block's `id` as its `call_id` and its `input` as arguments: an input that is
    not a JSON object (null included) is refused when the call runs (`INVALID_ARGS`).
    Raises `TypeError` only for a `source` that is not a message (or a block without its
    id), never for what the model wrote.
    """
    if isinstance(source, (str, bytes)) or field(source, "content") is None:
        raise TypeError(
            f"expected an Anthropic Message (or a message as a dict), got {type(source).__name__}"
        )
    content = field(source, "content")
    if isinstance(content, str):
        return []
    calls = []
    for block in items_of(content, "a message's content"):
        if field(block, "type") != "tool_use" or field(block, "toolset_name") is not None:
            continue
        call_id = provider_id(block, "id", "a tool_use block")
        arguments = object_arguments(field(block, "input"))
        calls.append(ToolCall(text_of(block, "name"), arguments, call_id))
    return calls


def run_tool_calls(
    registry: ToolRegistry,
    source: object,
    *,
    token: CancelToken | None = None,
    max_parallel: int = 8,
) -> list[Any]:
    """Run the tool calls of `source`; exactly one `tool_result` block per call, in order.

    The calls run as one `registry.execute_batch` (model-driven: hooks, approval, policies,
    observers, the result log and tracing see them like any other call): consecutive
    `concurrency_safe` tools overlap up to `max_parallel`, and once `token` (the turn's) is
    cancelled no further body starts. Returns only after every body that started has
    settled. Whatever happened to a call, it has its block: `{"type": "tool_result",
    "tool_use_id": id, "content": result.content, "is_error": not result.ok}`. A message
    without tool calls gives `[]`. A closed registry raises `RegistryClosedError`.

    Example::

        results = run_tool_calls(registry, message, token=turn.token)
        messages.append({"role": "user", "content": results})
    """
    calls = tool_calls(source)
    return _blocks(calls, run_turn(registry, calls, token, max_parallel))


async def arun_tool_calls(
    registry: ToolRegistry | AsyncToolRegistry,
    source: object,
    *,
    token: CancelToken | None = None,
    max_parallel: int = 8,
) -> list[Any]:
    """`run_tool_calls` through the asyncio facade: the event loop is never blocked.

    `registry` is a `ToolRegistry` (a facade is made for the call and closed after it) or an
    `AsyncToolRegistry` (pass one to reuse its threads across turns). Cancelling the awaiting
    task cancels the calls and waits until every started body has settled, then
    `asyncio.CancelledError` propagates.
    """
    calls = tool_calls(source)
    return _blocks(calls, await arun_turn(registry, calls, token, max_parallel))


def _blocks(calls: list[ToolCall], results: list[ToolResult[Any]]) -> list[Any]:
    return [
        {
            "type": "tool_result",
            "tool_use_id": call.call_id,
            "content": result.content,
            "is_error": not result.ok,
        }
        for call, result in zip(calls, results, strict=True)
    ]


class RegistryToolset:
    """Registry tools for the Anthropic SDK's tool runner (`client.beta.messages.tool_runner`).

    Iterating it gives one runnable tool per registry tool (the SDK's `BetaBuiltinFunctionTool`),
    for a sync `Anthropic` client's runner; `async_tools` gives the same for an
    `AsyncAnthropic` client's. `names` picks tools (all of them, sorted by name, for None;
    unknown or repeated names, and names Anthropic refuses, raise `ValueError`); `token`
    cancels every call the toolset makes (e.g. a session's or a turn's).

    Each call runs through the registry as a model-driven call (`start_if_cancelled=False`):
    hooks, approval, policies and observers see it, a call made after `token` is cancelled
    never starts its body, and the runner gets the call back only once its body has settled
    (cancelling the task awaiting an async tool cancels the call and waits for it). A success
    returns `result.content`; a failure raises the SDK's `ToolError` with `result.content`, so
    the runner sends an `is_error` result the model reads. The runner runs a turn's calls one
    at a time and does not hand a tool the `tool_use` id, so call ids are toolreg's own; for
    overlapping `concurrency_safe` calls, drive the loop with `run_tool_calls` instead. The
    tools are taken from one catalog snapshot. Thread-safe; one toolset may serve many runs.

    Example::

        toolset = RegistryToolset(registry, token=session.token)
        runner = client.beta.messages.tool_runner(
            model=model, max_tokens=1024, messages=messages, tools=[*toolset]
        )
        final = runner.until_done()
    """

    def __init__(
        self,
        registry: ToolRegistry,
        names: Iterable[str] | None = None,
        token: CancelToken | None = None,
    ) -> None:
        from ..aio import AsyncToolRegistry
        from . import _anthropic_runner as runner  # the SDK: ImportError names the extra

        self._registry = check_registry(registry)
        self._token = check_token(token)
        selection = select_provider_tools(registry, names, "Anthropic")
        facade = AsyncToolRegistry(registry)
        definitions = [_definition(selected) for selected in selection]
        self._tools = tuple(runner.RegistryTool(d, registry, self._token) for d in definitions)
        self._async_tools = tuple(
            runner.AsyncRegistryTool(d, facade, self._token) for d in definitions
        )

    @property
    def tools(self) -> list[RegistryTool]:
        """The tools for a sync client's tool runner, in the order of `names` (a new list)."""
        return list(self._tools)

    @property
    def async_tools(self) -> list[AsyncRegistryTool]:
        """The same tools for an `AsyncAnthropic` client's tool runner (a new list)."""
        return list(self._async_tools)

    def __iter__(self) -> Iterator[RegistryTool]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"<RegistryToolset tools={[tool.name for tool in self._tools]!r}>"
