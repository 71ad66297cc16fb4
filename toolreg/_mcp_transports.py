"""How `toolreg.mcp.serve` runs a server: stdio, and streamable HTTP on uvicorn.

stdio. The SDK's `stdio_server()` points fd 1 at stderr while serving, so stray output (a
tool's `print()`, a child process) misses the wire. Its stdin reader cannot be used as is: it
reads in an anyio worker thread that cannot be abandoned, so after a SIGTERM the server could
not leave `stdio_server()` until the client closed stdin, and interpreter exit would wait for
that (non-daemon) thread too. `StdinLines` reads the protocol's lines in a daemon thread of its
own, from a private duplicate of fd 0 (fd 0 itself reads from the null device while serving,
so children cannot steal protocol input), and can end the stream at once.

Shutdown is one path: EOF on stdin, or a signal (SIGTERM, SIGINT) that ends the input stream
itself. The SDK then sees EOF and cancels every request in flight; each call's source is
cancelled and its body joined; only then does `Server.run` return. From the moment the input
ends nothing more is written (`WriteGate`): the requests still in flight are not answered (the
SDK would otherwise write "Connection closed" errors for them), the connection is closing.

HTTP. uvicorn on a socket bound here (so port 0 works and the bound port is logged), with our
own signal handling: a signal marks the bridge as stopping and asks uvicorn to exit, with no
graceful wait for open streams (a streamed `tools/call` would otherwise keep the server up
until it finished by itself): uvicorn cancels the open requests, the lifespan shutdown closes
the sessions, the calls are cancelled and joined, and `serve` waits until every handler is done.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import anyio
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from ._mcp_bridge import Bridge, Connection

if TYPE_CHECKING:
    import uvicorn
    from typing_extensions import Self

__all__ = ["StdinLines", "WriteGate", "serve_http", "serve_stdio"]

logger = logging.getLogger("toolreg")


async def serve_stdio(server: Server[Connection], bridge: Bridge, lines: StdinLines) -> None:
    """Serve one stdio connection until EOF or a signal; every call joined on return."""
    async with stdio_server(stdin=cast(Any, lines)) as (read, write):
        # Once the input is over (EOF or a signal) the connection is closing: answer nothing more.
        gate = WriteGate(write, lambda: lines.ended)

        def stop() -> None:
            bridge.stopping = True
            lines.stop()

        async with anyio.create_task_group() as group:
            group.start_soon(_on_signals, stop, "stdio")
            await server.run(read, gate, server.create_initialization_options())
            group.cancel_scope.cancel()
    await bridge.wait_idle()
    logger.info("toolreg: MCP server %r stopped (stdio); every call settled", server.name)


async def serve_http(
    server: Server[Connection], bridge: Bridge, host: str, port: int, path: str
) -> None:
    """Serve streamable HTTP on uvicorn until a signal; every call joined on return."""
    import uvicorn  # here: the stdio server never needs it

    app = server.streamable_http_app(streamable_http_path=path, host=host)
    with _bound(host, port) as sock:
        bound = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            host=host,
            port=bound,
            lifespan="on",
            timeout_graceful_shutdown=0,  # cancel open streams: their calls are joined anyway
            log_level="warning",
        )
        uvicorn_server = _uvicorn_server(config)

        def stop() -> None:
            bridge.stopping = True
            uvicorn_server.should_exit = True

        where = f"[{host}]" if ":" in host else host
        logger.info("toolreg: MCP server %r at http://%s:%d%s", server.name, where, bound, path)
        async with anyio.create_task_group() as group:
            group.start_soon(_on_signals, stop, "streamable-http")
            await uvicorn_server.serve(sockets=[sock])
            group.cancel_scope.cancel()
    await bridge.wait_idle()
    logger.info("toolreg: MCP server %r stopped (streamable-http); every call settled", server.name)


def _uvicorn_server(config: uvicorn.Config) -> uvicorn.Server:
    """A uvicorn server that leaves signals to us (uvicorn re-raises them after serving)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server(config)


@contextmanager
def _bound(host: str, port: int) -> Iterator[socket.socket]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listening before the address is announced: a client that connects before uvicorn
        # serves waits in the backlog instead of being refused.
        sock.listen()
        yield sock
    finally:
        sock.close()


