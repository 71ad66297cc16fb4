"""execute_batch: 100 parallel-safe calls against the same calls on a bare thread pool.

One agent step's worth of calls: 100 calls of a trivial, `concurrency_safe=True` tool (it
returns a constant, so the figure is pure overhead: a real tool's own work dwarfs it).

* ThreadPoolExecutor(8): the baseline. The 100 bodies submitted straight to a pool of 8 workers,
  then every future joined: no pipeline, no classification, no results, no cancellation.
* execute_batch, max_parallel=8: the same 100 calls through `registry.execute_batch` on a
  registry with 8 workers, under a caller token (as an agent loop passes one). Target (issue
  18, both regimes) <= 1.10x.
* The same batch against the same 100 submits on a `ThreadPoolExecutor(8)` started on demand
  (`_harness.warm_pool`: one warm worker at first, another only when a task finds none idle;
  the figure says how many it started): what a user who does not pre-start the pool gets.
  Target (issue 37) <= 1.20x.
* execute_batch, no token: the same without the caller token.
* execute x100, one by one: the calls made sequentially with `registry.execute`, for scale.
* A batch of one call against one `submit(...).result()` (and one `execute`): what a batch
  costs besides its calls (its scheduler, its token, its runner), which an agent step of one or
  two calls mostly pays. No target: reported so that it stays measured.

The figure is the median time per batch (and per call); ratios are medians of per-round
ratios (`_harness.interleaved`), on pools that stay warm for the whole run, every worker
started before timing (in the cross regime, on the workers' CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from toolreg import CancelSource, ToolCall, ToolRegistry

from . import _regime
from ._harness import (
    Rounds,
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

WORKERS = 8  # both pools
MAX_PARALLEL = 8
CALLS = 100  # per batch
TARGET = Target(1.10)  # execute_batch / the bare pool, in every regime
TARGET_WARM = Target(1.20)  # execute_batch / the pool started on demand
ARGUMENTS: dict[str, Any] = {"q": "quiescent cancellation", "limit": 10}
SINGLES_PER_BATCH = 20  # one-call batches per timed run, per batch of CALLS in the others


@dataclass(frozen=True)
class Sizes:
    batches: int  # batches per timed run
    repeats: int


QUICK = Sizes(batches=10, repeats=7)
FULL = Sizes(batches=40, repeats=15)


def search(args: Any, ctx: Any) -> str:
    """The tool body every variant runs."""
    return "ok"


class Bench:
    """The pools, the registry and the calls, warm for the whole run."""

    def __init__(self) -> None:
        self.caller = CancelSource()
        self.calls = [ToolCall("search", ARGUMENTS, f"call-{index}") for index in range(CALLS)]
        with _regime.worker_side():
            self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="bench-pool")
            self.registry = ToolRegistry(max_workers=WORKERS, thread_name_prefix="bench-batch")
            self.registry.tool(concurrency_safe=True)(search)
            start_executor_workers(self.pool, WORKERS)
            start_registry_workers(self.registry, WORKERS)
            self.warm = warm_pool(WORKERS, thread_name_prefix="bench-warm-pool")
            for _ in range(20):  # warm the caches (and whatever threads a batch starts)
                self.pool_batches(1)
                self.pool_batches(1, self.warm)
                self.registry_batches(1)
                self.registry_batches(1, token=False)

    def close(self) -> None:
        self.registry.close()
        self.pool.shutdown(wait=True)
        self.warm.shutdown(wait=True)

    def pool_batches(self, n: int, pool: ThreadPoolExecutor | None = None) -> None:
        pool, calls = pool or self.pool, self.calls
        for _ in range(n):
            futures = [pool.submit(search, call.arguments, None) for call in calls]
            for future in futures:
                future.result()

    def registry_batches(self, n: int, token: bool = True) -> None:
        registry, calls = self.registry, self.calls
        caller = self.caller.token if token else None
        for _ in range(n):
            registry.execute_batch(calls, token=caller, max_parallel=MAX_PARALLEL)

    def pool_single(self, n: int) -> None:
        pool, arguments = self.pool, self.calls[0].arguments
        for _ in range(n):
            pool.submit(search, arguments, None).result()

    def registry_single(self, n: int) -> None:
        registry, one = self.registry, self.calls[:1]
        caller = self.caller.token
        for _ in range(n):
            registry.execute_batch(one, token=caller, max_parallel=MAX_PARALLEL)

    def execute_single(self, n: int) -> None:
        registry, call = self.registry, self.calls[0]
        caller = self.caller.token
        for _ in range(n):
            registry.execute(call, token=caller)

    def one_by_one(self, n: int) -> None:
        registry, calls = self.registry, self.calls
        caller = self.caller.token
        for _ in range(n):
            for call in calls:
                registry.execute(call, token=caller)


def measure(quick: bool) -> tuple[Rounds, int]:
    """Seconds per batch of each variant, per round; the workers the warm pool started."""
    sizes = QUICK if quick else FULL
    n = sizes.batches
    bench = Bench()
    try:

        def per_batch(fn: Callable[[int], None], count: int = n) -> Callable[[], float]:
            return lambda: timed_once(fn, count) / count

        singles = n * SINGLES_PER_BATCH
        variants: dict[str, Callable[[], float]] = {
            "pool": per_batch(bench.pool_batches),
            "warm pool": per_batch(partial(bench.pool_batches, pool=bench.warm)),
            "batch": per_batch(bench.registry_batches),
            "batch, no token": per_batch(partial(bench.registry_batches, token=False)),
            "one by one": per_batch(bench.one_by_one),
            "pool, 1 call": per_batch(bench.pool_single, singles),
            "batch, 1 call": per_batch(bench.registry_single, singles),
            "execute, 1 call": per_batch(bench.execute_single, singles),
        }
        return interleaved(variants, sizes.repeats), pool_workers(bench.warm)
    finally:
        bench.close()


def run(quick: bool) -> list[Row]:
    """Measure and return the table's rows."""
    m, started = measure(quick)
    base = m["pool"]

    def figure(seconds: float) -> str:
        return f"{format_time(seconds)}/batch ({format_time(seconds / CALLS)}/call)"

    return [
        Row(
            f"ThreadPoolExecutor({WORKERS}), workers pre-started: submit {CALLS} + join (baseline)",
            figure(base),
            "1.00x",
        ),
        judged(
            f"execute_batch, {CALLS} calls, max_parallel={MAX_PARALLEL}",
            figure(m["batch"]),
            m.ratio("batch", "pool"),
            TARGET,
        ),
        Row(
            "execute_batch, no caller token",
            figure(m["batch, no token"]),
            f"{m.ratio('batch, no token', 'pool'):.2f}x",
        ),
        Row(
            f"execute x{CALLS}, one by one",
            figure(m["one by one"]),
            f"{m.ratio('one by one', 'pool'):.2f}x",
        ),
        Row(
            f"ThreadPoolExecutor({WORKERS}) started on demand: submit {CALLS} + join (baseline)",
            f"{figure(m['warm pool'])}, {started} workers",
            "1.00x",
        ),
        judged(
            f"execute_batch, {CALLS} calls, against the pool started on demand",
            figure(m["batch"]),
            m.ratio("batch", "warm pool"),
            TARGET_WARM,
        ),
        Row(
            f"ThreadPoolExecutor({WORKERS}): submit 1 + join (baseline of the next two)",
            format_time(m["pool, 1 call"]),
            "1.00x",
        ),
        Row(
            "execute_batch, 1 call",
            format_time(m["batch, 1 call"]),
            f"{m.ratio('batch, 1 call', 'pool, 1 call'):.2f}x",
        ),
        Row(
            "execute, 1 call",
            format_time(m["execute, 1 call"]),
            f"{m.ratio('execute, 1 call', 'pool, 1 call'):.2f}x",
        ),
    ]


if __name__ == "__main__":
    import sys

    from .__main__ import main

    sys.exit(main(["--only", "batch", *sys.argv[1:]]))
