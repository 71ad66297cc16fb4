"""Calls and their results: `ToolCall`, `ToolResult`, `ToolError`, `ErrorCode`."""

from __future__ import annotations

import enum
import itertools
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from ._record import record

__all__ = ["CallTimeline", "ErrorCode", "ToolCall", "ToolError", "ToolResult"]

if TYPE_CHECKING:  # a bare `ToolResult` means ToolResult[Any] for type checkers (PEP 696)
    import datetime

    from typing_extensions import TypeVar as _DefaultTypeVar

    T = _DefaultTypeVar("T", default=Any)
else:  # at run time a plain TypeVar does; typing_extensions costs milliseconds to import
    T = TypeVar("T")


class ErrorCode(str, enum.Enum):
    """Why a call failed. Members compare equal to their names: `ErrorCode.ABORTED == "ABORTED"`.

    * `ABORTED`: cancelled after a body of this call started.
    * `ABORTED_BEFORE_DISPATCH`: cancelled before any body started (none will).
    * `TOOL_TIMEOUT`: the tool's own deadline (`TimeoutPolicy`) fired first.
    * `UNKNOWN_TOOL`, `INVALID_ARGS`: entry checks failed; nothing ran.
    * `DENIED`: a pre-execute hook, the approver or a guard said no.
    * `TOOL_ERROR`: the body raised (or its value could not be rendered).
    * `HOOK_ERROR`: a hook or wrapper raised or returned something its stage does not allow.
    """

    ABORTED = "ABORTED"
    ABORTED_BEFORE_DISPATCH = "ABORTED_BEFORE_DISPATCH"
    TOOL_TIMEOUT = "TOOL_TIMEOUT"
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    INVALID_ARGS = "INVALID_ARGS"
    DENIED = "DENIED"
    TOOL_ERROR = "TOOL_ERROR"
    HOOK_ERROR = "HOOK_ERROR"

    def __str__(self) -> str:
        return self.value


_call_ids = itertools.count(1)
_call_id_prefix = ""


def _new_call_id_prefix() -> None:
    # Random per process (and again after fork), so ids from several processes do not collide.
    global _call_id_prefix
    _call_id_prefix = "call_" + os.urandom(6).hex() + "_"


_new_call_id_prefix()
os.register_at_fork(after_in_child=_new_call_id_prefix)


def new_call_id() -> str:
    """A fresh call id, unique across the processes that write one log."""
    return f"{_call_id_prefix}{next(_call_ids)}"


@record(frozen=True)
class ToolCall:
    """A request to run the tool `name` with `arguments`.

    `arguments=None` means `{}`; `call_id=None` generates a fresh id. Construction never checks
    the arguments: `execute` does, and reports bad ones as an `INVALID_ARGS` result. The call a
    result carries (`result.call`) holds the validated, read-only copy of the arguments.
    """

    name: str
    arguments: Mapping[str, Any] | None = None
    call_id: str = ""

    def __init__(
        self, name: str, arguments: Mapping[str, Any] | None = None, call_id: str | None = None
    ) -> None:
        # One dict update instead of three frozen setattr calls: this is a hot path.
        self.__dict__.update(
            name=name,
            arguments={} if arguments is None else arguments,
            call_id=new_call_id() if call_id is None else call_id,
        )

    def __repr__(self) -> str:
        return f"ToolCall({self.name!r}, {self.arguments!r}, call_id={self.call_id!r})"


def frozen_call(name: str, arguments: Mapping[str, Any] | None, call_id: str) -> ToolCall:
    """A ToolCall holding exactly `arguments` (None when they could not be materialized)."""
    call = _new_object(ToolCall)
    fields = call.__dict__  # item by item: no keyword dict to build
    fields["name"] = name
    fields["arguments"] = arguments
    fields["call_id"] = call_id
    return call


@record(frozen=True)
class ToolError:
    """What went wrong: an `ErrorCode`, a message, and the exception if one was raised."""

    code: ErrorCode
    message: str
    exception: BaseException | None = None

    def __init__(
        self, code: ErrorCode, message: str, exception: BaseException | None = None
    ) -> None:
        self.__dict__.update(code=code, message=message, exception=exception)


def _first_encode(value: object) -> str:
    # json is imported by the first value that needs it, not by `import toolreg`; from then on
    # `_encode` is the encoder's own method. Two threads racing here each build an equal encoder.
    global _encode
    import json

    _encode = json.JSONEncoder(ensure_ascii=False).encode
    return _encode(value)


_encode: Callable[[object], str] = _first_encode

_FAILURE_CONTENT = {
    ErrorCode.ABORTED: "Error: tool call aborted",
    ErrorCode.ABORTED_BEFORE_DISPATCH: "Error: tool call aborted before dispatch",
}


def render_content(value: object, render: Callable[[Any], str] | None = None) -> str:
    """The model-visible text of a value: a str as is, else `render(value)` or JSON."""
    if render is not None:
        text = render(value)
        if not isinstance(text, str):
            raise TypeError(f"render() returned {type(text).__name__}, not str")
        return text
    kind = type(value)
    if kind is str:
        return value  # type: ignore[return-value]
    if kind is int:
        return int.__repr__(value)
    if isinstance(value, str):
        return str(value)
    return _encode(value)


