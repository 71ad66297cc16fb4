"""ToolRegistry.execute against the bare thread-pool hop it replaces, started two ways.

The baseline is the bare hop `pool.submit(fn).result()` on a `ThreadPoolExecutor(8)`, in two
forms: with its 8 workers pre-started (every worker started before timing), and started on
demand (`_harness.warm_pool`: one warm worker, and another only when a task finds none idle).
A sequential caller of a pool it did not pre-start keeps one warm worker, which hands off
faster than 8 workers taking turns: that is what a user who writes the hop gets. Every registry
has 8 workers (its default `WorkerPool`) and runs a trivial tool, so the figures are pure
overhead. Ratios are medians of per-round ratios (`_harness.interleaved`). Rows against the
pre-started pool, with the targets of issue 18 (same regime; cross in brackets):

* execute, no hooks: `registry.execute("one")` over the bare hop: <= 1.00x (<= 1.10x).
* execute, six hooks incl. TimeoutPolicy: a pre-execute hook, a guard, `TimeoutPolicy()` and
  a pass-through around wrapper, a post-execute hook and an observer, on a tool with
  `timeout=30` (never reached), over the same bare hop: <= 1.20x (<= 1.30x).
* 8 submitting threads: wall time for 8 threads calling `execute` in a loop over the same 8
  threads driving the `ThreadPoolExecutor(8)`: <= 1.00x (<= 1.00x).
* the same three against the pool started on demand (a pool of its own for the sequential
  rows and another for the 8 threads, each showing how many workers it started), with the
  targets of issue 37: six hooks <= 1.30x, 8 threads <= 1.10x.
* for reference: `WorkerPool(8).submit(fn).result()` (toolreg's pool as a plain `Executor`),
  the bare hand-off under any hop (`_harness.LockHop`: one thread, a lock each way, no
  `Future`; what `execute` costs beyond it is the pipeline's Python), and LangChain's
  `@tool(...).invoke` (a peer's per-call cost, when langchain-core is there).

Every pool has all its workers started before timing (`_harness.start_*_workers`, inside
`_regime.worker_side()`, so in the cross regime they run on the workers' CPU); the 8 submitting
threads are callers (`_regime.caller()`).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from toolreg import Allow, TimeoutPolicy, Tool, ToolRegistry, WorkerPool

from . import _regime
from ._harness import (
    LockHop,
    Row,
    Target,
    format_time,
    interleaved,
    judged,
    pool_workers,
    start_executor_workers,
    start_registry_workers,
    timed_once,
    warm_pool,
)

WORKERS = 8
THREADS = 8
NO_HOOKS = Target(1.00, 1.10)
SIX_HOOKS = Target(1.20, 1.30)
THREADED = Target(1.00, 1.00)
SIX_HOOKS_WARM = Target(1.30)  # against the pool started on demand
THREADED_WARM = Target(1.10)
TOOL_TIMEOUT = 30.0  # seconds: never reached


@dataclass(frozen=True)
class Sizes:
    calls: int  # calls per timed run
    repeats: int


QUICK = Sizes(calls=1_000, repeats=7)
FULL = Sizes(calls=5_000, repeats=21)


def _one() -> int:
    return 1


def _body(args: Any, ctx: Any) -> int:
    return 1


def _wrapper(dispatch: Any, proceed: Callable[[], Any]) -> Any:
    return proceed()


def plain_registry() -> ToolRegistry:
    """A registry with the trivial tool `one` and no hooks."""
    registry = ToolRegistry(max_workers=WORKERS)
    registry.register(Tool("one", _body))
    return registry


def six_hook_registry() -> ToolRegistry:
    """The trivial tool `one` (timeout=30) under six hooks, TimeoutPolicy among them."""
    registry = ToolRegistry(max_workers=WORKERS)
    registry.register(Tool("one", _body, timeout=TOOL_TIMEOUT))
    registry.add_pre_execute(lambda call, token: Allow())
    registry.add_guard(lambda call: None)
    registry.add_around(TimeoutPolicy())
    registry.add_around(_wrapper)
    registry.add_post_execute(lambda result, token: None)
    registry.on_result(lambda result: None)
    return registry


def _sequential(call: Callable[[], object], calls: int) -> Callable[[], float]:
    def work(n: int) -> None:
        for _ in range(n):
            call()

    return lambda: timed_once(work, calls) / calls


def _threaded(call: Callable[[], object], calls: int) -> Callable[[], float]:
    """Seconds per call, wall time, with `THREADS` caller threads sharing `calls` calls."""

    def measure() -> float:
        per_thread = calls // THREADS
        barrier = threading.Barrier(THREADS + 1)

        def caller() -> None:
            with _regime.caller():
                barrier.wait()
                for _ in range(per_thread):
                    call()
                barrier.wait()

        threads = [threading.Thread(target=caller, name="bench-caller") for _ in range(THREADS)]
        for thread in threads:
            thread.start()

        def work(_: int) -> None:
            barrier.wait()
            barrier.wait()

        elapsed = timed_once(work, 1)
        for thread in threads:
            thread.join()
        return elapsed / (per_thread * THREADS)

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


def run(quick: bool) -> list[Row]:
    sizes = QUICK if quick else FULL
    with _regime.worker_side():
        bare = LockHop()
        raw_pool = ThreadPoolExecutor(WORKERS)
        lean_pool = WorkerPool(WORKERS)
        plain = plain_registry()
        six = six_hook_registry()
        start_executor_workers(raw_pool, WORKERS)
        start_executor_workers(lean_pool, WORKERS)
        start_registry_workers(plain, WORKERS)
        start_registry_workers(six, WORKERS)
        warm = warm_pool(WORKERS)  # sequential callers only
        warm_x8 = warm_pool(WORKERS)  # the 8 threads only
    try:
        n = sizes.calls
        variants: dict[str, Callable[[], float]] = {
            "raw": _sequential(lambda: raw_pool.submit(_one).result(), n),
            "lean": _sequential(lambda: lean_pool.submit(_one).result(), n),
            "bare": _sequential(bare, n),
            "plain": _sequential(lambda: plain.execute("one"), n),
            "six": _sequential(lambda: six.execute("one"), n),
            "warm": _sequential(lambda: warm.submit(_one).result(), n),
            "raw x8": _threaded(lambda: raw_pool.submit(_one).result(), n),
            "warm x8": _threaded(lambda: warm_x8.submit(_one).result(), n),
            "plain x8": _threaded(lambda: plain.execute("one"), n),
        }
        peer = _langchain()
        if peer is not None:
            variants["langchain"] = _sequential(peer, n // 4)
        m = interleaved(variants, sizes.repeats)
    finally:
        plain.close()
        six.close()
        raw_pool.shutdown()
        started = {"warm": pool_workers(warm), "warm x8": pool_workers(warm_x8)}
        warm.shutdown()
        warm_x8.shutdown()
        lean_pool.shutdown()
        bare.close()
    rows = [
        Row(
            "ThreadPoolExecutor(8), 8 workers pre-started: submit(fn).result() (baseline)",
            format_time(m["raw"]),
        ),
        Row("WorkerPool(8): submit(fn).result()", format_time(m["lean"]), ratio_of(m, "lean")),
        Row(
            "bare hand-off: two locks, one thread (floor)",
            format_time(m["bare"]),
            ratio_of(m, "bare"),
        ),
        judged("execute, no hooks", format_time(m["plain"]), m.ratio("plain", "raw"), NO_HOOKS),
        judged(
            "execute, six hooks incl. TimeoutPolicy",
            format_time(m["six"]),
            m.ratio("six", "raw"),
            SIX_HOOKS,
        ),
    ]
    if "langchain" in m:
        figure = format_time(m["langchain"])
        rows.append(Row("langchain @tool(...).invoke (peer)", figure, ratio_of(m, "langchain")))
    rows += [
        Row(
            "ThreadPoolExecutor(8) started on demand: submit(fn).result() (baseline)",
            f"{format_time(m['warm'])} ({_workers(started['warm'])})",
        ),
        Row(
            "execute, no hooks, against the pool started on demand",
            format_time(m["plain"]),
            f"{m.ratio('plain', 'warm'):.2f}x",
        ),
        judged(
            "execute, six hooks incl. TimeoutPolicy, against the pool started on demand",
            format_time(m["six"]),
            m.ratio("six", "warm"),
            SIX_HOOKS_WARM,
        ),
        Row("8 threads: ThreadPoolExecutor(8) hop (baseline)", format_time(m["raw x8"])),
        judged(
            "8 threads: execute, wall time",
            format_time(m["plain x8"]),
            m.ratio("plain x8", "raw x8"),
            THREADED,
        ),
        Row(
            "8 threads: ThreadPoolExecutor(8) started on demand, hop (baseline)",
            f"{format_time(m['warm x8'])} ({_workers(started['warm x8'])})",
        ),
        judged(
            "8 threads: execute, wall time, against the pool started on demand",
            format_time(m["plain x8"]),
            m.ratio("plain x8", "warm x8"),
            THREADED_WARM,
        ),
    ]
    return rows


def _workers(count: int) -> str:
    return f"{count} worker{'s' if count != 1 else ''}"


def ratio_of(m: Any, name: str) -> str:
    return f"{m.ratio(name, 'raw'):.2f}x"


if __name__ == "__main__":
    import sys

    from .__main__ import main

    sys.exit(main(["--only", "registry", *sys.argv[1:]]))
