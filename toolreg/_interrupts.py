"""Ctrl-C as a request, not an exception: defer SIGINT while a batch is scheduled.

A `KeyboardInterrupt` raised by Python's default SIGINT handler can land on any bytecode of the
main thread, including the few between counting a batch in and counting it out. While a batch
runs on the main thread with the default handler in place, `deferred_sigint()` swaps in a handler
that only records the press and wakes the scheduler (through a reentrant `SimpleQueue.put`),
so the scheduler cancels the batch at a point of its choosing and re-raises once it drained.
A custom handler installed by the application is left alone.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType


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
    """Within the block, SIGINT sets `.pressed` and calls `.wake()` instead of raising."""
    request = SigintRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # signals are only handled on the main thread: nothing to defer
        return
    try:
        previous = signal.getsignal(signal.SIGINT)
    except ValueError:  # pragma: no cover - an interpreter without signal support
        previous = None
    if previous is not signal.default_int_handler:
        yield request
        return
    signal.signal(signal.SIGINT, request._handle)
    try:
        yield request
    finally:
        signal.signal(signal.SIGINT, previous)
        if request.pressed:
            raise KeyboardInterrupt
