"""MCP: `python -m toolreg mcp` against the SDK's own `MCPServer`, and the bridge in memory.

First, what a client sees of two real servers of the same sync tool (`search`, which returns at
once; its arguments validated against the same schema on both sides), each a process of its
own, called through the SDK's client (`mcp.Client`):

* the SDK's high-level `MCPServer` (`benchmarks._mcp_peer`): what a user serves the tool with
  when not using toolreg (the baseline: 1.00x);
* toolreg's server, `python -m toolreg mcp benchmarks._mcp_upstream` (target <= 1.10x): a
  model-driven call through the whole pipeline, one thread hop, the join;

over stdio and over streamable HTTP (on 127.0.0.1), sequential calls and 8 concurrent calls on
one connection. Then the gateway (`python -m toolreg mcp --config`): the same call through a
gateway process that mounts toolreg's server, against toolreg's server called directly
(sequential; target <= 1.30x), with the latency the second hop adds. With a tool that does
nothing, that hop is a whole MCP server and client, about the work of the direct call itself,
so the ratio tends to 2x; it meets 1.30x once the upstream's own work per call is about three
times the hop. All these variants are interleaved per round; the processes inherit the regime's
CPUs from the thread that starts them, so the pinning of the regimes applies only loosely here.

Then, in one process, the SDK's client (`mode="legacy"`) talking JSON-RPC over in-memory
streams to a low-level `Server` in the same event loop, for what the bridge itself costs:

* "plain MCP handler" (the baseline of these rows): an `on_call_tool` handler that calls the
  tool function itself, on the event loop, and returns its text, with no toolreg at all;
* "toolreg.mcp bridge": `build_server(registry)` on a registry holding the same function;
* "registry.execute, no MCP" and "AsyncToolRegistry.execute, no MCP": the call alone (sync,
  from a plain thread; awaited, one thread hop), for scale.

No target on these: no server a user would write runs a tool on its event loop with no
validation. Two shapes: sequential calls, and 8 concurrent callers on one connection. The event
loop runs on its own thread (an anyio blocking portal; a caller in the cross regime), entered
once per timed run, not once per call.

Last, the CPU the process spends while a client-cancelled call waits for an uncooperative body
(the handler's join): anyio re-delivers a cancel at every await of a cancelled scope, so a
join that does not sleep shows up here as a share of a core.

Variants are interleaved within each round (`_harness.interleaved`), with the cyclic GC off
while timing; figures are medians of wall time per call, ratios medians of per-round ratios.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import anyio.from_thread
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.server import Server
from mcp.shared.exceptions import MCPError

from toolreg import ToolRegistry
from toolreg.aio import AsyncToolRegistry
from toolreg.mcp import build_server

from . import _regime
from ._harness import (
    Rounds,
    Row,
    format_time,
    interleaved,
    start_registry_workers,
    timed_once,
    verdict,
)

WORKERS = 8
CONCURRENCY = 8
BASELINE = "plain MCP handler"
ARGUMENTS: dict[str, Any] = {"q": "quiescent cancellation", "limit": 10}


def search(args: Any, ctx: Any) -> str:
    """The tool body every variant runs."""
    return "ok"


def plain_server() -> Server[Any]:
    """A low-level server whose `tools/call` calls `search` directly: MCP with no toolreg."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        schema = {"type": "object", "properties": {}}
        return types.ListToolsResult(tools=[types.Tool(name="search", input_schema=schema)])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        text = search(params.arguments or {}, None)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    return Server("plain", on_list_tools=list_tools, on_call_tool=call_tool)


