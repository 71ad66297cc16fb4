"""What both provider modules need: reading SDK objects and dicts alike, and running one turn.

Nothing here imports a provider SDK. A response is read field by field, as an attribute of the
SDK's object or a key of a plain dict, so the two are interchangeable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import CancelToken, ToolCall, ToolRegistry, ToolResult
from .._batch import check_batch
from .._cancel import caller_token
from ..adapters._common import check_registry, parse_arguments

if TYPE_CHECKING:
    from ..aio import AsyncToolRegistry

__all__ = [
    "arun_turn",
    "field",
    "items_of",
    "json_arguments",
    "object_arguments",
    "provider_id",
    "run_turn",
    "text_of",
]


def field(source: object, name: str) -> Any:
    """`source[name]` for a mapping, `source.name` for anything else; None when absent."""
    if type(source) is dict:  # a response read from JSON: no ABC check
        return source.get(name)
    if isinstance(source, Mapping):
        return source.get(name)
    return getattr(source, name, None)


def items_of(value: object, what: str) -> Sequence[Any]:
    """A list field of a response (None reads as empty); `TypeError` for anything else."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return value
    raise TypeError(f"{what} must be a list, got {type(value).__name__}")


def provider_id(item: object, key: str, what: str) -> str:
    """The id the provider gave a tool call: the one its result item must carry back.

    The API always sets it, so a missing or empty one is a malformed response (`TypeError`),
    not something a model sent.
    """
    value = field(item, key)
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what} has no {key!r} (a non-empty str): got {value!r}")
    return value


def text_of(item: object, key: str) -> str:
    """A string field the model wrote (a tool name); anything else reads as its `str`."""
    value = field(item, key)
    return value if isinstance(value, str) else "" if value is None else str(value)


def json_arguments(raw: object) -> Any:
    """Arguments a model sent as JSON text, as Python; anything that is not a JSON object is
    handed on for the registry to refuse (`INVALID_ARGS`): parsing never raises. Empty or
    missing text means no arguments."""
    return parse_arguments(raw) if isinstance(raw, str) else raw


def object_arguments(value: object) -> Any:
    """Arguments a model sent as a JSON value (Anthropic's `input`): a null one is handed on as
    its JSON text, since a `ToolCall` reads None as `{}`; anything else as it is."""
    return "null" if value is None else value


def _distinct(calls: list[ToolCall]) -> list[ToolCall]:
    """The calls with unique call ids, as a batch needs: a repeated provider id (a malformed
    response) gets a suffix for the run; its result item still carries the provider's id."""
    seen: set[str] = set()
    distinct: list[ToolCall] = []
    for call in calls:
        call_id, n = call.call_id, 1
        while call_id in seen:
            n += 1
            call_id = f"{call.call_id}#{n}"
        seen.add(call_id)
        same = call_id == call.call_id
        distinct.append(call if same else ToolCall(call.name, call.arguments, call_id))
    return distinct


def _no_calls(token: CancelToken | None, max_parallel: int) -> list[ToolResult[Any]]:
    """A turn without tool calls runs nothing, but misuse is refused as a batch refuses it."""
    caller_token(token)
    check_batch((), max_parallel)
    return []


def run_turn(
    registry: ToolRegistry, calls: list[ToolCall], token: CancelToken | None, max_parallel: int
) -> list[ToolResult[Any]]:
    """One result per call, in order: the calls run as one model-driven `execute_batch`."""
    check_registry(registry)
    if not calls:
        return _no_calls(token, max_parallel)
    return registry.execute_batch(_distinct(calls), token=token, max_parallel=max_parallel)


async def arun_turn(
    target: ToolRegistry | AsyncToolRegistry,
    calls: list[ToolCall],
    token: CancelToken | None,
    max_parallel: int,
) -> list[ToolResult[Any]]:
    """`run_turn` through the asyncio facade; a `ToolRegistry` gets a facade for this turn.

    Cancelling the awaiting task cancels the batch and waits until every started body has
    settled (the facade's contract), then `asyncio.CancelledError` propagates.
    """
    from ..aio import AsyncToolRegistry  # here: a sync loop never starts the facade's helper

    if not isinstance(target, (ToolRegistry, AsyncToolRegistry)):
        raise TypeError(
            "expected a toolreg.ToolRegistry or a toolreg.aio.AsyncToolRegistry, "
            f"got {type(target).__name__}"
        )
    if not calls:
        return _no_calls(token, max_parallel)
    batch = _distinct(calls)
    if isinstance(target, AsyncToolRegistry):
        return await target.execute_batch(batch, token=token, max_parallel=max_parallel)
    facade = AsyncToolRegistry(target)
    try:
        return await facade.execute_batch(batch, token=token, max_parallel=max_parallel)
    finally:
        await facade.aclose()  # its batch scheduler's threads: the batch has settled by now
