"""How `toolreg.mcp.serve` runs a server: stdio, and streamable HTTP on uvicorn.

stdio. The wire is toolreg's own (`_stdio`: why the SDK's `stdio_server()` is not used).
Shutdown is one path: EOF on stdin, a signal (SIGTERM, SIGINT) that ends the input stream
itself, or a client that stopped reading (the writer ends the input). The SDK then sees EOF and
cancels every request in flight; each call's source is cancelled and its body joined; only then
does `Server.run` return. From the moment the input ends nothing more is written (`WriteGate`):
the requests still in flight are not answered (the SDK would otherwise write "Connection
closed" errors for them), the connection is closing.

HTTP. uvicorn on a socket bound here (so port 0 works and the bound port is logged), with our
own signal handling: a signal marks the bridge as stopping and asks uvicorn to exit, with no
graceful wait for open streams (a streamed `tools/call` would otherwise keep the server up
until it finished by itself): uvicorn cancels the open requests, the lifespan shutdown closes
the sessions, the calls are cancelled and joined, and `serve` waits until every handler is done.
The SDK's DNS-rebinding protection (`Host` and `Origin` checks) is on whatever the bind address
(`transport_security`); the SDK itself turns it on only for a loopback one.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server import Server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import SessionMessage

from ._bridge import Bridge, Connection
from ._stdio import StdinLines, StdoutLines, stdio_streams

if TYPE_CHECKING:
    import uvicorn
    from typing_extensions import Self

__all__ = ["WriteGate", "is_loopback", "serve_http", "serve_stdio", "transport_security"]

logger = logging.getLogger("toolreg")


async def serve_stdio(
    server: Server[Connection], bridge: Bridge, lines: StdinLines, out: StdoutLines
) -> None:
    """Serve one stdio connection until EOF, a signal or a client that stopped reading; every
    call joined on return."""
    async with stdio_streams(lines, out) as (read, write):
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
    server: Server[Connection],
    bridge: Bridge,
    host: str,
    port: int,
    path: str,
    allowed_hosts: tuple[str, ...] = (),
    allowed_origins: tuple[str, ...] = (),
) -> None:
    """Serve streamable HTTP on uvicorn until a signal; every call joined on return."""
    import uvicorn  # here: the stdio server never needs it

    security = transport_security(host, allowed_hosts, allowed_origins)
    app = server.streamable_http_app(
        streamable_http_path=path, host=host, transport_security=security
    )
    with _bound(host, port) as sock:
        bound = sock.getsockname()[1]
        if not is_loopback(host):
            _warn_exposed(server.name, host, bound, security)
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


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def transport_security(
    host: str, allowed_hosts: tuple[str, ...], allowed_origins: tuple[str, ...]
) -> TransportSecuritySettings:
    """The SDK's DNS-rebinding protection, on whatever the bind address.

    A request is refused unless its `Host` is a loopback name, the bind address itself (when it
    names one interface) or one of `allowed_hosts` (421), and unless its `Origin`, when it has
    one, is a loopback origin or one of `allowed_origins` (403). A host given without a port
    matches any port.
    """
    named = [*LOOPBACK_NAMES, *allowed_hosts]
    if not is_loopback(host) and host not in ("0.0.0.0", "::"):
        named.append(host)
    hosts = [pattern for name in named for pattern in _host_patterns(name)]
    origins = [
        f"{scheme}://{name}{port}"
        for name in LOOPBACK_NAMES
        for scheme in ("http", "https")
        for port in ("", ":*")
    ]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=list(dict.fromkeys(hosts)),
        allowed_origins=list(dict.fromkeys((*origins, *allowed_origins))),
    )


def is_loopback(host: str) -> bool:
    """True for a bind address that only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name other than localhost: it may resolve anywhere
        return False


def _host_patterns(host: str) -> list[str]:
    """The `Host` header values `host` stands for: itself, and any port when it names none."""
    if host.count(":") > 1 and not host.startswith("["):  # a bare IPv6 address
        host = f"[{host}]"
    if host.endswith("]") or ":" not in host:
        return [host, f"{host}:*"]
    return [host]


def _warn_exposed(name: str, host: str, port: int, security: TransportSecuritySettings) -> None:
    logger.warning(
        "toolreg: MCP server %r listens on %s port %d, beyond loopback: anyone who can reach it "
        "can list and call every tool, without authentication. Requests are refused unless "
        "their Host is one of %s and their Origin (if any) one of %s; allow more with "
        "--allow-host and --allow-origin",
        name,
        host,
        port,
        ", ".join(security.allowed_hosts),
        ", ".join(security.allowed_origins),
    )


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