async def _calls(client: Client, calls: int, concurrency: int) -> None:
    async def caller(count: int) -> None:
        for _ in range(count):
            await client.call_tool("search", ARGUMENTS)

    async with anyio.create_task_group() as group:
        for _ in range(concurrency):
            group.start_soon(caller, calls // concurrency)


@asynccontextmanager
async def _clients(servers: dict[str, Server[Any]]) -> AsyncIterator[dict[str, Client]]:
    async with (
        Client(servers[BASELINE], mode="legacy") as plain,
        Client(servers["toolreg.mcp bridge"], mode="legacy") as bridged,
    ):
        yield {BASELINE: plain, "toolreg.mcp bridge": bridged}


@contextmanager
def _portal() -> Iterator[anyio.from_thread.BlockingPortal]:
    with anyio.from_thread.start_blocking_portal(backend="asyncio") as portal:
        yield portal


def measure(quick: bool) -> Rounds:
    """Seconds per call, per round, keyed `<variant>|<concurrency>`."""
    repeats = 5 if quick else 15
    calls = 200 if quick else 2_000
    with _regime.worker_side():
        registry = ToolRegistry(max_workers=WORKERS)
        start_registry_workers(registry, WORKERS)
    registry.tool(search)
    servers = {BASELINE: plain_server(), "toolreg.mcp bridge": build_server(registry)}
    try:
        with _portal() as portal, portal.wrap_async_context_manager(_clients(servers)) as clients:
            portal.call(_regime.mark_caller)  # the event loop's thread: the MCP client side

            def timed(client: Client, concurrency: int) -> Callable[[], float]:
                def workload(n: int) -> None:
                    portal.call(_calls, client, n, concurrency)

                return lambda: timed_once(workload, calls) / calls

            areg = AsyncToolRegistry(registry)

            async def facade(n: int, concurrency: int) -> None:
                async def caller(count: int) -> None:
                    for _ in range(count):
                        await areg.execute("search", ARGUMENTS, start_if_cancelled=False)

                async with anyio.create_task_group() as group:
                    for _ in range(concurrency):
                        group.start_soon(caller, n // concurrency)

            portal.call(facade, 16 * WORKERS, 4 * WORKERS)  # every pool thread started
            for client in clients.values():  # warm up: threads, caches, the tools listing
                portal.call(_calls, client, 4 * WORKERS, WORKERS)
            runs = {
                f"{name}|{concurrency}": timed(client, concurrency)
                for concurrency in (1, CONCURRENCY)
                for name, client in clients.items()
            }

            def direct(n: int) -> None:
                for _ in range(n):
                    registry.execute("search", ARGUMENTS, start_if_cancelled=False)

            runs["registry.execute, no MCP|1"] = lambda: timed_once(direct, calls) / calls
            runs["AsyncToolRegistry.execute, no MCP|1"] = lambda: (
                timed_once(lambda n: portal.call(facade, n, 1), calls) / calls
            )
            return interleaved(runs, repeats)
    finally:
        registry.close()


def held_join_cpu(window: float) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of this process while a cancelled call's body is held."""
    registry = ToolRegistry(max_workers=2)
    started, release, cancelled = threading.Event(), threading.Event(), threading.Event()

    @registry.tool
    def stubborn(args: Any, ctx: Any) -> str:
        ctx.token.on_cancel(cancelled.set)
        started.set()
        release.wait(30.0)  # ignores its token until released
        return "late"

    server = build_server(registry)
    figures: list[float] = []

    async def main() -> None:
        async with Client(server, mode="legacy") as client:
            with contextlib.suppress(MCPError):  # the client's timeout: the server now joins
                await client.call_tool("stubborn", read_timeout_seconds=0.05)
            await anyio.to_thread.run_sync(cancelled.wait, 30.0)
            wall, cpu = time.perf_counter(), time.process_time()
            await anyio.to_thread.run_sync(threading.Event().wait, window)
            figures[:] = [time.process_time() - cpu, time.perf_counter() - wall]
            release.set()

    try:
        anyio.run(main, backend="asyncio")
    finally:
        release.set()
        registry.close()
    return figures[0], figures[1]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UPSTREAM = [sys.executable, "-m", "toolreg", "mcp", "benchmarks._mcp_upstream"]
GATEWAY_TARGET = 1.30  # through the gateway / direct to the upstream
SERVER_START = 60.0  # seconds a server process may take to announce its URL (loaded machine)


@contextmanager
def _http_server(*args: str) -> Iterator[str]:
    """`python -m toolreg mcp ...` over streamable HTTP on a free port: its URL; stopped on exit."""
    process = subprocess.Popen(
        [*args, "--transport", "streamable-http", "--port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stderr is not None
        for line in iter(process.stderr.readline, b""):
            lines.put(line.decode(errors="replace"))

    threading.Thread(target=pump, name="bench-server-stderr", daemon=True).start()
    try:
        limit = time.monotonic() + SERVER_START
        line = ""
        while " at http://" not in line:
            line = lines.get(timeout=max(0.0, limit - time.monotonic()))
        yield line.split(" at ", 1)[1].strip()
    finally:
        process.terminate()  # SIGTERM: the server joins its calls and exits 0
        process.wait(SERVER_START)
        assert process.stderr is not None
        process.stderr.close()


def _stdio(args: list[str]) -> StdioServerParameters:
    return StdioServerParameters(command=args[0], args=args[1:], env={"PYTHONPATH": ROOT}, cwd=ROOT)


def _gateway_config(directory: str, name: str, entry: dict[str, Any]) -> str:
    path = os.path.join(directory, f"{name}.json")
    with open(path, "w", encoding="utf-8") as file:
        json.dump({"mcpServers": {"up": entry}}, file)
    return path


PEER = [sys.executable, "-m", "benchmarks._mcp_peer"]
SERVED_TARGET = 1.10  # toolreg's server / the SDK's MCPServer, same tool, same transport
TRANSPORTS = ("stdio", "streamable HTTP")


def measure_served(quick: bool) -> Rounds:
    """Seconds per call, per round, keyed `<server>|<transport>|<concurrency>`: the SDK's
    `MCPServer` and toolreg's server (sequential and concurrent), and the gateway (sequential),
    each a process of its own, over stdio and over streamable HTTP."""
    repeats = 3 if quick else 11
    # Calls per timed run, a multiple of CONCURRENCY. Fewer over HTTP: there a sequential call
    # takes tens of milliseconds with either server (the SDK's HTTP client and uvicorn).
    calls = {"stdio": 48 if quick else 480, "streamable HTTP": 16 if quick else 96}
    stdio_entry = {"command": UPSTREAM[0], "args": UPSTREAM[1:], "env": {"PYTHONPATH": ROOT}}
    gateway = [sys.executable, "-m", "toolreg", "mcp", "--config"]
    with (
        tempfile.TemporaryDirectory() as directory,
        _http_server(*PEER) as peer_url,
        _http_server(*UPSTREAM) as upstream_url,
        _http_server(*gateway, _gateway_config(directory, "http", {"url": upstream_url})) as url,
        _portal() as portal,
    ):
        config = _gateway_config(directory, "stdio", {**stdio_entry, "cwd": ROOT})
        targets: dict[str, Any] = {
            "MCPServer|stdio": _stdio(PEER),
            "toolreg|stdio": _stdio(UPSTREAM),
            "gateway|stdio": _stdio([*gateway, config]),
            "MCPServer|streamable HTTP": peer_url,
            "toolreg|streamable HTTP": upstream_url,
            "gateway|streamable HTTP": url,
        }

        @asynccontextmanager
        async def clients() -> AsyncIterator[dict[str, tuple[Client, str]]]:
            async with contextlib.AsyncExitStack() as stack:
                opened = {}
                for key, target in targets.items():
                    client = await stack.enter_async_context(Client(target))
                    tool = "up.search" if key.startswith("gateway") else "search"
                    opened[key] = (client, tool)
                yield opened

        async def calls_of(client: Client, tool: str, n: int, concurrency: int) -> None:
            async def caller(count: int) -> None:
                for _ in range(count):
                    await client.call_tool(tool, ARGUMENTS)

            async with anyio.create_task_group() as group:
                for _ in range(concurrency):
                    group.start_soon(caller, n // concurrency)

        with portal.wrap_async_context_manager(clients()) as opened:
            for client, tool in opened.values():  # warm up: threads, caches, listings
                portal.call(calls_of, client, tool, 4 * CONCURRENCY, CONCURRENCY)

            def timed(key: str, concurrency: int) -> Callable[[], float]:
                client, tool = opened[key]
                count = calls[key.split("|")[1]]

                def workload(n: int) -> None:
                    portal.call(calls_of, client, tool, n, concurrency)

                return lambda: timed_once(workload, count) / count

            runs = {}
            for key in targets:
                shapes = (1,) if key.startswith("gateway") else (1, CONCURRENCY)
                for concurrency in shapes:
                    runs[f"{key}|{concurrency}"] = timed(key, concurrency)
            return interleaved(runs, repeats)


def served_rows(quick: bool) -> list[Row]:
    """Per transport and shape: the SDK's MCPServer (baseline) and toolreg's server; then the
    gateway against toolreg's server, sequential, with the latency it adds."""
    m = measure_served(quick)
    rows = []
    for transport in TRANSPORTS:
        for concurrency in (1, CONCURRENCY):
            shape = "sequential" if concurrency == 1 else f"{concurrency} concurrent calls"
            base = f"MCPServer|{transport}|{concurrency}"
            ours = f"toolreg|{transport}|{concurrency}"
            rows.append(
                Row(
                    f"the SDK's MCPServer, {transport}, {shape} (baseline)",
                    f"{format_time(m[base])}/call",
                    "1.00x",
                )
            )
            factor = m.ratio(ours, base)
            rows.append(
                Row(
                    f"python -m toolreg mcp, {transport}, {shape}",
                    f"{format_time(m[ours])}/call",
                    f"{factor:.2f}x",
                    f"<= {SERVED_TARGET:.2f}x",
                    verdict(factor, SERVED_TARGET),
                )
            )
    for transport in TRANSPORTS:
        direct = f"toolreg|{transport}|1"
        through = f"gateway|{transport}|1"
        factor = m.ratio(through, direct)
        added = m.difference(through, direct)
        rows.append(
            Row(
                f"the same call through the gateway, {transport}, sequential",
                f"{format_time(m[through])}/call (+{format_time(added)})",
                f"{factor:.2f}x",
                f"<= {GATEWAY_TARGET:.2f}x",
                verdict(factor, GATEWAY_TARGET),
                f"python -m toolreg mcp, {transport}, sequential",
            )
        )
    return rows


def run(quick: bool) -> list[Row]:
    """Measure and return the table's rows."""
    rows = served_rows(quick)
    medians = measure(quick)
    for concurrency in (1, CONCURRENCY):
        shape = "sequential" if concurrency == 1 else f"{concurrency} concurrent callers"
        base = f"{BASELINE}|{concurrency}"
        for key, cost in medians.items():
            name, level = key.rsplit("|", 1)
            if int(level) != concurrency:
                continue
            figure = f"{format_time(cost)}/call"
            factor = medians.ratio(key, base)
            label = f"{name}, {shape}" + (" (baseline)" if name == BASELINE else "")
            rows.append(Row(label, figure, f"{factor:.2f}x"))
    cpu, wall = held_join_cpu(0.2 if quick else 1.0)
    share = cpu / wall
    rows.append(
        Row(
            f"CPU while a cancelled call joins a held body ({wall:.2f} s)",
            f"{cpu * 1e3:.1f} ms",
            f"{share:.1%} of a core",
            "<= 10%",
            verdict(share, 0.10),
            "",  # a share of the CPU: against nothing
        )
    )
    return rows


if __name__ == "__main__":
    import sys

    from .__main__ import main

    sys.exit(main(["--only", "mcp", *sys.argv[1:]]))