def failure_content(code: ErrorCode, message: str) -> str:
    """The model-visible text of a failure."""
    return _FAILURE_CONTENT.get(code) or f"Error: {message}"


class CallTimeline(NamedTuple):
    """When the moments of one call happened (frozen).

    `entered` is the wall-clock time of entry (POSIX seconds, UTC; `entered_at` gives it as a
    `datetime`). The others are seconds after entry (monotonic clock), or None when the moment
    did not happen: `dispatched` (a body started; the first one, if a wrapper retried),
    `cancelled` (the token the body observes, or the call's own token, was first cancelled),
    `settled` (the body returned or raised; the last one), `finished` (the final result was
    materialized; it equals the result's `duration`). A body still running long after
    `cancelled` is a call that did not stop when asked.
    """

    entered: float
    dispatched: float | None
    cancelled: float | None
    settled: float | None
    finished: float

    @property
    def entered_at(self) -> datetime.datetime:
        """`entered` as an aware UTC `datetime`."""
        import datetime  # only this property needs it: `import toolreg` does not pay for it

        return datetime.datetime.fromtimestamp(self.entered, datetime.timezone.utc)


@record(frozen=True)
class ToolResult(Generic[T]):
    """The final outcome of one call (a frozen dataclass).

    `ok` tells success from failure; `value` is the body's return value (success only, not
    frozen); `content` the model-visible text; `error` a `ToolError` on failure; `contexts` what
    the body deferred with `ctx.defer_context`; `dispatched` whether a body of this call started;
    `duration` the seconds from entry to result; `timeline` when each moment of the call
    happened (a `CallTimeline`). The registry sets `call`, `dispatched`, `duration` and
    `timeline` on the final result, whatever a hook or wrapper returned.

    Hooks and wrappers build results with `ToolResult.success()` / `ToolResult.failure()`, or
    derive one with `dataclasses.replace`.
    """

    call: ToolCall
    ok: bool
    content: str
    value: T | None = None
    error: ToolError | None = None
    contexts: tuple[Any, ...] = ()
    dispatched: bool = False
    duration: float = 0.0
    timeline: CallTimeline | None = None

    def __init__(
        self,
        call: ToolCall,
        ok: bool,
        content: str,
        value: T | None = None,
        error: ToolError | None = None,
        contexts: tuple[Any, ...] = (),
        dispatched: bool = False,
        duration: float = 0.0,
        timeline: CallTimeline | None = None,
    ) -> None:
        fields = self.__dict__  # item by item: no keyword dict to build
        fields["call"] = call
        fields["ok"] = ok
        fields["content"] = content
        fields["value"] = value
        fields["error"] = error
        fields["contexts"] = contexts
        fields["dispatched"] = dispatched
        fields["duration"] = duration
        fields["timeline"] = timeline

    @classmethod
    def success(cls, call: ToolCall, value: T, contexts: tuple[Any, ...] = ()) -> ToolResult[T]:
        """A successful result; `content` is the value as text (a str as is, else JSON)."""
        return cls(call, True, render_content(value), value, None, tuple(contexts))

    @classmethod
    def failure(
        cls,
        call: ToolCall,
        code: ErrorCode | str,
        message: str,
        contexts: tuple[Any, ...] = (),
        exception: BaseException | None = None,
    ) -> ToolResult[Any]:
        """A failed result with `error=ToolError(code, message)` and content `"Error: ..."`."""
        code = ErrorCode(code)
        content = failure_content(code, message)
        return cls(call, False, content, None, ToolError(code, message, exception), tuple(contexts))

    @property
    def code(self) -> ErrorCode | None:
        """The error code, or None on success."""
        return None if self.error is None else self.error.code

    def __repr__(self) -> str:
        state = "ok" if self.ok else f"error code={self.code!s}"
        return (
            f"<ToolResult {state} name={self.call.name!r} call_id={self.call.call_id!r}"
            f" dispatched={self.dispatched} duration={self.duration:.6f}>"
        )


_new_object = object.__new__


def make_result(
    call: ToolCall,
    ok: bool,
    content: str,
    value: Any,
    error: ToolError | None,
    contexts: tuple[Any, ...],
    dispatched: bool = False,
    duration: float = 0.0,
    timeline: CallTimeline | None = None,
) -> ToolResult[Any]:
    """A `ToolResult` without a call of `__init__` (the hot path)."""
    result: ToolResult[Any] = _new_object(ToolResult)
    fields = result.__dict__  # item by item: no keyword dict to build
    fields["call"] = call
    fields["ok"] = ok
    fields["content"] = content
    fields["value"] = value
    fields["error"] = error
    fields["contexts"] = contexts
    fields["dispatched"] = dispatched
    fields["duration"] = duration
    fields["timeline"] = timeline
    return result


def finish_result(
    result: ToolResult[Any], dispatched: bool, duration: float, timeline: CallTimeline
) -> None:
    """Set what the registry owns on a result no user code has seen yet (in place)."""
    fields = result.__dict__  # item by item, as make_result: no keyword dict to build
    fields["dispatched"] = dispatched
    fields["duration"] = duration
    fields["timeline"] = timeline
