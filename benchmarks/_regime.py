"""Where the benchmark's threads run: the `same`, `cross` and `free` regimes.

A thread wake-up costs about 6 us when waker and woken share a CPU and 22-25 us across CPUs,
and which of the two a run gets depends on the other load on the machine: an unpinned ratio can
move 0.5-2x between runs. So the figures that carry targets are measured in two pinned regimes:

* **same**: every thread of the process on one CPU (`os.sched_setaffinity`). Threads inherit
  their creator's affinity, and the threads that already exist are pinned one by one (by their
  Linux thread id), so this is the whole process on one CPU. The loaded-machine case; stable.
* **cross**: callers on one CPU, workers on the other. A caller is the main thread and any
  thread marked with `caller()` (the submitting threads of a multi-threaded benchmark, the
  thread of an event loop run elsewhere); everything else is a worker: pool threads, the
  library's timer, helper and callback threads. Threads a benchmark starts inside
  `worker_side()` are born on the workers' CPU (the creating thread is pinned there for the
  while: pools started and warmed inside it start their threads there), and `settle()`, which
  `_harness.interleaved` calls before every round, moves every thread that is not a caller to
  the workers' CPU, so a thread the library starts later (from a caller's thread) is placed
  before the next round; `placement()` says which were.
* **free**: no pinning; the scheduler places every thread.

On a machine with one usable CPU, cross runs as same (with a note); where CPU affinity cannot
be set (not Linux), same and cross run as free (with a note). Leaving a regime (`active`)
gives every thread the CPUs the process had on entry back.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "NAMES",
    "Regime",
    "active",
    "caller",
    "current",
    "mark_caller",
    "placement",
    "plan",
    "settle",
    "task_ids",
    "worker_side",
]

NAMES = ("same", "cross", "free")
_TASKS = "/proc/self/task"


@dataclass(frozen=True)
class Regime:
    """A planned regime: which CPUs callers and workers get (empty sets: not pinned)."""

    name: str  # the regime that runs: same, cross or free
    requested: str  # the regime asked for (differs when it had to degrade)
    callers: frozenset[int] = frozenset()
    workers: frozenset[int] = frozenset()
    note: str = ""  # why it degraded, if it did

    @property
    def pinned(self) -> bool:
        return bool(self.callers)

    def describe(self) -> str:
        """One line: the regime and its CPUs."""
        if self.name == "same":
            text = f"same (every thread on CPU {_cpus(self.callers)})"
        elif self.name == "cross":
            callers, workers = _cpus(self.callers), _cpus(self.workers)
            text = f"cross (callers on CPU {callers}, workers on CPU {workers})"
        else:
            text = "free (no pinning)"
        return f"{text}; {self.note}" if self.note else text


FREE = Regime("free", "free")


def can_pin() -> bool:
    """Whether threads can be pinned one by one here (Linux: affinity and `/proc`)."""
    return hasattr(os, "sched_setaffinity") and os.path.isdir(_TASKS)


def plan(requested: str) -> Regime:
    """The regime `requested` becomes on this machine (it may degrade; `note` says why)."""
    if requested not in NAMES:
        raise ValueError(f"a regime is one of {', '.join(NAMES)}, got {requested!r}")
    if requested == "free":
        return FREE
    if not can_pin():
        return Regime("free", requested, note=f"{requested} needs Linux CPU affinity: ran free")
    allowed = sorted(os.sched_getaffinity(0))
    first = frozenset(allowed[:1])
    if requested == "same":
        return Regime("same", "same", first, first)
    if len(allowed) < 2:
        return Regime("same", "cross", first, first, "one CPU available: cross ran as same")
    return Regime("cross", "cross", first, frozenset(allowed[1:2]))


class _State:
    """The active regime and what it pinned. Guarded by `lock` where threads race."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards the name counters (callers mark concurrently)
        self.regime = FREE
        self.callers: set[int] = set()  # native ids of caller threads; set.add is atomic
        self.settled = False  # a settle() ran in this activation
        self.live_callers: collections.Counter[str] = collections.Counter()
        self.caller_names: collections.Counter[str] = collections.Counter()  # most at once
        self.worker_names: collections.Counter[str] = collections.Counter()  # most at once
        self.late: set[str] = set()  # started on a caller's CPU, moved by a later settle()
        self.earlier: set[int] = set()  # threads alive at entry (left by earlier benchmarks)


_state = _State()


def current() -> Regime:
    """The regime the running benchmark is in (free outside `active`)."""
    return _state.regime


@contextlib.contextmanager
def active(regime: Regime) -> Iterator[None]:
    """Run the block in `regime`; afterwards every thread may run on the CPUs it had before.

    Enter it from the thread that will be the main caller (it is marked as one). Not reentrant.
    """
    if _state.regime is not FREE or _state.callers:
        raise RuntimeError("a regime is already active")
    before = os.sched_getaffinity(0) if can_pin() else set()
    _state.regime = regime
    _state.callers = {threading.get_native_id()}
    _state.settled = False
    _state.live_callers.clear()
    _state.caller_names.clear()
    _state.worker_names.clear()
    _state.late.clear()
    _state.earlier = set(task_ids()) - _state.callers
    _state.caller_names[_pattern(threading.current_thread().name)] = 1
    try:
        if regime.pinned:
            os.sched_setaffinity(0, regime.callers)
            settle()
            _state.settled = False  # what was there before the benchmark started is not late
        yield
    finally:
        if regime.pinned:
            for tid in task_ids():
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.sched_setaffinity(tid, before)
        _state.regime = FREE
        _state.callers = set()


