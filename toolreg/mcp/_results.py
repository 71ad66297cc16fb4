"""What an MCP client gets: the answer for a settled call, and the reason a cancel carries.

Everything toolreg puts on the wire goes through `escape_surrogates` or `wire_json`: the SDK's
writer fails on a surrogate code point (what `os.fsdecode` makes of a file name byte that is not
UTF-8), and the request would never be answered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import mcp_types as types
from mcp.shared.exceptions import MCPError

from .._results import ErrorCode, ToolResult
from .._text import SURROGATE, escape_surrogates

__all__ = ["RequestCancelled", "RequestId", "answer", "wire_json"]

RequestId = str | int


def wire_json(value: Any) -> Any:
    """A plain JSON copy of `value`, surrogates escaped in every string (keys too), or None if
    it is not JSON (mappings become objects)."""
    try:
        text = json.dumps(value, default=_plain, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return None
    # Unescaped, a surrogate can only stand inside a string: write it as an escaped backslash
    # and the escape's letters, which decode to the escape's text.
    return json.loads(SURROGATE.sub(lambda found: f"\\\\u{ord(found.group()):04x}", text))


@dataclass(frozen=True)
class RequestCancelled:
    """Why an MCP request's call was cancelled: the reason its token carries (not an exception).

    `cause` is `"client"` (the client sent `notifications/cancelled`, as it does on its read
    timeout; `client_reason` is the reason it stated, or None; on the per-request HTTP wire of
    2026-07-28 the client cancels by closing the request's stream, which states no reason),
    `"closed"` (the request ended without one: the client disconnected or the connection
    closed), or `"shutdown"` (`serve()` is stopping on SIGTERM or SIGINT). `str()` names the
    request and the cause::

        MCP request 7 cancelled by the client: timed out after 0.2s
    """

    request_id: RequestId
    cause: Literal["client", "closed", "shutdown"]
    client_reason: str | None = None

    def __str__(self) -> str:
        request = f"MCP request {self.request_id!r}"
        if self.cause == "client":
            stated = self.client_reason if self.client_reason else "(no reason given)"
            return f"{request} cancelled by the client: {stated}"
        if self.cause == "shutdown":
            return f"{request} cancelled: the server is shutting down"
        return f"{request} ended: the client disconnected or the connection closed"


def answer(result: ToolResult[Any]) -> types.CallToolResult:
    """The MCP answer for a settled call (the mapping in `toolreg.mcp`'s docstring)."""
    error = result.error
    if error is not None and error.code == ErrorCode.UNKNOWN_TOOL:
        raise MCPError(types.INVALID_PARAMS, escape_surrogates(error.message))
    meta: dict[str, Any] = {
        "toolreg/code": None if error is None else error.code.value,
        "toolreg/dispatched": result.dispatched,
        "toolreg/callId": result.call.call_id,
    }
    if result.contexts:
        contexts = wire_json(list(result.contexts))
        if contexts is not None:
            meta["toolreg/contexts"] = contexts
    text = escape_surrogates(result.content)
    content: list[types.ContentBlock] = [types.TextContent(type="text", text=text)]
    if error is not None:
        return types.CallToolResult(content=content, is_error=True, _meta=meta)
    structured = wire_json(result.value) if isinstance(result.value, Mapping) else None
    return types.CallToolResult(content=content, structured_content=structured, _meta=meta)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON")
