"""Tests for toolreg.mcp against what a hostile client or a strange string still broke.

Each test pins one behaviour: hostile text on the wire (a lone surrogate), a client that stops
reading, requests beyond the parser's limits, output a tool left buffered, foreign origins and
hosts, dropped HTTP connections, and the cancel reason over HTTP. The stdio server runs in a
subprocess (`python -m toolreg mcp mcp_edges_fixture`, driven by `RawServer` from
`test_mcp.py`); the HTTP server runs in-process on uvicorn at 127.0.0.1 or, for the CLI, in a
subprocess. Every wait is bounded by `WAIT`.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import Any

import pytest

pytest.importorskip("mcp")

import anyio
import httpx2  # the MCP SDK's own HTTP client: installed with the extra
import mcp_types as types
from _registry_helpers import WAIT, Gate
from mcp import Client
from mcp.server.streamable_http import EventMessage, EventStore
from test_mcp import (
    RawServer,
    _wait_for,
    add_cooperative,
    call,
    in_thread,
    raw_server,
    run,
    served,
)

from toolreg import ErrorCode, ToolContext, ToolRegistry
from toolreg.mcp import RequestCancelled, build_server

LATIN1_NAME = os.fsdecode(b"caf\xe9.txt")  # what os.listdir() yields: a lone surrogate
LATIN1_NAME_ON_THE_WIRE = "caf\\udce9.txt"  # the escape's six characters, not the code point


def next_message(server: RawServer) -> dict[str, Any]:
    """The next message the server wrote, whatever it is."""
    line = server.out.get(timeout=WAIT)
    assert line, "the server closed stdout"
    message: dict[str, Any] = json.loads(line)
    return message


def text_of(answer: dict[str, Any]) -> str:
    text: str = answer["result"]["content"][0]["text"]
    return text


# -- hostile text ---------------------------------------------------------------------------------


def test_stdio_a_lone_surrogate_in_a_result_an_error_or_progress_is_escaped_and_served_on() -> None:
    with raw_server(target="mcp_edges_fixture") as server:
        server.initialize()
        server.send(call(1, "held"))  # in flight throughout: it must not be disturbed
        assert server.expect("BODY STARTED").startswith("mcp:1:")
        server.send(call(2, "lone_surrogate", how="return"))
        assert text_of(server.answer(2)) == LATIN1_NAME_ON_THE_WIRE
        server.send(call(3, "lone_surrogate", how="raise"))
        raised = server.answer(3)
        assert raised["result"]["isError"] is True
        assert text_of(raised) == f"Error: ValueError: {LATIN1_NAME_ON_THE_WIRE}"
        progress_call = call(4, "lone_surrogate", how="progress")
        progress_call["params"]["_meta"] = {"progressToken": "p4"}
        server.send(progress_call)
        progress = next_message(server)
        assert progress["method"] == "notifications/progress"
        assert progress["params"]["message"] == LATIN1_NAME_ON_THE_WIRE
        assert text_of(server.answer(4)) == "reported"
        server.send(call(5, "lone_surrogate", how="object"))
        structured = server.answer(5)["result"]
        expected = {"file": LATIN1_NAME_ON_THE_WIRE, LATIN1_NAME_ON_THE_WIRE: 1}
        assert structured["structuredContent"] == expected
        assert structured["_meta"]["toolreg/contexts"] == [{"file": LATIN1_NAME_ON_THE_WIRE}]
        server.send(call(6, "add", a=1, b=2))
        assert server.answer(6)["result"]["structuredContent"] == {"sum": 3}
        # The held call was never cancelled: only the end of the input cancels it.
        assert server.proc.stdin is not None
        server.proc.stdin.close()
        cancelled = server.expect("BODY CANCELLED")
        assert cancelled == "MCP request 1 ended: the client disconnected or the connection closed"
        server.release()
        status, written = server.finish()
        after = server.rest_of_stderr()
    assert status == 0
    assert written == []
    assert not any("Traceback" in line for line in server.errors + after)


@asynccontextmanager
async def http_served(app: Any, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """`app` on uvicorn at `host` and an ephemeral port until the block ends; yields its URL."""
    import uvicorn

    with socket.socket() as sock:
        sock.bind((host, 0))
        sock.listen()  # a client connecting before uvicorn serves waits in the backlog
        port = sock.getsockname()[1]
        config = uvicorn.Config(app, host=host, port=port, log_level="warning")
        server = uvicorn.Server(config)
        async with anyio.create_task_group() as group:
            group.start_soon(partial(server.serve, sockets=[sock]))
            try:
                yield f"http://127.0.0.1:{port}/mcp"
            finally:
                server.should_exit = True


def add_lone_surrogate_tools(registry: ToolRegistry) -> None:
    @registry.tool(description="returns a lone surrogate")
    def listed(args: Any, ctx: ToolContext) -> dict[str, str]:
        ctx.report_progress(1, 2, LATIN1_NAME)
        return {"file": LATIN1_NAME}

    @registry.tool(description="raises with a lone surrogate")
    def broken(args: Any, ctx: ToolContext) -> None:
        raise OSError(LATIN1_NAME)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_streamable_http_answers_a_lone_surrogate_escaped(mode: str) -> None:
    messages: list[str | None] = []
    with served() as (registry, observed):
        add_lone_surrogate_tools(registry)

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            messages.append(message)

        async def main() -> tuple[types.CallToolResult, types.CallToolResult]:
            app = build_server(registry).streamable_http_app()
            async with http_served(app) as url, Client(url, mode=mode) as client:
                listed = await client.call_tool(
                    "listed", read_timeout_seconds=WAIT, progress_callback=on_progress
                )
                broken = await client.call_tool("broken", read_timeout_seconds=WAIT)
            return listed, broken

        listed, broken = run(main)
    assert listed.structured_content == {"file": LATIN1_NAME_ON_THE_WIRE}
    assert broken.is_error
    assert broken.content[0].model_dump()["text"] == f"Error: OSError: {LATIN1_NAME_ON_THE_WIRE}"
    assert messages in ([LATIN1_NAME_ON_THE_WIRE], [])  # progress may be coalesced away
    assert observed.codes == [None, ErrorCode.TOOL_ERROR]


# -- stdio: a client that misbehaves ---------------------------------------------------------------


def read_line(server: RawServer) -> bytes:
    """One line of the server's stdout, read by the test itself (no pump thread holds it)."""
    assert server.proc.stdout is not None
    fd = server.proc.stdout.fileno()
    line = b""
    while not line.endswith(b"\n"):
        assert select.select([fd], [], [], WAIT)[0], "no output"
        chunk = os.read(fd, 1)
        assert chunk, "the server closed stdout"
        line += chunk
    return line


