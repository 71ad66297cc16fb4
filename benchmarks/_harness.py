"""Timing, warm-up, counting and table helpers shared by the `bench_*.py` modules.

* `interleaved` runs several variants in rounds, every round in a rotated order with the cyclic
  GC off, and returns their per-round samples (`Rounds`): indexing gives a variant's median,
  `Rounds.ratio(a, b)` the median of the per-round ratios `a / b` (paired: both sides of a ratio
  ran in the same round, so the drift of a busy, shared machine cancels), and
  `Rounds.difference(a, b)` the median of the per-round differences. Before every round it
  calls `_regime.settle()`, which places threads started since the last round.
* `timed_once` times one `fn(n)` with the cyclic GC off (as `timeit` does: a collection landing
  in one variant's run would be charged to whichever variant allocated the triggering object).
* `start_executor_workers` and `start_registry_workers` start every worker of a pool (each
  worker holds one task at a `Barrier`, so none can be reused): call them inside
  `_regime.worker_side()`, so that in the cross regime the workers are born on their CPU.
* `voluntary_switches` counts how often the process's threads have gone to sleep: each sleep
  ends in one wake-up, so its growth over N calls is the wake-ups those calls cost.
* `Target` is a figure's target in each regime (same; cross and free in brackets);
  `judged` makes the row that carries it. `Row` and `format_table` print a fixed-column table.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from . import _regime

Workload = Callable[[int], object]  # performs n operations

WARM_UP_WAIT = 60.0  # seconds a warm-up task waits for the others at its barrier (loaded machine)
WARM_UP_TOOL = "bench_warm_up"


@dataclass(frozen=True)
class Row:
    """One line of a benchmark table."""

    name: str
    figure: str  # the median, with its unit
    ratio: str = ""  # against the module's baseline, e.g. "0.88x" (or "+3.10 us")
    target: str = ""  # e.g. "<= 1.00x"
    verdict: str = ""  # "PASS", "MISS", or "" when there is no target
    # What the ratio is against, for the performance page: None means the last row named
    # "... (baseline)" before this one; "" means nothing (an absolute figure).
    baseline: str | None = None

    def cells(self) -> tuple[str, str, str, str, str]:
        return (self.name, self.figure, self.ratio, self.target, self.verdict)


HEADER = Row("benchmark", "median", "vs base", "target", "result")


# -- timing --------------------------------------------------------------------------------------


@contextlib.contextmanager
def gc_off() -> Iterator[None]:
    """The cyclic GC off for the block (restored as it was)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def timed_once(fn: Workload, n: int) -> float:
    """Seconds for one `fn(n)` call, with the cyclic GC off."""
    with gc_off():
        started = time.perf_counter()
        fn(n)
        return time.perf_counter() - started


def median_per_op(fn: Workload, n: int, repeats: int) -> float:
    """Median over `repeats` runs of seconds per operation of `fn(n)`."""
    return statistics.median(timed_once(fn, n) / n for _ in range(repeats))


