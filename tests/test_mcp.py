"""Tests for toolreg.mcp: a registry served over MCP, driven by the SDK's own client.

Three wires. In memory: `Client(..., mode="legacy")` over JSON-RPC memory streams, the server
writing through a `Tap` that records every message it sends: the "no reply" oracle. A
`Settled` middleware (the SDK's public `Server.middleware`) tells when a request's handler has
returned, after which the dispatcher has written its answer or never will. Over stdio: the
server is `python -m toolreg mcp mcp_fixture` in a subprocess (see `mcp_fixture.py`), driven by
`Client(StdioServerParameters)` or by raw JSON-RPC lines. Over streamable HTTP: uvicorn on
127.0.0.1, an ephemeral port, started by the test (and, for the CLI, in a subprocess).

Bodies synchronize on `threading.Event`s (`Gate`) and, across processes, on lines of stderr
and a release pipe; nothing sleeps to order anything, and every wait is bounded by `WAIT`.
Async tests are plain functions that drive `anyio.run` (no pytest plugin).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("mcp")

import anyio
import mcp_types as types
from _registry_helpers import WAIT, Gate, Observed, gc_paused, open_registry
from mcp import Client, StdioServerParameters
from mcp.server import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.memory import create_client_server_memory_streams
from mcp.shared.message import SessionMessage

from toolreg import (
    CancelSource,
    ErrorCode,
    TimeoutPolicy,
    ToolContext,
    ToolRegistry,
)
from toolreg.mcp import RequestCancelled, build_server

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

ABORTED = ErrorCode.ABORTED
BEFORE = ErrorCode.ABORTED_BEFORE_DISPATCH


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return anyio.run(main, backend="asyncio")


async def in_thread(wait: Callable[[], object]) -> None:
    """Run a blocking handshake (`gate.wait_reached`, ...) off the event loop."""
    await anyio.to_thread.run_sync(wait)


def request_id_of(ctx: ToolContext) -> int:
    """The JSON-RPC id of the request a body runs for, read from its `mcp:<id>:<nonce>` id."""
    match = re.fullmatch(r"mcp:(\d+):\S+", ctx.call.call_id)
    assert match, ctx.call.call_id
    return int(match.group(1))


# -- the in-memory wire ---------------------------------------------------------------------------


class Tap:
    """The server's write stream, recording every message before passing it on."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sent: list[Any] = []

    async def send(self, item: SessionMessage, /) -> None:
        self.sent.append(item.message)
        await self.inner.send(item)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> Tap:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.inner.aclose()

    def answered(self, request_id: int) -> bool:
        """True if a response or an error for `request_id` went on the wire."""
        answers = (types.JSONRPCResponse, types.JSONRPCError)
        return any(isinstance(m, answers) and m.id == request_id for m in self.sent)

    def progress(self) -> list[tuple[Any, float]]:
        """(progressToken, progress) of every progress notification, in wire order."""
        found: list[tuple[Any, float]] = []
        for m in self.sent:
            if isinstance(m, types.JSONRPCNotification) and m.method == "notifications/progress":
                assert m.params is not None
                found.append((m.params["progressToken"], m.params["progress"]))
        return found


class Settled:
    """Server middleware: an event per request id, set once its handler chain has returned."""

    def __init__(self) -> None:
        self.events: dict[Any, anyio.Event] = {}

    def event(self, request_id: Any) -> anyio.Event:
        return self.events.setdefault(request_id, anyio.Event())

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        try:
            return await call_next(ctx)
        finally:
            if ctx.request_id is not None:
                self.event(ctx.request_id).set()

    async def wait(self, request_id: Any) -> None:
        """Wait until the handler returned and the dispatcher has answered or never will."""
        with anyio.fail_after(WAIT):
            await self.event(request_id).wait()
        await anyio.wait_all_tasks_blocked()  # the dispatcher's write (if any) is done


class Wire:
    """One in-memory connection: the client, the server's tap, and handler completion."""

    def __init__(self, client: Client, tap: Tap, settled: Settled) -> None:
        self.client = client
        self.tap = tap
        self.settled = settled


@asynccontextmanager
async def tapped(server: Server[Any], taps: list[Tap]) -> AsyncIterator[Any]:
    async with create_client_server_memory_streams() as (client_streams, server_streams):
        tap = Tap(server_streams[1])
        taps.append(tap)
        options = server.create_initialization_options()
        async with anyio.create_task_group() as group:
            group.start_soon(partial(server.run, server_streams[0], tap, options))
            yield client_streams
            await client_streams[1].aclose()  # EOF: the server cancels and joins what is left


@asynccontextmanager
async def wire(
    server: Server[Any], mode: str = "legacy", **client_options: Any
) -> AsyncIterator[Wire]:
    settled = Settled()
    server.middleware.append(settled)
    taps: list[Tap] = []
    async with Client(tapped(server, taps), mode=mode, **client_options) as client:
        yield Wire(client, taps[0], settled)


