"""Around-dispatch policies: `TimeoutPolicy` and `RetryPolicy`.

Both are plain around wrappers (`registry.add_around(policy)`), and both keep the cancellation
contract: they never abandon a body (every `proceed()` joins the body it starts), they never
detach the caller (the registry re-fuses the caller's token before every body), and they never
retry or reclassify a cancellation that is not theirs.

Composition follows registration order (the first registered is the outermost)::

    registry.add_around(RetryPolicy(attempts=3))
    registry.add_around(TimeoutPolicy())     # inside the retry: each attempt has its own timeout

    registry.add_around(TimeoutPolicy())
    registry.add_around(RetryPolicy(attempts=3))  # inside the timeout: one budget for all tries
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _validate
from ._cancel import CancelSource, CancelToken, close_token, deadline_token, timed_out
from ._hooks import Dispatch, Proceed
from ._results import ErrorCode, ToolResult

if TYPE_CHECKING:
    from ._tools import Tool

__all__ = ["RetryPolicy", "TimeoutPolicy"]

_CANCELLATIONS = (ErrorCode.ABORTED, ErrorCode.ABORTED_BEFORE_DISPATCH)


class TimeoutPolicy:
    """Give each call of a tool with a `timeout` a deadline; report `TOOL_TIMEOUT` when it fires.

    For a tool with `timeout` (or, with `default=`, any tool), it replaces `dispatch.token` with
    `deadline(dispatch.token, timeout, code)`, calls `proceed()`, then always restores the
    previous token and closes the deadline, so nothing stays registered on the caller's token
    and a timer that fires after `proceed()` returned changes nothing.

    The result becomes `TOOL_TIMEOUT` (content `"Error: tool call timed out after <t>s"`) only
    when this deadline's own timer fired (`timed_out`) before the call's token
    (`dispatch.call_token`: the caller's, plus `close()` and Ctrl-C) was cancelled: a caller
    that cancelled first gets `ABORTED`, even under an outer wrapper that put an unrelated
    token in `dispatch.token` and even if the deadline comes due while the body cleans up; an
    outer deadline reads as plain cancellation; a failure the body reported itself stays. A
    body that ignores the deadline is still joined: its `TOOL_TIMEOUT` comes back only once it
    has returned.
    """

    # The registry's own policy (`_hooks.OwnPolicy`): it hands on the result it got, or a new
    # one, and keeps neither; alone around the body, the registry runs its deadline with no
    # chain (`HookSet.deadline`).
    _keeps_no_result = True
    _runs_as_deadline = True

    def __init__(self, code: str = "TOOL_TIMEOUT", *, default: float | None = None) -> None:
        if not isinstance(code, str) or not code:
            raise TypeError("code must be a non-empty str")
        if default is not None:
            _validate.seconds(default, "default", unlimited="pass None for no default timeout")
        self.code = code
        self.default = default

    def __call__(self, dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        return self._run_in_chain(dispatch, proceed)

    def _run_in_chain(
        self, dispatch: Dispatch, proceed: Callable[..., ToolResult[Any]], *args: Any
    ) -> ToolResult[Any]:
        """`__call__` with the rest of the chain as `proceed(*args)`: how the registry runs it,
        with no `proceed()` made per call (`HookSet.chain_runs`)."""
        tool = dispatch.tool
        seconds = self._seconds(tool)
        if seconds is None:
            return proceed(*args)
        previous = dispatch.token
        call_token = dispatch.call_token
        # The deadline also follows the call's token, so a caller who cancels first cancels it
        # (with the caller's reason, never `timed_out`) even when an outer wrapper replaced
        # `dispatch.token` with a token the caller does not reach.
        follows = None if previous is call_token else CancelSource(previous, call_token)
        parent = previous if follows is None else follows.token
        budget = deadline_token(parent, seconds, self.code)
        dispatch.token = budget
        try:
            result = self._timed(tool, budget, proceed(*args))
        finally:
            close_token(budget)  # disarm first: from here on the timer cannot fire
            if follows is not None:
                follows.close()
            dispatch.token = previous
        return result

    # The deadline as data (`HookSet.deadline`): what `_run_in_chain` does around the chain,
    # done by the registry around the body, the deadline being the body's token.

    def _open_deadline(self, tool: Tool, parent: CancelToken) -> CancelToken | None:
        """The deadline of a call of `tool`: a lazy child of `parent`; None if it has none."""
        seconds = self._seconds(tool)
        return None if seconds is None else deadline_token(parent, seconds, self.code)

    def _close_deadline(
        self, tool: Tool, budget: CancelToken, result: ToolResult[Any]
    ) -> ToolResult[Any]:
        """After the body: `result`, or `TOOL_TIMEOUT` if `budget` is what cancelled it;
        `budget` closed (after that read: a closed lazy deadline is not resolved again)."""
        try:
            return self._timed(tool, budget, result)
        finally:
            close_token(budget)

    def _seconds(self, tool: Tool) -> float | None:
        """The deadline's length for `tool`, or None for no deadline. Both durations were
        validated already (the tool's when it was made, `default` here)."""
        seconds = tool.timeout
        if seconds is None:
            seconds = self.default
            if seconds is None:
                return None
        return float(seconds)

    def _timed(self, tool: Tool, budget: CancelToken, result: ToolResult[Any]) -> ToolResult[Any]:
        """`result`, or `TOOL_TIMEOUT` if it is the cancellation of `budget`'s own due time: to
        be read before closing it (a closed lazy deadline is not resolved again; a token below
        it that the body observed may have inherited its due time without marking it)."""
        error = result.error
        if error is None or error.code not in _CANCELLATIONS or not timed_out(budget):
            return result
        seconds = self._seconds(tool)
        assert seconds is not None  # it made the deadline
        message = f"tool call timed out after {format(seconds, 'g')}s"
        return ToolResult.failure(result.call, ErrorCode.TOOL_TIMEOUT, message, result.contexts)

    def __repr__(self) -> str:
        return f"TimeoutPolicy(code={self.code!r}, default={self.default!r})"


Backoff = float | Callable[[int], float]
Wait = Callable[[CancelToken, float], bool]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _wait_on(token: CancelToken, seconds: float) -> bool:
    return token.wait(seconds)


class RetryPolicy:
    """Re-run `proceed()` when the body raised one of `retry_on`.

    `attempts` counts all tries. Between tries it waits `backoff * 2**(n-1)` seconds before retry
    `n` (or `backoff(n)` if `backoff` is callable) on `dispatch.token` fused with the call's
    token (the caller's, plus `close()` and Ctrl-C), so a cancellation ends the wait at once,
    and it never retries once either is cancelled. Only `TOOL_ERROR` results whose exception is
    an instance of `retry_on` are retried: never `ABORTED`, `ABORTED_BEFORE_DISPATCH`,
    `TOOL_TIMEOUT`, denials or hook errors. The last attempt's result stands. Every attempt's
    body is joined before the next starts.

    An `attempts` that is not an int, or a `backoff` that is neither a number nor callable (a
    `bool` is neither), raises `TypeError`; `attempts < 1` or a negative, NaN or infinite
    `backoff` raises `ValueError`.

    `wait(token, seconds) -> bool` is how the backoff waits (default: `token.wait(seconds)`):
    block until `token` is cancelled or `seconds` passed, and return True if it was cancelled.
    It runs on the thread running the call, like `tenacity`'s `sleep=`; tests pass one that
    records the delays and returns at once.
    """

    # The registry's own policy (`_hooks.OwnPolicy`): it hands on the last attempt's result
    # and keeps none; it has no deadline to offer.
    _keeps_no_result = True
    _runs_as_deadline = False

    def __init__(
        self,
        attempts: int = 3,
        backoff: Backoff = 0.1,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] = (Exception,),
        *,
        wait: Wait = _wait_on,
    ) -> None:
        _validate.count(attempts, "attempts")
        if not callable(backoff):
            if not _is_number(backoff):
                raise TypeError(f"backoff must be seconds or a callable, got {backoff!r}")
            _validate.seconds(backoff, "backoff", allow_zero=True)
        if not callable(wait):
            raise TypeError(f"wait must be callable, got {type(wait).__name__}")
        kinds: tuple[object, ...] = (retry_on,) if isinstance(retry_on, type) else tuple(retry_on)
        if not all(isinstance(kind, type) and issubclass(kind, BaseException) for kind in kinds):
            raise TypeError("retry_on must be an exception type or a tuple of them")
        self.attempts = attempts
        self.backoff = backoff
        self.retry_on: tuple[type[BaseException], ...] = kinds  # type: ignore[assignment]
        self.wait = wait

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1 for the second attempt).

        Capped at `threading.TIMEOUT_MAX`; a callable returning a negative number or NaN raises
        `ValueError` (the call then fails as a `HOOK_ERROR`).
        """
        if callable(self.backoff):
            seconds = self.backoff(retry)
            # `seconds != seconds` is NaN; unlike math.isnan it cannot overflow on a huge int.
            if not _is_number(seconds) or seconds != seconds or seconds < 0:
                raise ValueError(f"backoff({retry}) returned {seconds!r}, not seconds >= 0")
        else:
            seconds = float(self.backoff) * 2.0 ** min(retry - 1, 1023)
        return float(min(seconds, threading.TIMEOUT_MAX))  # compared exactly, even a huge int

    def __call__(self, dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        return self._run_in_chain(dispatch, proceed)

    def _run_in_chain(
        self, dispatch: Dispatch, proceed: Callable[..., ToolResult[Any]], *args: Any
    ) -> ToolResult[Any]:
        """`__call__` with the rest of the chain as `proceed(*args)` (`HookSet.chain_runs`)."""
        attempt = 1
        result = proceed(*args)
        while attempt < self.attempts and self._retryable(result):
            # The call's token, not just the caller's: close() and Ctrl-C end the wait too.
            with CancelSource(dispatch.token, dispatch.call_token) as waiter:
                if waiter.token.cancelled or self.wait(waiter.token, self.delay(attempt)):
                    return result
            attempt += 1
            result = proceed(*args)
        return result

    def _retryable(self, result: ToolResult[Any]) -> bool:
        error = result.error
        return (
            error is not None
            and error.code == ErrorCode.TOOL_ERROR
            and isinstance(error.exception, self.retry_on)
        )

    def __repr__(self) -> str:
        return (
            f"RetryPolicy(attempts={self.attempts}, backoff={self.backoff!r}, "
            f"retry_on={self.retry_on!r})"
        )
