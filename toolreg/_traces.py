"""Call hooks at work: starting a call's traces, running a body inside them, ending them.

A trace is user code on the call path, so every step here is guarded: any exception from a hook
or a trace, a `BaseException` such as `GeneratorExit` included, is logged and never changes the
call (its outcome stands and the observers see it once). Only an interrupt (`KeyboardInterrupt`,
`SystemExit`) goes on, to the caller, which makes it the call's (section 3.6 of the contract).
A registry with no call hooks pays one empty-tuple check per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._hooks import CallHook, CallTrace
from ._interrupts import INTERRUPTS
from ._logger import logger

if TYPE_CHECKING:
    from ._cancel import CancelToken
    from ._results import ToolCall, ToolResult

__all__ = ["end_traces", "notify_traces", "run_inside", "start_traces"]


def start_traces(
    hooks: tuple[CallHook, ...], call: ToolCall, token: CancelToken
) -> tuple[CallTrace, ...]:
    """Each hook's trace of a call entering now (the hooks that returned None are left out)."""
    traces: list[CallTrace] = []
    for hook in hooks:
        try:
            trace = hook(call, token)
        except INTERRUPTS:
            raise
        except BaseException:
            logger.exception("toolreg: call hook %r raised", hook)
            continue
        if trace is not None:
            traces.append(trace)
    return tuple(traces)


def run_inside(traces: tuple[CallTrace, ...], ctx: Any, body: Callable[[], Any]) -> Any:
    """`body()` on its thread inside each trace's `body(ctx)` scope, entered in order.

    Plain calls rather than `contextlib` machinery: this runs around every traced body. A
    scope that fails to enter or to leave is logged; the body's own outcome always stands.
    """
    entered: list[tuple[Any, CallTrace]] = []
    for trace in traces:
        make = getattr(trace, "body", None)
        if make is None:
            continue
        try:
            scope = make(ctx)
            scope.__enter__()
        except INTERRUPTS:
            raise
        except BaseException:
            logger.exception("toolreg: call trace %r failed to enter a body", trace)
            continue
        entered.append((scope, trace))
    try:
        return body()
    finally:
        for scope, trace in reversed(entered):
            try:
                scope.__exit__(None, None, None)
            except INTERRUPTS:
                raise
            except BaseException:
                logger.exception("toolreg: call trace %r failed to leave a body", trace)


def notify_traces(traces: tuple[CallTrace, ...], method: str, *args: Any) -> None:
    """Call `trace.<method>(*args)` on each trace that has it; log what raises."""
    for trace in traces:
        handler: Callable[..., object] | None = getattr(trace, method, None)
        if handler is None:
            continue
        try:
            handler(*args)
        except INTERRUPTS:
            raise
        except BaseException:
            logger.exception("toolreg: call trace %r raised in %s()", trace, method)


def end_traces(traces: tuple[CallTrace, ...], result: ToolResult[Any]) -> None:
    """Each trace sees the final result (before the observers do)."""
    notify_traces(traces, "end", result)