@contextmanager
def served(**server_options: Any) -> Iterator[tuple[ToolRegistry, Observed]]:
    with open_registry(max_workers=4) as registry:
        observed = Observed()
        registry.on_result(observed)
        yield registry, observed


def meta(result: types.CallToolResult) -> dict[str, Any]:
    assert result.meta is not None
    return dict(result.meta)


# -- import hygiene ---------------------------------------------------------------------------


def test_importing_toolreg_never_imports_the_mcp_sdk() -> None:
    # The command line reads the `mcp` command's options (`toolreg.mcp._cli`) without the SDK.
    code = (
        "import sys, toolreg, toolreg.aio, toolreg.log, toolreg.process\n"
        "before = sorted(m for m in sys.modules if m.startswith('toolreg.mcp'))\n"
        "import toolreg.__main__\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('mcp', 'mcp_types', 'uvicorn', 'starlette') or m.startswith('toolreg.mcp'))\n"
        "print(before, loaded)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT, check=True
    )
    assert out.stdout.strip() == "[] ['toolreg.mcp', 'toolreg.mcp._cli', 'toolreg.mcp._gateway']"


def test_the_public_names_of_toolreg_mcp_are_pinned() -> None:
    import toolreg.mcp

    assert toolreg.mcp.__all__ == [
        "Mount",
        "RequestCancelled",
        "UpstreamError",
        "UpstreamToolError",
        "UpstreamUnavailable",
        "build_server",
        "mount",
        "serve",
    ]


def test_build_server_and_serve_refuse_bad_arguments_before_anything_runs() -> None:
    from toolreg.mcp import serve

    with open_registry(max_workers=1) as registry:
        with pytest.raises(TypeError, match="ToolRegistry"):
            build_server(object())  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_concurrent_calls"):
            build_server(registry, max_concurrent_calls=0)
        with pytest.raises(TypeError, match="CancelToken"):
            build_server(registry, token="stop")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="name"):
            build_server(registry, name="")
        with pytest.raises(ValueError, match="host"):
            serve(registry, transport="streamable-http", host="")
        with pytest.raises(ValueError, match="transport"):
            serve(registry, transport="sse")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="port"):
            serve(registry, transport="streamable-http", port=70000)
        with pytest.raises(ValueError, match="path"):
            serve(registry, transport="streamable-http", path="mcp")
        assert not registry.closed


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"max_concurrent_calls": "1"}, TypeError),
        ({"max_concurrent_calls": True}, TypeError),
        ({"max_concurrent_calls": 1.0}, TypeError),
        ({"max_concurrent_calls": 0}, ValueError),
        ({"transport": "streamable-http", "port": "8000"}, TypeError),
        ({"transport": "streamable-http", "port": True}, TypeError),
        ({"transport": "streamable-http", "port": -1}, ValueError),
        ({"transport": "streamable-http", "port": 65536}, ValueError),
    ],
)
def test_a_count_that_is_not_an_int_is_a_type_error_and_one_out_of_range_a_value_error(
    options: dict[str, Any], error: type[Exception]
) -> None:
    from toolreg.mcp import serve

    name = "port" if "port" in options else "max_concurrent_calls"
    with open_registry(max_workers=1) as registry, pytest.raises(error, match=name):
        serve(registry, **options)


def test_the_http_socket_listens_before_its_address_is_announced() -> None:
    """`serve` logs the URL before uvicorn serves: a client connecting then must not be refused."""
    from toolreg.mcp._transports import _bound

    with _bound("127.0.0.1", 0) as sock, socket.create_connection(sock.getsockname()[:2], WAIT):
        pass  # connected: the socket listens already


def test_the_cli_target_names_a_registry_or_a_factory_and_bad_targets_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolreg.__main__ import main
    from toolreg.mcp import _cli as mcp_cli

    monkeypatch.syspath_prepend(str(TESTS))
    import mcp_fixture

    assert mcp_cli.load_registry("mcp_fixture") == (mcp_fixture.registry, False)
    made, owned = mcp_cli.load_registry("mcp_fixture:make_registry")
    assert owned and [tool.name for tool in made.tools()] == ["add"]
    made.close()
    # A dotted attribute: an object in the module holding the registry, or a factory.
    holder = SimpleNamespace(registry=mcp_fixture.registry, make=mcp_fixture.make_registry)
    monkeypatch.setattr(mcp_fixture, "holder", holder, raising=False)
    assert mcp_cli.load_registry("mcp_fixture:holder.registry") == (mcp_fixture.registry, False)
    made, owned = mcp_cli.load_registry("mcp_fixture:holder.make")
    assert owned and [tool.name for tool in made.tools()] == ["add"]
    made.close()
    for target, problem in [
        ("mcp_fixture:nothing", "has no attribute 'nothing'"),
        ("mcp_fixture:WAIT", "is a float: name a ToolRegistry"),
        ("mcp_fixture:registry.nothing", "has no attribute 'registry.nothing'"),
        (":registry", "TARGET must be module:attribute"),
        ("no_such_module_here", "No module named"),
    ]:
        assert main(["mcp", target]) == 2
        assert problem in capsys.readouterr().err


