"""Progress reports from a running body: `ToolProgress`, and the per-call sink that filters them.

A body calls `ctx.report_progress(progress, total, message)`; the sink of its call keeps only
increasing values (MCP requires them, and a retried attempt must not go backwards) and hands each
kept update to the `progress=` callback of the `execute` that runs the call. The callback is user
code: it runs outside the sink's lock and its exceptions are logged, never raised into the body.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._results import ToolCall

__all__ = ["ProgressCallback", "ProgressSink", "ToolProgress", "check_progress"]

logger = logging.getLogger("toolreg")


@dataclass(frozen=True, slots=True)
class ToolProgress:
    """One progress update of a call: how far (`progress` of `total`), with an optional message.

    `progress` only ever increases within one call; `total` and `message` may be None.
    """

    call: ToolCall
    progress: float
    total: float | None = None
    message: str | None = None


ProgressCallback = Callable[[ToolProgress], object]


def check_progress(progress: object, total: object, message: object) -> None:
    """`TypeError` for a bool or non-number, `ValueError` for NaN or infinity, per the contract."""
    _check_number(progress, "progress")
    if total is not None:
        _check_number(total, "total")
    if message is not None and not isinstance(message, str):
        raise TypeError(f"message must be a str or None, got {type(message).__name__}")


def _check_number(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a real number, got {type(value).__name__}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise ValueError(f"{what} must be finite, got {value!r}")


class ProgressSink:
    """The progress filter of one call: increasing values only, then the callback."""

    __slots__ = ("_callback", "_last", "_lock")

    def __init__(self, callback: ProgressCallback) -> None:
        self._callback = callback
        self._last: Any = None  # the last progress value passed on
        self._lock = threading.Lock()  # guards _last

    def report(
        self, call: ToolCall, progress: float, total: float | None, message: str | None
    ) -> None:
        """Pass the update on if `progress` exceeds the last one; log the callback's errors."""
        with self._lock:
            if self._last is not None and not progress > self._last:
                return
            self._last = progress
        try:
            self._callback(ToolProgress(call, progress, total, message))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # a callback's failure never reaches the body
            logger.exception("toolreg: progress callback %r raised", self._callback)
