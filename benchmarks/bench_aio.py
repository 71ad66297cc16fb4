"""The asyncio facade: awaited `execute` against a bare `asyncio.to_thread` hop, and peers.

A trivial tool (it returns a constant) is awaited through

* `AsyncToolRegistry.execute` (the whole pipeline on a pool worker, one thread hop back),
* `asyncio.to_thread(fn, ...)` with the loop's default executor set to a pool of the same size
  (the baseline: 1.00x; targets for toolreg, issue 18, both regimes: <= 1.00x sequential,
  <= 0.90x with 8 concurrent awaiters),
* `loop.run_in_executor(pool, fn, ...)` on a pool of the same size,
* `loop.run_in_executor(pool, fn, ...)` on a pool started on demand (`_harness.warm_pool`: one
  warm worker at first, another only when a call finds none idle; one such pool for the
  sequential awaits, another for the concurrent ones): what `asyncio.to_thread` gets from a
  default executor nobody pre-started. toolreg aio is shown against it too (no target),

* `asyncio.to_thread(registry.execute, ...)`: the naive wrapping of the sync API (two thread
  hops: the pipeline on the default executor, the body on the registry's pool),
* peers, when their packages are importable (never installed by toolreg): OpenAI Agents
  `FunctionTool.on_invoke_tool` and MCP's in-process `call_tool` (`MCPServer`, or `FastMCP`
  before mcp 2). Both run a sync tool function on the event loop itself, with no thread hop.

Two shapes: sequential awaits, and 8 concurrent awaiters (each awaiting in a loop). The figure
is wall time per call, on one event loop (in the main thread: the caller); variants are
interleaved within each round in a rotated order (`_harness.interleaved`), with the cyclic GC
off while timing; figures are medians over the rounds and ratios medians of per-round ratios.
Every pool has all its workers started first (in the cross regime, on the workers' CPU), so
thread start-up is not timed.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from toolreg import ToolRegistry
from toolreg.aio import AsyncToolRegistry

from . import _regime
from ._harness import (
    Rounds,
    Row,
    Target,
    format_time,
    interleaved,
    judged,
    start_executor_workers,
    start_registry_workers,
    timed_once,
    warm_pool,
)

WORKERS = 8  # every thread pool measured here has this many workers
CONCURRENCY = 8
TARGETS = {1: Target(1.00), 8: Target(0.90)}  # toolreg aio / asyncio.to_thread, by concurrency
BASELINE = "asyncio.to_thread"
ON_DEMAND = "loop.run_in_executor, pool started on demand"
ARGUMENTS: dict[str, Any] = {"q": "quiescent cancellation", "limit": 10}

Invoke = Callable[[], Awaitable[Any]]


def search(args: Any, ctx: Any) -> str:
    """The tool body every variant runs (or, for the peers, its keyword-argument twin)."""
    return "ok"


def search_kw(q: str, limit: int) -> str:
    """Search the index."""
    return "ok"


def _openai_agents() -> Invoke | None:
    """`FunctionTool.on_invoke_tool` of OpenAI Agents, or None if it is not installed."""
    try:
        from agents import function_tool
        from agents.tool_context import ToolContext
    except ImportError:
        return None
    tool = function_tool(search_kw, name_override="search")
    payload = json.dumps(ARGUMENTS)

    def context() -> Any:
        try:
            return ToolContext(
                context=None, tool_name="search", tool_call_id="call-1", tool_arguments=payload
            )
        except TypeError:  # releases before tool_arguments existed
            return ToolContext(context=None, tool_name="search", tool_call_id="call-1")

    async def invoke() -> Any:
        return await tool.on_invoke_tool(context(), payload)

    return invoke


def _mcp() -> Invoke | None:
    """MCP's in-process `call_tool` (mcp 2: `MCPServer`; mcp 1: `FastMCP`), or None."""
    try:
        from mcp.server.mcpserver import MCPServer as Server
    except ImportError:
        try:
            from mcp.server.fastmcp import FastMCP as Server  # type: ignore[no-redef,attr-defined]
        except ImportError:
            return None
    server = Server("bench")
    server.tool(name="search")(search_kw)

    async def invoke() -> Any:
        return await server.call_tool("search", dict(ARGUMENTS))

    return invoke


