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
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest

pytest.importorskip("mcp")

import anyio
import mcp_types as types
from _registry_helpers import WAIT
from mcp import Client
from test_mcp import RawServer, call, raw_server, run, served

from toolreg import ErrorCode, ToolContext, ToolRegistry
from toolreg.mcp import build_server

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
