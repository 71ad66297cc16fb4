"""The stdio wire of `toolreg.mcp.serve`: toolreg's own reader and writer around the SDK's server.

The SDK's `stdio_server()` is not used, for four reasons, each a way a client could break it:

* Its stdin reader runs in an anyio worker thread that cannot be abandoned: after a SIGTERM the
  server could not leave until the client closed stdin. `StdinLines` reads in a daemon thread
  of its own and can end the stream at once.
* A line it cannot parse (valid JSON nested deeper than the parser allows, or an integer too
  large for it) is dropped, so the client waits forever for that request. Here it is answered
  with an error for its id whenever the id can be read (`refusal`).
* A message it cannot encode, or a client that stopped reading (`BrokenPipeError`), kills its
  writer task, and with it the whole server, which exits 1 with a traceback. Here a message
  that cannot be encoded becomes an error answer for its request, and a client that is gone
  ends the input: the connection closes the usual way (calls cancelled and joined, exit 0).
* Output a tool buffered in `sys.stdout` was flushed to the wire at exit, after fd 1 pointed
  at it again. `StdoutLines.restore()` flushes it to stderr first.

While serving, fd 0 reads from the null device and fd 1 writes to stderr (as the SDK does): the
protocol's lines travel on private duplicates of both, so neither a tool's `print()` nor a
child process can touch them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from .._text import safe_str

__all__ = ["StdinLines", "StdoutLines", "refusal", "stdio_streams"]

logger = logging.getLogger("toolreg")

_MAX_ID_DIGITS = 20  # an integer id longer than this is not one a client would pick


Streams = tuple[
    MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]
]


@asynccontextmanager
async def stdio_streams(lines: StdinLines, out: StdoutLines) -> AsyncIterator[Streams]:
    """The server's (read, write) streams over `lines` and `out`, until the body returns.

    On exit the input is stopped, and every message already handed to the write stream is
    written (or dropped, if the client is gone) before this returns.
    """
    read_send, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write, write_receive = anyio.create_memory_object_stream[SessionMessage](0)
    async with anyio.create_task_group() as group:
        group.start_soon(_read, lines, read_send, write.clone())
        group.start_soon(_write, write_receive, out, lines)
        try:
            yield read, write
        finally:
            lines.stop()
            read.close()  # a reader blocked handing over a line gives up
            write.close()


async def _read(
    lines: StdinLines,
    read_send: MemoryObjectSendStream[SessionMessage | Exception],
    answers: MemoryObjectSendStream[SessionMessage],
) -> None:
    """Parse each line into a message for the server; answer a request it cannot read."""
    with read_send, answers:
        async for line in lines:
            try:
                message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            except ValueError as exc:  # pydantic's ValidationError
                refused = refusal(line, exc)
                if refused is not None:
                    try:
                        await answers.send(SessionMessage(refused))
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        return
                continue
            try:
                await read_send.send(SessionMessage(message))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return  # the server stopped reading


async def _write(
    write_receive: MemoryObjectReceiveStream[SessionMessage], out: StdoutLines, lines: StdinLines
) -> None:
    """Write each message as one line; once the client stops reading, end the input."""
    with write_receive:
        async for item in write_receive:
            line = _encode(item.message)
            if line is None or out.broken:
                continue
            if not await out.write(line):
                logger.info(
                    "toolreg: MCP client stopped reading (stdout closed); cancelling the calls "
                    "in flight and stopping"
                )
                lines.stop()


def _encode(message: types.JSONRPCMessage) -> bytes | None:
    """`message` as one line of JSON; for a response that cannot be encoded, an error for its
    request instead; None (logged) for another message that cannot be encoded."""
    try:
        return message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
    except ValueError as exc:  # pydantic's PydanticSerializationError
        problem = safe_str(exc).encode("ascii", "backslashreplace").decode()
        if not isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            logger.error(
                "toolreg: an MCP message could not be encoded and was dropped: %s", problem
            )
            return None
        logger.error(
            "toolreg: the answer to MCP request %r could not be encoded: %s", message.id, problem
        )
        error = types.ErrorData(
            code=types.INTERNAL_ERROR, message=f"the answer could not be encoded as JSON: {problem}"
        )
        substitute = types.JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
        return substitute.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"


def refusal(line: str, problem: Exception) -> types.JSONRPCError | None:
    """The error that answers a line the SDK cannot read, or None when nothing may answer it.

    A request whose id can be read is answered for that id: `INVALID_PARAMS` when it is a
    well-formed request whose content is beyond the parser's limits, `INVALID_REQUEST`
    otherwise. A notification, a response, or a blank line is never answered. Anything else
    is answered with a null id: `PARSE_ERROR` if it is not JSON, `INVALID_REQUEST` if it is.
    """
    if not line.strip():
        return None
    why = _first_problem(problem)
    try:
        # No number is converted (Python's own digit limit would refuse a long one), and
        # nesting is bounded by the recursion limit, far beyond the SDK parser's.
        found = json.loads(line, parse_int=_Digits, parse_float=float, parse_constant=float)
    except (ValueError, RecursionError):
        return _error(None, types.PARSE_ERROR, f"Parse error: {why}")
    if not isinstance(found, dict):
        return _error(None, types.INVALID_REQUEST, f"Invalid request: {why}")
    if "id" not in found and isinstance(found.get("method"), str):
        return None  # a notification: never answered
    if "method" not in found and ("result" in found or "error" in found):
        return None  # an answer to a request this server never sends
    request_id = _request_id(found.get("id"))
    code = types.INVALID_PARAMS if isinstance(found.get("method"), str) else types.INVALID_REQUEST
    if request_id is None:
        code = types.INVALID_REQUEST
    return _error(request_id, code, f"Invalid request: {why}")


class _Digits:
    """A JSON integer's digits, kept as text (not a `str`: a number is not a method name)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _request_id(value: object) -> str | int | None:
    if isinstance(value, _Digits):
        digits = value.text.lstrip("-")
        return int(value.text) if len(digits) <= _MAX_ID_DIGITS else None
    return value if isinstance(value, str) else None