@contextlib.contextmanager
def worker_side() -> Iterator[None]:
    """In cross, this thread runs on the workers' CPU for the block: threads started in it
    (pool workers started by warm-up calls) are born there. In a pinned regime the threads
    started in it are named by `placement()`."""
    regime = _state.regime
    if not regime.pinned:
        yield
        return
    before = set(task_ids())
    previous = os.sched_getaffinity(0)
    if regime.name == "cross":
        os.sched_setaffinity(0, regime.workers)
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)  # nested blocks restore their own
        _count_workers(set(task_ids()) - before)  # named even if they end before a settle()


def mark_caller() -> None:
    """Mark the calling thread as a caller (until the regime ends); pin it to the callers' CPU."""
    regime = _state.regime
    _state.callers.add(threading.get_native_id())
    name = _pattern(threading.current_thread().name)
    with _state.lock:
        _state.live_callers[name] += 1
        _state.caller_names[name] = max(_state.caller_names[name], _state.live_callers[name])
    if regime.pinned:
        os.sched_setaffinity(0, regime.callers)


@contextlib.contextmanager
def caller() -> Iterator[None]:
    """Mark the calling thread as a caller for the block (a benchmark's submitting thread)."""
    mark_caller()
    try:
        yield
    finally:
        _state.callers.discard(threading.get_native_id())
        with _state.lock:
            _state.live_callers[_pattern(threading.current_thread().name)] -= 1


def settle() -> None:
    """Pin every thread where the regime wants it: callers to theirs, the rest to the workers'.

    Cheap (a few syscalls per thread); call it outside timed code. Does nothing when free.
    """
    regime = _state.regime
    if not regime.pinned:
        return
    names = _thread_names()
    for tid in task_ids():
        is_caller = tid in _state.callers
        want = regime.callers if is_caller else regime.workers
        try:
            if os.sched_getaffinity(tid) != want:
                os.sched_setaffinity(tid, want)
                if _state.settled and not is_caller and regime.callers != regime.workers:
                    _state.late.add(_pattern(names.get(tid) or _comm(tid)))
        except ProcessLookupError:  # the thread ended meanwhile
            continue
    _count_workers(set(task_ids()) - _state.earlier, names)
    _state.settled = True


def _count_workers(tids: set[int], names: dict[int, str] | None = None) -> None:
    """Name the worker threads among `tids` for `placement()` (the most of a name at once).

    Only threads Python knows are named: one that has just ended may linger in /proc for a
    moment (it is pinned all the same).
    """
    names = _thread_names() if names is None else names
    workers = collections.Counter(
        _pattern(names[tid]) for tid in tids if tid in names and tid not in _state.callers
    )
    with _state.lock:
        for name, count in workers.items():
            _state.worker_names[name] = max(_state.worker_names[name], count)


def placement() -> str:
    """What the active regime pinned so far, for the output (call it before leaving it)."""
    regime = _state.regime
    if not regime.pinned:
        return regime.describe()
    with _state.lock:
        callers = _names(_state.caller_names)
        workers = _names(_state.worker_names)
        late = ", ".join(sorted(_state.late))
        earlier = len(set(task_ids()) & _state.earlier)
    if regime.name == "same":
        cpu = _cpus(regime.callers)
        text = f"same: every thread on CPU {cpu} (callers: {callers}; others: {workers})"
    else:
        text = (
            f"cross: callers on CPU {_cpus(regime.callers)} ({callers}); "
            f"workers on CPU {_cpus(regime.workers)} ({workers})"
        )
    if earlier:
        text += f"; {earlier} idle threads left by earlier benchmarks pinned as workers"
    if late:
        text += f"; started on the callers' CPU and moved before the next round: {late}"
    if regime.note:
        text += f"; {regime.note}"
    return text


def task_ids() -> list[int]:
    """The Linux thread ids of this process's threads (empty where there is no `/proc`)."""
    try:
        return [int(name) for name in os.listdir(_TASKS)]
    except FileNotFoundError:
        return []


def _thread_names() -> dict[int, str]:
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def _comm(tid: int) -> str:
    try:
        with open(f"{_TASKS}/{tid}/comm", encoding="utf-8", errors="replace") as stream:
            return stream.read().strip() or "?"
    except OSError:
        return "?"


_NUMBERS = re.compile(r"\d+")


def _pattern(name: str) -> str:
    """A thread's name with its serial numbers folded: `toolreg-pool-3-7` -> `toolreg-pool-N-N`."""
    return _NUMBERS.sub("N", name)


def _names(counts: collections.Counter[str]) -> str:
    shown = [f"{count} x {name}" if count > 1 else name for name, count in sorted(counts.items())]
    return ", ".join(shown) if shown else "none"


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))
