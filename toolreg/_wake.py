"""What an idle `WorkerPool` worker sleeps on, and how a hand-off wakes it.

Where `os.eventfd` exists (Linux), a worker sleeps in a blocking read of an eventfd of its own
and the waker writes to it. Both calls give up the GIL around the system call, and that is the
point: when the waker and the worker share a CPU, a woken thread usually preempts its waker at
once. Woken by a lock release, it finds the GIL still held, blocks again and hands the CPU
back, and the same happens on the way back: about six context switches per round trip. Woken
by a write, it finds the GIL free, runs its item right away, and the round trip takes two. (With
the two threads on different CPUs nobody is preempted, and the two kinds cost about the same.)
Elsewhere a worker sleeps on a lock of its own.

The two kinds differ in when the pool may wake a worker: a lock is released under the pool's
lock (the slot and the wake-up go together, and a timed-out sleep can take the release back);
an eventfd write is made after the pool's lock is released (`deferred`), so the worker it wakes
does not find that lock held either. An eventfd sleep never times out: an interrupted hand-off
wakes the workers it may have left out instead (`WorkerPool._rescue`).

The price: a waker that goes on running after the hand-off (an event loop queuing more awaited
calls, a worker passing a queued item on) gives the CPU to the worker it woke and waits for the
GIL back, where a lock release would have let it finish first. A blocking caller, the common
case, waits for that worker anyway. A waker that knows it goes on asks for a write that keeps
the GIL (`release_deferred(goes_on=True)`: libc's `eventfd_write` through `ctypes.PyDLL`): the
worker wakes, waits for the GIL, and runs once the waker blocks. The asyncio facade does, when
its loop has other callbacks ready (the rest of a `gather`), so the loop hands over every call
it has before the first worker takes the CPU. A lone awaited call keeps the GIL-free write: its
loop has nothing else to do, and keeping the GIL would only make the worker wait for it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import ClassVar

__all__ = ["IDLE_CHECK", "EventWake", "LockWake", "Wake", "new_wake"]

IDLE_CHECK = 30.0  # seconds a worker sleeping on a lock waits before it re-checks its slot


class LockWake:
    """A lock held while the worker sleeps, released to wake it."""

    __slots__ = ("_lock",)

    deferred: ClassVar[bool] = False  # released under the pool's lock

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def mark(self) -> None:
        """A deferred wake-up is coming (no-op: this kind is released at once)."""

    def release(self) -> None:
        """Wake the worker; `RuntimeError` if it was woken already and has not slept since."""
        self._lock.release()

    def sleep(self) -> bool:
        """Block until woken (True) or `IDLE_CHECK` seconds passed (False)."""
        return self._lock.acquire(timeout=IDLE_CHECK)

    def waking(self) -> bool:
        """Released, and the worker has not woken from it yet."""
        return not self._lock.locked()

    def take_back(self) -> None:
        """After a sleep that timed out as the worker was released: undo the release."""
        self._lock.acquire(False)

    def release_deferred(self, goes_on: bool = False) -> None:
        """The wake-up `mark` announced (never used: this kind is not deferred)."""
        self._lock.release()

    def close(self) -> None:
        """The worker has left (nothing to free)."""


class EventWake:
    """An eventfd: the worker blocks reading it, a write wakes it (see the module docstring)."""

    __slots__ = ("_fd", "_waking", "_writes")

    deferred: ClassVar[bool] = True  # written after the pool's lock is released

    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_CLOEXEC)
        # Set (under the pool's lock) before the write, cleared by the worker once woken.
        self._waking = False
        # One entry per deferred write announced and not made yet: appended under the pool's
        # lock, popped by the writer after its write (a list's append and pop are atomic), so
        # `close` knows whether a writer may still be about to use the descriptor.
        self._writes: list[None] = []

    def mark(self) -> None:
        """Under the pool's lock: a deferred wake-up is coming (`release_deferred`);
        `waking()` is True from now until the worker has woken."""
        self._waking = True
        self._writes.append(None)

    def release(self) -> None:
        """Under the pool's lock: wake the worker. Extra wake-ups before it wakes count as
        one, and a spurious one only makes it look at its slot."""
        self._waking = True
        fd = self._fd
        if fd >= 0:  # closed (its worker has left, under the same lock): nobody to wake
            os.eventfd_write(fd, 1)

    def release_deferred(self, goes_on: bool = False) -> None:
        """After the pool's lock: the wake-up `mark` announced.

        `goes_on`: the waker has more to do right away (an event loop with other callbacks
        ready), so the write keeps the GIL: the worker wakes but waits for the GIL until the
        waker blocks, instead of taking the CPU from it now (see the module docstring).
        """
        if goes_on:
            _write_keeping_gil()(self._fd, 1)
        else:
            os.eventfd_write(self._fd, 1)
        self._writes.pop()

    def sleep(self) -> bool:
        """Block until woken; always True (this kind never times out)."""
        os.eventfd_read(self._fd)
        self._waking = False
        return True

    def waking(self) -> bool:
        return self._waking

    def take_back(self) -> None:
        """Never needed: an eventfd sleep does not time out."""

    def close(self) -> None:
        """Under the pool's lock, as the worker leaves (out of the idle list, so no hand-off
        takes it any more; a wake-up under that lock finds it closed and skips it): close the
        descriptor, unless a deferred writer may still be about to use it; the finalizer
        closes it then. (A close while a writer is in its system call could hit a descriptor
        opened meanwhile under the same number.)"""
        if not self._writes and self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __del__(self) -> None:
        # Nothing refers to it any more, so nobody can write to it: close what `close` left.
        if self._fd >= 0:
            os.close(self._fd)


Wake = LockWake | EventWake

_EVENTFD = hasattr(os, "eventfd")


def new_wake() -> Wake:
    """The wake-up of a new worker: an eventfd where there is one, else a lock."""
    return EventWake() if _EVENTFD else LockWake()


_EventfdWrite = Callable[[int, int], object]
_keeping_gil: _EventfdWrite | None = None  # built on first use (it imports ctypes)


def _write_keeping_gil() -> _EventfdWrite:
    """libc's `eventfd_write` called through `ctypes.PyDLL`, which keeps the GIL during the
    call (`os.eventfd_write` gives it up); `os.eventfd_write` where libc has none."""
    global _keeping_gil
    if _keeping_gil is None:
        _keeping_gil = _libc_eventfd_write() or os.eventfd_write
    return _keeping_gil


def _libc_eventfd_write() -> _EventfdWrite | None:
    try:
        import ctypes

        write = ctypes.PyDLL(None).eventfd_write
    except (ImportError, OSError, AttributeError):
        return None
    write.argtypes = (ctypes.c_int, ctypes.c_uint64)
    write.restype = ctypes.c_int
    return write
