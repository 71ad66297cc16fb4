"""The process-wide helper thread: small jobs handed over from threads that must not block.

An event loop must never start a thread (`Thread.start()` waits until the new thread runs) nor
run token callbacks (user code); the worker pool must be able to start a thread for a caller on
an event loop. Both hand such jobs to this helper. It is started lazily with
`_thread.start_new_thread`, which does not wait for the thread to run, so even the first
`call_soon` never blocks; it is a daemon (it never keeps the interpreter alive) and is started
anew after `fork()`. Jobs run in order; one that raises is logged and the helper lives on.
"""

from __future__ import annotations

import _thread
import logging
import os
import queue
import threading
from collections.abc import Callable

__all__ = ["HELPER", "Helper"]

logger = logging.getLogger("toolreg")


class Helper:
    """One lazily started daemon thread that runs jobs in the order they were handed over."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._started = False
        self._start_lock = threading.Lock()  # guards _started (so one thread is started)

    def call_soon(self, job: Callable[[], object]) -> None:
        """Run `job()` on the helper thread; never blocks (safe on an event loop)."""
        self._jobs.put(job)
        if not self._started:
            with self._start_lock:
                if not self._started:
                    _thread.start_new_thread(self._serve, ())
                    self._started = True

    def _serve(self) -> None:
        # A raw thread has no threading.Thread until it asks for one: name the one it gets.
        threading.current_thread().name = "toolreg-helper"
        while True:
            job = self._jobs.get()
            try:
                job()
            except BaseException:  # the helper must survive anything a job does
                logger.exception("toolreg: a helper job raised")
            del job


HELPER = Helper()