# -- tools/list ---------------------------------------------------------------------------------


def test_list_tools_is_the_registrys_mcp_catalog_with_normalized_schemas() -> None:
    with served() as (registry, _):

        @registry.tool(description="no parameters at all", title="Ping")
        def ping(args: Any, ctx: ToolContext) -> str:
            return "pong"

        @registry.tool(
            description="a schema without a root type",
            parameters={"properties": {"q": {"type": "string"}}, "required": ["q"]},
            annotations={"readOnlyHint": True, "openWorldHint": False},
        )
        def search(args: Any, ctx: ToolContext) -> dict[str, Any]:
            return {"hits": []}

        @registry.tool(
            name="files.sum",
            description="an enforced output schema",
            output_schema={"type": "object", "properties": {"total": {"type": "number"}}},
            validate_output=True,
        )
        def files_sum(args: Any, ctx: ToolContext) -> dict[str, Any]:
            return {"total": 0}

        async def main() -> list[dict[str, Any]]:
            async with wire(build_server(registry)) as w:
                listing = await w.client.list_tools()
            return [t.model_dump(by_alias=True, exclude_none=True) for t in listing.tools]

        tools = run(main)
        assert tools == registry.schemas("mcp")
        by_name = {tool["name"]: tool for tool in tools}
        assert by_name["ping"]["inputSchema"] == {"type": "object", "properties": {}}
        assert by_name["ping"]["title"] == "Ping"
        assert by_name["search"]["inputSchema"]["type"] == "object"
        assert by_name["search"]["annotations"] == {"readOnlyHint": True, "openWorldHint": False}
        assert by_name["files.sum"]["outputSchema"]["properties"] == {"total": {"type": "number"}}


# -- results --------------------------------------------------------------------------------------


def test_a_success_is_text_plus_structured_content_when_the_value_is_an_object() -> None:
    with served() as (registry, observed):

        @registry.tool(description="an object")
        def stats(args: Any, ctx: ToolContext) -> dict[str, Any]:
            ctx.defer_context({"note": "counted"})
            return {"count": 2, "names": ("a", "b")}

        @registry.tool(description="a list")
        def names(args: Any, ctx: ToolContext) -> list[str]:
            ctx.defer_context(object())  # not JSON: left out of _meta
            return ["a", "b"]

        async def main() -> tuple[types.CallToolResult, types.CallToolResult]:
            async with wire(build_server(registry)) as w:
                return await w.client.call_tool("stats"), await w.client.call_tool("names")

        first, second = run(main)
    assert not first.is_error
    assert [c.model_dump(exclude_none=True) for c in first.content] == [
        {"type": "text", "text": '{"count": 2, "names": ["a", "b"]}'}
    ]
    assert first.structured_content == {"count": 2, "names": ["a", "b"]}
    call_ids = [result.call.call_id for result in observed.results]
    assert meta(first) == {
        "toolreg/code": None,
        "toolreg/dispatched": True,
        "toolreg/callId": call_ids[0],
        "toolreg/contexts": [{"note": "counted"}],
    }
    assert second.structured_content is None
    assert second.content[0].model_dump()["text"] == '["a", "b"]'
    assert "toolreg/contexts" not in meta(second)
    assert all(re.fullmatch(r"mcp:\d+:[0-9a-f]+-\d+", call_id) for call_id in call_ids)
    assert len(set(call_ids)) == 2


def add_failing_tools(registry: ToolRegistry, server_source: CancelSource) -> None:
    registry.add_around(TimeoutPolicy())
    registry.add_guard(lambda call: "guarded" if call.name == "denied" else None)
    registry.add_pre_execute(lambda call, token: 42 if call.name == "broken_hook" else None)  # type: ignore[arg-type]
    schema = {"properties": {"n": {"type": "integer"}}, "required": ["n"]}

    @registry.tool(description="wants n", parameters=schema)
    def strict(args: Any, ctx: ToolContext) -> int:
        return int(args["n"])

    @registry.tool(description="raises")
    def boom(args: Any, ctx: ToolContext) -> None:
        raise ValueError("boom")

    @registry.tool(description="never allowed")
    def denied(args: Any, ctx: ToolContext) -> None:
        raise AssertionError("a guard refused it")

    @registry.tool(description="behind a malfunctioning hook")
    def broken_hook(args: Any, ctx: ToolContext) -> None:
        raise AssertionError("the hook failed closed")

    @registry.tool(description="outlives its deadline", timeout=0.05)
    def slow(args: Any, ctx: ToolContext) -> str:
        ctx.token.wait(WAIT)  # its TimeoutPolicy deadline cancels it
        return "late"

    @registry.tool(description="waits for the server's token")
    def stopped(args: Any, ctx: ToolContext) -> str:
        server_source.cancel("server stopping")
        ctx.token.raise_if_cancelled()
        return "never"