async def _awaits(invoke: Invoke, calls: int, concurrency: int) -> None:
    """`concurrency` awaiters share `calls` awaits, each awaiting in a loop."""

    async def awaiter(count: int) -> None:
        for _ in range(count):
            await invoke()

    await asyncio.gather(*(awaiter(calls // concurrency) for _ in range(concurrency)))


def _peers(variants: dict[str, Invoke]) -> list[str]:
    """Add the importable peers to `variants`; return the names of the skipped ones."""
    skipped = []
    for name, make in (("openai-agents on_invoke_tool", _openai_agents), ("mcp call_tool", _mcp)):
        try:
            invoke = make()
        except Exception as exc:  # installed, but its API moved: report it, go on
            invoke = None
            name = f"{name} ({type(exc).__name__}: {exc})"
        if invoke is None:
            skipped.append(name)
        else:
            variants[name] = invoke
    return skipped


def measure(quick: bool) -> tuple[Rounds, list[str]]:
    """Seconds per call, per round, keyed `<variant>|<concurrency>`; and the skipped peers."""
    repeats = 7 if quick else 15
    calls = 600 if quick else 4_000
    loop = asyncio.new_event_loop()
    with _regime.worker_side():
        default = ThreadPoolExecutor(WORKERS)
        loop.set_default_executor(default)  # what asyncio.to_thread uses
        pool = ThreadPoolExecutor(WORKERS)
        registry = ToolRegistry(max_workers=WORKERS)
        registry.tool(search)
        start_executor_workers(default, WORKERS)
        start_executor_workers(pool, WORKERS)
        start_registry_workers(registry, WORKERS)
        on_demand = {concurrency: warm_pool(WORKERS) for concurrency in (1, CONCURRENCY)}
    areg = AsyncToolRegistry(registry)
    variants: dict[str, Invoke] = {
        "toolreg aio": lambda: areg.execute("search", ARGUMENTS),
        BASELINE: lambda: asyncio.to_thread(search, ARGUMENTS, None),
        "loop.run_in_executor": lambda: loop.run_in_executor(pool, search, ARGUMENTS, None),
        "to_thread(registry.execute)": lambda: asyncio.to_thread(
            registry.execute, "search", ARGUMENTS
        ),
    }
    skipped = _peers(variants)

    def timed(invoke: Invoke, concurrency: int) -> Callable[[], float]:
        def workload(n: int) -> None:
            loop.run_until_complete(_awaits(invoke, n, concurrency))

        return lambda: timed_once(workload, calls) / calls

    try:
        with _regime.worker_side():  # warm the caches; a thread started here is a worker
            for invoke in variants.values():
                loop.run_until_complete(_awaits(invoke, 4 * WORKERS, WORKERS))
        runs = {
            f"{name}|{concurrency}": timed(invoke, concurrency)
            for concurrency in (1, CONCURRENCY)
            for name, invoke in variants.items()
        }
        for concurrency, warm in on_demand.items():
            invoke = functools.partial(loop.run_in_executor, warm, search, ARGUMENTS, None)
            with _regime.worker_side():  # the threads it starts while warming are workers
                loop.run_until_complete(_awaits(invoke, 4 * WORKERS, concurrency))
            runs[f"{ON_DEMAND}|{concurrency}"] = timed(invoke, concurrency)
        return interleaved(runs, repeats), skipped
    finally:
        loop.run_until_complete(areg.aclose())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        pool.shutdown(wait=True)
        for warm in on_demand.values():
            warm.shutdown(wait=True)


def run(quick: bool) -> list[Row]:
    """Measure and return the table's rows."""
    m, skipped = measure(quick)
    rows: list[Row] = []
    for concurrency in (1, CONCURRENCY):
        shape = "sequential" if concurrency == 1 else f"{concurrency} concurrent awaiters"
        base = f"{BASELINE}|{concurrency}"
        for key, cost in m.items():
            name, level = key.rsplit("|", 1)
            if int(level) != concurrency:
                continue
            figure = f"{format_time(cost)}/call"
            factor = m.ratio(key, base)
            if name == "toolreg aio":
                against = f"{BASELINE}, {shape}"
                target = TARGETS[concurrency]
                rows.append(judged(f"{name}, {shape}", figure, factor, target, against))
                warm = m.ratio(key, f"{ON_DEMAND}|{concurrency}")
                rows.append(
                    Row(
                        f"{name}, {shape}, against the pool started on demand",
                        figure,
                        f"{warm:.2f}x",
                        baseline=f"{ON_DEMAND}, {shape}",
                    )
                )
            else:
                label = f"{name}, {shape}" + (" (baseline)" if name == BASELINE else "")
                rows.append(Row(label, figure, f"{factor:.2f}x"))
    rows += [Row(f"{name}: not installed, skipped", "-") for name in skipped]
    return rows


if __name__ == "__main__":
    import sys

    from .__main__ import main

    sys.exit(main(["--only", "aio", *sys.argv[1:]]))
