"""toolreg: run tool calls with cooperative, quiescent cancellation."""

from ._cancel import Cancelled as Cancelled
from ._cancel import CancelSource as CancelSource
from ._cancel import CancelToken as CancelToken
from ._cancel import Registration as Registration
from ._cancel import TimeoutReason as TimeoutReason
from ._cancel import deadline as deadline
from ._cancel import timeout_of as timeout_of

__all__ = [
    "CancelSource",
    "CancelToken",
    "Cancelled",
    "Registration",
    "TimeoutReason",
    "deadline",
    "timeout_of",
]