def test_stdio_a_client_that_stops_reading_is_a_clean_disconnect() -> None:
    with raw_server(read_stdout=False) as server:
        params = {"protocolVersion": "2025-11-25", "capabilities": {}}
        params["clientInfo"] = {"name": "raw", "version": "0"}
        server.send({"id": 0, "method": "initialize", "params": params})
        assert json.loads(read_line(server))["id"] == 0
        server.send({"method": "notifications/initialized"})
        server.send(call(1, "held"))
        assert server.expect("BODY STARTED").startswith("mcp:1:")
        assert server.proc.stdout is not None
        server.proc.stdout.close()  # the client stops reading, and its read end is gone
        server.send(call(2, "add", a=1, b=2))  # answering it finds the pipe broken
        cancelled = server.expect("BODY CANCELLED")
        assert cancelled == "MCP request 1 ended: the client disconnected or the connection closed"
        server.release()
        status = server.proc.wait(timeout=WAIT)
        after = server.rest_of_stderr()
    assert status == 0
    assert after[0] == "BODY ENDED"
    assert "stopped (stdio); every call settled" in after[-2]
    assert not any("Traceback" in line or "Error" in line for line in server.errors + after)


def test_stdio_a_request_beyond_the_parsers_limits_is_answered_for_its_id() -> None:
    deep = {"a": json.loads("[" * 200 + "]" * 200)}
    with raw_server() as server:
        server.initialize()
        # Nested 200 levels deep, or holding a 5,000-digit integer: valid JSON, beyond the
        # SDK parser's limits.
        server.send(call(5, "add", **deep))
        assert server.answer(5)["error"]["code"] == types.INVALID_PARAMS
        assert server.proc.stdin is not None
        huge = '{"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "add", '
        huge += '"arguments": {"a": ' + "9" * 5000 + ', "b": 1}}}\n'
        server.proc.stdin.write(huge.encode())
        server.proc.stdin.flush()
        refused = server.answer(6)["error"]
        assert refused["code"] == types.INVALID_PARAMS
        assert "number out of range" in refused["message"]
        # A notification the parser cannot read is never answered; neither is a blank line.
        cancel = {"method": "notifications/cancelled", "params": {"requestId": 1, "x": deep}}
        server.send(cancel)
        server.proc.stdin.write(b"\n")
        # Not JSON at all, or not a message: answered with a null id.
        server.proc.stdin.write(b"{this is not json\n")
        server.proc.stdin.flush()
        assert server.answer(None)["error"]["code"] == types.PARSE_ERROR  # type: ignore[arg-type]
        server.send({"id": 7, "method": 42})
        assert server.answer(7)["error"]["code"] == types.INVALID_REQUEST
        server.send(call(8, "add", a=1, b=2))
        assert server.answer(8)["result"]["structuredContent"] == {"sum": 3}
        server.proc.stdin.close()
        status, written = server.finish()
    assert status == 0
    assert written == []


