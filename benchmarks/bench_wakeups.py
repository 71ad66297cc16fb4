"""Thread wake-ups: per call through `execute` against the bare hops, and of the deadline timer.

Wake-ups are counted, not timed: the growth of the voluntary context switches of every thread
of the process (`/proc/self/task/*/status`; each time a thread goes to sleep, one wake-up ends
it) over N calls, divided by N. So these figures hold on a loaded machine too; they do depend on
placement (a woken thread that finds the GIL held goes back to sleep once more), hence both
regimes. Threads that start or end inside the window would skew the count: every pool has all
its workers started before counting.

* per call: a bare hand-off (the baseline): one worker thread sleeping on a lock of its own,
  the caller on another; the caller releases the worker's and takes its own, the worker runs
  `fn` and releases the caller's. Across CPUs that is exactly the two wake-ups a hop needs
  (the caller wakes the worker, the worker wakes the caller). On one CPU a woken thread may
  preempt its waker, find the GIL still held and sleep once more, so there the hand-off counts
  about 3-4 and is no strict floor. Against it: the bare hop
  `ThreadPoolExecutor(8).submit(fn).result()`, toolreg's own pool used the same way
  (`WorkerPool(8).submit(fn).result()`: a `Future` on top of the hand-off), and the registry
  path: `execute` with no hooks and with six hooks incl. TimeoutPolicy (as in
  `bench_registry`). Target (issue 18): `execute` wakes no thread beyond what the bare
  hand-off needs, in the same run and placement: at most 0.10 more per call (the margin covers
  the process's own background wake-ups). Figures are medians over rounds, the differences
  medians of per-round differences.
* the shared timer: wake-ups of the `toolreg-timer` thread while N eager deadlines (a listener
  makes a deadline eager: `deadline(None, 3600)` plus `token.on_cancel(...)`) are scheduled
  behind an earlier one and closed again. Target: at most 1 per 1,000 deadlines. For contrast
  (and as a check that the count sees wake-ups at all), a few deadlines each earlier than the
  last, which must each wake it (at least 1,000 per 1,000; more where the woken timer thread
  then waits for the GIL).

Where there is no `/proc` (not Linux), the module reports that it counted nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from toolreg import CancelSource, WorkerPool, deadline

from . import _regime
from ._harness import (
    LockHop,
    Row,
    Target,
    interleaved,
    judged,
    start_executor_workers,
    start_registry_workers,
    switches_since,
    voluntary_switches,
)
from .bench_registry import plain_registry, six_hook_registry

WORKERS = 8
HOP_TARGET = Target(0.10, unit="+/call")  # wake-ups per call beyond the bare hand-off's
TIMER_TARGET = Target(1.00, unit="/1000")
ANCHOR = 1800.0  # seconds: the earlier deadline the others are scheduled behind
LATER = 3600.0  # seconds: every deadline scheduled behind the anchor
STEP = 5.0  # seconds each deadline of the check comes due before the one scheduled before it
QUIET = 0.02  # seconds a thread's count must stay unchanged to read as asleep
QUIET_LIMIT = 5.0  # seconds to wait for that at most


@dataclass(frozen=True)
class Sizes:
    calls: int  # calls per counted run
    repeats: int
    deadlines: int  # eager deadlines behind the earliest
    earlier: int  # deadlines each earlier than the last (each waited out: keep it small)


QUICK = Sizes(calls=1_000, repeats=5, deadlines=2_000, earlier=20)
FULL = Sizes(calls=2_000, repeats=9, deadlines=10_000, earlier=20)


def _one() -> int:
    return 1


def _noop() -> None:
    pass


def wakes_per_call(call: Callable[[], object], calls: int) -> float:
    """Wake-ups of all the process's threads per `call()`, over `calls` calls."""
    before = voluntary_switches()
    for _ in range(calls):
        call()
    return switches_since(before) / calls


# -- per call ------------------------------------------------------------------------------------