@pytest.mark.parametrize(
    ("name", "arguments", "code", "text"),
    [
        ("strict", {"n": "x"}, "INVALID_ARGS", "Error: data.n must be integer"),
        ("denied", {}, "DENIED", "Error: guarded"),
        ("boom", {}, "TOOL_ERROR", "Error: ValueError: boom"),
        ("broken_hook", {}, "HOOK_ERROR", None),
        ("slow", {}, "TOOL_TIMEOUT", "Error: tool call timed out after 0.05s"),
        ("stopped", {}, "ABORTED", "Error: tool call aborted"),
    ],
)
def test_a_tool_level_failure_is_an_error_result_with_its_code(
    name: str, arguments: dict[str, Any], code: str, text: str | None
) -> None:
    with served() as (registry, observed):
        server_source = CancelSource()
        add_failing_tools(registry, server_source)

        async def main() -> types.CallToolResult:
            async with wire(build_server(registry, token=server_source.token)) as w:
                return await w.client.call_tool(name, arguments)

        result = run(main)
    assert result.is_error
    assert result.structured_content is None
    assert meta(result)["toolreg/code"] == code
    assert meta(result)["toolreg/dispatched"] == (code in ("TOOL_ERROR", "TOOL_TIMEOUT", "ABORTED"))
    assert result.content[0].model_dump()["text"] == observed.results[0].content
    if text is not None:
        assert observed.results[0].content == text


def test_an_unknown_tool_is_a_protocol_error_invalid_params() -> None:
    with served() as (registry, observed):

        async def main() -> MCPError:
            async with wire(build_server(registry)) as w:
                with pytest.raises(MCPError) as caught:
                    await w.client.call_tool("missing")
                return caught.value

        error = run(main)
    assert error.code == types.INVALID_PARAMS
    assert "missing" in error.message
    assert observed.codes == [ErrorCode.UNKNOWN_TOOL]


def test_a_closed_registry_is_a_protocol_error_internal_error() -> None:
    registry = ToolRegistry(max_workers=1)
    server = build_server(registry)
    registry.close()

    async def main() -> MCPError:
        async with wire(server) as w:
            with pytest.raises(MCPError) as caught:
                await w.client.call_tool("anything")
            return caught.value

    assert run(main).code == types.INTERNAL_ERROR


def test_a_refusing_executor_is_a_protocol_error_internal_error() -> None:
    executor = ThreadPoolExecutor(max_workers=1)
    with open_registry(executor=executor) as registry:
        registry.tool(name="work", description="never runs")(lambda args, ctx: "ran")
        executor.shutdown()  # its owner shut it down: it refuses every body

        async def main() -> MCPError:
            async with wire(build_server(registry)) as w:
                with pytest.raises(MCPError) as caught:
                    await w.client.call_tool("work")
                return caught.value

        error = run(main)
    assert error.code == types.INTERNAL_ERROR
    assert "refused" in error.message


def test_a_server_token_cancelled_before_the_request_runs_nothing() -> None:
    stop, bodies, hooks = CancelSource(), [], []
    stop.cancel("server stopping")
    with served() as (registry, observed):
        registry.add_pre_execute(lambda call, token: hooks.append(call.call_id))

        @registry.tool(description="never runs")
        def work(args: Any, ctx: ToolContext) -> str:
            bodies.append("work")
            return "ran"

        async def main() -> types.CallToolResult:
            async with wire(build_server(registry, token=stop.token)) as w:
                return await w.client.call_tool("work")

        result = run(main)
    assert result.is_error
    assert meta(result)["toolreg/code"] == "ABORTED_BEFORE_DISPATCH"
    assert meta(result)["toolreg/dispatched"] is False
    assert result.content[0].model_dump()["text"] == "Error: tool call aborted before dispatch"
    assert bodies == [] and hooks == []
    assert observed.codes == [BEFORE]


# -- cancellation ---------------------------------------------------------------------------------


def add_cooperative(registry: ToolRegistry, gate: Gate, seen: dict[str, Any]) -> None:
    """A tool `cooperative` that records its request id, reaches `gate`, waits for its token,
    records the reason in `seen`, and ends cancelled."""

    @registry.tool(description="waits for its token")
    def cooperative(args: Any, ctx: ToolContext) -> str:
        seen["id"] = request_id_of(ctx)
        gate.reached.set()
        assert ctx.token.wait(WAIT)
        seen["reason"] = ctx.token.reason
        ctx.token.raise_if_cancelled()
        return "never"


@pytest.mark.parametrize(
    "mode", ["legacy", "2026-07-28"]
)  # the handshake era, and the per-request one
def test_a_client_cancel_reaches_a_cooperative_body_with_its_reason_and_is_never_answered(
    mode: str,
) -> None:
    gate = Gate()
    seen: dict[str, Any] = {}
    with served() as (registry, observed):
        add_cooperative(registry, gate, seen)

        async def main() -> None:
            async with wire(build_server(registry), mode) as w:
                scope = anyio.CancelScope()

                async def call() -> None:
                    with scope:
                        await w.client.call_tool("cooperative")

                async with anyio.create_task_group() as group:
                    group.start_soon(call)
                    await in_thread(gate.wait_reached)
                    scope.cancel()  # the client sends notifications/cancelled
                await w.settled.wait(seen["id"])
                assert not w.tap.answered(seen["id"])
                assert (await w.client.call_tool("cooperative_done")).is_error is False

        @registry.tool(description="answers")
        def cooperative_done(args: Any, ctx: ToolContext) -> str:
            return "ok"

        run(main)
    reason = seen["reason"]
    assert isinstance(reason, RequestCancelled)
    assert (reason.request_id, reason.cause, reason.client_reason) == (
        seen["id"],
        "client",
        "caller cancelled",
    )
    assert str(reason) == f"MCP request {seen['id']} cancelled by the client: caller cancelled"
    assert observed.codes == [ABORTED, None]
    assert observed.results[0].dispatched


