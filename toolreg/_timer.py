"""The process-wide timer behind every deadline: one daemon thread and a heap.

No thread or `threading.Timer` per token: a deadline is a heap entry holding its token weakly
(a source dropped without `close()` can be collected; its entry is then skipped), and strongly
(`keep`) once a callback is registered on it: a callback registered on a deadline runs when it
comes due, whether or not anyone still holds the source. Disarmed
entries are dropped lazily and the heap is compacted in place once they make up half of it. The
thread is started on first use, survives anything `fire` does, caps each wait (a deadline
centuries away must not overflow `Condition.wait`), and is replaced in a forked child.

`fire` must be quick and must not run user code: `_cancel` marks the token cancelled there and
hands its callbacks to other threads, so one slow callback never delays another deadline.

Time is injectable: `Timer(fire, clock=ManualClock())` runs no thread at all, and
`clock.advance(seconds)` fires every deadline due by then, in due order, in the calling thread.
Tests use it to fire deadlines exactly when they mean to.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from _weakref import ref as _weak_ref  # `weakref.ref`, without loading `weakref`
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ._interrupts import MAX_WAIT
from ._jobs import after_fork_in_child
from ._logger import logger

if TYPE_CHECKING:
    import weakref

    from typing_extensions import Self

__all__ = ["ManualClock", "Timer", "TimerEntry"]


_next_key = itertools.count().__next__  # tie-breaker for equal due times; atomic under the GIL


@functools.cache
def _heapq() -> ModuleType:
    # Loaded with the first deadline armed, not by `import toolreg` (an extension module).
    import heapq

    return heapq


class TimerEntry(_weak_ref):  # type: ignore[type-arg]
    """A scheduled deadline; holds its token weakly so a dropped source can be collected.

    `keep` holds it strongly while callbacks wait for it to fire (set under the token's lock).
    """

    __slots__ = ("dead", "due", "keep", "reason", "timer")
    dead: bool  # never re-armed; written without a lock, read by the timer thread
    keep: Any  # the token, once it has a listener; None once fired or disarmed
    due: float  # when it is due, on the timer's clock
    reason: Any  # a TimeoutReason
    timer: Timer

    def __new__(cls, token: Any, reason: Any, timer: Timer, due: float) -> Self:
        self = _weak_ref.__new__(cls, token, TimerEntry._died)
        self.reason = reason
        self.timer = timer
        self.due = due
        self.dead = False
        self.keep = None
        return self

    def __init__(self, token: Any, reason: Any, timer: Timer, due: float) -> None:
        # weakref.ref.__init__ takes (object, callback) only; __new__ did the real work.
        super().__init__(token, TimerEntry._died)  # type: ignore[call-arg]

    def disarm(self) -> None:
        self.keep = None
        if not self.dead:
            self.dead = True
            self.timer.dead_count += 1

    @staticmethod
    def _died(entry: weakref.ref[Any]) -> None:
        # A finalizer: no lock (see module docstring). The count only paces heap compaction.
        assert isinstance(entry, TimerEntry)
        entry.disarm()


class ManualClock:
    """A clock that moves only when told: the seam for deterministic tests of deadlines.

    A `Timer` built on it starts no thread. `advance(seconds)` moves the time forward, then
    fires every deadline due by then, in due order, in the calling thread; it returns once they
    were fired (their tokens read as cancelled; their callbacks are handed over as usual).
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[Timer] = []

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the time forward by `seconds` and fire what came due."""
        if not seconds >= 0:
            raise ValueError(f"a clock only moves forward, got {seconds!r}")
        self._now += seconds
        for timer in self._timers:
            timer.fire_due()

    def attach(self, timer: Timer) -> None:
        self._timers.append(timer)


class Timer:
    """A heap of deadlines served by one daemon thread (or by a `ManualClock`'s `advance`).

    `fire(token, reason)` cancels a due token as its own timer. `on_start()`, if given, runs in
    the thread that starts the timer thread, just before (it starts the threads that run the
    callbacks, so the timer thread never has to).
    """

    def __init__(
        self,
        fire: Callable[[Any, Any], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self._fire = fire
        self._clock = clock
        self._on_start = on_start
        self._manual = isinstance(clock, ManualClock)
        self._reset()
        if isinstance(clock, ManualClock):
            clock.attach(self)
        else:
            after_fork_in_child(self._after_fork)

    def _reset(self) -> None:
        # Guards _heap and _thread. No GC-sensitive work is done while holding it beyond heap
        # pushes; finalizers never take it.
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, TimerEntry]] = []
        self._thread: threading.Thread | None = None
        self.dead_count = 0  # approximate number of disarmed entries still in the heap

    def _after_fork(self) -> None:
        # The thread did not survive fork(); keep the deadlines and serve them with a new one.
        heap = self._heap
        self._reset()
        self._heap = heap
        if heap:
            self._start()

    def schedule(self, token: Any, due: float, reason: Any) -> TimerEntry:
        """Fire `token` at `due` (on this timer's clock); its entry, which `disarm()` cancels."""
        entry = TimerEntry(token, reason, self, due)
        item = (due, _next_key(), entry)
        heapq = _heapq()  # before the lock: the first call imports
        with self._cond:
            heap = self._heap
            if self.dead_count > 64 and self.dead_count * 2 > len(heap):
                _drop_dead(heap)  # in place: nothing allocated while the lock is held
                self.dead_count = 0
            heapq.heappush(heap, item)
            if heap[0] is item:
                self._cond.notify()
            start = self._thread is None and not self._manual
            if start:
                self._thread = threading.current_thread()  # claimed: only one thread starts it
        if start:
            self._start()
        return entry

    def _start(self) -> None:
        if self._on_start is not None:
            self._on_start()
        thread = threading.Thread(target=self._serve, name="toolreg-timer", daemon=True)
        with self._cond:
            self._thread = thread
        thread.start()

    def fire_due(self) -> None:
        """Fire every entry due by now, in due order, in this thread (the manual clock's way)."""
        while True:
            with self._cond:
                entry = self._pop_due()
            if entry is None:
                return
            self._fire_entry(entry)

    def _pop_due(self) -> TimerEntry | None:
        heap = self._heap
        if not heap:
            return None
        heapq = _heapq()  # loaded already: something was scheduled
        while heap and heap[0][2].dead:
            heapq.heappop(heap)
        if heap and heap[0][0] <= self._clock():
            due: TimerEntry = heapq.heappop(heap)[2]
            return due
        return None

    def _next_due(self) -> TimerEntry:
        with self._cond:
            heap = self._heap
            while True:
                entry = self._pop_due()
                if entry is not None:
                    return entry
                if not heap:
                    self._cond.wait()
                    continue
                delay = heap[0][0] - self._clock()
                self._cond.wait(min(delay, MAX_WAIT))  # a far deadline: wake and re-check

    def _serve(self) -> None:
        while True:
            try:
                entry = self._next_due()
            except Exception:  # never let the shared timer die; log and keep serving
                logger.exception("toolreg: the shared timer failed to wait; retrying")
                continue
            self._fire_entry(entry)
            del entry

    def _fire_entry(self, entry: TimerEntry) -> None:
        token = entry()
        entry.keep = None  # its strong hold ends here: `token` holds it while it fires
        if token is None or entry.dead:
            return
        entry.dead = True
        try:
            self._fire(token, entry.reason)
        except BaseException:  # the shared timer must survive anything
            logger.exception("toolreg: a deadline's cancellation raised")


def _drop_dead(heap: list[tuple[float, int, TimerEntry]]) -> None:
    kept = 0
    for index in range(len(heap)):
        if not heap[index][2].dead:
            heap[kept] = heap[index]
            kept += 1
    del heap[kept:]
    _heapq().heapify(heap)
