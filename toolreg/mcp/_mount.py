"""`toolreg.mcp.mount`: the tools of an upstream MCP server, registered in a registry.

A `Mount` registers one tool per upstream tool (`prefix + name`, with the upstream's
description, input schema, title and annotations) and keeps that set in step with the
upstream: after a `tools/list_changed` and after a reconnection the tools are listed again and
registrations are added, replaced or removed. A mounted tool's body runs on a registry worker,
like any body: it hands the call to the mount's event loop (`_session`), relays the
upstream's progress to `ctx.report_progress` on its own thread, and turns the answer into a
value or an exception; so the whole pipeline (hooks, approval, policies, observers, the log)
runs on the caller's side.

The registrations themselves live in `_registrations`: the first listing is applied by the
thread that calls `mount()`, later ones by a helper thread, never by the loop (registering runs
the registry's `on_tools_changed` callbacks, user code).
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

import mcp_types as types

from .. import CancelToken, ToolContext, ToolRegistry, _validate, thaw
from .._cancel import Cancelled, checked_token
from .._helper import HELPER
from .._text import safe_str
from ._registrations import Registrations
from ._session import Call, Session
from ._upstream import Upstream, UpstreamToolError, UpstreamUnavailable, parse_upstream
from ._wire import LoopThread

__all__ = ["Mount", "mount"]

logger = logging.getLogger("toolreg")

_PREFIX_RULE = re.compile(r"[A-Za-z0-9_.-]{0,127}")
_CLOSED = "the mount was closed"  # the reason a call cancelled by `close()` carries upstream


class Mount:
    """The tools of one upstream MCP server, registered in a `ToolRegistry`; see `mount()`.

    `tools` is the tuple of registry names it registered now (sorted). `close()` unregisters
    them and ends the session; it is idempotent, also a context manager's exit. Thread-safe.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        upstream: Upstream,
        prefix: str,
        names: frozenset[str] | None,
        token: CancelToken | None,
        cancel_grace: float,
        timeout: float,
    ) -> None:
        self._upstream = upstream
        self._token = token
        self._timeout = timeout
        HELPER.start()  # here, not from the loop: Thread.start() there would stall it
        self._loop = LoopThread("toolreg-mcp-mount")
        self._session = Session(
            upstream, timeout=timeout, cancel_grace=cancel_grace, on_tools=self._listed
        )
        self._registrations = Registrations(registry, upstream.label, prefix, names, self._body)
        self._lock = threading.Lock()  # guards _closed, _closer and _calls
        self._closed = False
        self._closer = 0  # ident of the thread closing it
        self._shut = threading.Event()  # close() has finished
        self._calls: set[Call] = set()  # calls whose bodies wait for an outcome

    @property
    def tools(self) -> tuple[str, ...]:
        """The registry names of the tools this mount registered now, sorted."""
        return self._registrations.names

    def close(self) -> None:
        """Unregister the tools, cancel the calls in flight, end the session; idempotent.

        A call in flight is cancelled upstream (`notifications/cancelled`, reason "the mount
        was closed"), waited for up to `cancel_grace`, and fails with `UpstreamUnavailable`
        (`ABORTED` if its caller cancelled it too). Then the connection ends: a stdio upstream
        is stopped the way the SDK does it (stdin closed, then SIGTERM and SIGKILL to its
        process group, each after a bounded wait) and reaped, and the mount's thread is
        joined. Tools unregistered here are gone for new calls at once.
        """
        me = threading.get_ident()
        if me == self._loop.ident:
            raise RuntimeError("Mount.close() cannot run on the mount's own event loop")
        with self._lock:
            if self._closed:
                first = self._closer
            else:
                first, self._closed, self._closer = 0, True, me
        if first:
            if first != me:
                self._shut.wait()  # another thread is closing it: return once it is closed
            return
        try:
            self._registrations.close()
        finally:
            self._stop()
            self._shut.set()

    def __enter__(self) -> Mount:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        with self._lock:
            state = "closed" if self._closed else "open"
        count = len(self._registrations.names)
        return f"<Mount {self._upstream.label!r} tools={count} {state}>"

    # -- starting and stopping ---------------------------------------------------------------

    def _start(self) -> None:
        deadline = time.monotonic() + self._timeout
        try:
            try:
                tools = self._loop.run(self._session.start(), self._timeout)
            except concurrent.futures.TimeoutError:
                raise UpstreamUnavailable(
                    f"MCP upstream {self._upstream.label}: did not start and initialize within "
                    f"{self._timeout:g}s"
                ) from None
            self._registrations.offer(tools, strict=True)
            self._registrations.warn_missing(tools)
        except BaseException:
            with self._lock:
                self._closed, self._closer = True, threading.get_ident()
            self._registrations.close()
            self._stop(max(0.0, deadline - time.monotonic()))
            self._shut.set()
            raise

    def _stop(self, budget: float | None = None) -> None:
        """End the session, then the loop, and join its thread. With a `budget` (seconds) it
        waits no longer: a stubborn upstream's shutdown then finishes on the mount's thread."""
        try:
            self._loop.run(self._close_session(), budget)
        except concurrent.futures.TimeoutError:
            logger.debug(
                "toolreg: MCP upstream %s is still shutting down; the mount's thread ends "
                "once it has",
                self._upstream.label,
            )
        else:
            self._loop.join()
        finally:
            self._fail_waiting()

    async def _close_session(self) -> None:
        try:
            await self._session.close(_CLOSED)
        finally:
            self._loop.stop()

    def _fail_waiting(self) -> None:
        """Calls handed to a loop that stopped before it ran them still get an outcome."""
        with self._lock:
            waiting = list(self._calls)
        for call in waiting:  # a second outcome for a call that had one is never read
            call.events.put(("error", self._unavailable("the mount is closed")))

    def _listed(self, tools: list[types.Tool]) -> None:
        """On the loop: a fresh listing, applied on a helper thread."""
        HELPER.call_soon(functools.partial(self._registrations.offer, tools))

    # -- calls -------------------------------------------------------------------------------

    def _body(self, upstream_name: str) -> Callable[[Mapping[str, Any], ToolContext], Any]:
        return functools.partial(self._call, upstream_name)

    def _call(self, upstream_name: str, args: Mapping[str, Any], ctx: ToolContext) -> Any:
        """A mounted tool's body: the upstream call, on the mount's loop; block until settled."""
        token = ctx.token
        if token.cancelled:  # a pre-aborted direct call: nothing is sent upstream
            raise Cancelled(token.reason)
        call = Call(upstream_name, thaw(args))
        with self._lock:
            if self._closed:
                raise self._unavailable("the mount is closed")
            self._calls.add(call)
        try:
            kind, payload = self._wait(call, ctx)
        finally:
            with self._lock:
                self._calls.discard(call)
        if token.cancelled:  # whatever came back, a call its caller cancelled is ABORTED
            raise Cancelled(token.reason)
        return self._value(kind, payload)

    def _wait(self, call: Call, ctx: ToolContext) -> tuple[str, Any]:
        """Start `call` on the loop and relay its progress until its outcome arrives."""
        watched = [ctx.token] if self._token is None else [ctx.token, self._token]
        # Watched before the call is handed over: a token cancelled by now hands its cancel
        # to the loop first, so the call's task sees it before it could send anything.
        cancels = [each.on_cancel(functools.partial(self._cancel, call, each)) for each in watched]
        try:
            if not self._loop.call_soon(self._session.start_call, call):
                raise self._unavailable("the mount is closed")
            while True:
                kind, payload = call.events.get()
                if kind != "progress":
                    return kind, payload
                self._progress(ctx, payload)
        finally:
            for registration in cancels:
                registration.remove()

    def _cancel(self, call: Call, token: CancelToken) -> None:
        """On the cancelling thread: hand the cancel to the loop (never blocks)."""
        self._loop.call_soon(self._session.cancel, call, token.reason)

    def _progress(self, ctx: ToolContext, update: tuple[float, float | None, str | None]) -> None:
        try:
            ctx.report_progress(*update)
        except (TypeError, ValueError) as exc:  # a value toolreg refuses (say, NaN)
            logger.debug("toolreg: MCP progress %r dropped: %s", update, exc)

    def _value(self, kind: str, payload: Any) -> Any:
        if kind == "error":
            raise payload
        if kind == "cancelled":
            raise self._unavailable(f"the call was cancelled: {safe_str(payload)}")
        result: types.CallToolResult = payload
        if result.is_error:
            raise UpstreamToolError(_text(result) or "the upstream reported an error")
        if result.structured_content is not None:
            return result.structured_content
        return _text(result)

    def _unavailable(self, what: str) -> UpstreamUnavailable:
        return UpstreamUnavailable(f"MCP upstream {self._upstream.label}: {what}")


