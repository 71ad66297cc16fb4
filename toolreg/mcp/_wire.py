"""Between the SDK's client and a transport: the mount's event loop thread, and the two streams.

`Outbound` wraps the transport's write stream. Each mounted call runs as a task of its own,
with `CURRENT_CALL` set to its call (the SDK writes a request in the task that sends it), so
`Outbound` learns the JSON-RPC id of each call's `tools/call` as it is written: ids are minted
per connection, and a cancel names the request on the connection that carries it. It also
drops the SDK's courtesy `notifications/cancelled` for a request whose cancel we sent
ourselves (with `OWN_CANCEL` set), with the reason. `Inbound` wraps the read stream: its end
(a stdio server that died) marks the connection lost at once, so the next call reconnects
instead of failing on a dead connection.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Protocol

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage

__all__ = ["CURRENT_CALL", "OWN_CANCEL", "Inbound", "LoopThread", "Outbound", "Requester"]


class Requester(Protocol):
    """What `Outbound` records a request id on (a mounted call)."""

    request_id: types.RequestId | None


CURRENT_CALL: ContextVar[Requester | None] = ContextVar("toolreg_mcp_call", default=None)
OWN_CANCEL: ContextVar[bool] = ContextVar("toolreg_mcp_own_cancel", default=False)


class _Stream:
    """Closing, and `async with`, for a wrapped stream."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._inner.aclose()


class Inbound(_Stream):
    """The transport's read stream; `ended()` runs when it ends."""

    def __init__(self, inner: Any, ended: Callable[[], None]) -> None:
        super().__init__(inner)
        self._ended = ended

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)  # read by the SDK's dispatcher

    def __aiter__(self) -> Inbound:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._inner.__anext__()
        except StopAsyncIteration:
            self._ended()
            raise

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._ended()
            raise


class Outbound(_Stream):
    """The transport's write stream: records request ids, drops duplicate cancels."""

    def __init__(self, inner: Any, notified: set[types.RequestId]) -> None:
        super().__init__(inner)
        self._notified = notified  # requests we sent our own cancel for (the loop's set)

    async def send(self, item: SessionMessage, /) -> None:
        message = item.message
        if isinstance(message, types.JSONRPCRequest) and message.method == "tools/call":
            call = CURRENT_CALL.get()
            if call is not None:
                call.request_id = message.id  # a resend (after a stale listing) replaces it
        elif (
            isinstance(message, types.JSONRPCNotification)
            and message.method == "notifications/cancelled"
            and not OWN_CANCEL.get()
            and (message.params or {}).get("requestId") in self._notified
        ):
            return  # the SDK's courtesy cancel: the upstream has ours, with the reason
        await self._inner.send(item)


class LoopThread:
    """An asyncio event loop on a daemon thread of its own, for one mount.

    `call_soon(fn, *args)` runs `fn` on the loop from any thread (False once the loop is
    gone); `run(coro, timeout)` runs a coroutine there and waits for its result; `stop()`
    ends the loop (tasks left are cancelled, as `asyncio.run` does) and `join()` waits.
    """

    def __init__(self, name: str) -> None:
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), name=name)
        self._thread.daemon = True  # a stuck upstream shutdown never keeps the interpreter up
        self._thread.start()
        self._started.wait()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._started.set()
        await self._stop.wait()

    def call_soon(self, fn: Callable[..., object], *args: Any) -> bool:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed
            return False
        return True

    def run(self, work: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """`work`'s result; `concurrent.futures.TimeoutError` after `timeout` (work goes on)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout)

    def stop(self) -> None:
        if self._stop is not None:
            self.call_soon(self._stop.set)

    def join(self, timeout: float | None = None) -> bool:
        """True once the thread has ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
