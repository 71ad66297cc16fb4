"""Running one body and joining it: who starts the body is decided by a single claim.

A `BodyRun` is one start of a tool body (a retrying wrapper makes several per call). Exactly one
of two parties claims it, with one non-blocking `Lock.acquire`:

* the thread that runs it (a pool worker, or the pipeline's own thread for inline bodies), which
  then checks the token once more and starts the body, or
* a canceller: the token's cancel callback (or the joining thread after Ctrl-C), which marks it
  never-started and wakes the joiner at once, so a call cancelled while queued returns promptly
  and its body never starts.

The joiner waits until `settled` (guarded by `done`, a lock released exactly once by whoever
claimed). It never looks at an executor future: joining means the registry's own wrapper
recorded that the body returned or raised.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from ._cancel import CancelToken, Registration, deadline

logger = logging.getLogger("toolreg")

INTERRUPTS = (KeyboardInterrupt, SystemExit)
MAIN_THREAD_SLICE = 0.1  # seconds; bounds how late a Ctrl-C is noticed while the main thread waits


class BodyRun:
    """One start of a body; see the module docstring for the claim protocol."""

    __slots__ = (
        "_call",
        "_claim",
        "_done",
        "_overdue",
        "_overdue_after",
        "_target",
        "cancelled_at",
        "check",
        "error",
        "live_on_return",
        "settled",
        "started",
        "token",
        "value",
    )

    def __init__(
        self,
        target: Callable[[], Any],
        token: CancelToken,
        check: bool,
        call: Any,
        overdue_after: float | None,
    ) -> None:
        self._target = target
        self.token = token
        self.check = check  # False for pre-aborted entry: the body must start regardless
        self._call = call  # named in the overdue warning
        self._overdue_after = overdue_after
        self._claim = threading.Lock()  # acquired once, by the party that owns the start
        self._done = threading.Lock()  # held until the owner finished; released exactly once
        self._done.acquire()
        self.started = False
        self.settled = False
        self.live_on_return = False  # the token was live when the body returned (worker's view)
        self.value: Any = None
        self.error: BaseException | None = None
        self._overdue: Any = None  # the overdue-warning deadline, armed by a canceller

    # -- the party that runs the body ----------------------------------------------------------

    def run(self) -> None:
        """Start the body here if nobody claimed it, and if its token allows; never raises."""
        if not self._claim.acquire(blocking=False):
            return  # a canceller owns it: it never starts, and the joiner was woken already
        try:
            if not (self.check and self.token.cancelled):
                self.started = True
                try:
                    self.value = self._target()
                    # Read here, not after the join: a deadline firing while the caller wakes
                    # up must not turn an on-time success into a cancellation.
                    self.live_on_return = not self.token.cancelled
                except BaseException as exc:  # recorded for the caller; the worker lives on
                    self.error = exc
        finally:
            self.settled = True
            self._done.release()

    # -- cancellers ------------------------------------------------------------------------------

    def on_cancel(self) -> None:
        """Cancel callback: claim a body that has not started; else watch for an overdue one."""
        if self._claim.acquire(blocking=False):
            self.settled = True
            self._done.release()
        else:
            self.watch_overdue()

    def watch_overdue(self) -> None:
        """Warn once if the body has not settled `overdue_after` seconds from now."""
        if not self.settled and self._overdue_after is not None and self._overdue is None:
            watch = deadline(None, self._overdue_after)
            watch.token.on_cancel(self._warn_overdue)
            self._overdue = watch

    def _warn_overdue(self) -> None:
        if not self.settled:
            logger.warning(
                "toolreg: tool %s has not settled %gs after its cancellation; the registry keeps "
                "waiting for it (a non-quiescent call: make the body observe ctx.token)",
                f"{self._call.name!r} (call {self._call.call_id})",
                self._overdue_after,
            )

    # -- the joiner ------------------------------------------------------------------------------

    def submit_and_join(
        self, executor: Executor, interrupt: Callable[[BaseException], None]
    ) -> None:
        """Run the body on `executor` and wait until it settled (or never started).

        A Ctrl-C here, even one that lands inside `submit()`, calls `interrupt` (which cancels
        the call) and claims the body if it has not started; the join then goes on.
        """
        try:
            executor.submit(self.run)
        except INTERRUPTS as exc:
            interrupt(exc)
            self._claim_after_interrupt()
        except RuntimeError:  # the executor was shut down under us
            if self._claim.acquire(blocking=False):
                self.settled = True
                self._done.release()
                raise
        self.join(interrupt)

    def join(self, interrupt: Callable[[BaseException], None]) -> None:
        """Wait until the body settled or was claimed by a canceller; Ctrl-C-safe.

        The main thread waits in slices: a SIGINT that lands between releasing the GIL and
        blocking in `acquire()` is only handled when the wait returns, so an unbounded wait
        could sit on a Ctrl-C until the body finished on its own.
        """
        main = threading.current_thread() is threading.main_thread()
        slice_ = MAIN_THREAD_SLICE if main else -1
        # `settled` is written before `_done` is released: once it reads True the outcome is
        # recorded. Looping on it (not on the lock) also survives a Ctrl-C that lands right
        # after a successful acquire, which must not send us back to wait on a lock we hold.
        while not self.settled:
            try:
                self._done.acquire(timeout=slice_)
            except INTERRUPTS as exc:
                interrupt(exc)
                self._claim_after_interrupt()

    def claim_or_join(self, interrupt: Callable[[BaseException], None]) -> None:
        """After a Ctrl-C anywhere around submit/join: claim it if unstarted, else join it."""
        self._claim_after_interrupt()
        self.join(interrupt)

    def _claim_after_interrupt(self) -> None:
        if self._claim.acquire(blocking=False):
            self.settled = True
            self._done.release()

    def finish(self, registration: Registration | None) -> None:
        """After the join: drop the cancel callback and any overdue watch."""
        if registration is not None:
            registration.remove()  # waits for an on_cancel running right now
        overdue = self._overdue
        if overdue is not None:
            overdue.close()