def _text(result: types.CallToolResult) -> str:
    """The answer's text blocks, one per line; any other block as its JSON."""
    parts = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            dumped = block.model_dump(by_alias=True, exclude_none=True, mode="json")
            parts.append(json.dumps(dumped, ensure_ascii=False))
    return "\n".join(parts)


def mount(
    registry: ToolRegistry,
    upstream: str | Iterable[str] | Mapping[str, Any],
    prefix: str | None = None,
    names: Iterable[str] | None = None,
    token: CancelToken | None = None,
    cancel_grace: float = 1.0,
    timeout: float = 10.0,
) -> Mount:
    """Register the tools of an upstream MCP server in `registry`; return the `Mount`.

    `upstream` is a command line (a `str`, split like a shell would, or a list of arguments)
    run as a subprocess over stdio, an ``http(s)://`` URL (streamable HTTP), or one entry of
    the usual client configuration: ``{"command", "args", "env", "cwd"}`` or ``{"url",
    "headers"}``. As with the SDK's stdio client, a child gets only a few safe variables of
    this process's environment (``PATH``, ``HOME``, ...) plus `env`.

    Each upstream tool becomes a registry tool named ``prefix + name`` with the upstream's
    description, input schema, title and annotations (`names` keeps only those upstream
    names). They follow the upstream: after a `notifications/tools/list_changed` (or a
    reconnection) the tools are listed again and registrations added, replaced or removed
    (`on_tools_changed` fires). A name already registered in `registry` is a `ValueError`
    here (pass a prefix) and is left out with a warning later; so is a definition the
    registry refuses.

    A call runs the registry's whole pipeline on the caller's side (the arguments are checked
    against the upstream's schema there), then sends `tools/call`. Success: the value is the
    upstream's `structuredContent` if it sent one, else its text. `isError: true`:
    `TOOL_ERROR` with the upstream's text (`UpstreamToolError`). The upstream's progress
    reaches `ctx.report_progress`.

    Cancellation: when the call's token (or `token`, which cancels every call made through the
    mount) is cancelled, `notifications/cancelled` with the reason goes upstream at once for
    that request; the call then waits up to `cancel_grace` seconds for an answer already on
    its way (a server must not answer a cancelled request, so normally none comes) and is
    `ABORTED` either way. MCP has no cancellation acknowledgement: whether the upstream's work
    has stopped cannot be observed, which is the documented limit of a mounted tool.

    An upstream that dies or disconnects fails its calls in flight with `TOOL_ERROR`
    (`UpstreamUnavailable`, naming the upstream); the mount reconnects on a later call.
    `mount()` raises `UpstreamUnavailable` when the upstream cannot be started or does not
    initialize within `timeout` seconds (it never waits longer), `TypeError`/`ValueError` for
    bad arguments before anything starts.

    The session lives on an event loop thread of the mount's own; a mounted tool may be called
    from any thread, by `execute` or awaited through `toolreg.aio`. `mount()` blocks while it
    connects: from async code, run it in a thread. Close the mount before the registry.

    Example::

        with ToolRegistry() as registry:
            files = mount(registry, "npx -y @modelcontextprotocol/server-filesystem /tmp",
                          prefix="fs.")
            try:
                registry.execute("fs.list_directory", {"path": "/tmp"})
            finally:
                files.close()
    """
    if not isinstance(registry, ToolRegistry):
        raise TypeError(f"mount() needs a ToolRegistry, got {type(registry).__name__}")
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str or None, got {type(prefix).__name__}")
    if prefix and not _PREFIX_RULE.fullmatch(prefix):
        raise ValueError(f"prefix must match [A-Za-z0-9_.-]{{0,127}}, got {prefix!r}")
    kept = _names(names)
    if token is not None:
        checked_token(token, "token")
    grace = _validate.seconds(cancel_grace, "cancel_grace", allow_zero=True)
    bound = _validate.seconds(timeout, "timeout")
    spec = parse_upstream(upstream)
    mounted = Mount(registry, spec, prefix or "", kept, token, grace, bound)
    mounted._start()
    return mounted


def _names(names: Iterable[str] | None) -> frozenset[str] | None:
    if names is None:
        return None
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError("names must be a collection of upstream tool names (not one str) or None")
    kept = frozenset(names)
    for name in kept:
        if not isinstance(name, str):
            raise TypeError(f"names must hold str, got {name!r}")
    return kept
