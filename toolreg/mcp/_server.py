"""`build_server` and `serve`: a registry behind the SDK's low-level `Server` (see the package
docstring, `toolreg.mcp`, for what they promise). Importing this module imports the MCP SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any, Literal

try:
    import anyio
    import mcp_types as types
    from mcp.server import Server
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "toolreg.mcp needs the MCP SDK: pip install 'toolreg-quiescent[mcp]'"
    ) from exc

from .. import ToolRegistry, _validate  # the public class, through the package (it loads with it)
from .._cancel import CancelToken
from .._text import escape_surrogates
from ._bridge import Bridge, Connection
from ._http import McpServer

__all__ = ["build_server", "serve"]

Transport = Literal["stdio", "streamable-http"]


def build_server(
    registry: ToolRegistry,
    name: str = "toolreg",
    version: str | None = None,
    instructions: str | None = None,
    token: CancelToken | None = None,
    max_concurrent_calls: int = 32,
) -> Server[Connection]:
    """An MCP low-level `Server` that serves `registry`'s tools; see `toolreg.mcp`.

    `version=None` advertises toolreg's own version. `token` cancels every call (each request
    runs under a child of it). `max_concurrent_calls` bounds the calls in the registry at once
    (an int >= 1: `TypeError` for another type, a `bool` included, `ValueError` below 1);
    later requests wait for admission, and one cancelled while waiting runs nothing. The server
    never closes the registry. Run it on an asyncio event loop, with `server.run(read, write,
    options)` or `server.streamable_http_app()`; `serve(registry)` builds its own and runs it.
    """
    server, _ = _build(registry, name, version, instructions, token, max_concurrent_calls)
    return server


def serve(
    registry: ToolRegistry,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    path: str = "/mcp",
    *,
    allowed_hosts: Iterable[str] = (),
    allowed_origins: Iterable[str] = (),
    **build_kw: Any,
) -> None:
    """Serve `registry` over MCP until stopped; blocks. `build_kw` goes to `build_server`.

    `"stdio"`: the protocol runs on the process's stdin and stdout; while serving, fd 0 reads
    from the null device and fd 1 writes to stderr, so a tool's `print()` or a child process's
    output never corrupts the stream. EOF on stdin, SIGTERM, SIGINT or a client that stopped
    reading cancels every call in flight and joins it (those requests are not answered: the
    connection is closing), then `serve` returns. A line that cannot be read is answered with an
    error (for its id when it can be read). `"streamable-http"`: uvicorn on `host:port`
    (127.0.0.1 by default) at `path`; SIGTERM or SIGINT cancels and joins the calls, then stops
    the server. Signals are handled only when `serve` runs on the main thread. Never closes the
    registry. Call it from synchronous code (it runs its own event loop); inside a loop use
    `build_server`. A `port` that is not an int is a `TypeError`, one outside 0..65535 a
    `ValueError`, raised before anything runs.

    HTTP requests are checked against DNS rebinding, whatever the bind address: one whose
    `Origin` (a browser's page) is not a loopback origin or one of `allowed_origins` is refused
    with 403, one whose `Host` is not a loopback name, the bind address or one of
    `allowed_hosts` (a host without a port matches any port) with 421. Binding beyond loopback
    logs a warning saying what is exposed to whom.
    """
    if transport not in ("stdio", "streamable-http"):
        raise ValueError(f"transport must be 'stdio' or 'streamable-http', got {transport!r}")
    if transport == "streamable-http":
        _check_http(host, port, path)
    hosts = _allowed(allowed_hosts, "allowed_hosts")
    origins = _allowed(allowed_origins, "allowed_origins")
    server, bridge = _build(registry, **build_kw)
    from . import _transports

    if transport == "stdio":
        from ._stdio import StdinLines, StdoutLines

        lines = StdinLines()  # takes fd 0 over until restore()
        try:
            out = StdoutLines()  # takes fd 1 over until restore()
            try:
                anyio.run(_transports.serve_stdio, server, bridge, lines, out, backend="asyncio")
            finally:
                out.restore()
        finally:
            lines.restore()
    else:
        serve_http = _transports.serve_http
        anyio.run(serve_http, server, bridge, host, port, path, hosts, origins, backend="asyncio")


def _build(
    registry: ToolRegistry,
    name: str = "toolreg",
    version: str | None = None,
    instructions: str | None = None,
    token: CancelToken | None = None,
    max_concurrent_calls: int = 32,
) -> tuple[Server[Connection], Bridge]:
    if not isinstance(registry, ToolRegistry):
        raise TypeError(f"build_server() serves a ToolRegistry, got {type(registry).__name__}")
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty str")
    if version is not None and not isinstance(version, str):
        raise TypeError("version must be a str or None")
    if instructions is not None and not isinstance(instructions, str):
        raise TypeError("instructions must be a str or None")
    if token is not None and not isinstance(token, CancelToken):
        raise TypeError(f"token must be a CancelToken or None, got {type(token).__name__}")
    _validate.count(max_concurrent_calls, "max_concurrent_calls")
    bridge = Bridge(registry, token, max_concurrent_calls)

    @asynccontextmanager
    async def connection(server: Server[Connection]) -> AsyncIterator[Connection]:
        yield Connection()  # one per Server.run (a stdio or in-memory connection), one per app

    server: Server[Connection] = McpServer(
        escape_surrogates(name),  # argv, say, may hold text UTF-8 cannot carry
        version=escape_surrogates(version) if version is not None else _own_version(),
        instructions=escape_surrogates(instructions) if instructions is not None else None,
        lifespan=connection,
        get_tool_input_schema=bridge.input_schema,
        on_list_tools=bridge.list_tools,
        on_call_tool=bridge.call_tool,
    )
    server.add_notification_handler(
        "notifications/cancelled", types.CancelledNotificationParams, bridge.on_cancelled
    )
    return server, bridge


def _own_version() -> str:
    import toolreg

    return toolreg.__version__  # the distribution's version, from its metadata


def _check_http(host: object, port: object, path: object) -> None:
    if not isinstance(host, str) or not host:
        raise ValueError(f"host must be a non-empty str, got {host!r}")
    _validate.count(port, "port", minimum=0, maximum=65535, hint="0: any free port")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"path must be a str starting with '/', got {path!r}")


def _allowed(values: object, what: str) -> tuple[str, ...]:
    """`values` as a tuple of non-empty str (a bare str is refused: it is not a list of names)."""
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be an iterable of str, got {type(values).__name__}")
    found = tuple(values)
    for value in found:
        if not isinstance(value, str) or not value.strip() or value != value.strip():
            raise ValueError(f"{what} must hold non-empty str, unpadded; got {value!r}")
    return found
