"""The results the stages of a call make: a body's success, a failure, a cancellation.

Both the body stage (`_body.run_body`) and the other stages (`_pipeline`) make them, so they
live below both. A success is checked (the output schema) and rendered here; what a success
becomes when cancellation wins is `aborted`: `ABORTED` once a body started, else
`ABORTED_BEFORE_DISPATCH`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._interrupts import INTERRUPTS
from ._results import (
    ErrorCode,
    ToolCall,
    ToolError,
    ToolResult,
    failure_content,
    make_result,
    render_content,
)
from ._text import describe

if TYPE_CHECKING:
    from ._call import CallState

__all__ = ["aborted", "failure", "success"]

_ABORTED = ErrorCode.ABORTED
_BEFORE = ErrorCode.ABORTED_BEFORE_DISPATCH
_TOOL_ERROR = ErrorCode.TOOL_ERROR
_NO_CONTEXTS: tuple[Any, ...] = ()


def aborted(state: CallState, contexts: tuple[Any, ...] = _NO_CONTEXTS) -> ToolResult[Any]:
    """The call's cancellation: `ABORTED` if a body of it started, else
    `ABORTED_BEFORE_DISPATCH`, keeping `contexts`."""
    if state.dispatched:
        return failure(state.call, _ABORTED, "tool call aborted", contexts)
    return failure(state.call, _BEFORE, "tool call aborted before dispatch", contexts)


def failure(
    call: ToolCall,
    code: ErrorCode,
    message: str,
    contexts: tuple[Any, ...] = _NO_CONTEXTS,
    exception: BaseException | None = None,
) -> ToolResult[Any]:
    """A failed result of `call` (not final yet: finalizing stamps it)."""
    error = ToolError(code, message, exception)
    return make_result(call, False, failure_content(code, message), None, error, contexts)


def success(state: CallState, value: Any, live: bool, contexts: tuple[Any, ...]) -> ToolResult[Any]:
    """What a body that returned `value` comes to: its success, checked against the tool's
    output schema and rendered; a failure if either fails; its cancellation if the caller's
    token was live at entry and the body's was not (`live`) when it returned."""
    # `live`: the body's token as the body's thread saw it on return. A caller that cancelled
    # after that is still caught by the recheck after the wrappers.
    if state.live and not live:
        return aborted(state, contexts)
    call = state.call
    validator = state.entry.output_validator
    if validator is not None:
        try:
            validator(value)
        except Exception as exc:
            problem = str(getattr(exc, "message", None) or describe(exc))
            message = f"the value does not match the output schema: {problem}"
            return failure(call, _TOOL_ERROR, message, contexts)
    render = state.tool.render
    try:
        # A str without a render function is its own content (render_content's first case).
        content = value if render is None and type(value) is str else render_content(value, render)
    except INTERRUPTS as exc:
        state.interrupt(exc)
        return aborted(state, contexts)
    except BaseException as exc:
        message = f"cannot render a {type(value).__name__} result: {describe(exc)}"
        return failure(call, _TOOL_ERROR, message, contexts, exc)
    result = make_result(call, True, content, value, None, contexts)
    if state.hooks.results_unseen:
        state.own_result = result  # no user code will see it before it is final
    return result
