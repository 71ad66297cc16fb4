"""Progress reports from a running body: `ToolProgress`, and the per-call sink that filters them.

A body calls `ctx.report_progress(progress, total, message)`; the sink of its call keeps only
increasing values (MCP requires them, and a retried attempt must not go backwards) and hands each
kept update to the `progress=` callback of the `execute` that runs the call. The callback is user
code: it runs outside the sink's lock, on one thread at a time (so its values arrive in
increasing order even when several threads report), and its exceptions are logged, never raised
into the body.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _validate
from ._interrupts import INTERRUPTS
from ._logger import logger
from ._record import record

if TYPE_CHECKING:
    from ._results import ToolCall

__all__ = ["ProgressCallback", "ProgressSink", "ToolProgress", "check_progress"]


@record(frozen=True, slots=True)
class ToolProgress:
    """One progress update of a call: how far (`progress` of `total`), with an optional message.

    `progress` only ever increases within one call; `total` and `message` may be None.
    """

    call: ToolCall
    progress: float
    total: float | None = None
    message: str | None = None

    def __init__(
        self,
        call: ToolCall,
        progress: float,
        total: float | None = None,
        message: str | None = None,
    ) -> None:
        object.__setattr__(self, "call", call)
        object.__setattr__(self, "progress", progress)
        object.__setattr__(self, "total", total)
        object.__setattr__(self, "message", message)


ProgressCallback = Callable[[ToolProgress], object]


def check_progress(progress: object, total: object, message: object) -> None:
    """`TypeError` for a bool or non-number, `ValueError` for NaN or infinity, per the contract."""
    _validate.real(progress, "progress")
    if total is not None:
        _validate.real(total, "total")
    if message is not None and not isinstance(message, str):
        raise TypeError(f"message must be a str or None, got {type(message).__name__}")


class ProgressSink:
    """The progress filter of one call: increasing values only, then the callback.

    One thread at a time delivers, outside the lock: a report that arrives while another thread
    is in the callback only leaves its update pending (replacing an older pending one) and
    returns, and the delivering thread passes the latest pending update on once the callback
    returned. So the callback never runs concurrently with itself and only ever sees increasing
    values, with updates that came in meanwhile coalesced into the latest.
    """

    __slots__ = ("_callback", "_delivering", "_last", "_lock", "_pending")

    def __init__(self, callback: ProgressCallback) -> None:
        self._callback = callback
        self._last: Any = None  # the last progress value kept
        self._pending: ToolProgress | None = None  # kept, not delivered yet
        self._delivering = 0  # ident of the thread in the callback's loop; 0 for none
        self._lock = threading.Lock()  # guards the three above; never held around user code

    def report(
        self, call: ToolCall, progress: float, total: float | None, message: str | None
    ) -> None:
        """Pass the update on if `progress` exceeds the last one; log the callback's errors."""
        update: ToolProgress | None = ToolProgress(call, progress, total, message)
        me = threading.get_ident()
        try:
            with self._lock:
                if self._last is not None and not progress > self._last:
                    return
                self._last = progress
                if self._delivering:  # another thread (or the callback, here) is delivering
                    update, self._pending = self._pending, update
                    return  # the replaced pending update is dropped outside the lock
                self._delivering = me
            while update is not None:
                self._deliver(update)
                with self._lock:
                    update, self._pending = self._pending, None
                    if update is None:
                        self._delivering = 0
        except BaseException:  # Ctrl-C or SystemExit: whoever reports next delivers again
            with self._lock:
                if self._delivering == me:
                    self._delivering = 0
                    self._pending = None  # coalesced away, as a later update would replace it
            raise

    def _deliver(self, update: ToolProgress) -> None:
        try:
            self._callback(update)
        except INTERRUPTS:
            raise
        except BaseException:  # a callback's failure never reaches the body
            logger.exception("toolreg: progress callback %r raised", self._callback)
