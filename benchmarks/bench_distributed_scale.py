"""Dask at scale: 10,000 quick remote calls on 4 worker processes, and a cancel half-way.

One processes `LocalCluster` (four worker processes of two threads each, free to run on every
CPU, as in `bench_distributed`), started here. The tool body returns its argument at once, so
the figures are what the remote path itself costs.

* throughput: `registry.execute_batch` of 10,000 calls (`max_parallel=64`, on a registry of 64
  workers) against `client.map` of the same function over the same 10,000 inputs, then
  `gather` (the baseline). Both in the same rounds; the ratio is of wall times (medians of
  per-round ratios), the figures in calls per second.
* cancel half-way: the same batch under a token that is cancelled once half of its calls have
  finished (seen through `on_progress`): the time from `cancel()` to `execute_batch` returning,
  which is when the last result is in (every started body joined), and how the calls ended.
* what the scheduler holds once the calls settle: toolreg's tasks, the claim board's records
  and watch entries, and the scheduler's task groups, read on the scheduler after the futures
  were released (polled, bounded): nothing of the calls is left behind.

`--quick` runs 300 calls, one round.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from ._harness import Row, interleaved
from .bench_distributed import start_cluster

WORKERS = 4  # worker processes
THREADS = 2  # threads per worker process
MAX_PARALLEL = 64
SETTLE_WAIT = 60.0  # seconds the scheduler may take to forget the calls' tasks


def quick_body(args: Any, ctx: Any) -> int:
    """The remote tool body: returns at once."""
    return int(args["n"])


def quick_raw(n: int) -> int:
    """The same, as a plain Dask function."""
    return n


def measure(quick: bool) -> dict[str, Any]:
    """Median seconds of both variants, their ratio, and the cancel run's figures."""
    from toolreg import ToolCall, ToolRegistry
    from toolreg.distributed import DaskBackend

    calls = 300 if quick else 10_000
    repeats = 1 if quick else 2
    cluster, client = start_cluster(WORKERS, THREADS)
    backend = DaskBackend(client)
    registry = ToolRegistry(max_workers=MAX_PARALLEL)
    registry.tool(name="quick_body", concurrency_safe=True)(backend.remote(quick_body))
    batch = [ToolCall("quick_body", {"n": n}) for n in range(calls)]

    def through_batch() -> float:
        started = time.perf_counter()
        results = registry.execute_batch(batch, max_parallel=MAX_PARALLEL)
        elapsed = time.perf_counter() - started
        assert all(result.ok for result in results), [r for r in results if not r.ok][:1]
        return elapsed

    def raw_map() -> float:
        started = time.perf_counter()
        futures = client.map(quick_raw, range(calls), pure=False)
        values = client.gather(futures)
        elapsed = time.perf_counter() - started
        assert values == list(range(calls))
        del futures
        return elapsed

    try:
        registry.execute_batch(batch[:200], max_parallel=MAX_PARALLEL)  # warm up
        client.gather(client.map(quick_raw, range(200), pure=False))
        rounds = interleaved({"client.map": raw_map, "batch": through_batch}, repeats)
        figures: dict[str, Any] = dict(rounds)
        figures["ratio"] = rounds.ratio("batch", "client.map")
        figures.update(_cancel_half_way(registry, backend, batch))
        figures["calls"] = calls
        return figures
    finally:
        registry.close()
        backend.close()
        client.close()
        cluster.close()


def _cancel_half_way(registry: Any, backend: Any, batch: list[Any]) -> dict[str, Any]:
    """Run `batch`, cancel it once half its calls finished; then wait for the scheduler to
    forget the calls. The seconds from cancel to return, the codes, and what was left."""
    from toolreg import CancelSource

    source = CancelSource()
    half = len(batch) // 2
    moment: list[float] = []

    def on_progress(done: int, total: int) -> None:
        if done >= half and not moment:
            moment.append(time.perf_counter())
            source.cancel("half-way")

    results = registry.execute_batch(
        batch, token=source.token, max_parallel=MAX_PARALLEL, on_progress=on_progress
    )
    returned = time.perf_counter()
    codes = Counter("ok" if result.ok else str(result.code) for result in results)
    started = time.perf_counter()
    left = _scheduler_holds(backend)
    pause = threading.Event()
    while any(left.values()) and time.perf_counter() - started < SETTLE_WAIT:
        pause.wait(0.05)
        left = _scheduler_holds(backend)
    return {
        "cancel -> returned": returned - moment[0],
        "codes": codes,
        "left": left,
        "settled in": time.perf_counter() - started,
    }


def _scheduler_holds(backend: Any) -> dict[str, int]:
    """What the scheduler still holds of toolreg's calls: tasks, task groups, board entries."""

    def read(dask_scheduler: Any) -> dict[str, int]:
        tasks = [key for key in dask_scheduler.tasks if str(key).startswith("toolreg-")]
        groups = [name for name in dask_scheduler.task_groups if str(name).startswith("toolreg-")]
        return {"tasks": len(tasks), "task groups": len(groups)}

    held: dict[str, int] = backend.client.run_on_scheduler(read)
    board = backend.board_state()
    held["board records"] = board["records"]
    held["board watches"] = board["watches"]
    return held


def run(quick: bool) -> list[Row]:
    """Measure and return the table's rows (needs the `dask` extra)."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        return [Row("distributed is not installed (extra toolreg[dask]): skipped", "-")]
    figures = measure(quick)
    calls = int(figures["calls"])
    cluster = f"{WORKERS} worker processes x {THREADS} threads"

    def rate(key: str) -> str:
        return f"{calls / figures[key]:,.0f} calls/s ({figures[key]:.2f} s)"

    codes = figures["codes"]
    ended = ", ".join(f"{count:,} {code}" for code, count in sorted(codes.items()))
    left = figures["left"]
    held = ", ".join(f"{count} {what}" for what, count in left.items())
    return [
        Row(f"{calls:,} inputs: client.map + gather, {cluster} (baseline)", rate("client.map")),
        Row(
            f"execute_batch of {calls:,}, max_parallel={MAX_PARALLEL}",
            rate("batch"),
            f"{figures['ratio']:.2f}x",
        ),
        Row(
            "the batch cancelled half-way: cancel -> execute_batch returned",
            f"{figures['cancel -> returned'] * 1e3:.1f} ms ({ended})",
            baseline="",
        ),
        Row(
            "what the scheduler holds of the calls once they settled",
            f"{held} ({figures['settled in']:.2f} s after the return)",
            "nothing left" if not any(left.values()) else "LEFT BEHIND",
            baseline="",
        ),
    ]


if __name__ == "__main__":
    import sys

    from .__main__ import main

    sys.exit(main(["--only", "distributed_scale", *sys.argv[1:]]))