def test_a_read_timeout_answers_the_client_at_once_while_the_server_joins_the_body() -> None:
    gate = Gate()
    seen: dict[str, Any] = {}
    journal: list[object] = []
    with served() as (registry, observed):
        registry.on_result(lambda result: journal.append(("result", result.code)))

        @registry.tool(description="ignores its token until released")
        def stubborn(args: Any, ctx: ToolContext) -> str:
            seen["id"] = request_id_of(ctx)
            seen["token"] = ctx.token
            gate.hold()
            journal.append("body returned")
            return "late success"

        async def main() -> None:
            async with wire(build_server(registry)) as w:
                with pytest.raises(MCPError) as caught:
                    await w.client.call_tool("stubborn", read_timeout_seconds=0.2)
                # The client has its timeout while the body is still held: nothing waited for it.
                assert caught.value.code == types.REQUEST_TIMEOUT
                assert gate.reached.is_set() and not gate.released.is_set()
                listing = await w.client.list_tools()  # other requests are answered meanwhile
                assert [tool.name for tool in listing.tools] == ["stubborn"]
                await in_thread(partial(seen["token"].wait, WAIT))
                journal.append("body cancelled, still held")
                # The handler returns only after the call has settled: it is still joining.
                assert not w.settled.event(seen["id"]).is_set()
                gate.release()
                await w.settled.wait(seen["id"])
                assert not w.tap.answered(seen["id"])  # the late success is never sent

        run(main)
    assert journal == ["body cancelled, still held", "body returned", ("result", ABORTED)]
    reason = seen["token"].reason
    assert str(reason) == f"MCP request {seen['id']} cancelled by the client: timed out after 0.2s"
    assert observed.results[0].dispatched


def test_the_join_of_an_uncooperative_body_does_not_spin() -> None:
    """anyio re-delivers a cancel at every await of a cancelled scope: the join must sleep."""
    gate, seen, figures = Gate(), {}, {}
    with served() as (registry, _):

        @registry.tool(description="ignores its token until released")
        def stubborn(args: Any, ctx: ToolContext) -> str:
            seen["token"] = ctx.token
            gate.hold()
            return "late"

        async def main() -> None:
            async with wire(build_server(registry)) as w:
                with pytest.raises(MCPError):
                    await w.client.call_tool("stubborn", read_timeout_seconds=0.1)
                await in_thread(partial(seen["token"].wait, WAIT))
                wall, cpu = time.perf_counter(), time.process_time()
                await in_thread(partial(threading.Event().wait, 0.3))  # the join is held
                figures["wall"] = time.perf_counter() - wall
                figures["cpu"] = time.process_time() - cpu
                gate.release()

        with gc_paused():  # the CPU share measured is the join's, not a collection's
            run(main)
    share = figures["cpu"] / figures["wall"]
    print(f"\nheld join: {figures['cpu'] * 1000:.1f} ms CPU over {figures['wall']:.3f} s")
    assert share < 0.30


def test_a_cancel_during_approval_aborts_before_dispatch_and_runs_no_body() -> None:
    gate, seen, bodies = Gate(), {}, []
    with served() as (registry, observed):
        registry.add_pre_execute(lambda call, token: toolreg_ask())

        def approver(call: Any, reason: str, token: Any) -> bool:
            seen["token"] = token
            seen["id"] = int(call.call_id.split(":")[1])
            gate.reached.set()
            token.wait(WAIT)  # a human would still be deciding
            return False  # refused only because its turn was cancelled

        registry.set_approver(approver)

        @registry.tool(description="needs approval")
        def risky(args: Any, ctx: ToolContext) -> None:
            bodies.append(ctx.call.call_id)

        async def main() -> None:
            async with wire(build_server(registry)) as w:
                scope = anyio.CancelScope()

                async def call() -> None:
                    with scope:
                        await w.client.call_tool("risky")

                async with anyio.create_task_group() as group:
                    group.start_soon(call)
                    await in_thread(gate.wait_reached)
                    scope.cancel()
                await w.settled.wait(seen["id"])
                assert not w.tap.answered(seen["id"])

        run(main)
    assert bodies == []
    assert observed.codes == [BEFORE]
    assert isinstance(seen["token"].reason, RequestCancelled)


def toolreg_ask() -> Any:
    from toolreg import Ask

    return Ask("a human decides")


