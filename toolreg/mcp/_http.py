"""Streamable HTTP: telling a `tools/call` handler that its client dropped the request's stream.

On the handshake-era wire (protocol versions before 2026-07-28) a `tools/call` is a POST whose
response is an SSE stream, inside a session that outlives it. When the client drops that
connection, the SDK stops writing the stream but keeps the request's handler running: the call
would go on until the session is deleted or times out (30 minutes), although nobody can receive
its result. The MCP specification lets a client resume a dropped stream (a GET with
`Last-Event-ID`) only when the server keeps an event store, and the SDK offers a request a
stream-close callback exactly then (`ctx.close_sse_stream`). So: a drop cancels the call when
the stream cannot be resumed, and is only logged when it can.

`StreamDrops` is ASGI middleware on every app `build_server(...).streamable_http_app()` makes
(`McpServer`): it gives each POST a `Drop`, in its ASGI scope, that fires when the client
disconnects before the response ended. It only watches what the app itself receives: the SDK's
SSE response listens for the disconnect (in JSON-response mode nothing does, and a drop goes
unnoticed). The per-request wire of 2026-07-28 needs none of this: there the SDK cancels the
handler itself when the connection drops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcp.server import Server
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["DROP_KEY", "Drop", "McpServer", "StreamDrops"]

DROP_KEY = "toolreg.mcp.drop"
"""Where a POST's `Drop` lives in its ASGI scope (the handler reads it from `ctx.request`)."""


class Drop:
    """Fires once, when the client disconnected before the POST's response ended.

    Read and written on the event loop only, so it needs no lock.
    """

    __slots__ = ("_callbacks", "dropped")

    def __init__(self) -> None:
        self.dropped = False
        self._callbacks: list[Callable[[], None]] = []

    def on_drop(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run `callback()` when the client drops (now, if it already has); returns a remover."""
        if self.dropped:
            callback()
            return _nothing
        self._callbacks.append(callback)
        return lambda: self._remove(callback)

    def fire(self) -> None:
        if self.dropped:
            return
        self.dropped = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def _remove(self, callback: Callable[[], None]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)


def _nothing() -> None:
    pass


class StreamDrops:
    """ASGI middleware: a `Drop` for every HTTP POST, fired by a disconnect before its end."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        drop = Drop()
        scope[DROP_KEY] = drop
        ended = False  # the response's last body chunk was sent

        async def watched_send(message: Message) -> None:
            nonlocal ended
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        async def watched_receive() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and not ended:
                drop.fire()
            return message

        await self.app(scope, watched_receive, watched_send)


class McpServer(Server[Any]):
    """The SDK's low-level `Server`, whose streamable HTTP apps report dropped streams."""

    def streamable_http_app(self, *args: Any, **kwargs: Any) -> Starlette:
        app = super().streamable_http_app(*args, **kwargs)
        app.add_middleware(StreamDrops)
        return app
