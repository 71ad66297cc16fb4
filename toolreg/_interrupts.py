"""Where a Ctrl-C (or any exception a signal handler raises) may land, and what happens then.

Python runs signal handlers in the main thread, between bytecodes: a `KeyboardInterrupt` from
the default SIGINT handler, or whatever an application's own handler raises (the
`signal.alarm()` + raise-`TimeoutError` idiom), can appear at almost any line the main thread
runs, including the library's own. The contract is the same wherever it lands: the call it lands
in is cancelled (its own token, never the caller's), the pipeline is completed (a started body
is joined, observers see the result once), and then the exception is re-raised. What that takes
depends on where it landed:

* In a hook, the approver or a wrapper (user code): `KeyboardInterrupt` and `SystemExit` raised
  there are interrupts (`INTERRUPTS`), anything else is that hook's failure (`HOOK_ERROR`).
* In a wait of the library's own (joining a body, draining wrappers, scheduling a batch): there
  is no user code on that line, so *any* exception is asynchronous: it is an interrupt. The wait
  then goes on: `wait_until` hands the exception to the call and keeps waiting until the thing
  waited for has settled.
* While a body is handed to a worker: who starts the body is one claim (see `_claim`), so the
  interrupted caller claims it back if no worker has started it, or joins it if one has.

Why the main thread waits in slices: a signal that arrives after the interpreter's last check
and before the thread blocks in `lock.acquire()` is only handled when that wait returns; an
unbounded wait could hold a Ctrl-C until the body finished on its own. `wait_until` therefore
waits in `MAIN_THREAD_SLICE` slices on the main thread (other threads never receive signals and
block without a timeout).

Why a batch defers SIGINT and `execute` does not: a batch's scheduler runs many lines of its own
between counting the batch in and out; with Python's default handler in place, `deferred_sigint`
swaps in a handler that only records the press and wakes the scheduler, which then cancels the
batch at a point of its choosing, drains it, and raises `KeyboardInterrupt`. `execute` would pay
two `signal.signal()` calls per call for that; it handles the exception wherever it lands
instead. A custom handler installed by the application is never replaced. The swap goes through
`_signal`, the C module behind `signal`: the `signal` module's wrappers turn every handler and
signal number into an enum member and back, which made the swap most of what deferring costs a
small batch.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; a builtin module, always loaded
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = [
    "INTERRUPTS",
    "MAIN_THREAD_SLICE",
    "MAX_WAIT",
    "SigintRequest",
    "deferred_sigint",
    "main_ident",
    "slice_for",
    "wait_until",
]

INTERRUPTS = (KeyboardInterrupt, SystemExit)  # raised by user code: an interrupt, not a failure
MAIN_THREAD_SLICE = 0.1  # seconds; bounds how late a signal is handled while the main thread waits
MAX_WAIT = 3600.0  # seconds; a longer timed wait is made in pieces (Lock.acquire overflows)


def main_ident() -> int | None:
    """The main thread's ident: the only thread signal handlers (and their exceptions) run on."""
    return threading.main_thread().ident


# The same, read as a module attribute on the join's hot path. It changes only in a child forked
# from another thread, whose main thread threading's own after-fork hook (registered before
# this one, so run first) has just made the forking thread.
main_thread_ident = main_ident()


def _main_thread_forked() -> None:
    global main_thread_ident
    main_thread_ident = main_ident()


os.register_at_fork(after_in_child=_main_thread_forked)


def wait_until(
    done: Callable[[], bool],
    wait: Callable[[float], object],
    interrupted: Callable[[BaseException], None],
    wake_at: Callable[[], float | None] | None = None,
    woke: Callable[[], None] | None = None,
) -> None:
    """Call `wait(timeout)` until `done()`; an exception landing meanwhile never ends the wait.

    `wait(timeout)` blocks at most `timeout` seconds, or without limit for -1 (like
    `Lock.acquire`). Any exception raised while waiting goes to `interrupted(exc)` (which
    cancels what is waited for) and the wait goes on. `wake_at()` is a monotonic time at which
    to call `woke()` once (say, a deadline that nothing pushes), or None.
    """
    main = threading.current_thread() is threading.main_thread()
    while True:
        due: float | None = None
        try:
            if done():
                return
            if wake_at is not None:
                due = wake_at()
            wait(slice_for(main, due))
        except BaseException as exc:  # asynchronous (a signal handler): cancel, wait on
            interrupted(exc)
            continue
        if due is not None and time.monotonic() >= due:
            wake_at = None  # once: after it, the woken party reaches us like any canceller
            if woke is not None:
                woke()


def slice_for(main: bool, due: float | None) -> float:
    """How long one wait may block: until `due` (a monotonic time) if given, at most
    `MAX_WAIT`, and `MAIN_THREAD_SLICE` on the main thread; -1 for no limit."""
    timeout = MAIN_THREAD_SLICE if main else -1.0
    if due is not None:
        left = min(max(0.0, due - time.monotonic()), MAX_WAIT)
        timeout = left if timeout < 0 else min(timeout, left)
    return timeout


class SigintRequest:
    """Whether Ctrl-C was pressed during the deferral, and whom to wake when it is."""

    __slots__ = ("pressed", "wake")

    def __init__(self) -> None:
        self.pressed = False
        self.wake: Callable[[], None] = _nothing  # must be safe inside a signal handler

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.pressed = True
        self.wake()


def _nothing() -> None:
    pass


@contextlib.contextmanager
def deferred_sigint() -> Iterator[SigintRequest]:
    """Within the block, SIGINT sets `.pressed` and calls `.wake()` instead of raising.

    Only on the main thread and only while Python's default handler is installed; on leaving the
    block the default handler is back and a press made meanwhile raises `KeyboardInterrupt`.
    """
    request = SigintRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # signals are only handled on the main thread: nothing to defer
        return
    try:
        previous = _signal.getsignal(_SIGINT)
    except ValueError:  # pragma: no cover - an interpreter without signal support
        previous = None
    if previous is not _DEFAULT_INT_HANDLER:
        yield request
        return
    _signal.signal(_SIGINT, request._handle)
    try:
        yield request
    finally:
        _signal.signal(_SIGINT, previous)
        if request.pressed:
            raise KeyboardInterrupt


_SIGINT: int = _signal.SIGINT
_DEFAULT_INT_HANDLER: Callable[..., object] = _signal.default_int_handler
