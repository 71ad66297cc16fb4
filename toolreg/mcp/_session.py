"""The client side of a mount: one upstream MCP session, driven on the mount's event loop.

Everything in `Session` runs on that loop (`_wire.LoopThread`); the only thing another
thread touches is a `Call`'s `events` queue (its body's thread reads it).

A `_Link` is one connection: the SDK's `Client` (protocol era negotiated by `mode="auto"`:
2026-07-28 where the upstream speaks it, the 2025 initialize handshake otherwise), held open by
a task of its own (`_hold`), because the SDK's context managers must be entered and left by one
task. A link is lost when the upstream's output ends (stdio EOF, seen by `Inbound`), when a
call learns that the connection closed, or when the transport itself fails; the next call then
opens a new link (within `timeout`) and lists the tools again.

Request ids. Each connection mints its own JSON-RPC ids. A call learns the id of its own
`tools/call` as the request is written (`_wire.Outbound`), so a cancel names exactly that
request, on exactly the connection that carries it.

How a cancel travels (`Session.cancel`, on the loop, scheduled by the token's callback):
`notifications/cancelled` with the reason goes out at once, from a task of its own, never
behind the call it cancels; then the call waits up to `cancel_grace` for an answer already on
its way, and its scope is cancelled. The SDK sends its own courtesy cancel ("caller cancelled")
when that scope ends; `Outbound` drops it for a request we already told about, so the
upstream sees one cancel, with our reason. A request not yet written is simply not sent. On a
2026-07-28 streamable HTTP connection the SDK turns a cancel into closing the request's stream
(that era's only spelling of it), which carries no reason.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from .._text import describe, safe_str
from ._upstream import Upstream, UpstreamError, UpstreamUnavailable
from ._wire import CURRENT_CALL, OWN_CANCEL, Inbound, Outbound

__all__ = ["LIVE", "Call", "Session"]

logger = logging.getLogger("toolreg")

LIVE = object()
"""`Call.reason` of a call nobody cancelled (a reason may be anything, even None)."""

_PAGES = 100  # tools/list pages read at most: an upstream that pages forever cannot hang us


class Call:
    """One mounted call on the loop's side: what to send, its request id, its cancellation.

    `events` is the one thing another thread touches: the body's thread reads progress
    updates, then exactly one outcome, from it. Every other field is the loop's.
    """

    __slots__ = ("arguments", "events", "link", "name", "reason", "request_id", "scope")

    def __init__(self, name: str, arguments: dict[str, Any]) -> None:
        self.name = name
        self.arguments = arguments
        # ("progress", (progress, total, message)) any number of times, then one of
        # ("result", CallToolResult), ("error", UpstreamError), ("cancelled", reason).
        self.events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.scope: anyio.CancelScope | None = None
        self.link: _Link | None = None
        self.request_id: types.RequestId | None = None
        self.reason: object = LIVE

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.events.put(("progress", (progress, total, message)))


class _Link:
    """One connection to the upstream, held open by `Session._hold`. Loop only."""

    __slots__ = ("client", "dirty", "leave", "notified", "scope", "tools", "usable")

    def __init__(self) -> None:
        self.client: Client | None = None
        self.tools: list[types.Tool] = []  # as listed when it connected
        self.usable = False  # initialized, and not known to be lost
        self.leave = asyncio.Event()  # asks the holding task to close the connection
        self.dirty = asyncio.Event()  # the upstream's tools changed: list them again
        self.notified: set[types.RequestId] = set()  # requests we sent our own cancel for
        self.scope: anyio.CancelScope | None = None  # the holding task's; cancelled on close

    def lost(self) -> None:
        self.usable = False
        self.leave.set()

    async def on_message(self, message: Any) -> None:
        """The SDK's message handler: a tools/list_changed marks the listing dirty."""
        if isinstance(message, types.ToolListChangedNotification):
            self.dirty.set()
        elif isinstance(message, Exception):
            logger.debug("toolreg: MCP upstream transport reported %s", describe(message))


