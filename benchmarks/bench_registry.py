"""ToolRegistry.execute against the raw executor round trip it wraps.

Every figure is a median over interleaved repeats; ratios are against baselines measured in the
same run. Rows:

* execute, no hooks: `registry.execute("one")` on a trivial tool, against the raw round trip
  `pool.submit(fn).result()` on a `ThreadPoolExecutor` of the same size (target <= 1.10x).
* execute, full pipeline: the same with a pre-execute hook, a guard, two around wrappers, a post
  hook and an observer, all trivial (target <= 1.30x).
* langchain `@tool(...).invoke`: the peer's own per-call cost, when langchain-core is installed.
* throughput, 8 threads: calls per second with 8 submitting threads, against the raw pool driven
  the same way (target >= 0.85x, shown as raw/execute time ratio <= 1.18x).
* memory: traced bytes retained by one long-lived caller token after many calls (must stay 0).
"""

from __future__ import annotations

import gc
import importlib
import threading
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from toolreg import Allow, CancelSource, Tool, ToolRegistry

from ._harness import Row, format_time, interleaved, ratio, timed_once, verdict

NO_HOOKS_TARGET = 1.10
FULL_TARGET = 1.30
THROUGHPUT_TARGET = 1 / 0.85


@dataclass(frozen=True)
class Sizes:
    calls: int  # calls per timed run
    repeats: int
    memory_calls: int


QUICK = Sizes(calls=1_000, repeats=5, memory_calls=20_000)
FULL = Sizes(calls=5_000, repeats=15, memory_calls=1_000_000)


def _one() -> int:
    return 1


def _body(args: Any, ctx: Any) -> int:
    return 1


def _wrapper(dispatch: Any, proceed: Callable[[], Any]) -> Any:
    return proceed()


def _full_registry(workers: int) -> ToolRegistry:
    registry = ToolRegistry(max_workers=workers)
    registry.register(Tool("one", _body))
    registry.add_pre_execute(lambda call, token: Allow())
    registry.add_guard(lambda call: None)
    registry.add_around(_wrapper)
    registry.add_around(_wrapper)
    registry.add_post_execute(lambda result, token: None)
    registry.on_result(lambda result: None)
    return registry


def _sequential(call: Callable[[], object]) -> Callable[[], float]:
    def measure(calls: int) -> float:
        def work(n: int) -> None:
            for _ in range(n):
                call()

        return timed_once(work, calls) / calls

    return lambda: measure(_SIZES.calls)


def _threaded(call: Callable[[], object], threads: int = 8) -> Callable[[], float]:
    def measure() -> float:
        per_thread = _SIZES.calls // threads
        barrier = threading.Barrier(threads + 1)

        def worker() -> None:
            barrier.wait()
            for _ in range(per_thread):
                call()
            barrier.wait()

        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for thread in pool:
            thread.start()

        def work(_: int) -> None:
            barrier.wait()
            barrier.wait()

        elapsed = timed_once(work, 1)
        for thread in pool:
            thread.join()
        return elapsed / (per_thread * threads)

    return measure


def _langchain() -> Callable[[], object] | None:
    try:
        tools = importlib.import_module("langchain_core.tools")
    except ImportError:
        return None

    def one(x: int) -> int:
        """Return one."""
        return 1

    peer = tools.tool(one)
    return lambda: peer.invoke({"x": 1})


def _growth(calls: int) -> tuple[int, int]:
    """Traced bytes grown over `calls` calls on one caller token, and what the token holds."""
    with ToolRegistry(max_workers=2) as registry:
        registry.register(Tool("one", _body))
        caller = CancelSource()
        for _ in range(1000):  # warm caches and pool threads before measuring
            registry.execute("one", token=caller.token)
        gc.collect()
        gc.disable()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(calls):
                registry.execute("one", token=caller.token)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            gc.enable()
        held = len(caller.token._listeners or ()) + len(caller.token._children or ())
        return grown, held


_SIZES = QUICK


def run(quick: bool) -> list[Row]:
    global _SIZES
    _SIZES = QUICK if quick else FULL
    workers = 8
    raw_pool = ThreadPoolExecutor(workers)
    plain = ToolRegistry(max_workers=workers)
    plain.register(Tool("one", _body))
    full = _full_registry(workers)
    try:
        variants: dict[str, Callable[[], float]] = {
            "raw": _sequential(lambda: raw_pool.submit(_one).result()),
            "plain": _sequential(lambda: plain.execute("one")),
            "full": _sequential(lambda: full.execute("one")),
            "raw x8": _threaded(lambda: raw_pool.submit(_one).result()),
            "plain x8": _threaded(lambda: plain.execute("one")),
        }
        peer = _langchain()
        if peer is not None:
            variants["langchain"] = _sequential(peer)
        figures = interleaved(variants, _SIZES.repeats)
    finally:
        plain.close()
        full.close()
        raw_pool.shutdown()
    return _rows(figures)


def _rows(figures: dict[str, float]) -> list[Row]:
    raw, raw8 = figures["raw"], figures["raw x8"]
    rows = [
        Row("pool.submit(fn).result() (baseline)", format_time(raw)),
        _row("execute, no hooks", figures["plain"], raw, NO_HOOKS_TARGET),
        _row("execute, pre+guard+2 wrappers+post+observer", figures["full"], raw, FULL_TARGET),
    ]
    if "langchain" in figures:
        rows.append(
            Row(
                "langchain @tool(...).invoke (peer)",
                format_time(figures["langchain"]),
                ratio(figures["langchain"], raw),
            )
        )
    rows.append(Row("raw pool, 8 threads (baseline)", format_time(raw8)))
    rows.append(_row("execute, 8 threads", figures["plain x8"], raw8, THROUGHPUT_TARGET))
    grown, held = _growth(_SIZES.memory_calls)
    flat = held == 0 and grown < 64 * 1024
    rows.append(
        Row(
            f"memory growth, {_SIZES.memory_calls:,} calls on one caller token",
            f"{grown / 1024:.1f} KiB, {held} held",
            target="flat, 0 held",
            verdict="PASS" if flat else "MISS",
        )
    )
    return rows


def _row(name: str, value: float, baseline: float, target: float) -> Row:
    return Row(
        name,
        format_time(value),
        ratio(value, baseline),
        f"<= {target:.2f}x",
        verdict(value / baseline, target),
    )
