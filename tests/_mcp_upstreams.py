"""Upstream MCP servers for the mount and gateway tests, started and stopped by the tests.

* `Fifos`: the report and release FIFOs of the `mcp_upstream` bodies (see that module); the
  test reads reports with `expect(prefix)` (select() on the FIFO, bounded by `WAIT`) and lets
  one `steps` body return with `release()`.
* `stdio_entry(fifos)`: the client configuration entry that runs `python -m toolreg mcp
  mcp_upstream` (a toolreg registry served over stdio), with the import path it needs: the
  SDK's stdio client hands a child only a few variables of our environment, plus `env`.
* `http_upstream(legacy=False)`: the SDK's own high-level server (`MCPServer`) on uvicorn at
  127.0.0.1 on a free port, in a thread; `legacy=True` refuses `server/discover`, so clients
  fall back to the 2025 initialize handshake. Its tools hand-shake with the test through
  `threading.Event`s.
"""

from __future__ import annotations

import os
import select
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from typing_extensions import TypedDict

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
WAIT = 30.0


class Fifos:
    """The report FIFO (read by the test) and the release FIFO (written by the test)."""

    def __init__(self, directory: Path) -> None:
        self.report_path = directory / "report.fifo"
        self.release_path = directory / "release.fifo"
        os.mkfifo(self.report_path)
        os.mkfifo(self.release_path)
        # Read-write ends: opening never blocks, a writer always finds a reader, the reader
        # never sees EOF between writers, and a released byte stays until a body reads it.
        self._report = os.open(self.report_path, os.O_RDWR | os.O_NONBLOCK)
        self._release = os.open(self.release_path, os.O_RDWR | os.O_NONBLOCK)
        self._buffer = b""
        self.seen: list[str] = []  # every line read, for a failing assertion's message

    @property
    def env(self) -> dict[str, str]:
        return {
            "TOOLREG_TEST_REPORT": str(self.report_path),
            "TOOLREG_TEST_RELEASE": str(self.release_path),
        }

    def expect(self, prefix: str) -> str:
        """The rest of the next report line that starts with `prefix` (others are skipped)."""
        limit = time.monotonic() + WAIT
        while True:
            while b"\n" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\n", 1)
                line = raw.decode()
                self.seen.append(line)
                if line.startswith(prefix):
                    return line[len(prefix) :].strip()
            left = limit - time.monotonic()
            if left <= 0 or not select.select([self._report], [], [], left)[0]:
                raise AssertionError(f"no {prefix!r} report within {WAIT}s; saw {self.seen}")
            self._buffer += os.read(self._report, 65536)

    def release(self) -> None:
        """Let one `steps` body return."""
        os.write(self._release, b"x")

    def close(self) -> None:
        os.close(self._report)
        os.close(self._release)


def stdio_entry(fifos: Fifos, target: str = "mcp_upstream") -> dict[str, Any]:
    """The configuration entry of `python -m toolreg mcp <target>` over stdio."""
    path = os.pathsep.join([str(TESTS), str(ROOT)])
    return {
        "command": sys.executable,
        "args": ["-m", "toolreg", "mcp", target],
        "env": {"PYTHONPATH": path, **fifos.env},
        "cwd": str(ROOT),
    }


class Echoed(TypedDict):
    text: str


@dataclass
class HttpUpstream:
    """The running HTTP upstream: its URL and the events its tools set or wait for."""

    url: str
    started: threading.Event = field(default_factory=threading.Event)  # `slow` began
    cancelled: threading.Event = field(default_factory=threading.Event)  # `slow` was cancelled
    stepped: threading.Event = field(default_factory=threading.Event)  # `steps` reported 1..3
    release: threading.Event = field(default_factory=threading.Event)  # lets `steps` return
    calls: list[str] = field(default_factory=list)  # tools/call names, in arrival order
    cancels: list[str] = field(default_factory=list)  # reasons of notifications/cancelled


class _LegacyOnly:
    """Server middleware: no `server/discover`, so a client falls back to `initialize`."""

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        if ctx.method == "server/discover":
            raise MCPError(types.METHOD_NOT_FOUND, "this server speaks the 2025 handshake only")
        return await call_next(ctx)


class _Recorder:
    """Server middleware: records every tools/call and every notifications/cancelled."""

    def __init__(self, state: HttpUpstream) -> None:
        self.state = state

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        params = ctx.params or {}
        if ctx.method == "tools/call":
            self.state.calls.append(str(params.get("name")))
        elif ctx.method == "notifications/cancelled":
            self.state.cancels.append(str(params.get("reason")))
        return await call_next(ctx)


def _build(state: HttpUpstream, legacy: bool) -> MCPServer:
    middleware: list[Any] = [_Recorder(state)]
    if legacy:
        middleware.append(_LegacyOnly())
    server = MCPServer("web", middleware=middleware)

    @server.tool(description="Say it back", title="Echo")
    def echo(text: str) -> Echoed:
        return {"text": text}

    @server.tool(description="Waits until cancelled")
    async def slow() -> str:
        state.started.set()
        try:
            await anyio.sleep(WAIT)
        except BaseException:
            state.cancelled.set()
            raise
        return "slept"

    @server.tool(description="Reports progress 1..3, then returns once released")
    async def steps(ctx: Context) -> str:
        for step in (1, 2, 3):
            await ctx.report_progress(step, 3, f"step {step}")
        state.stepped.set()
        await anyio.to_thread.run_sync(state.release.wait, WAIT)
        return "stepped"

    @server.tool(description="Adds a tool named fresh, and says so")
    async def grow(ctx: Context) -> str:
        server.add_tool(lambda: "fresh!", name="fresh", description="Added while serving")
        if legacy:  # 2025: a notification
            await ctx.request_context.session.send_tool_list_changed()
        else:  # 2026-07-28: an event on the subscriptions/listen streams
            await ctx.notify_tools_changed()
        return "grown"

    return server


@contextmanager
def http_upstream(legacy: bool = False) -> Iterator[HttpUpstream]:
    """`MCPServer` on uvicorn at 127.0.0.1:<free port>, stopped and joined on exit."""
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()  # clients that come before uvicorn serves wait in the backlog
        state = HttpUpstream(url=f"http://127.0.0.1:{sock.getsockname()[1]}/mcp")
        app = _build(state, legacy).streamable_http_app()
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="upstream")
        thread.start()
        try:
            yield state
        finally:
            state.release.set()
            server.should_exit = True
            thread.join(WAIT)
            assert not thread.is_alive(), "the HTTP upstream did not stop"


def children() -> set[int]:
    """The pids whose parent is this process (from /proc; a zombie counts: not reaped)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:  # it ended meanwhile
            continue
        if int(fields[1]) == os.getpid():
            found.add(int(entry))
    return found


def exists(pid: int) -> bool:
    """Whether `pid` is still a process (a zombie is: it was not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def mount_threads() -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == "toolreg-mcp-mount")
