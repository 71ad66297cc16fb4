"""Shared helpers for the registry tests: handshakes, recorders, callers on their own threads,
and the small tools many test files register.

Threads are ordered only with `Event`s (`Gate`, `Caller`). Every wait is bounded by `WAIT`, a
limit a correct implementation never comes near: it turns a hang into a failure with a message.
`wait_until` polls an observable condition (say, a log record) in short bounded slices; it never
orders threads by sleeping.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from types import FrameType
from typing import Any

from toolreg import CancelSource, ErrorCode, ToolContext, ToolRegistry, ToolResult, deadline

WAIT = 10.0  # seconds any handshake may take before the test fails

ABORTED = ErrorCode.ABORTED
BEFORE = ErrorCode.ABORTED_BEFORE_DISPATCH

Args = Any  # what a tool body receives as `args` (a read-only mapping)
Proceed = Callable[[], ToolResult[Any]]  # an around wrapper's `proceed`

SEARCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["q"],
}


def echo(args: Args, ctx: ToolContext) -> Any:
    """Return the arguments as a plain dict."""
    return dict(args)


def counting_tool(registry: ToolRegistry, name: str = "work") -> list[str]:
    """Register a tool returning "ran"; the list it returns collects the call id of each start."""
    starts: list[str] = []

    def body(args: Args, ctx: ToolContext) -> str:
        starts.append(ctx.call.call_id)
        return "ran"

    registry.tool(name=name)(body)
    return starts


class Opaque:
    """A value that is neither JSON nor anything the registry knows how to render."""


class Gate:
    """Holds the thread that calls `hold()` until `release()`; `reached` tells it got there."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.released = threading.Event()

    def hold(self) -> None:
        self.reached.set()
        if not self.released.wait(WAIT):
            raise AssertionError("the gate was never released")

    def wait_reached(self) -> None:
        assert self.reached.wait(WAIT), "no thread reached the gate"

    def release(self) -> None:
        self.released.set()


class Caller:
    """Runs `fn()` on a thread of its own and keeps its return value or exception."""

    def __init__(self, fn: Callable[[], Any], name: str = "test-caller") -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = fn()
        except BaseException as exc:  # reported by join(), never lost in the thread
            self.error = exc
        finally:
            self.done.set()

    def still_blocked(self, seconds: float = 0.05) -> bool:
        """True if `fn` has not returned after `seconds` (a check, never used to order)."""
        return not self.done.wait(seconds)

    def join(self, timeout: float = WAIT) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the call did not return"
        if self.error is not None:
            raise self.error
        return self.value


class Observed:
    """An `on_result` observer that keeps every result it sees, in order."""

    def __init__(self) -> None:
        self.results: list[ToolResult[Any]] = []
        self._lock = threading.Lock()  # guards results

    def __call__(self, result: ToolResult[Any]) -> None:
        with self._lock:
            self.results.append(result)

    @property
    def codes(self) -> list[ErrorCode | None]:
        return [result.code for result in self.results]


class Journal:
    """A thread-safe list of events, for asserting an exact order."""

    def __init__(self) -> None:
        self.entries: list[Any] = []
        self._lock = threading.Lock()  # guards entries

    def __call__(self, entry: Any) -> None:
        with self._lock:
            self.entries.append(entry)


