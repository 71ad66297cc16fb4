"""The process-wide timer behind every deadline: one daemon thread and a heap.

No thread or `threading.Timer` per token: a deadline is a heap entry holding its token weakly
(a source dropped without `close()` can be collected; its entry is then skipped). Disarmed
entries are dropped lazily and the heap is compacted in place once they make up half of it. The
thread is started on first use, survives anything a callback does, caps each wait (a deadline
centuries away must not overflow `Condition.wait`), and is replaced in a forked child.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from typing_extensions import Self

__all__ = ["Timer", "TimerEntry"]

logger = logging.getLogger("toolreg")

_next_key = itertools.count().__next__  # tie-breaker for equal due times; atomic under the GIL
_MAX_TIMER_WAIT = 3600.0  # seconds; Condition.wait overflows on very long timeouts


class TimerEntry(weakref.ref):  # type: ignore[type-arg]
    """A scheduled deadline; holds its token weakly so a dropped source can be collected."""

    __slots__ = ("dead", "reason", "timer")
    dead: bool  # never re-armed; written without a lock, read by the timer thread
    reason: Any  # a TimeoutReason
    timer: Timer

    def __new__(cls, token: Any, reason: Any, timer: Timer) -> Self:
        self = weakref.ref.__new__(cls, token, TimerEntry._died)
        self.reason = reason
        self.timer = timer
        self.dead = False
        return self

    def __init__(self, token: Any, reason: Any, timer: Timer) -> None:
        # weakref.ref.__init__ takes (object, callback) only; __new__ did the real work.
        super().__init__(token, TimerEntry._died)  # type: ignore[call-arg]

    def disarm(self) -> None:
        if not self.dead:
            self.dead = True
            self.timer.dead_count += 1

    @staticmethod
    def _died(entry: weakref.ref[Any]) -> None:
        # A finalizer: no lock (see module docstring). The count only paces heap compaction.
        assert isinstance(entry, TimerEntry)
        entry.disarm()


class Timer:
    """The process-wide timer: one daemon thread and a heap of deadlines."""

    def __init__(self, fire: Callable[[Any, Any], None]) -> None:
        self._fire = fire  # fire(token, reason): cancels the token as its own timer
        self._reset()
        os.register_at_fork(after_in_child=self._after_fork)

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

    def schedule(self, token: Any, seconds: float, reason: Any) -> TimerEntry:
        entry = TimerEntry(token, reason, self)
        item = (time.monotonic() + seconds, _next_key(), entry)
        with self._cond:
            heap = self._heap
            if self.dead_count > 64 and self.dead_count * 2 > len(heap):
                _drop_dead(heap)  # in place: nothing allocated while the lock is held
                self.dead_count = 0
            heapq.heappush(heap, item)
            if heap[0] is item:
                self._cond.notify()
            if self._thread is None:
                self._start()
        return entry

    def _start(self) -> None:
        thread = threading.Thread(target=self._serve, name="toolreg-timer", daemon=True)
        self._thread = thread
        thread.start()

    def _next_due(self) -> TimerEntry:
        with self._cond:
            heap = self._heap
            while True:
                while heap and heap[0][2].dead:
                    heapq.heappop(heap)
                if not heap:
                    self._cond.wait()
                    continue
                delay = heap[0][0] - time.monotonic()
                if delay <= 0:
                    return heapq.heappop(heap)[2]
                self._cond.wait(min(delay, _MAX_TIMER_WAIT))  # a far deadline: wake and re-check

    def _serve(self) -> None:
        while True:
            try:
                entry = self._next_due()
            except Exception:  # never let the shared timer die; log and keep serving
                logger.exception("toolreg: the shared timer failed to wait; retrying")
                continue
            token = entry()
            if token is None or entry.dead:
                continue
            entry.dead = True
            try:
                self._fire(token, entry.reason)
            except BaseException:  # the shared timer must survive anything a callback does
                logger.exception("toolreg: a deadline's cancellation raised")
            del token


def _drop_dead(heap: list[tuple[float, int, TimerEntry]]) -> None:
    kept = 0
    for index in range(len(heap)):
        if not heap[index][2].dead:
            heap[kept] = heap[index]
            kept += 1
    del heap[kept:]
    heapq.heapify(heap)