def test_a_cancel_while_waiting_for_admission_runs_nothing() -> None:
    gate, hooks, bodies = Gate(), [], []
    with served() as (registry, observed):
        registry.add_pre_execute(lambda call, token: hooks.append(call.call_id))

        @registry.tool(description="holds the only admission slot")
        def first(args: Any, ctx: ToolContext) -> str:
            gate.hold()
            return "first"

        @registry.tool(description="queued behind it")
        def second(args: Any, ctx: ToolContext) -> str:
            bodies.append("second")
            return "second"

        async def main() -> None:
            async with wire(build_server(registry, max_concurrent_calls=1)) as w:
                scope = anyio.CancelScope()
                answers: list[Any] = []

                async def call_first() -> None:
                    answers.append(await w.client.call_tool("first"))

                async def call_second() -> None:
                    with scope:
                        await w.client.call_tool("second")

                async with anyio.create_task_group() as group:
                    group.start_soon(call_first)
                    await in_thread(gate.wait_reached)
                    group.start_soon(call_second)
                    await anyio.wait_all_tasks_blocked()  # its handler waits for admission
                    scope.cancel()
                    await in_thread(partial(_wait_for, lambda: len(observed.results) == 1))
                    gate.release()
                assert [a.content[0].text for a in answers] == ["first"]
                second_id = int(observed.results[0].call.call_id.split(":")[1])
                await w.settled.wait(second_id)
                assert not w.tap.answered(second_id)

        run(main)
    assert bodies == []
    assert len(hooks) == 1  # the first call's: the queued one entered no hook
    assert [(r.call.name, r.code, r.dispatched) for r in observed.results] == [
        ("second", BEFORE, False),
        ("first", None, True),
    ]


def _wait_for(condition: Callable[[], bool]) -> None:
    pause = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if condition():
            return
        pause.wait(0.01)
    raise AssertionError("condition never became true")


def test_the_in_process_dispatcher_never_returns_a_late_result_after_a_timeout() -> None:
    """`Client(server)` runs the handler in the caller's task: the join must still re-raise."""
    with served() as (registry, observed):

        @registry.tool(description="returns a value once cancelled")
        def translates(args: Any, ctx: ToolContext) -> str:
            ctx.token.wait(WAIT)
            return "late value"

        async def main() -> MCPError:
            async with Client(build_server(registry)) as client:
                with pytest.raises(MCPError) as caught:
                    await client.call_tool("translates", read_timeout_seconds=0.1)
                return caught.value

        error = run(main)
    assert error.code == types.REQUEST_TIMEOUT
    assert observed.codes == [ABORTED]


# -- progress -------------------------------------------------------------------------------------


def test_progress_arrives_in_order_only_while_the_request_is_live() -> None:
    delivered, seen = [], {}
    steps = [threading.Event() for _ in range(3)]
    with served() as (registry, _):

        @registry.tool(description="reports progress, then waits to be cancelled")
        def work(args: Any, ctx: ToolContext) -> str:
            seen["id"] = request_id_of(ctx)
            for n, step in enumerate(steps, start=1):
                ctx.report_progress(n, 10, f"step {n}")
                assert step.wait(WAIT)  # the client saw it
            ctx.report_progress(3, 10, "not increasing: dropped")
            assert ctx.token.wait(WAIT)
            ctx.report_progress(9, 10, "after the cancel")  # the request is over: not sent
            return "never"

        @registry.tool(description="reports progress, then answers")
        def quick(args: Any, ctx: ToolContext) -> str:
            ctx.report_progress(1, 1, "done")
            return "ok"

        async def main() -> None:
            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                delivered.append((progress, total, message))
                steps[int(progress) - 1].set()

            async with wire(build_server(registry)) as w:
                scope = anyio.CancelScope()

                async def call() -> None:
                    with scope:
                        await w.client.call_tool("work", progress_callback=on_progress)

                async with anyio.create_task_group() as group:
                    group.start_soon(call)
                    await in_thread(partial(steps[-1].wait, WAIT))
                    scope.cancel()
                await w.settled.wait(seen["id"])
                sent = [p for token, p in w.tap.progress() if token == seen["id"]]
                assert sent == [1, 2, 3]
                quiet = await w.client.call_tool("quick")  # no progress token: nothing sent
                assert not quiet.is_error
                assert [t for t, _ in w.tap.progress()] == [seen["id"]] * 3
                await w.client.call_tool("quick", progress_callback=on_progress)
                last = w.tap.sent[-1]
                assert isinstance(last, types.JSONRPCResponse)  # nothing after the answer

        run(main)
    assert delivered[:3] == [(1, 10, "step 1"), (2, 10, "step 2"), (3, 10, "step 3")]


# -- stdio ----------------------------------------------------------------------------------------


def fixture_environment(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **extra}