def fired_by_timer(callback: Callable[[], object], seconds: float = 0.001) -> CancelSource:
    """A fresh deadline with `callback` registered before it came due: its timer fires it,
    and `callback` runs on a callback thread, never in this one.

    `on_cancel` on a token that is already cancelled runs the callback at once, in the thread
    that registers it, and under load that thread can be held up past a short deadline's due
    time: a callback meant to block (or raise) on a callback thread would block (or raise) in
    the test itself. A registration that came late is caught (the callback is skipped there)
    and made again on a fresh deadline twice as long.
    """
    here = threading.get_ident()
    late = False

    def on_callback_thread() -> None:
        nonlocal late
        if threading.get_ident() == here:  # run inline by on_cancel: registered too late
            late = True
        else:
            callback()

    while True:
        budget = deadline(None, seconds)
        budget.token.on_cancel(on_callback_thread)
        if not late:
            return budget
        late = False
        seconds *= 2


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Poll an observable condition in short bounded slices; fail after `timeout` seconds."""
    pause = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        pause.wait(0.01)
    assert condition(), f"timed out waiting for {what}"


@contextlib.contextmanager
def open_registry(**options: Any) -> Iterator[ToolRegistry]:
    """A registry that is closed when the block ends, however it ends."""
    registry = ToolRegistry(**options)
    try:
        yield registry
    finally:
        registry.close()


TRACED_FRAMES = 8  # `tracemalloc.start(TRACED_FRAMES)`: deep enough to see whose thread it is
# Threads that other libraries keep for the whole process once a test has used them
# (distributed's IO loop and its executors), and the snapshot's own objects.
_NOT_OURS = [
    tracemalloc.Filter(False, "*/distributed/*", all_frames=True),
    tracemalloc.Filter(False, "*/tornado/*", all_frames=True),
    tracemalloc.Filter(False, tracemalloc.__file__),
]


def traced_ours() -> int:
    """The bytes tracemalloc holds now, less what other libraries' own threads allocated.

    Memory tests measure this rather than the process's total: a thread an earlier test left
    behind allocates on its own schedule (distributed keeps its IO loop thread for the whole
    process), which is no growth of ours. Trace with `TRACED_FRAMES` frames, so that an
    allocation on such a thread shows whose it is.
    """
    snapshot = tracemalloc.take_snapshot().filter_traces(_NOT_OURS)
    return sum(trace.size for trace in snapshot.traces)


# toolreg's process-wide helper threads: each started when first needed, kept for the process.
PROCESS_WIDE_THREADS = ("toolreg-timer", "toolreg-callbacks", "toolreg-helper")


def threads_of_our_own() -> list[str]:
    """The names of the live threads, less toolreg's process-wide helpers (which a test may be
    the first to start: that is no leak)."""
    return sorted(t.name for t in threading.enumerate() if t.name not in PROCESS_WIDE_THREADS)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC off for the block, back on after it if it was on.

    For measurements of what toolreg makes a thread do (CPU while joining, event-loop gaps): a
    full collection stops every thread for as long as the heap is large (200-600 ms late in the
    suite, once every framework is imported), which says nothing about the code measured.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def frame_of(thread_id: int | None) -> FrameType | None:
    """The innermost frame a thread is running, read with the cyclic GC paused.

    `sys._current_frames()` allocates while holding the interpreter's list of threads locked. A
    collection that starts there and frees a `threading.local` (every `ToolRegistry` holds one,
    and a registry a test left in a reference cycle is freed by the collector) needs that same
    lock: the thread deadlocks while holding the GIL, and the whole process stops, timeouts
    included (CPython gh-106883, present in the 3.11 this suite runs on).
    """
    with gc_paused():
        return sys._current_frames().get(thread_id or 0)


def main_thread_sleeps() -> bool:
    """True if the main thread is blocked in the kernel (Linux: its task state is 'S')."""
    native_id = threading.main_thread().native_id
    with open(f"/proc/self/task/{native_id}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "S"


def wait_until_main_thread_blocks(polls: int = 5) -> None:
    """Wait until the main thread has been blocked for `polls` polls in a row.

    A signal that arrives while the main thread is *about to* block (past its last check for
    pending signals, not yet in the system call) is only handled once that call returns: a
    CPython race, not a toolreg one. Tests deliver Ctrl-C only once the main thread is seen
    blocked, 10 ms apart, with this thread not holding the GIL in between (so it is not merely
    waiting for the GIL).
    """
    pause = threading.Event()
    streak = 0
    for _ in range(int(WAIT / 0.01)):
        streak = streak + 1 if main_thread_sleeps() else 0
        if streak >= polls:
            return
        pause.wait(0.01)
    raise AssertionError("the main thread never blocked")


def send_ctrl_c_when(event: threading.Event) -> Caller:
    """From another thread: once `event` is set and the main thread blocks, deliver SIGINT."""
    main = threading.main_thread().ident
    assert main is not None and threading.current_thread() is threading.main_thread()

    def deliver() -> None:
        assert event.wait(WAIT), "the moment to press Ctrl-C never came"
        wait_until_main_thread_blocks()
        signal.pthread_kill(main, signal.SIGINT)

    return Caller(deliver, name="ctrl-c")


@contextlib.contextmanager
def default_sigint() -> Iterator[None]:
    """Python's own SIGINT handler (raise KeyboardInterrupt) for the duration of the block."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def holds_nothing(token: Any) -> bool:
    """True if a token keeps no listener and no child link, not even a dead weak one."""
    return not token._listeners and not token._children


def occupy(executor: Executor) -> threading.Event:
    """Hold `executor`'s one worker busy until the returned event is set (work queues behind)."""
    busy, release = threading.Event(), threading.Event()

    def hold() -> bool:
        busy.set()
        return release.wait(WAIT)

    executor.submit(hold)
    assert busy.wait(WAIT)
    return release


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))