def test_stdio_output_a_tool_left_buffered_never_reaches_the_wire_after_serving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # sys.stdout buffers, as by default
    with raw_server(target="mcp_edges_fixture") as server:
        server.initialize()
        server.send(call(1, "buffered_print"))
        assert text_of(server.answer(1)) == "printed"
        assert server.proc.stdin is not None
        server.proc.stdin.close()
        status = server.proc.wait(timeout=WAIT)
        after_serving = []
        while line := server.out.get(timeout=WAIT):
            after_serving.append(line)
        stderr = server.rest_of_stderr()
    assert status == 0
    assert after_serving == []  # the wire carried nothing after the last answer
    assert "stray output a tool left in sys.stdout's buffer" in server.errors + stderr


def test_stdio_an_answer_that_cannot_be_encoded_becomes_an_error_for_its_request() -> None:
    from toolreg.mcp._stdio import _encode

    unencodable = types.JSONRPCResponse(jsonrpc="2.0", id=3, result={"text": LATIN1_NAME})
    line = _encode(unencodable)
    assert line is not None and line.endswith(b"\n")
    error = json.loads(line)
    assert error["id"] == 3 and error["error"]["code"] == types.INTERNAL_ERROR
    notification = types.JSONRPCNotification(
        jsonrpc="2.0", method="notifications/message", params={"data": LATIN1_NAME}
    )
    assert _encode(notification) is None  # dropped (and logged): it answers nothing


# -- streamable HTTP: DNS rebinding ---------------------------------------------------------------


def http_address(server: RawServer) -> tuple[str, int]:
    """Read the server's stderr up to the line announcing its URL; (host, port) it listens on."""
    line = server.expect("")
    while "MCP server 'toolreg' at http://" not in line:
        line = server.expect("")
    where = line.split(" at http://", 1)[1].split("/", 1)[0]
    host, _, port = where.rpartition(":")
    return host, int(port)


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}


