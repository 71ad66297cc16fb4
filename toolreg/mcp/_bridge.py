"""The MCP bridge: `tools/list` and `tools/call` handlers that serve a `ToolRegistry`.

One `tools/call` request is one model-driven call (`start_if_cancelled=False`) under a fresh
`CancelSource` (a child of the server's token, if any). The handler runs the call as a task of
its own (`AsyncToolRegistry.execute`: the pipeline on a pool worker) and waits for it with
`asyncio.wait`, which never cancels what it waits for. So the request's end reaches the call
only one way, as a cancel of its source with a reason, and anyio (which re-delivers a cancel
at every await of a cancelled scope) meets the handler once; the join that follows runs in a
shielded scope and sleeps until the call has settled.

How a request ends on the client's side, and the reason the body sees:

* `notifications/cancelled` (the client's cancel, or its read timeout): the SDK cancels the
  handler's scope before it hands us the notification, so the handler waits (shielded, bounded
  by `REASON_WAIT`) for our notification handler to deliver the client's stated reason, then
  cancels the source with `RequestCancelled(id, "client", reason)`.
* a disconnect or the connection's end (EOF): the same scope cancel with no notification:
  `RequestCancelled(id, "closed")`; `"shutdown"` when `serve()` is stopping on a signal. On the
  per-request HTTP wire (2026-07-28) that scope cancel is the client's own cancel, which carries
  no reason there: `RequestCancelled(id, "client")`.
* a handshake-era HTTP client dropping the POST stream of its request: the SDK goes on with the
  handler, so `_watch_drop` cancels the source (`"closed"`) when the stream cannot be resumed,
  and only logs the drop when it can (`_http`).

The cancel runs on toolreg's helper threads (`_helper.HELPER`), never on the event loop:
cancelling runs every callback registered on the call's token, a body's own `on_cancel`
callbacks included. The handler returns only after the call has settled (body joined, observers
notified), and a request that ended on the client's side is never answered: the handler re-
raises the cancellation, even on an in-process dispatcher that would deliver a late return.

`max_concurrent_calls` is an admission limit. A request that ends before its call starts
(while waiting for admission, or before its handler's first step) runs nothing: its source is
cancelled before the call enters the registry (nothing is linked to it yet, so no callback runs
on the loop), and the call goes through `AsyncToolRegistry.execute` already cancelled, so
observers see `ABORTED_BEFORE_DISPATCH` and no hook or body runs.

Requests are matched with their `notifications/cancelled` through the connection state that the
server's lifespan yields (`Connection`): one per `Server.run` (stdio, in-memory), one per app on
streamable HTTP, where the `Mcp-Session-Id` header tells sessions apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
from asyncio import FIRST_COMPLETED
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.lowlevel
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp_types.version import is_version_at_least

from .. import ToolRegistry  # the public class, through the package (it loads with it)
from .._cancel import CancelSource, CancelToken
from .._helper import HELPER
from .._results import ToolCall, ToolResult
from .._text import escape_surrogates, safe_str
from ..adapters._common import wait_settled
from ..aio import AsyncToolRegistry
from ._http import DROP_KEY, Drop
from ._loop import ProgressPump
from ._results import RequestCancelled, RequestId, answer, wire_json

__all__ = ["REASON_WAIT", "Bridge", "Connection"]

logger = logging.getLogger("toolreg")

PER_REQUEST_WIRE = "2026-07-28"
"""The first protocol version whose HTTP requests stand alone (no session, no handshake)."""

REASON_WAIT = 1.0
"""Seconds a client-cancelled call waits for the notification that states the client's reason.