class Session:
    """The upstream session of one mount; every method runs on the mount's event loop.

    `on_tools(tools)` is called on the loop with a fresh listing after a `tools/list_changed`
    and after every reconnection (not after the first connection: `start()` returns that one).
    """

    def __init__(
        self,
        upstream: Upstream,
        *,
        timeout: float,
        cancel_grace: float,
        on_tools: Callable[[list[types.Tool]], None],
    ) -> None:
        self.upstream = upstream
        self._timeout = timeout
        self._grace = cancel_grace
        self._on_tools = on_tools
        self._link: _Link | None = None  # the usable connection, if any
        self._links: set[_Link] = set()  # every connection not yet closed
        self._opening: asyncio.Future[_Link] | None = None  # the connection attempt, if any
        self._connections = 0
        self._calls: dict[Call, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()  # holders and cancel senders
        self._closed = False

    async def start(self) -> list[types.Tool]:
        """Connect (within `timeout`) and return the upstream's tools."""
        return (await self._connect()).tools

    def start_call(self, call: Call) -> None:
        """Start running `call` (from a loop callback); its outcome goes to `call.events`."""
        if self._closed:
            call.events.put(("error", self._unavailable("the mount is closed")))
            return
        self._calls[call] = asyncio.get_running_loop().create_task(self._run(call))

    def cancel(self, call: Call, reason: object) -> None:
        """Cancel `call`: tell the upstream at once, then allow `cancel_grace` for an answer."""
        if call.reason is not LIVE:
            return
        call.reason = reason
        scope, link, request_id = call.scope, call.link, call.request_id
        if scope is None:
            return  # its task has not run yet: it cancels itself first thing
        if link is None or request_id is None or not link.usable:
            scope.cancel()  # nothing was written upstream (or no connection is left to tell)
            return
        link.notified.add(request_id)
        self._spawn(self._send_cancel(link, request_id, reason))
        grace_ends = asyncio.get_running_loop().time() + self._grace
        scope.deadline = min(scope.deadline, grace_ends)

    async def close(self, reason: object) -> None:
        """Cancel every call (telling the upstream), wait for them, then end the connection."""
        self._closed = True
        for call in list(self._calls):
            self.cancel(call, reason)
        if self._calls:
            await asyncio.wait(self._calls.values())
        for link in self._links:
            if link.scope is not None:
                link.scope.cancel()  # the SDK's own shutdown runs, shielded and bounded
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    # -- calls -------------------------------------------------------------------------------

    async def _run(self, call: Call) -> None:
        CURRENT_CALL.set(call)  # this task's own context: `Outbound` reads it
        outcome: tuple[str, Any] = ("error", self._unavailable("the mount's event loop stopped"))
        try:
            outcome = await self._outcome(call)
        finally:
            del self._calls[call]
            call.events.put(outcome)

    async def _outcome(self, call: Call) -> tuple[str, Any]:
        with anyio.CancelScope() as scope:
            call.scope = scope
            if call.reason is not LIVE:
                scope.cancel()
            try:
                link = call.link = await self._connect()
                assert link.client is not None
                result = await link.client.call_tool(
                    call.name, call.arguments, progress_callback=call.progress
                )
                outcome: tuple[str, Any] = ("result", result)
            except MCPError as exc:
                outcome = ("error", self._failed(call, exc))
            except UpstreamError as exc:
                outcome = ("error", exc)
            except Exception as exc:  # an answer the SDK could not read or validate
                outcome = ("error", UpstreamError(f"MCP upstream {self._label}: {describe(exc)}"))
            finally:
                if call.link is not None and call.request_id is not None:
                    call.link.notified.discard(call.request_id)
            # An answer after our cancel (some servers answer a cancelled request, e.g. with
            # -32800) only ends the grace early: the cancel has won.
            return outcome if call.reason is LIVE else ("cancelled", call.reason)
        return ("cancelled", call.reason)

    def _failed(self, call: Call, exc: MCPError) -> UpstreamError:
        message = safe_str(exc.error.message)
        if exc.code != types.CONNECTION_CLOSED:
            return UpstreamError(
                f"MCP upstream {self._label} answered with error {exc.code}: {message}", exc.code
            )
        if call.link is not None:
            call.link.lost()
        if self._closed:
            return self._unavailable("the mount was closed during the call", exc.code)
        return self._unavailable(
            f"the connection ended during the call ({message}); the mount reconnects on the "
            "next call",
            exc.code,
        )

    async def _send_cancel(self, link: _Link, request_id: types.RequestId, reason: object) -> None:
        OWN_CANCEL.set(True)
        params = types.CancelledNotificationParams(request_id=request_id, reason=safe_str(reason))
        try:
            assert link.client is not None
            await link.client.session.send_notification(types.CancelledNotification(params=params))
        except Exception as exc:  # the connection is going: nothing left to tell
            logger.debug("toolreg: MCP cancel of request %r not sent: %s", request_id, exc)

    # -- connections -------------------------------------------------------------------------

    async def _connect(self) -> _Link:
        if self._closed:
            raise self._unavailable("the mount is closed")
        link = self._link
        if link is not None and link.usable:
            return link
        opening = self._opening
        if opening is None or opening.done():
            opening = self._opening = asyncio.get_running_loop().create_future()
            opening.add_done_callback(_retrieve)
            self._spawn(self._hold(_Link(), opening))
        return await asyncio.shield(opening)

    async def _hold(self, link: _Link, ready: asyncio.Future[_Link]) -> None:
        """Open `link`, hand it to `ready`, keep it open until it is lost or closed."""
        if self._closed:
            ready.set_exception(self._unavailable("the mount is closed"))
            return
        self._links.add(link)
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + self._timeout) as scope:
                link.scope = scope
                async with Client(
                    self._transport(link), mode="auto", cache=None, message_handler=link.on_message
                ) as client:
                    link.client = client
                    link.tools = await _list_tools(client)
                    scope.deadline = math.inf
                    link.usable = True
                    self._link = link
                    ready.set_result(link)
                    if self._connections:
                        self._on_tools(link.tools)
                    self._connections += 1
                    await self._serve(link)
            if not ready.done():
                ready.set_exception(
                    self._unavailable(f"did not start and initialize within {self._timeout:g}s")
                    if not self._closed
                    else self._unavailable("the mount was closed while it started")
                )
        except Exception as exc:
            cause = describe(_root(exc))
            if ready.done():
                logger.warning("toolreg: MCP upstream %s: connection lost: %s", self._label, cause)
            else:
                ready.set_exception(self._unavailable(f"could not be started: {cause}"))
        finally:
            link.usable = False
            self._links.discard(link)
            if self._link is link:
                self._link = None
            if not ready.done():
                ready.set_exception(self._unavailable("the connection closed while it started"))

    async def _serve(self, link: _Link) -> None:
        assert link.client is not None
        async with anyio.create_task_group() as group:
            group.start_soon(self._relist, link)
            if _announces_changes(link.client):
                group.start_soon(self._listen, link)
            await link.leave.wait()
            group.cancel_scope.cancel()

    @asynccontextmanager
    async def _transport(self, link: _Link) -> AsyncIterator[tuple[Inbound, Outbound]]:
        async with self.upstream.connect() as (read, write):
            yield Inbound(read, link.lost), Outbound(write, link.notified)

    async def _relist(self, link: _Link) -> None:
        assert link.client is not None
        while True:
            await link.dirty.wait()
            link.dirty.clear()
            try:
                tools = await _list_tools(link.client)
            except Exception as exc:
                logger.warning("toolreg: MCP upstream %s: tools/list failed: %s", self._label, exc)
                continue
            self._on_tools(tools)

    async def _listen(self, link: _Link) -> None:
        """On 2026-07-28, change notifications come on a `subscriptions/listen` stream."""
        assert link.client is not None
        try:
            async with link.client.listen(tools_list_changed=True) as subscription:
                async for _ in subscription:
                    link.dirty.set()
        except Exception as exc:  # e.g. the stream was lost with the connection
            logger.debug("toolreg: MCP upstream %s: listen ended: %s", self._label, exc)

    # -- helpers -----------------------------------------------------------------------------

    @property
    def _label(self) -> str:
        return self.upstream.label

    def _unavailable(self, what: str, code: int | None = None) -> UpstreamUnavailable:
        return UpstreamUnavailable(f"MCP upstream {self._label}: {what}", code)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _list_tools(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _announces_changes(client: Client) -> bool:
    tools = client.server_capabilities.tools
    modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
    return modern and tools is not None and bool(tools.list_changed)


def _root(exc: BaseException) -> BaseException:
    """The one exception inside (nested) single-member exception groups, else `exc`."""
    inner = getattr(exc, "exceptions", None)
    while isinstance(inner, tuple) and len(inner) == 1:
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    return exc


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: a failed attempt that every waiter left is not an error