def test_stdio_serves_the_sdk_client_and_stray_output_never_corrupts_the_stream() -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "toolreg", "mcp", "mcp_fixture:registry"],
        env=fixture_environment(),
        cwd=str(ROOT),
    )

    async def main() -> tuple[list[str], types.CallToolResult, types.CallToolResult]:
        async with Client(params) as client:
            listing = await client.list_tools()
            noisy = await client.call_tool("noisy")
            added = await client.call_tool("add", {"a": 2, "b": 3})
        return [tool.name for tool in listing.tools], noisy, added

    names, noisy, added = run(main)
    assert names == ["add", "held", "noisy"]
    assert noisy.content[0].model_dump()["text"] == "quiet"
    assert added.structured_content == {"sum": 5}


class RawServer:
    """`python -m toolreg mcp mcp_fixture` (or `target`) spoken to in raw JSON-RPC lines."""

    def __init__(self, *args: str, target: str = "mcp_fixture", read_stdout: bool = True) -> None:
        self.release_read, self.release_write = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toolreg", "mcp", target, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=fixture_environment(TOOLREG_TEST_RELEASE_FD=str(self.release_read)),
            pass_fds=[self.release_read],
            cwd=str(ROOT),
        )
        self.out: queue.Queue[bytes] = queue.Queue()
        self.err: queue.Queue[bytes] = queue.Queue()
        self.received: list[dict[str, Any]] = []
        self.errors: list[str] = []
        pumped = [(self.proc.stderr, self.err)]
        if read_stdout:  # else the test reads (or closes) stdout itself
            pumped.append((self.proc.stdout, self.out))
        for stream, lines in pumped:
            threading.Thread(target=_pump_lines, args=(stream, lines), daemon=True).start()

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        self.proc.stdin.flush()

    def initialize(self) -> dict[str, Any]:
        params = {"protocolVersion": "2025-11-25", "capabilities": {}}
        params["clientInfo"] = {"name": "raw", "version": "0"}
        self.send({"id": 0, "method": "initialize", "params": params})
        result: dict[str, Any] = self.answer(0)["result"]
        self.send({"method": "notifications/initialized"})
        return result

    def answer(self, request_id: int) -> dict[str, Any]:
        """The next answer read, which must be for `request_id`."""
        line = self.out.get(timeout=WAIT)
        message: dict[str, Any] = json.loads(line)
        self.received.append(message)
        assert message.get("id") == request_id, message
        return message

    def expect(self, prefix: str) -> str:
        """Read stderr up to the next line starting with `prefix`; return its rest."""
        limit = time.monotonic() + WAIT
        while True:
            line = self.err.get(timeout=max(0.0, limit - time.monotonic())).decode().rstrip()
            self.errors.append(line)
            if line.startswith(prefix):
                return line[len(prefix) :].strip()

    def release(self) -> None:
        os.write(self.release_write, b"x")

    def finish(self) -> tuple[int, list[dict[str, Any]]]:
        """Wait for the exit; the status and every message it wrote after the last read."""
        status = self.proc.wait(timeout=WAIT)
        rest: list[dict[str, Any]] = []
        while True:
            try:
                line = self.out.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError("stdout was never closed") from None
            if not line:
                return status, rest
            rest.append(json.loads(line))

    def rest_of_stderr(self) -> list[str]:
        lines = []
        while (line := self.err.get(timeout=WAIT)) != b"":
            lines.append(line.decode().rstrip())
        self.errors.extend(lines)
        return lines

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()
        os.close(self.release_read)
        os.close(self.release_write)


def _pump_lines(stream: Any, lines: queue.Queue[bytes]) -> None:
    for line in iter(stream.readline, b""):
        lines.put(line)
    lines.put(b"")  # end of stream


@contextmanager
def raw_server(
    *args: str, target: str = "mcp_fixture", read_stdout: bool = True
) -> Iterator[RawServer]:
    server = RawServer(*args, target=target, read_stdout=read_stdout)
    try:
        yield server
    finally:
        server.close()


def call(request_id: int, name: str, **arguments: Any) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"id": request_id, "method": "tools/call", "params": params}


def test_stdio_cancel_and_eof_cancel_and_join_the_body_and_never_answer_it() -> None:
    with raw_server() as server:
        info = server.initialize()["serverInfo"]
        version = importlib.metadata.version("toolreg-quiescent")
        assert info == {"name": "toolreg", "version": version}
        # notifications/cancelled: the body sees the stated reason; other requests go on.
        server.send(call(1, "held"))
        assert server.expect("BODY STARTED").startswith("mcp:1:")
        server.send(
            {
                "method": "notifications/cancelled",
                "params": {"requestId": 1, "reason": "user hit stop"},
            }
        )
        assert (
            server.expect("BODY CANCELLED")
            == "MCP request 1 cancelled by the client: user hit stop"
        )
        server.send({"id": 2, "method": "tools/list"})
        assert len(server.answer(2)["result"]["tools"]) == 3  # answered while the body is held
        server.release()
        assert server.expect("BODY ENDED") == ""
        assert server.expect("RESULT mcp:1:").endswith("ABORTED")
        server.send(call(3, "add", a=1, b=2))
        assert server.answer(3)["result"]["structuredContent"] == {"sum": 3}  # not 1's answer
        # EOF with a body in flight: cancelled, joined, then the server exits 0.
        server.send(call(4, "held"))
        assert server.expect("BODY STARTED").startswith("mcp:4:")
        assert server.proc.stdin is not None
        server.proc.stdin.close()
        cancelled = server.expect("BODY CANCELLED")
        assert cancelled == "MCP request 4 ended: the client disconnected or the connection closed"
        assert server.proc.poll() is None  # still joining the body
        server.release()
        status, written = server.finish()
        after = server.rest_of_stderr()
    assert status == 0
    assert written == []  # neither request 1 nor request 4 was ever answered
    assert after[0] == "BODY ENDED"
    assert after[1].startswith("RESULT mcp:4:") and after[1].endswith("ABORTED")
    assert "stopped (stdio); every call settled" in after[-2]
    assert after[-1] == "EXIT registry closed: False"  # serve() closes no registry it was given


