"""Remote tool bodies on Dask: the backend against a raw `client.map`, and cancel latencies.

One `LocalCluster` (one worker process with two threads), started here. Measured on it:

* throughput: 400 calls of a 5 ms body from 32 threads through `ToolRegistry.execute` and
  `DaskBackend` (every call: the pipeline on the caller, a claim on the scheduler, the join),
  against a raw `client.map` of the same body over the same 400 inputs, then `gather`
  (the baseline: 1.00x; target for toolreg <= 1.05x). Interleaved, median wall time.
* cancel -> body: from `CancelSource.cancel()` on the caller to the remote body's token
  waking (`time.monotonic` is one clock for all processes of this machine); median.
* cancel -> ABORTED: from `cancel()` to `execute` returning `ABORTED` for that body; median.
* cancel -> ABORTED_BEFORE_DISPATCH: a call queued behind two busy worker threads; from
  `cancel()` to `execute` returning; median.

The figures depend on the machine's load (Dask's client batches its messages every 10 ms, and
the scheduler shares the machine's cores with everything else): read them as ratios measured
in the same run.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._harness import Row, format_time, interleaved, verdict

CALLERS = 32
TARGET = 1.05  # backend / raw client.map
BODY_SECONDS = 0.005
WAIT = 30.0  # bound on every handshake


def work(args: Any, ctx: Any) -> int:
    """The remote tool body: 5 ms of (sleeping) work."""
    time.sleep(BODY_SECONDS)
    return int(args["n"])


def work_raw(n: int) -> int:
    """The same work, as a plain Dask function."""
    time.sleep(BODY_SECONDS)
    return n


def wait_for_cancel(args: Any, ctx: Any) -> None:
    """Tell the caller it started, wait for the cancellation, note when it arrived."""
    from distributed import Event

    Event(args["started"]).set()
    ctx.token.wait(WAIT)
    ctx.defer_context(time.monotonic())


def hold(args: Any, ctx: Any) -> None:
    from distributed import Event

    Event(args["started"]).set()
    Event(args["release"]).wait(WAIT)


def mark(args: Any, ctx: Any) -> str:
    return "ran"


def measure(quick: bool) -> dict[str, float]:
    """Median seconds: `backend`, `client.map`, and the three cancel latencies."""
    from distributed import Client, Event, LocalCluster

    from toolreg import CancelSource, ToolRegistry
    from toolreg.distributed import DaskBackend

    calls = 100 if quick else 400
    repeats = 1 if quick else 5
    samples = 5 if quick else 25
    cluster = LocalCluster(
        n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0"
    )
    client = Client(cluster)
    backend = DaskBackend(client)
    registry = ToolRegistry(max_workers=4)
    for body in (work, wait_for_cancel, hold, mark):
        registry.tool(name=body.__name__)(backend.remote(body))
    callers = ThreadPoolExecutor(CALLERS)

    def through_backend() -> float:
        started = time.perf_counter()
        results = list(callers.map(lambda n: registry.execute("work", {"n": n}), range(calls)))
        elapsed = time.perf_counter() - started
        assert all(result.ok for result in results), [r for r in results if not r.ok][:1]
        return elapsed

    def raw_map() -> float:
        started = time.perf_counter()
        futures = client.map(work_raw, range(calls), pure=False)
        values = client.gather(futures)
        elapsed = time.perf_counter() - started
        assert values == list(range(calls))
        del futures
        return elapsed

    def cancel_running() -> tuple[float, float]:
        started = f"bench-started-{time.monotonic_ns()}"
        source = CancelSource()
        box: list[Any] = []
        caller = threading.Thread(
            target=lambda: box.append(
                registry.execute("wait_for_cancel", {"started": started}, token=source.token)
            )
        )
        caller.start()
        assert Event(started, client=client).wait(WAIT)
        moment = time.monotonic()
        source.cancel("bench")
        caller.join(WAIT)
        returned = time.monotonic()
        Event(started, client=client).clear()
        [result] = box
        assert result.code == "ABORTED", result
        return result.contexts[0] - moment, returned - moment

    def cancel_queued() -> float:
        started = [f"bench-hold-{n}-{time.monotonic_ns()}" for n in range(2)]
        release = f"bench-release-{time.monotonic_ns()}"
        holders = [
            threading.Thread(
                target=registry.execute, args=("hold", {"started": s, "release": release})
            )
            for s in started
        ]
        for holder in holders:
            holder.start()
        for name in started:
            assert Event(name, client=client).wait(WAIT)
        source = CancelSource()
        box: list[Any] = []
        caller = threading.Thread(
            target=lambda: box.append(registry.execute("mark", token=source.token))
        )
        caller.start()
        _wait_for_task(client, "toolreg-mark-")  # queued behind the two held threads
        moment = time.monotonic()
        source.cancel("bench")
        caller.join(WAIT)
        returned = time.monotonic()
        Event(release, client=client).set()
        for holder in holders:
            holder.join(WAIT)
        for name in [*started, release]:
            Event(name, client=client).clear()
        [result] = box
        assert result.code == "ABORTED_BEFORE_DISPATCH", result
        return returned - moment

    try:
        through_backend()  # warm up: every caller thread, the workers' imports, the board
        raw_map()
        rounds = interleaved({"backend": through_backend, "client.map": raw_map}, repeats)
        figures = dict(rounds)
        figures["ratio"] = rounds.ratio("backend", "client.map")
        running = [cancel_running() for _ in range(samples)]
        figures["cancel -> body"] = statistics.median(body for body, _ in running)
        figures["cancel -> ABORTED"] = statistics.median(done for _, done in running)
        figures["cancel -> ABORTED_BEFORE_DISPATCH"] = statistics.median(
            cancel_queued() for _ in range(samples)
        )
        figures["calls"] = calls
        return figures
    finally:
        callers.shutdown(wait=True)
        registry.close()
        backend.close()
        client.close()
        cluster.close()


def run(quick: bool) -> list[Row]:
    """Measure and return the table's rows (needs the `dask` extra)."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        return [Row("distributed is not installed (extra toolreg[dask]): skipped", "-")]
    figures = measure(quick)
    calls = int(figures["calls"])
    base = figures["client.map"]
    backend = figures["backend"]
    rows = [
        Row(
            f"{calls} calls from {CALLERS} threads, DaskBackend",
            f"{backend:.3f} s",
            f"{figures['ratio']:.2f}x",
            f"<= {TARGET:.2f}x",
            verdict(figures["ratio"], TARGET),
            f"{calls} inputs, raw client.map + gather",
        ),
        Row(f"{calls} inputs, raw client.map + gather (baseline)", f"{base:.3f} s", "1.00x"),
    ]
    for name in ("cancel -> body", "cancel -> ABORTED", "cancel -> ABORTED_BEFORE_DISPATCH"):
        rows.append(Row(f"{name} (median)", format_time(figures[name])))
    return rows


def _wait_for_task(client: Any, prefix: str) -> None:
    """Poll the scheduler (bounded) until a task whose key starts with `prefix` exists."""

    def present(dask_scheduler: Any) -> bool:
        return any(str(key).startswith(prefix) for key in dask_scheduler.tasks)

    pause = threading.Event()
    for _ in range(int(WAIT / 0.005)):
        if client.run_on_scheduler(present):
            return
        pause.wait(0.005)
    raise AssertionError(f"no task {prefix}* reached the scheduler")


if __name__ == "__main__":
    import sys

    from ._harness import format_table

    print(format_table("bench_distributed", run(quick="--quick" in sys.argv)))
