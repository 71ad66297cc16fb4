"""Run the tool calls of an OpenAI response through a registry (`toolreg[openai]`).

Chat Completions and Responses, one result item per tool call, always::

    from toolreg.providers import openai as tp

    completion = client.chat.completions.create(model=model, messages=messages,
                                                tools=tp.tools(registry))
    message = completion.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    messages.extend(tp.run_tool_calls(registry, completion, token=turn.token))

* `tools(registry, names=None, api="chat")`: the definitions, `{"type": "function",
  "function": {...}}` for Chat Completions, `{"type": "function", "name", "description",
  "parameters", "strict": False}` for Responses (`api="responses"`). Not strict: OpenAI's
  strict mode would demand a schema that makes every field required.
* `tool_calls(source)`: the function calls a `ChatCompletion` (its first choice), a
  `ChatCompletionMessage` or a `Response` asked for, in order, each a `ToolCall` whose
  `call_id` is OpenAI's id (`tool_call.id`, a Responses item's `call_id`).
* `run_tool_calls(registry, source, token=None, max_parallel=8)`: runs them as one
  model-driven `execute_batch` and returns exactly one item per call, in order:
  `{"role": "tool", "tool_call_id", "content"}` for a chat source, `{"type":
  "function_call_output", "call_id", "output"}` for a `Response`. The text is
  `result.content`, for successes and failures alike, so the model reads what went wrong.
* `arun_tool_calls(...)`: the same through the asyncio facade.

Sources may be the SDK's objects or plain dicts of the same shape (a conversation stored as
JSON): this module never imports the `openai` package, and works without it. Arguments that
are not valid JSON, or not a JSON object, still give a `ToolCall`, which the registry refuses
as `INVALID_ARGS` (parsing never raises on what a model sent). Only function calls are
collected: a custom tool's call (`type: "custom"`, `custom_tool_call`) and the built-in tools'
items (web search, file search, ...) belong to whoever declared those tools, since a registry
only ever declares functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from .. import CancelToken, ToolCall, ToolRegistry, ToolResult
from ..adapters._common import select_provider_tools
from ._common import (
    arun_turn,
    field,
    items_of,
    json_arguments,
    provider_id,
    run_turn,
    text_of,
)

if TYPE_CHECKING:
    from ..aio import AsyncToolRegistry

__all__ = ["arun_tool_calls", "run_tool_calls", "tool_calls", "tools"]

Api = Literal["chat", "responses"]
_Kind = Literal["chat", "responses"]  # the shape a source's result items take


def tools(
    registry: ToolRegistry, names: Iterable[str] | None = None, api: Api = "chat"
) -> list[Any]:
    """The registry's tools as OpenAI tool definitions (a fresh, JSON-serializable list).

    `names` picks tools, in that order (all of them, sorted by name, for None); unknown or
    repeated names, and names OpenAI refuses (over 64 characters, or a `.`), raise
    `ValueError`. `api` is `"chat"` (Chat Completions) or `"responses"`. Each definition
    carries the registry's advertised parameters schema. Typed `Any` so the list goes into
    the SDK's typed `tools=` parameter without a cast.

    Example::

        client.responses.create(model=model, input=items, tools=tools(registry, api="responses"))
    """
    if api not in ("chat", "responses"):
        raise ValueError(f"api must be 'chat' or 'responses', got {api!r}")
    definitions: list[Any] = []
    for selected in select_provider_tools(registry, names, "OpenAI"):
        tool = selected.tool
        function = {
            "name": tool.name,
            "description": tool.description,
            "parameters": selected.schema,
        }
        if api == "chat":
            definitions.append({"type": "function", "function": function})
        else:
            definitions.append({"type": "function", **function, "strict": False})
    return definitions


def tool_calls(source: object) -> list[ToolCall]:
    """The function calls `source` asked for, in order; `[]` when there are none.

    `source`: a `ChatCompletion` (its first choice's message), a `ChatCompletionMessage`, or
    a `Response` (the `function_call` items of its `output`), or the same as plain dicts.
    Each `ToolCall` carries OpenAI's id as its `call_id`. Arguments are parsed from their
    JSON text; text that is not JSON, or JSON that is not an object, is kept as it is and
    refused when the call runs (`INVALID_ARGS`). Raises `TypeError` only for a `source` that
    is none of these shapes (or a call without its id), never for what the model wrote.
    """
    return _read(source)[1]


def run_tool_calls(
    registry: ToolRegistry,
    source: object,
    *,
    token: CancelToken | None = None,
    max_parallel: int = 8,
) -> list[Any]:
    """Run the tool calls of `source`; exactly one result item per call, in the same order.

    The calls run as one `registry.execute_batch` (model-driven: hooks, approval, policies,
    observers, the result log and tracing see them like any other call): consecutive
    `concurrency_safe` tools overlap up to `max_parallel`, and once `token` (the turn's) is
    cancelled no further body starts. Returns only after every body that started has
    settled. Whatever happened to a call (an unknown tool, bad arguments, a denial, a
    timeout, cancellation), it has its item, whose text is `result.content`: for a chat
    source `{"role": "tool", "tool_call_id": id, "content": text}`, for a `Response`
    `{"type": "function_call_output", "call_id": id, "output": text}`. A source without
    tool calls gives `[]`. A closed registry raises `RegistryClosedError` (nothing ran).

    Example::

        messages.extend(run_tool_calls(registry, completion, token=turn.token))
    """
    kind, calls = _read(source)
    return _items(kind, calls, run_turn(registry, calls, token, max_parallel))


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
    `asyncio.CancelledError` propagates (no items: the turn was abandoned).
    """
    kind, calls = _read(source)
    return _items(kind, calls, await arun_turn(registry, calls, token, max_parallel))


def _read(source: object) -> tuple[_Kind, list[ToolCall]]:
    if field(source, "choices") is not None:  # a ChatCompletion: its first choice
        choices = items_of(field(source, "choices"), "a ChatCompletion's choices")
        message = field(choices[0], "message") if choices else None
        return "chat", [] if message is None else _chat_calls(message)
    if field(source, "output") is not None:  # a Response
        return "responses", _response_calls(field(source, "output"))
    if field(source, "role") is not None or field(source, "tool_calls") is not None:
        return "chat", _chat_calls(source)
    raise TypeError(
        "expected a ChatCompletion, a ChatCompletionMessage or a Response (or the same as a "
        f"dict), got {type(source).__name__}"
    )


def _chat_calls(message: object) -> list[ToolCall]:
    calls = []
    for item in items_of(field(message, "tool_calls"), "a message's tool_calls"):
        function = field(item, "function")
        if field(item, "type") not in (None, "function") or function is None:
            continue  # a custom tool's call
        call_id = provider_id(item, "id", "a chat tool call")
        name = text_of(function, "name")
        calls.append(ToolCall(name, json_arguments(field(function, "arguments")), call_id))
    return calls


def _response_calls(output: object) -> list[ToolCall]:
    calls = []
    for item in items_of(output, "a Response's output"):
        if field(item, "type") != "function_call":
            continue  # messages, reasoning, built-in and custom tools' items
        call_id = provider_id(item, "call_id", "a function_call item")
        name = text_of(item, "name")
        calls.append(ToolCall(name, json_arguments(field(item, "arguments")), call_id))
    return calls


def _items(kind: _Kind, calls: list[ToolCall], results: list[ToolResult[Any]]) -> list[Any]:
    if kind == "chat":
        return [
            {"role": "tool", "tool_call_id": call.call_id, "content": result.content}
            for call, result in zip(calls, results, strict=True)
        ]
    return [
        {"type": "function_call_output", "call_id": call.call_id, "output": result.content}
        for call, result in zip(calls, results, strict=True)
    ]
