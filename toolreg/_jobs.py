"""Daemon threads that run small jobs for threads that must never block on them.

The shared deadline timer hands every deadline's cancel callbacks to `JobThreads`, so a slow
callback cannot delay the next deadline; an event loop can hand over work the same way.

* `call_soon(job)` queues `job()` and returns at once: it never runs the job, never waits for
  one, and (once `start()` ran) never starts a thread. Jobs start in the order they were queued.
* A job that blocks does not hold up the others for long: a job that finds every other worker
  busy waits at most `_PATIENCE` (20 ms) for one to free up, then the last idle worker starts a
  spare worker and runs it, so one more idle worker is ready for the next job. Quick jobs that
  merely arrive together start no threads. There are at most `limit` workers; beyond that, jobs
  wait for the first worker to free up. `keep` workers stay; the others exit after `linger`
  idle seconds.
* Workers are daemon threads: they never keep the interpreter alive. A job that raises is logged
  on the ``toolreg`` logger (any `BaseException`); the worker goes on.
* After `fork()` the child has none of the parent's threads: its `JobThreads` start afresh on
  first use (or on `start()`), at the fork itself only if jobs were still queued then. That
  first `call_soon` in the child starts them, so it waits for them to run, once.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from _weakref import ref as _weak_ref  # `weakref.ref`, without loading `weakref`
from collections.abc import Callable
from types import MethodType
from typing import Any

from ._logger import logger

__all__ = ["JobThreads", "after_fork_in_child"]


# Seconds a job waits, with every worker busy, before a spare worker is started for it: jobs
# that are merely quick to come start no threads, a blocked job costs the others this much.
_PATIENCE = 0.02

Job = Callable[[], object]


class JobThreads:
    """A few daemon threads named `name` that run queued jobs; see the module docstring."""

    def __init__(self, name: str, *, keep: int = 2, limit: int = 32, linger: float = 1.0) -> None:
        # With a single worker, nobody would be idle to notice that its job blocks.
        if not 2 <= keep <= limit:
            raise ValueError("JobThreads needs 2 <= keep <= limit")
        self._name = name
        self._keep = keep
        self._limit = limit
        self._linger = linger
        self._reset(collections.deque())
        after_fork_in_child(self._after_fork)

    def _reset(self, jobs: collections.deque[Job]) -> None:
        # Guards _jobs, _threads, _idle and _closed. No job runs under it, but it is a plain
        # lock and what runs under it does allocate (`_take` returns tuples; `Condition.wait`
        # and `notify` are Python code that allocates a waiter lock): a finalizer that a
        # collection runs there and that queues a job on this same instance would deadlock its
        # thread (the plain-lock caveat of contract A.4; toolreg's own finalizers never do).
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # notified when a job is queued
        self._jobs = jobs
        self._threads = 0  # workers alive or being started
        self._idle = 0  # workers waiting for a job
        self._closed = False

    def _after_fork(self) -> None:
        # Only the forking thread survives: the lock may be held by a thread that is gone.
        self._reset(self._jobs)
        if self._jobs:  # jobs queued in the parent are the child's to run too
            self.start()

    def start(self) -> None:
        """Start workers up to `keep` now; call it from a thread that may block.

        Starting a thread waits for it to run (milliseconds under load), so a thread that must
        not block (the timer, an event loop) should not be the one to start them: start them
        early (the timer does it when it starts its own thread). Idempotent.
        """
        with self._lock:
            missing = max(0, self._keep - self._threads)
            self._threads += missing
        for _ in range(missing):
            self._spawn()

    def call_soon(self, job: Job) -> None:
        """Run `job()` on one of the workers, soon; never blocks once `start()` ran."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"JobThreads {self._name!r} is closed")
            self._jobs.append(job)
            if self._idle:
                self._ready.notify()
                return
            short = self._threads < self._keep
        if short:  # never started (or a start failed): this caller pays for the threads, once
            self.start()

    def close(self) -> None:
        """Refuse new jobs; every worker exits once the queued jobs are done (for tests: the
        process-wide instances are never closed)."""
        with self._lock:
            self._closed = True
            self._ready.notify_all()

    def _spawn(self) -> None:
        try:
            thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            thread.start()
        except Exception:  # out of threads, or the interpreter is shutting down
            with self._lock:
                self._threads -= 1
            logger.debug("toolreg: could not start a %s thread", self._name, exc_info=True)

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
                if self._jobs:
                    self._ready.notify_all()  # a worker waiting out its patience: we are free
                taken = self._take()
                self._idle -= 1
            if taken is None:
                return
            job, spare = taken
            if spare:
                self._spawn()  # before the job: if it blocks too, the spare serves the next ones
            try:
                job()
            except BaseException:  # a worker survives anything a job does
                logger.exception("toolreg: a job on a %s thread raised", self._name)
            del job, taken  # drop the job's references before waiting for the next one

    def _take(self) -> tuple[Job, bool] | None:
        """With the lock held: the next job and whether to start a spare, or None to exit."""
        patience_until: float | None = None
        while True:
            if not self._jobs and self._closed:
                self._threads -= 1
                return None
            if not self._jobs:
                patience_until = None
                woken = self._ready.wait(self._linger)
                # Leave only if another worker stays idle: a queued job never waits for a
                # busy worker while we are below the limit.
                if not (woken or self._jobs) and self._threads > self._keep and self._idle > 1:
                    self._threads -= 1
                    return None
                continue
            if self._idle > 1 or self._threads >= self._limit:
                return self._jobs.popleft(), False
            if self._threads < self._keep:  # a start failed earlier: make up for it now
                self._threads += 1
                return self._jobs.popleft(), True
            # We are the last idle worker: taking the job leaves none for the next one. If the
            # busy workers are quick (the usual case), one of them frees up soon; if not, start
            # a spare. Either way no job waits much longer than `_PATIENCE` for a blocked one.
            now = time.monotonic()
            if patience_until is None:
                patience_until = now + _PATIENCE
            if now >= patience_until:
                self._threads += 1
                return self._jobs.popleft(), True
            self._ready.wait(patience_until - now)

    def __repr__(self) -> str:
        return (
            f"<JobThreads {self._name!r} threads={self._threads} idle={self._idle} "
            f"queued={len(self._jobs)}>"
        )


def after_fork_in_child(method: Callable[[], None]) -> None:
    """Call the bound `method` in a forked child, unless its object was collected by then.

    Registered for the life of the process (`os.register_at_fork` has no undo), so it holds the
    object weakly (what `weakref.WeakMethod` does, without loading `weakref` at import).
    """
    assert isinstance(method, MethodType), "a bound method"
    owner, function = _weak_ref(method.__self__), method.__func__
    os.register_at_fork(after_in_child=lambda: _call_if_alive(owner, function))


def _call_if_alive(owner: Callable[[], object], function: Callable[[Any], object]) -> None:
    target = owner()
    if target is not None:
        function(target)
