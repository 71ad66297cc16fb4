"""Remote tool bodies on Dask: the backend against what a user would write with Dask alone.

One processes `LocalCluster` (two worker processes of four threads each), started here with its
worker processes free to run on every CPU (only this process's threads follow the regime).
The tool body sleeps 5 ms; the same function, as a plain Dask function, serves the baselines.
Two shapes, each against the Dask code a user would otherwise write:

* a batch: `registry.execute_batch` of 400 calls (`max_parallel=32`, on a registry of 32
  workers) against `client.map` of the body over the same 400 inputs, then `gather` (the
  baseline; target <= 1.10x);
* many callers: 32 threads sharing 400 calls of `registry.execute` against 32 threads sharing
  400 calls of `client.submit(fn, n, pure=False).result()` (the baseline; target <= 1.05x).

Both sides of each ratio run in the same rounds (`_harness.interleaved`: medians of per-round
ratios). Then the cancel latencies, with every worker thread idle:

* cancel -> body: from `CancelSource.cancel()` on the caller to the remote body's token
  waking (`time.monotonic` is one clock for all processes of this machine); median.
* cancel -> ABORTED: from `cancel()` to `execute` returning `ABORTED` for that body; median.
* cancel -> ABORTED_BEFORE_DISPATCH: a call queued behind bodies holding every worker thread;
  from `cancel()` to `execute` returning; median.

The figures depend on the machine's load (the client batches its messages every 10 ms, and
the scheduler shares the machine's cores with the workers and everything else): read them as
ratios measured in the same run.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._harness import Row, Target, format_time, interleaved, judged

WORKERS = 2  # worker processes
THREADS = 4  # threads per worker process
CALLERS = 32
MAX_PARALLEL = 32
BATCH_TARGET = Target(1.10)  # execute_batch / client.map + gather
CALLERS_TARGET = Target(1.05)  # execute from 32 threads / client.submit().result() from 32
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


@contextlib.contextmanager
def every_cpu() -> Iterator[None]:
    """This thread may run on every CPU for the block, so the processes and threads it starts
    (a cluster's loop thread, its worker processes) are not pinned by the regime."""
    if not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def start_cluster(workers: int, threads: int) -> tuple[Any, Any]:
    """A processes `LocalCluster` and its client, the workers free to run on every CPU."""
    from distributed import Client, LocalCluster

    with every_cpu():
        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=threads,
            processes=True,
            dashboard_address=":0",
        )
    return cluster, Client(cluster)


def measure(quick: bool) -> dict[str, float]:
    """Median seconds of each variant, the paired ratios, and the three cancel latencies."""
    from toolreg import ToolCall, ToolRegistry
    from toolreg.distributed import DaskBackend

    calls = 100 if quick else 400
    repeats = 1 if quick else 7
    samples = 5 if quick else 25
    cluster, client = start_cluster(WORKERS, THREADS)
    backend = DaskBackend(client)
    registry = ToolRegistry(max_workers=MAX_PARALLEL)
    for body in (work, wait_for_cancel, hold, mark):
        registry.tool(name=body.__name__, concurrency_safe=True)(backend.remote(body))
    callers = ThreadPoolExecutor(CALLERS)
    batch = [ToolCall("work", {"n": n}) for n in range(calls)]

    def timed(fn: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            fn()
            return time.perf_counter() - started

        return run

    def through_batch() -> None:
        results = registry.execute_batch(batch, max_parallel=MAX_PARALLEL)
        assert all(result.ok for result in results), [r for r in results if not r.ok][:1]

    def raw_map() -> None:
        futures = client.map(work_raw, range(calls), pure=False)
        assert client.gather(futures) == list(range(calls))

    def through_execute() -> None:
        results = list(callers.map(lambda n: registry.execute("work", {"n": n}), range(calls)))
        assert all(result.ok for result in results), [r for r in results if not r.ok][:1]

    def raw_submit() -> None:
        def one(n: int) -> int:
            value: int = client.submit(work_raw, n, pure=False).result()
            return value

        assert list(callers.map(one, range(calls))) == list(range(calls))

    variants = {
        "client.map": timed(raw_map),
        "batch": timed(through_batch),
        "client.submit x32": timed(raw_submit),
        "execute x32": timed(through_execute),
    }
    try:
        for variant in variants.values():  # warm up: caller threads, imports, the board
            variant()
        rounds = interleaved(variants, repeats)
        figures = dict(rounds)
        figures["batch ratio"] = rounds.ratio("batch", "client.map")
        figures["callers ratio"] = rounds.ratio("execute x32", "client.submit x32")
        running = [_cancel_running(registry, client) for _ in range(samples)]
        figures["cancel -> body"] = statistics.median(body for body, _ in running)
        figures["cancel -> ABORTED"] = statistics.median(done for _, done in running)
        figures["cancel -> ABORTED_BEFORE_DISPATCH"] = statistics.median(
            _cancel_queued(registry, client) for _ in range(samples)
        )
        figures["calls"] = calls
        return figures
    finally:
        callers.shutdown(wait=True)
        registry.close()
        backend.close()
        client.close()
        cluster.close()


def _cancel_running(registry: Any, client: Any) -> tuple[float, float]:
    """(cancel -> the body saw it, cancel -> execute returned ABORTED), in seconds."""
    from distributed import Event

    from toolreg import CancelSource

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


def _cancel_queued(registry: Any, client: Any) -> float:
    """Seconds from cancelling a call queued behind busy worker threads to `execute` returning."""
    from distributed import Event

    from toolreg import CancelSource

    started = [f"bench-hold-{n}-{time.monotonic_ns()}" for n in range(WORKERS * THREADS)]
    release = f"bench-release-{time.monotonic_ns()}"
    holders = [
        threading.Thread(
            target=registry.execute, args=("hold", {"started": name, "release": release})
        )
        for name in started
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
    _wait_for_task(client, "toolreg-mark-")  # queued behind the held threads
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


def run(quick: bool) -> list[Row]:
    """Measure and return the table's rows (needs the `dask` extra)."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        return [Row("distributed is not installed (extra toolreg[dask]): skipped", "-")]
    figures = measure(quick)
    calls = int(figures["calls"])
    cluster = f"{WORKERS} worker processes x {THREADS} threads"

    def seconds(key: str) -> str:
        return f"{figures[key]:.3f} s"

    rows = [
        Row(f"{calls} inputs: client.map + gather, {cluster} (baseline)", seconds("client.map")),
        judged(
            f"execute_batch of {calls}, max_parallel={MAX_PARALLEL}",
            seconds("batch"),
            figures["batch ratio"],
            BATCH_TARGET,
        ),
        Row(
            f"{CALLERS} threads, {calls} calls: client.submit(...).result() (baseline)",
            seconds("client.submit x32"),
        ),
        judged(
            f"{CALLERS} threads, {calls} calls: execute",
            seconds("execute x32"),
            figures["callers ratio"],
            CALLERS_TARGET,
        ),
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

    from .__main__ import main

    sys.exit(main(["--only", "distributed", *sys.argv[1:]]))