The SDK hands the notification to us right after cancelling the handler, on the same loop, so
this wait normally ends within a loop turn; the bound covers a notification the SDK drops."""


class Connection:
    """The lifespan state of one `Server.run` (or one HTTP app): its `tools/call` requests.

    Only the event loop touches it, so it needs no lock.
    """

    __slots__ = ("requests",)

    def __init__(self) -> None:
        self.requests: dict[tuple[str | None, RequestId], _Request] = {}


class _Request:
    """One `tools/call` request, from admission to its answer or its end on the client's side.

    Read and written on the event loop only.
    """

    __slots__ = ("cancel_requested", "client_reason", "notified", "per_request", "reason")

    def __init__(self, cancel_requested: anyio.Event | None, per_request: bool) -> None:
        self.cancel_requested = cancel_requested  # the SDK's flag for a client cancel, if known
        # On the per-request HTTP wire (2026-07-28) closing the stream is the client's cancel.
        self.per_request = per_request
        self.notified = False  # our notifications/cancelled handler has delivered the reason
        self.client_reason: str | None = None
        self.reason: asyncio.Future[None] | None = None  # done when the notification arrives


class Bridge:
    """Serves one registry: the handlers `build_server` registers on the `Server`.

    `stopping` is set by `serve()` when a signal stops it, so calls cancelled by the shutdown
    say so. Handlers run on one asyncio event loop (the calls go through `toolreg.aio`).
    """

    def __init__(
        self, registry: ToolRegistry, token: CancelToken | None, max_concurrent_calls: int
    ) -> None:
        self._registry = registry
        self._areg = AsyncToolRegistry(registry)
        self._token = token
        # First come, first served; no yield when a slot is free (fast_acquire); a slot handed
        # to a waiter cancelled before it resumed is passed on. Event loop only.
        self._admission = anyio.Semaphore(max_concurrent_calls, fast_acquire=True)
        self._nonce = f"{os.urandom(4).hex()}-"  # with the counter: unique across processes
        self._counter = itertools.count(1)
        self.stopping = False
        self._handlers = 0  # tools/call handlers running (event loop only)
        self._shared = Connection()  # for a server whose lifespan no longer yields ours
        self._idle: asyncio.Future[None] | None = None  # done when _handlers drops to 0
        HELPER.start()  # here, not on the loop at the first cancel: Thread.start() can stall

    async def wait_idle(self) -> None:
        """Wait until no `tools/call` handler of this bridge is running."""
        while self._handlers:
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle

    # -- tools/list ------------------------------------------------------------------------------

    async def list_tools(
        self, ctx: ServerRequestContext[Connection], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        """The registry's `mcp` catalog, one snapshot, in one page.

        A tool the SDK's model refuses is left out with a warning: one bad definition must
        not fail the whole listing.
        """
        tools = []
        for schema in self._registry.catalog().schemas("mcp"):
            try:
                tools.append(types.Tool.model_validate(wire_json(schema)))
            except ValueError as exc:  # pydantic's ValidationError
                logger.warning("toolreg: MCP tools/list leaves out %r: %s", schema["name"], exc)
        return types.ListToolsResult(tools=tools)

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        """The advertised input schema of `name` (for the SDK's HTTP header checks), or None."""
        for schema in self._registry.catalog().schemas("mcp"):
            if schema["name"] == name:
                found: Mapping[str, Any] = schema["inputSchema"]
                return found
        return None

    # -- tools/call ------------------------------------------------------------------------------

    async def call_tool(
        self, ctx: ServerRequestContext[Connection], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        """Run the call; answer with its result, or never if the request ended first."""
        request_id: RequestId = ctx.request_id if ctx.request_id is not None else "?"
        call_id = f"mcp:{request_id}:{self._nonce}{next(self._counter)}"
        call = ToolCall(params.name, params.arguments, call_id=call_id)
        request = _Request(_cancel_requested(ctx), _per_request(ctx))
        requests = self._connection(ctx).requests
        key = (_session_id(ctx), coerce_request_id(request_id))
        requests[key] = request
        source = CancelSource(self._token) if self._token is not None else CancelSource()
        stop_watching = _watch_drop(ctx, request_id, source)
        self._handlers += 1
        try:
            admitted = False
            try:
                await self._admission.acquire()
                admitted = True
                # Ended before the call could start (while queued, or before this handler's
                # first step): nothing may run, so the call must not even enter the registry.
                await anyio.lowlevel.checkpoint_if_cancelled()
            except asyncio.CancelledError:
                if admitted:
                    self._admission.release()
                await self._never_admitted(request, request_id, call, source)
                raise
            try:
                result = await self._run(ctx, request, request_id, call, source)
            finally:
                self._admission.release()
        finally:
            stop_watching()
            source.close()
            if requests.get(key) is request:  # a client reusing an id may have replaced it
                del requests[key]
            self._handlers -= 1
            if not self._handlers and self._idle is not None and not self._idle.done():
                self._idle.set_result(None)
        return answer(result)

    async def _run(
        self,
        ctx: ServerRequestContext[Connection],
        request: _Request,
        request_id: RequestId,
        call: ToolCall,
        source: CancelSource,
    ) -> ToolResult[Any]:
        """The admitted call: run it, relay the request's end to its source, join it."""
        loop = asyncio.get_running_loop()
        wants_progress = progress_token_from_params(ctx.params) is not None  # 0 is a token
        progress = ProgressPump(ctx) if wants_progress else None
        running = loop.create_task(
            self._areg.execute(
                call, token=source.token, start_if_cancelled=False, progress=progress
            )
        )
        try:
            # Waiting never cancels the call: the request's end reaches it only as a cancel of
            # its source, with the reason. anyio delivers the request's cancel here once.
            await asyncio.wait((running,))
        except asyncio.CancelledError:
            if progress is not None:
                progress.close()  # before anything else: no progress after the cancel
            reason = await self._reason(request, request_id, running)
            if not running.done():
                HELPER.call_soon(functools.partial(source.cancel, reason))
            await wait_settled(running)  # a started body is never abandoned
            if not running.cancelled():
                running.exception()  # retrieved: the request is over, nobody else will read it
            raise  # never answered, even by a dispatcher that would deliver a late return
        finally:
            if progress is not None:
                progress.close()
        # Completed, but the request may have ended in the same turn: never answer it then.
        await anyio.lowlevel.checkpoint_if_cancelled()
        try:
            return running.result()
        except Exception as exc:  # a closed registry, a refusing executor
            logger.error("toolreg: MCP request %r could not run: %s", request_id, exc)
            message = escape_surrogates(f"the call could not run: {safe_str(exc)}")
            raise MCPError(types.INTERNAL_ERROR, message) from exc

    async def _never_admitted(
        self, request: _Request, request_id: RequestId, call: ToolCall, source: CancelSource
    ) -> None:
        """Cancelled while waiting for admission: observers see it, nothing else runs."""
        source.cancel(await self._reason(request, request_id, None))  # nothing linked yet
        try:
            # Unshielded in a cancelled scope: the facade claims the call back before a worker
            # takes it (observers notified off the loop) or, if one already did, the call is
            # pre-cancelled and model-driven, so no hook or body runs. Then it re-raises.
            await self._areg.execute(call, token=source.token, start_if_cancelled=False)
        except asyncio.CancelledError:
            pass  # the caller re-raises the request's own cancellation
        except Exception:
            logger.debug("toolreg: recording a never-admitted MCP call failed", exc_info=True)

    async def _reason(
        self, request: _Request, request_id: RequestId, running: asyncio.Task[Any] | None
    ) -> RequestCancelled:
        """Why the request ended; waits (shielded, bounded) for a client's stated reason.

        The wait also ends when the call settles by itself meanwhile (then nothing is
        cancelled).
        """
        if request.cancel_requested is not None and request.cancel_requested.is_set():
            if not request.notified:
                request.reason = asyncio.get_running_loop().create_future()
                waits: set[asyncio.Future[Any]] = {request.reason}
                if running is not None:
                    waits.add(running)
                # Shielded from anyio; a raw Task.cancel() only ends the wait: the caller still
                # cancels the source and joins the call before re-raising.
                with anyio.CancelScope(shield=True), contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait(waits, timeout=REASON_WAIT, return_when=FIRST_COMPLETED)
            return RequestCancelled(request_id, "client", request.client_reason)
        if self.stopping:
            return RequestCancelled(request_id, "shutdown")
        # That wire carries no reason: the client's cancel (its read timeout too) is a closed
        # stream, and so, by the specification, is a dropped connection.
        return RequestCancelled(request_id, "client" if request.per_request else "closed")

    def _connection(self, ctx: ServerRequestContext[Connection]) -> Connection:
        """The request's connection state (the bridge's own if the lifespan was replaced)."""
        connection = ctx.lifespan_context
        return connection if isinstance(connection, Connection) else self._shared

    async def on_cancelled(
        self, ctx: ServerRequestContext[Connection], params: types.CancelledNotificationParams
    ) -> None:
        """`notifications/cancelled`: hand the client's stated reason to the request's handler."""
        if params.request_id is None:
            return
        key = (_session_id(ctx), coerce_request_id(params.request_id))
        request = self._connection(ctx).requests.get(key)
        if request is None or request.notified:
            return  # finished already (a legal race), or not ours
        request.notified = True
        request.client_reason = params.reason
        if request.reason is not None and not request.reason.done():
            request.reason.set_result(None)


def _session_id(ctx: ServerRequestContext[Connection]) -> str | None:
    """The streamable HTTP session of the message (None on stdio and in memory)."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return None
    session: str | None = headers.get("mcp-session-id")
    return session


def _per_request(ctx: ServerRequestContext[Connection]) -> bool:
    """True for a request of the per-request HTTP wire (2026-07-28 and later, no session)."""
    return ctx.request is not None and is_version_at_least(ctx.protocol_version, PER_REQUEST_WIRE)


def _watch_drop(
    ctx: ServerRequestContext[Connection], request_id: RequestId, source: CancelSource
) -> Callable[[], None]:
    """Cancel the call if the client drops a stream it cannot resume (`_http`); returns
    what stops watching."""
    scope = getattr(ctx.request, "scope", None)
    drop = scope.get(DROP_KEY) if isinstance(scope, dict) else None
    if not isinstance(drop, Drop) or _per_request(ctx):
        return _nothing  # not a handshake-era HTTP request: its end reaches the handler itself
    if ctx.close_sse_stream is not None:  # the SDK keeps its events: the client may resume
        return drop.on_drop(
            functools.partial(
                logger.info,
                "toolreg: MCP request %r: the client dropped its stream; the call goes on, "
                "and the client may resume the stream (the server keeps an event store)",
                request_id,
            )
        )

    def dropped() -> None:
        logger.info(
            "toolreg: MCP request %r: the client dropped its stream, which cannot be resumed "
            "(no event store); cancelling the call",
            request_id,
        )
        HELPER.call_soon(functools.partial(source.cancel, RequestCancelled(request_id, "closed")))

    return drop.on_drop(dropped)


def _nothing() -> None:
    pass


def _cancel_requested(ctx: ServerRequestContext[Connection]) -> anyio.Event | None:
    """The SDK's per-request "the client cancelled it" flag, or None if it cannot be reached.

    mcp 2.3 sets `DispatchContext.cancel_requested` before it cancels the handler, but exposes
    it only on the session's private request channel (modelcontextprotocol/python-sdk#3389).
    Without it every cancel reads as `"closed"`: the call is still cancelled and joined.
    """
    outbound = getattr(ctx.session, "_request_outbound", None)
    flag = getattr(outbound, "cancel_requested", None)
    return flag if isinstance(flag, anyio.Event) else None
