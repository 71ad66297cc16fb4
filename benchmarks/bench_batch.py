"""execute_batch: 100 parallel-safe calls against the same calls on a bare thread pool.

One agent step's worth of calls: 100 calls of a trivial, `concurrency_safe=True` tool (it
returns a constant, so the figure is pure overhead: a real tool's own work dwarfs it).

* ThreadPoolExecutor(8): the baseline. The 100 bodies submitted straight to a pool of 8 workers,
  then every future joined: no pipeline, no classification, no results, no cancellation.
* execute_batch, max_parallel=8: the same 100 calls through `registry.execute_batch` on a
  registry with 8 workers, under a caller token (as an agent loop passes one). Target <= 1.15x.
* execute_batch, no token: the same without the caller token.
* execute x100, one by one: the calls made sequentially with `registry.execute`, for scale.

The figure is the median time per batch (and per call). The ratio is paired: each sample times
the pool and the batch back to back (ABBA), on pools that stay warm for the whole run, and the
table shows the median of those ratios, which cancels most of the drift of a busy, shared
machine. The absolute figures are medians over the same interleaved repeats.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from toolreg import CancelSource, ToolCall, ToolRegistry

from ._harness import Row, format_time, interleaved, timed_once, verdict

WORKERS = 8  # both pools
MAX_PARALLEL = 8
CALLS = 100  # per batch
TARGET = 1.15  # execute_batch / the bare pool
ARGUMENTS: dict[str, Any] = {"q": "quiescent cancellation", "limit": 10}


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
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="bench-pool")
        self.registry = ToolRegistry(max_workers=WORKERS, thread_name_prefix="bench-batch")
        self.registry.tool(concurrency_safe=True)(search)
        self.caller = CancelSource()
        self.calls = [ToolCall("search", ARGUMENTS, f"call-{index}") for index in range(CALLS)]
        for _ in range(20):  # start every worker of both pools; warm the caches
            self.pool_batches(1)
            self.registry_batches(1)
            self.registry_batches(1, token=False)

    def close(self) -> None:
        self.registry.close()
        self.pool.shutdown(wait=True)

    def pool_batches(self, n: int) -> None:
        pool, calls = self.pool, self.calls
        for _ in range(n):
            futures = [pool.submit(search, call.arguments, None) for call in calls]
            for future in futures:
                future.result()

    def registry_batches(self, n: int, token: bool = True) -> None:
        registry, calls = self.registry, self.calls
        caller = self.caller.token if token else None
        for _ in range(n):
            registry.execute_batch(calls, token=caller, max_parallel=MAX_PARALLEL)

    def one_by_one(self, n: int) -> None:
        registry, calls = self.registry, self.calls
        caller = self.caller.token
        for _ in range(n):
            for call in calls:
                registry.execute(call, token=caller)

    def paired(self, n: int) -> float:
        """execute_batch over the bare pool, timed ABBA."""
        pool = timed_once(self.pool_batches, n)
        batch = timed_once(self.registry_batches, n)
        batch += timed_once(self.registry_batches, n)
        pool += timed_once(self.pool_batches, n)
        return batch / pool


def measure(quick: bool) -> dict[str, float]:
    """Medians: seconds per batch for each variant, and the paired ratio (`batch / pool`)."""
    sizes = QUICK if quick else FULL
    n = sizes.batches
    bench = Bench()
    try:

        def per_batch(fn: Callable[[int], None]) -> Callable[[], float]:
            return lambda: timed_once(fn, n) / n

        variants: dict[str, Callable[[], float]] = {
            "pool": per_batch(bench.pool_batches),
            "batch": per_batch(bench.registry_batches),
            "batch, no token": per_batch(partial(bench.registry_batches, token=False)),
            "one by one": per_batch(bench.one_by_one),
            "batch / pool": partial(bench.paired, max(1, n // 2)),
        }
        return interleaved(variants, sizes.repeats)
    finally:
        bench.close()


def run(quick: bool) -> list[Row]:
    """Measure and return the table's rows."""
    m = measure(quick)
    base = m["pool"]

    def figure(seconds: float) -> str:
        return f"{format_time(seconds)}/batch ({format_time(seconds / CALLS)}/call)"

    factor = m["batch / pool"]
    return [
        Row(
            f"ThreadPoolExecutor({WORKERS}): submit {CALLS} + join (baseline)",
            figure(base),
            "1.00x",
        ),
        Row(
            f"execute_batch, {CALLS} calls, max_parallel={MAX_PARALLEL}, paired",
            figure(m["batch"]),
            f"{factor:.2f}x",
            f"<= {TARGET:.2f}x",
            verdict(factor, TARGET),
        ),
        Row(
            "execute_batch, no caller token",
            figure(m["batch, no token"]),
            f"{m['batch, no token'] / base:.2f}x",
        ),
        Row(
            f"execute x{CALLS}, one by one",
            figure(m["one by one"]),
            f"{m['one by one'] / base:.2f}x",
        ),
    ]


if __name__ == "__main__":
    import sys

    from ._harness import format_table

    print(format_table("bench_batch", run(quick="--quick" in sys.argv)))