def jsonrpc(message: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", **message}


def post_status(port: int, headers: dict[str, str], body: object = INITIALIZE) -> int:

    accept = {"Accept": "application/json, text/event-stream"}
    url = f"http://127.0.0.1:{port}/mcp"
    response = httpx2.post(url, json=body, headers={**accept, **headers}, timeout=WAIT)
    return response.status_code


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_streamable_http_refuses_foreign_origins_and_hosts_whatever_the_bind_address(
    host: str,
) -> None:
    allow = ["--allow-origin", "https://app.example", "--allow-host", "tools.example"]
    with raw_server("--transport", "streamable-http", "--host", host, "--port", "0", *allow) as (
        server
    ):
        bound, port = http_address(server)
        assert bound == host
        warned = [line for line in server.errors if "beyond loopback" in line]
        if host == "127.0.0.1":
            assert warned == []
        else:
            assert len(warned) == 1
            assert "anyone who can reach it can list and call every tool" in warned[0]
            assert "https://app.example" in warned[0] and "tools.example" in warned[0]
        assert post_status(port, {}) == 200  # no Origin: not a browser
        assert post_status(port, {"Origin": f"http://localhost:{port}"}) == 200
        assert post_status(port, {"Origin": "https://app.example"}) == 200
        assert post_status(port, {"Origin": "http://evil.example"}) == 403
        assert post_status(port, {"Origin": "null"}) == 403
        assert post_status(port, {"Host": f"tools.example:{port}"}) == 200
        assert post_status(port, {"Host": f"evil.example:{port}"}) == 421
        # The per-request (2026) wire is checked the same way.
        modern = {"Origin": "http://evil.example", "Mcp-Protocol-Version": "2026-07-28"}
        assert post_status(port, modern, jsonrpc(call(1, "add", a=1, b=1))) == 403
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=WAIT) == 0


def test_serve_refuses_allowed_hosts_or_origins_that_are_not_lists_of_names() -> None:
    from toolreg.mcp import serve

    with served() as (registry, _):
        with pytest.raises(TypeError, match="allowed_origins must be an iterable of str"):
            serve(registry, allowed_origins="https://app.example")
        with pytest.raises(ValueError, match="allowed_hosts must hold non-empty str"):
            serve(registry, allowed_hosts=["tools.example", ""])
        with pytest.raises(ValueError, match="allowed_hosts"):
            serve(registry, allowed_hosts=[" tools.example"])


# -- streamable HTTP: a dropped stream, the cancel's reason ---------------------------------------


class MemoryEventStore(EventStore):
    """Every event kept in memory, replayed after the one a resuming client names."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, types.JSONRPCMessage | None]] = []
        self.answered = threading.Event()  # an answer (a result or an error) is stored

    async def store_event(self, stream_id: str, message: types.JSONRPCMessage | None) -> str:
        event_id = str(len(self.events) + 1)
        self.events.append((event_id, stream_id, message))
        if message is not None:
            wire = json.loads(message.model_dump_json(by_alias=True, exclude_none=True))
            if "result" in wire or "error" in wire:
                self.answered.set()
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: Any) -> str | None:
        stream = next((s for e, s, _ in self.events if e == last_event_id), None)
        for event_id, stream_id, message in self.events[int(last_event_id) :]:
            if stream_id == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream


async def legacy_session(client: httpx2.AsyncClient, url: str) -> dict[str, str]:
    """A 2025-11-25 session, initialized; the headers every later request carries."""
    accept = {"Accept": "application/json, text/event-stream"}
    response = await client.post(url, json=INITIALIZE, headers=accept)
    assert response.status_code == 200
    headers = {**accept, "Mcp-Session-Id": response.headers["mcp-session-id"]}
    headers["Mcp-Protocol-Version"] = "2025-11-25"
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await client.post(url, json=initialized, headers=headers)).status_code == 202
    return headers


@contextmanager
def logged(text: str) -> Iterator[Logged]:
    """A `Logged` on the `toolreg` logger, which logs INFO records for the block."""
    handler, toolreg_logger = Logged(text), logging.getLogger("toolreg")
    level = toolreg_logger.level
    toolreg_logger.addHandler(handler)
    toolreg_logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        toolreg_logger.setLevel(level)
        toolreg_logger.removeHandler(handler)


class Logged(logging.Handler):
    """Sets `seen` once a record on the `toolreg` logger contains `text`."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()

    def wait(self, timeout: float) -> None:
        assert self.seen.wait(timeout), f"never logged: {self.text!r}"


