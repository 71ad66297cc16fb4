"""Serve a `ToolRegistry` over the Model Context Protocol (extra `toolreg[mcp]`).

`build_server(registry)` returns the official SDK's low-level `mcp.server.Server`, whose
`tools/list` is the registry's `mcp` catalog and whose `tools/call` runs a model-driven call
with toolreg's cancellation contract; `serve(registry)` runs it over stdio or streamable HTTP;
`python -m toolreg mcp package.module:registry` does that from the command line. The other
direction: `mount(registry, upstream)` registers the tools of an upstream MCP server in a
registry, and `python -m toolreg mcp --config servers.json` serves several upstreams (and an
optional local registry) as one server, a gateway.

What a client's cancel does. Everything that ends a request on the client's side cancels that
request's own `CancelSource`: `notifications/cancelled` (the client's cancel, or its read
timeout, which sends one), a disconnect, the end of the connection, server shutdown. The body
sees `ctx.token.reason`, a `RequestCancelled` whose `str()` names the request and the client's
stated reason (the per-request HTTP wire of 2026-07-28 carries none). On streamable HTTP a
client that drops a session's response stream cancels its call only if the stream cannot be
resumed (the app keeps no event store). The handler returns only after the call has settled: an
uncooperative body is waited for (never abandoned) while other requests are answered. A request
the client cancelled is never answered, and a request cancelled while waiting for
`max_concurrent_calls` runs nothing (observers still see `ABORTED_BEFORE_DISPATCH`).

Results: a success is text content (`result.content`) plus `structuredContent` when the value
is a JSON object; a failure (`INVALID_ARGS`, `DENIED`, `TOOL_ERROR`, `HOOK_ERROR`,
`TOOL_TIMEOUT`, and aborts the client did not cause) is `isError: true` with the error text; an
unknown tool is the protocol error -32602; a call that could not run at all (a closed registry,
a refusing executor) -32603. `_meta` carries
`toolreg/code` (null on success), `toolreg/dispatched`, `toolreg/callId` and, when they are
JSON, the deferred contexts as `toolreg/contexts`. A body's `ctx.report_progress` becomes
`notifications/progress` (coalesced to the latest) when the request carried a progress token,
only while the request is live.

The server runs on an asyncio event loop (calls go through `toolreg.aio`). Importing
`toolreg` never imports this package or the SDK, and importing `toolreg.mcp` loads no SDK
either: its public names load it when first used, and raise `ImportError` naming the extra
without it (so `python -m toolreg mcp --help` works without the extra).

Example::

    from toolreg import ToolRegistry
    from toolreg.mcp import serve

    registry = ToolRegistry()

    @registry.tool(description="Add two numbers")
    def add(args, ctx):
        return {"sum": args["a"] + args["b"]}

    serve(registry)   # stdio; or serve(registry, transport="streamable-http", port=8000)
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

__all__ = [
    "Mount",
    "RequestCancelled",
    "UpstreamError",
    "UpstreamToolError",
    "UpstreamUnavailable",
    "build_server",
    "mount",
    "serve",
]

if _TYPE_CHECKING:
    from ._mount import Mount as Mount
    from ._mount import mount as mount
    from ._results import RequestCancelled as RequestCancelled
    from ._server import build_server as build_server
    from ._server import serve as serve
    from ._upstream import UpstreamError as UpstreamError
    from ._upstream import UpstreamToolError as UpstreamToolError
    from ._upstream import UpstreamUnavailable as UpstreamUnavailable
else:  # hidden from type checkers, so `from toolreg.mcp import Typo` is an error

    def __getattr__(name: str) -> _Any:
        if name in __all__:
            _load()
            return globals()[name]
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _load() -> None:
    """Import the server and its SDK (`ImportError` naming the extra without it); publish the
    public names here, reporting this module as theirs."""
    from .._public import report_public
    from . import _server
    from ._mount import Mount, mount
    from ._results import RequestCancelled
    from ._upstream import UpstreamError, UpstreamToolError, UpstreamUnavailable

    found = {
        "Mount": Mount,
        "RequestCancelled": RequestCancelled,
        "UpstreamError": UpstreamError,
        "UpstreamToolError": UpstreamToolError,
        "UpstreamUnavailable": UpstreamUnavailable,
        "build_server": _server.build_server,
        "mount": mount,
        "serve": _server.serve,
    }
    for value in found.values():
        report_public(value, __name__)
    globals().update(found)  # found directly from now on