def _first_problem(problem: Exception) -> str:
    errors = getattr(problem, "errors", None)
    try:
        message = errors()[0]["msg"] if callable(errors) else safe_str(problem)
    except Exception:
        message = safe_str(problem)
    return str(message).encode("ascii", "backslashreplace").decode()


def _error(request_id: str | int | None, code: int, message: str) -> types.JSONRPCError:
    error = types.ErrorData(code=code, message=message)
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)


class StdoutLines:
    """The protocol's output: whole lines written to a private duplicate of fd 1.

    Construction takes fd 1 over: the lines go to a private duplicate, and fd 1 writes to
    stderr until `restore()`. `write()` runs on the event loop and writes in a worker thread;
    once a write fails (the client closed its end) every later line is dropped.
    """

    def __init__(self) -> None:
        self._fd = _private_duplicate(1)
        try:
            os.dup2(2, 1)
        except OSError:  # no stderr: stray output goes nowhere
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, 1)
            finally:
                os.close(null)
        self.broken = False  # a write failed: the client is gone (event loop only)

    async def write(self, line: bytes) -> bool:
        """Write `line` whole; False (and nothing written from now on) if the client is gone."""
        if self.broken:
            return False
        try:
            await anyio.to_thread.run_sync(_write_all, self._fd, line)
        except OSError:  # BrokenPipeError, ConnectionResetError, an I/O error
            self.broken = True
            return False
        return True

    def restore(self) -> None:
        """Point fd 1 back at the protocol stream, once what `sys.stdout` buffered while serving
        has gone where fd 1 pointed then (stderr), never onto the wire."""
        for stream in (sys.stdout, sys.__stdout__):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):  # closed, or its descriptor is gone
                pass
        os.dup2(self._fd, 1)
        os.close(self._fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


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