@pytest.mark.parametrize("resumable", [False, True])
def test_a_dropped_http_stream_cancels_the_call_unless_the_client_can_resume_it(
    resumable: bool,
) -> None:
    gate, seen = Gate(), {}
    with logged("the client dropped its stream") as dropped, served() as (registry, observed):

        @registry.tool(description="waits for its token, or for the test")
        def held(args: Any, ctx: ToolContext) -> dict[str, bool]:
            seen["token"] = ctx.token
            gate.reached.set()
            if not resumable:
                assert ctx.token.wait(WAIT)
                ctx.token.raise_if_cancelled()
            gate.hold()
            return {"cancelled": ctx.token.cancelled}

        async def main() -> list[str]:
            store = MemoryEventStore() if resumable else None
            app = build_server(registry).streamable_http_app(event_store=store)
            async with http_served(app) as url, httpx2.AsyncClient(timeout=WAIT) as client:
                headers = await legacy_session(client, url)
                last_event = None
                async with client.stream(
                    "POST", url, json=jsonrpc(call(1, "held")), headers=headers
                ) as s:
                    assert s.status_code == 200
                    if resumable:  # the priming event names where the stream may resume
                        lines = s.aiter_lines()
                        while not (line := await anext(lines)).startswith("id:"):
                            pass
                        last_event = line.partition(":")[2].strip()
                    await in_thread(gate.wait_reached)
                # The response was not read to its end: leaving the block dropped the connection.
                await in_thread(partial(dropped.wait, WAIT))
                if not resumable:
                    await in_thread(partial(_wait_for, lambda: len(observed.results) == 1))
                    return []
                gate.release()
                # Resumed once the answer is stored, so the replay carries it. (A resume racing
                # the answer's arrival depends on how the SDK hands a replay over to a live
                # stream, which is not what this test is about.)
                assert store is not None
                await in_thread(partial(store.answered.wait, WAIT))
                assert store.answered.is_set(), "the answer was never stored"
                resumed = {**headers, "Last-Event-ID": str(last_event)}
                async with client.stream("GET", url, headers=resumed) as replay:
                    async for (
                        line
                    ) in replay.aiter_lines():  # the stream stays open: read to the answer
                        if line.startswith("data:") and '"id":1' in line:
                            return [line]
                raise AssertionError("the resumed stream ended without the answer")

        replayed = run(main)
    reason = seen["token"].reason
    if resumable:
        assert reason is None  # never cancelled: the call went on
        answer = json.loads(replayed[-1].partition(":")[2])
        assert answer["id"] == 1 and answer["result"]["structuredContent"] == {"cancelled": False}
        assert observed.codes == [None]
    else:
        assert isinstance(reason, RequestCancelled) and reason.cause == "closed"
        assert (
            str(reason) == "MCP request 1 ended: the client disconnected or the connection closed"
        )
        assert observed.codes == [ErrorCode.ABORTED]


def test_a_cancel_on_the_per_request_http_wire_reaches_the_body_as_the_clients() -> None:
    """At 2026-07-28 a client cancels (read timeouts too) by closing the request's stream,
    which carries no reason: the body is told it was the client, not a lost connection."""
    gate, seen = Gate(), dict[str, Any]()
    with served() as (registry, observed):
        add_cooperative(registry, gate, seen)

        async def main() -> None:
            app = build_server(registry).streamable_http_app()
            async with http_served(app) as url, Client(url, mode="auto") as client:
                scope = anyio.CancelScope()

                async def call_it() -> None:
                    with scope:
                        await client.call_tool("cooperative")

                async with anyio.create_task_group() as group:
                    group.start_soon(call_it)
                    await in_thread(gate.wait_reached)
                    scope.cancel()
                await in_thread(partial(_wait_for, lambda: len(observed.results) == 1))

        run(main)
    reason = seen["reason"]
    assert isinstance(reason, RequestCancelled)
    assert (reason.cause, reason.client_reason) == ("client", None)
    assert (
        str(reason)
        == f"MCP request {reason.request_id!r} cancelled by the client: (no reason given)"
    )
    assert observed.codes == [ErrorCode.ABORTED]