def test_stdio_sigterm_cancels_and_joins_the_body_then_exits_zero_with_stdin_open() -> None:
    with raw_server() as server:
        server.initialize()
        server.send(call(1, "held"))
        assert server.expect("BODY STARTED").startswith("mcp:1:")
        server.proc.send_signal(signal.SIGTERM)  # stdin stays open: the server must not wait on it
        assert (
            server.expect("BODY CANCELLED")
            == "MCP request 1 cancelled: the server is shutting down"
        )
        server.release()
        status, written = server.finish()
        after = server.rest_of_stderr()
    assert status == 0
    assert written == []
    assert after[0] == "BODY ENDED"
    assert "stopped (stdio); every call settled" in after[-2]


# -- streamable HTTP ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_streamable_http_on_localhost_serves_and_cancels_on_read_timeout(mode: str) -> None:
    import socket

    import uvicorn

    gate, seen = Gate(), {}
    with served() as (registry, observed):

        @registry.tool(description="Add", parameters={"required": ["a", "b"]})
        def add(args: Any, ctx: ToolContext) -> dict[str, Any]:
            return {"sum": args["a"] + args["b"]}

        @registry.tool(description="ignores its token until released")
        def stubborn(args: Any, ctx: ToolContext) -> str:
            seen["token"] = ctx.token
            gate.hold()
            return "late"

        app = build_server(registry).streamable_http_app()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        http = uvicorn.Server(config)

        async def main() -> None:
            async with anyio.create_task_group() as group:
                group.start_soon(partial(http.serve, sockets=[sock]))
                url = f"http://127.0.0.1:{port}/mcp"
                try:
                    async with Client(url, mode=mode) as client:
                        listing = await client.list_tools()
                        assert [t.name for t in listing.tools] == ["add", "stubborn"]
                        added = await client.call_tool("add", {"a": 1, "b": 2})
                        assert added.structured_content == {"sum": 3}
                        with pytest.raises(MCPError) as caught:
                            await client.call_tool("stubborn", read_timeout_seconds=0.2)
                        assert caught.value.code == types.REQUEST_TIMEOUT
                        assert not gate.released.is_set()
                        await in_thread(partial(seen["token"].wait, WAIT))
                        assert (await client.call_tool("add", {"a": 2, "b": 2})).structured_content
                        gate.release()
                        await in_thread(partial(_wait_for, lambda: len(observed.results) == 3))
                finally:
                    http.should_exit = True

        run(main)
        sock.close()
    assert observed.codes == [None, ABORTED, None] or observed.codes == [None, None, ABORTED]
    reason = seen["token"].reason
    assert isinstance(reason, RequestCancelled)
    # 2025 sessions send notifications/cancelled with the reason; a 2026 client cancels by
    # closing the stream, which carries none.
    assert reason.cause == "client"
    assert reason.client_reason == ("timed out after 0.2s" if mode == "legacy" else None)


def test_the_cli_serves_streamable_http_and_stops_on_sigterm_after_joining_calls() -> None:
    with raw_server("--transport", "streamable-http", "--port", "0") as server:
        where = server.expect("")
        while "MCP server 'toolreg' at http://" not in where:
            where = server.expect("")
        url = where.split(" at ", 1)[1]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")

        async def main() -> None:
            async with Client(url, mode="legacy") as client:
                assert (await client.call_tool("add", {"a": 1, "b": 1})).structured_content
                async with anyio.create_task_group() as group:

                    async def call_held() -> None:
                        # Cancelled by the shutdown, the request is never answered.
                        with pytest.raises(MCPError, match="ended without a response"):
                            await client.call_tool("held")

                    group.start_soon(call_held)
                    await in_thread(partial(server.expect, "BODY STARTED"))
                    server.proc.send_signal(signal.SIGTERM)
                    reason = await anyio.to_thread.run_sync(server.expect, "BODY CANCELLED")
                    assert reason.endswith("cancelled: the server is shutting down")
                    assert server.proc.poll() is None  # joining the body
                    server.release()

        run(main)
        status = server.proc.wait(timeout=WAIT)
        after = server.rest_of_stderr()
    assert status == 0
    assert "BODY ENDED" in after
    assert any(line.endswith("ABORTED") for line in after)
    assert "stopped (streamable-http); every call settled" in after[-2]