def _per_call_rows(sizes: Sizes) -> list[Row]:
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
    caller = CancelSource()
    try:
        for _ in range(100):  # warm the caches
            plain.execute("one", token=caller.token)
            six.execute("one", token=caller.token)
        n = sizes.calls
        token = caller.token
        m = interleaved(
            {
                "bare": partial(wakes_per_call, bare, n),
                "raw": partial(wakes_per_call, lambda: raw_pool.submit(_one).result(), n),
                "lean": partial(wakes_per_call, lambda: lean_pool.submit(_one).result(), n),
                "plain": partial(wakes_per_call, lambda: plain.execute("one", token=token), n),
                "six": partial(wakes_per_call, lambda: six.execute("one", token=token), n),
            },
            sizes.repeats,
        )
    finally:
        plain.close()
        six.close()
        raw_pool.shutdown()
        lean_pool.shutdown()
        bare.close()

    def figure(name: str) -> str:
        return f"{m[name]:.2f} wake-ups/call"

    def beyond(name: str) -> str:
        return HOP_TARGET.show(m.difference(name, "bare"))

    return [
        Row("wake-ups: bare hand-off, one worker, a lock each (baseline)", figure("bare")),
        Row("wake-ups: ThreadPoolExecutor(8).submit(fn).result()", figure("raw"), beyond("raw")),
        Row("wake-ups: WorkerPool(8).submit(fn).result()", figure("lean"), beyond("lean")),
        judged(
            "wake-ups: execute, no hooks",
            figure("plain"),
            m.difference("plain", "bare"),
            HOP_TARGET,
        ),
        judged(
            "wake-ups: execute, six hooks incl. TimeoutPolicy",
            figure("six"),
            m.difference("six", "bare"),
            HOP_TARGET,
        ),
    ]


# -- the timer -----------------------------------------------------------------------------------


def _status(tid: int) -> tuple[str, int]:
    """A thread's state letter (`S`: asleep) and its voluntary context switches."""
    state, switches = "?", -1
    with open(f"/proc/self/task/{tid}/status", encoding="ascii") as stream:
        for line in stream:
            if line.startswith("State:"):
                state = line.split()[1]
            elif line.startswith("voluntary_ctxt_switches:"):
                switches = int(line.split(":", 1)[1])
    return state, switches


def _asleep(tid: int) -> int:
    """Wait (bounded) until thread `tid` sleeps and stays asleep for `QUIET`; its switches.

    The timer thread offers no handshake, so this polls: a benchmark may, a test must not.
    """
    give_up = time.monotonic() + QUIET_LIMIT
    state, last = _status(tid)
    while True:
        time.sleep(QUIET)
        state, now = _status(tid)
        if (state == "S" and now == last) or time.monotonic() > give_up:
            return now
        last = now


_lowest_due = float("inf")  # the earliest due time (monotonic) any check here has scheduled


def _timer_tid() -> int:
    for thread in threading.enumerate():
        if thread.name == "toolreg-timer" and thread.native_id is not None:
            return thread.native_id
    raise RuntimeError("no toolreg-timer thread after scheduling an eager deadline")


def timer_wakes(count: int, earlier: bool) -> float:
    """Wake-ups of the timer thread per 1,000 eager deadlines, scheduled then closed.

    `earlier=False`: each at `LATER` seconds, behind an anchor at `ANCHOR` (not earlier than
    the current earliest). `earlier=True`: each earlier than the last, and each waited out.
    """
    global _lowest_due
    with _regime.worker_side():  # the timer (and its callback threads) may start here
        anchor = deadline(None, ANCHOR)
        anchor.token.on_cancel(_noop)  # eager: armed on the timer
    tid = _timer_tid()
    _regime.settle()
    sources: list[CancelSource] = []
    try:
        before = _asleep(tid)
        for _ in range(count):
            if earlier:  # before anything scheduled so far, however long the waits took
                now = time.monotonic()
                _lowest_due = min(_lowest_due, now + ANCHOR) - STEP
                seconds = _lowest_due - now
            else:
                seconds = LATER
            source = deadline(None, seconds)
            source.token.on_cancel(_noop)
            sources.append(source)
            if earlier:
                _asleep(tid)  # one wake-up each: let the timer go back to sleep first
        for source in sources:
            source.close()
        after = _asleep(tid)
    finally:
        for source in sources:
            source.close()
        anchor.close()
    return (after - before) * 1000 / count


def _timer_rows(sizes: Sizes) -> list[Row]:
    behind = timer_wakes(sizes.deadlines, earlier=False)
    earlier = timer_wakes(sizes.earlier, earlier=True)
    return [
        judged(
            f"timer: {sizes.deadlines:,} eager deadlines behind an earlier one",
            f"{behind:.2f} wake-ups per 1,000",
            behind,
            TIMER_TARGET,
            "",  # a count: against nothing
        ),
        Row(
            f"timer: {sizes.earlier} deadlines, each earlier than the last (a check)",
            f"{earlier:,.0f} wake-ups per 1,000",
            "",
            ">= 1,000",
        ),
    ]


def run(quick: bool) -> list[Row]:
    """Count and return the table's rows."""
    if not voluntary_switches():
        return [Row("wake-ups: not counted (no /proc/self/task here)", "-")]
    sizes = QUICK if quick else FULL
    return _per_call_rows(sizes) + _timer_rows(sizes)


if __name__ == "__main__":
    import sys

    from .__main__ import main

    sys.exit(main(["--only", "wakeups", *sys.argv[1:]]))