async def _on_signals(stop: Callable[[], None], transport: str) -> None:
    """On the first SIGTERM or SIGINT, `stop()`; later ones only say that it is stopping."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers live on the main thread: whoever runs us stops us
    try:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            stopping = False
            async for signum in signals:
                name = signal.Signals(signum).name
                if stopping:
                    logger.warning(
                        "toolreg: %s: already stopping; waiting for the calls in flight to "
                        "settle (a body is never abandoned)",
                        name,
                    )
                    continue
                stopping = True
                logger.info(
                    "toolreg: %s: stopping the MCP server (%s); cancelling and joining the "
                    "calls in flight",
                    name,
                    transport,
                )
                stop()
    except NotImplementedError:  # pragma: no cover - a loop without signal handlers (Windows)
        return


class WriteGate:
    """The server's write stream, shut to every message once `closing()` is true."""

    def __init__(self, inner: Any, closing: Callable[[], bool]) -> None:
        self._inner = inner
        self._closing = closing  # read on the event loop only

    async def send(self, item: SessionMessage, /) -> None:
        if self._closing():
            logger.debug("toolreg: connection closing, not sent: %r", item.message)
            return
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self._inner.aclose()


class StdinLines:
    """The protocol's input: the lines of fd 0, read by a daemon thread, as an async iterator.

    Construction takes fd 0 over: the lines come from a private duplicate, and fd 0 reads from
    the null device until `restore()`. One line is read per `__anext__` (no read-ahead), so a
    stopped stream loses nothing the server could have handled. `stop()` (on the event loop)
    ends the iteration at once, whatever the reading thread is blocked on; that thread and the
    duplicate are left alone afterwards (never closed under a blocked read), and the thread,
    a daemon, never holds up interpreter exit.
    """

    def __init__(self) -> None:
        self._fd = _private_duplicate(0)
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(null, 0)
        finally:
            os.close(null)
        self._file = open(self._fd, "rb", closefd=False)  # noqa: SIM115 - lives with the thread
        self._requests: queue.SimpleQueue[
            tuple[asyncio.AbstractEventLoop, asyncio.Future[bytes]] | None
        ] = queue.SimpleQueue()
        self._pending: asyncio.Future[bytes] | None = None
        self._ended = False  # EOF seen or stop() called (event loop only)
        self._thread = threading.Thread(target=self._read, name="toolreg-mcp-stdin", daemon=True)
        self._thread.start()

    @property
    def ended(self) -> bool:
        """True once EOF was read or `stop()` was called: no line will follow."""
        return self._ended

    def __aiter__(self) -> StdinLines:
        return self

    async def __anext__(self) -> str:
        if self._ended:
            raise StopAsyncIteration
        loop = asyncio.get_running_loop()
        pending: asyncio.Future[bytes] = loop.create_future()
        self._pending = pending
        self._requests.put((loop, pending))
        try:
            line = await pending
        finally:
            self._pending = None
        if not line or self._ended:
            self._ended = True
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")

    def stop(self) -> None:
        """End the input now, as if EOF had come (on the event loop); a line read later is
        dropped."""
        self._ended = True
        pending = self._pending
        if pending is not None and not pending.done():
            pending.set_result(b"")
        self._requests.put(None)  # the thread leaves after the read it may be blocked in

    def restore(self) -> None:
        """Point fd 0 back at the protocol stream (the duplicate stays open: see the class)."""
        self._requests.put(None)
        os.dup2(self._fd, 0)

    def _read(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            loop, pending = request
            try:
                line = self._file.readline()
            except (OSError, ValueError):
                line = b""
            try:
                loop.call_soon_threadsafe(_resolve, pending, line)
            except RuntimeError:  # the loop is closed: nobody reads any more
                return


def _resolve(pending: asyncio.Future[bytes], line: bytes) -> None:
    if not pending.done():
        pending.set_result(line)


def _private_duplicate(fd: int) -> int:
    """A close-on-exec duplicate of `fd` above the standard descriptors."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return os.dup(fd)
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
