"""Timing, memory and table helpers shared by the `bench_*.py` modules.

* `median_per_op` times `fn(n)` (which performs n operations) and returns the median seconds per
  operation over the repeats; `interleaved` does that for several variants, rotating their order
  in every repeat, so that the drift of a busy, shared machine spreads over all of them.
* `bytes_per_object` is the tracemalloc-traced size of one object, averaged over many.
* `Row` and `format_table` print a fixed-column table; `verdict` says PASS or MISS.

Timed runs switch the cyclic GC off (as `timeit` does): a collection landing in one variant's run
would be charged to whichever variant happened to allocate the triggering object.
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

Workload = Callable[[int], object]  # performs n operations


@dataclass(frozen=True)
class Row:
    """One line of a benchmark table."""

    name: str
    figure: str  # the median, with its unit
    ratio: str = ""  # against the module's baseline, e.g. "0.88x"
    target: str = ""  # e.g. "<= 1.00x"
    verdict: str = ""  # "PASS", "MISS", or "" when there is no target

    def cells(self) -> tuple[str, str, str, str, str]:
        return (self.name, self.figure, self.ratio, self.target, self.verdict)


HEADER = Row("benchmark", "median", "ratio", "target", "result")


def timed_once(fn: Workload, n: int) -> float:
    """Seconds for one `fn(n)` call, with the cyclic GC off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        started = time.perf_counter()
        fn(n)
        return time.perf_counter() - started
    finally:
        if was_enabled:
            gc.enable()


def median_per_op(fn: Workload, n: int, repeats: int) -> float:
    """Median over `repeats` runs of seconds per operation of `fn(n)`."""
    return statistics.median(timed_once(fn, n) / n for _ in range(repeats))


def interleaved(variants: Mapping[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Median of each variant's figure; every repeat runs all variants in a rotated order."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for repeat in range(repeats):
        shift = repeat % len(order)
        for name in order[shift:] + order[:shift]:
            samples[name].append(variants[name]())
    return {name: statistics.median(values) for name, values in samples.items()}


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


def verdict(value: float, limit: float) -> str:
    """PASS if `value` is at most `limit`."""
    return "PASS" if value <= limit else "MISS"


def ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.2f}x"


def format_time(seconds: float) -> str:
    """A per-operation time in the unit that keeps it readable."""
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    return f"{seconds * 1e3:.2f} ms"


def format_table(title: str, rows: Sequence[Row]) -> str:
    """The rows under a header, in columns as wide as their widest cell."""
    lines = [HEADER.cells(), *(row.cells() for row in rows)]
    widths = [max(len(line[column]) for line in lines) for column in range(len(HEADER.cells()))]
    rendered = [title]
    for line in lines:
        cells = (cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        rendered.append("  " + "  ".join(cells).rstrip())
    return "\n".join(rendered)