class Rounds(Mapping[str, float]):
    """Each variant's per-round samples; `rounds[name]` is the median of its samples."""

    def __init__(self, samples: dict[str, list[float]]) -> None:
        self.samples = samples

    def __getitem__(self, name: str) -> float:
        return statistics.median(self.samples[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def ratio(self, name: str, base: str) -> float:
        """The median of the per-round ratios `name / base` (not the ratio of the medians)."""
        pairs = zip(self.samples[name], self.samples[base], strict=True)
        return statistics.median(value / baseline for value, baseline in pairs)

    def difference(self, name: str, base: str) -> float:
        """The median of the per-round differences `name - base`."""
        pairs = zip(self.samples[name], self.samples[base], strict=True)
        return statistics.median(value - baseline for value, baseline in pairs)


def interleaved(variants: Mapping[str, Callable[[], float]], repeats: int) -> Rounds:
    """Run every variant once per round, `repeats` rounds, each in a rotated order.

    Before each round: `_regime.settle()` and a full collection (both untimed); during the
    round the cyclic GC is off.
    """
    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for repeat in range(repeats):
        _regime.settle()
        gc.collect()
        shift = repeat % len(order)
        with gc_off():
            for name in order[shift:] + order[:shift]:
                samples[name].append(variants[name]())
    return Rounds(samples)


def bytes_per_object(make: Callable[[], object], count: int) -> float:
    """Traced bytes per object made by `make()`, averaged over `count` live objects."""
    holder: list[object] = [None] * count  # allocated before tracing: not counted
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for index in range(count):
            holder[index] = make()
        return (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()


# -- starting workers ------------------------------------------------------------------------


def start_executor_workers(executor: Executor, count: int) -> None:
    """Start `count` workers of `executor`: `count` tasks that wait for each other.

    Raises `threading.BrokenBarrierError` if the executor cannot run `count` tasks at once.
    """
    barrier = threading.Barrier(count)
    futures = [executor.submit(barrier.wait, WARM_UP_WAIT) for _ in range(count)]
    for future in futures:
        future.result(WARM_UP_WAIT + 5)


def warm_pool(workers: int, **options: Any) -> ThreadPoolExecutor:
    """A `ThreadPoolExecutor(workers)` with one warm worker: the pool a user gets who does not
    start workers up front. It starts another worker only when a task finds none idle, so a
    sequential caller keeps one (in the same regime); concurrent callers grow it as they need.
    Call it inside `_regime.worker_side()`; `pool_workers` says how many it has started."""
    pool = ThreadPoolExecutor(workers, **options)
    pool.submit(int).result()
    return pool


def pool_workers(pool: ThreadPoolExecutor) -> int:
    """How many workers `pool` has started so far (the stdlib keeps them in `_threads`)."""
    return len(pool._threads)


def start_registry_workers(registry: Any, count: int) -> None:
    """Start `count` workers of a `ToolRegistry`'s pool: `count` concurrent calls that wait for
    each other, made from `count` threads (which start the workers, so call it inside
    `_regime.worker_side()`). The warm-up tool is removed again afterwards."""
    from toolreg import Tool

    barrier = threading.Barrier(count)
    outcomes: list[object] = []

    def body(args: Any, ctx: Any) -> int:
        return barrier.wait(WARM_UP_WAIT)

    def call() -> None:
        outcomes.append(registry.execute(WARM_UP_TOOL))

    registration = registry.register(Tool(WARM_UP_TOOL, body))
    try:
        threads = [threading.Thread(target=call, name="bench-warm-up") for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WARM_UP_WAIT + 5)
    finally:
        registration.remove()
    failed = [result for result in outcomes if not getattr(result, "ok", False)]
    if len(outcomes) != count or failed:
        raise RuntimeError(f"could not start {count} workers of the registry: {failed[:1]}")


# -- counting wake-ups ---------------------------------------------------------------------------


def voluntary_switches() -> dict[int, int]:
    """Each thread's count of voluntary context switches (times it went to sleep), by thread id.

    Empty where there is no `/proc` (not Linux).
    """
    counts: dict[int, int] = {}
    for tid in _regime.task_ids():
        try:
            with open(f"/proc/self/task/{tid}/status", encoding="ascii") as stream:
                for line in stream:
                    if line.startswith("voluntary_ctxt_switches:"):
                        counts[tid] = int(line.split(":", 1)[1])
                        break
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return counts


def switches_since(before: Mapping[int, int]) -> int:
    """Voluntary context switches of all threads since `before` (threads that ended since are
    not counted: keep thread starts and exits out of the measured window)."""
    after = voluntary_switches()
    return sum(count - before.get(tid, 0) for tid, count in after.items())


# -- targets and rows ----------------------------------------------------------------------------

_FORMATS: dict[str, Callable[[float], str]] = {
    "x": lambda value: f"{value:.2f}x",
    "+us": lambda value: f"{value * 1e6:+.2f} us",
    "ms": lambda value: f"{value * 1e3:.1f} ms",
    "/call": lambda value: f"{value:.2f}/call",
    "+/call": lambda value: f"{value:+.2f}/call",
    "/1000": lambda value: f"{value:.2f} per 1,000",
}


@dataclass(frozen=True)
class Target:
    """A figure's upper limit in the same regime and (if it differs) in cross.

    The free regime is held to the cross limit (an unpinned run places threads as it may).
    `unit` says how values print: `x` (a ratio), `+us` (seconds added, shown in us), `ms`
    (seconds, shown in ms), `/call`, `+/call` (added) or `/1000` (counts).
    """

    same: float
    cross: float | None = None
    unit: str = "x"

    def limit(self, regime: str) -> float:
        return self.same if regime == "same" or self.cross is None else self.cross

    def show(self, value: float) -> str:
        return _FORMATS[self.unit](value)

    def text(self, regime: str) -> str:
        return f"<= {self.show(self.limit(regime))}"

    def verdict(self, value: float, regime: str) -> str:
        return "PASS" if value <= self.limit(regime) else "MISS"


def judged(
    name: str, figure: str, value: float, target: Target, baseline: str | None = None
) -> Row:
    """The row of a figure with a target, judged in the current regime.

    `value` is what the target limits (a ratio, seconds, a count); it is shown in the ratio
    column in the target's unit, unless the figure shows it already. `baseline`: see `Row`.
    """
    regime = _regime.current().name
    shown = target.show(value)
    return Row(
        name,
        figure,
        "" if shown == figure else shown,
        target.text(regime),
        target.verdict(value, regime),
        baseline,
    )


def verdict(value: float, limit: float) -> str:
    """PASS if `value` is at most `limit`."""
    return "PASS" if value <= limit else "MISS"


def ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.2f}x"


def format_time(seconds: float) -> str:
    """A per-operation time in the unit that keeps it readable."""
    if abs(seconds) < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    return f"{seconds * 1e3:.2f} ms"


def format_table(title: str, rows: Sequence[Row]) -> str:
    """The rows under a header, in columns as wide as their widest cell."""
    lines = [HEADER.cells(), *(row.cells() for row in rows)]
    return "\n".join([title, *_columns(lines)])


def _columns(lines: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(line[column]) for line in lines) for column in range(len(lines[0]))]
    rendered = []
    for line in lines:
        cells = (cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        rendered.append("  " + "  ".join(cells).rstrip())
    return rendered


def format_grid(title: str, header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    """Like `format_table`, with a header of one's own."""
    return "\n".join([title, *_columns([header, *lines])])


class LockHop:
    """A bare hand-off: one worker thread, one lock to wake it, one to wake the caller: the
    floor under any pool's hop (bench_wakeups counts its wake-ups, bench_registry times it).

    Not thread-safe: one caller at a time. `close()` stops the worker.
    """

    def __init__(self) -> None:
        self._go = threading.Lock()  # held while the worker sleeps; released to hand it work
        self._go.acquire()
        self._done = threading.Lock()  # held while the caller waits; released by the worker
        self._done.acquire()
        self._stop = False
        self._result: object = None
        self._thread = threading.Thread(target=self._serve, name="bench-lock-hop", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            self._go.acquire()
            if self._stop:
                return
            self._result = 1  # what a trivial `fn` returns
            self._done.release()

    def __call__(self) -> object:
        self._go.release()
        self._done.acquire()
        return self._result

    def close(self) -> None:
        self._stop = True
        self._go.release()
        self._thread.join()
