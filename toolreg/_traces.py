"""Call hooks at work: starting a call's traces, running a body inside them, ending them.

A trace is user code on the call path, so every step here is guarded: an exception from a hook
or a trace is logged and never changes the call, and a registry with no call hooks pays one
empty-tuple check per call.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ._hooks import CallHook, CallTrace

if TYPE_CHECKING:
    from ._cancel import CancelToken
    from ._results import ToolCall, ToolResult

__all__ = ["end_traces", "inside_traces", "notify_traces", "start_traces"]

logger = logging.getLogger("toolreg")


def start_traces(
    hooks: tuple[CallHook, ...], call: ToolCall, token: CancelToken
) -> tuple[CallTrace, ...]:
    """Each hook's trace of a call entering now (the hooks that returned None are left out)."""
    traces: list[CallTrace] = []
    for hook in hooks:
        try:
            trace = hook(call, token)
        except Exception:
            logger.exception("toolreg: call hook %r raised", hook)
            continue
        if trace is not None:
            traces.append(trace)
    return tuple(traces)


@contextlib.contextmanager
def inside_traces(traces: tuple[CallTrace, ...], ctx: Any) -> Iterator[None]:
    """Around a body, on its thread: each trace's `body(ctx)` context, entered in order."""
    with contextlib.ExitStack() as stack:
        for trace in traces:
            body = getattr(trace, "body", None)
            if body is None:
                continue
            try:
                stack.enter_context(_guarded(body(ctx), trace))
            except Exception:
                logger.exception("toolreg: call trace %r failed to enter a body", trace)
        yield


@contextlib.contextmanager
def _guarded(scope: contextlib.AbstractContextManager[Any], trace: object) -> Iterator[None]:
    # A trace's exit that raises must not replace the body's own outcome.
    scope.__enter__()
    try:
        yield
    finally:
        try:
            scope.__exit__(None, None, None)
        except Exception:
            logger.exception("toolreg: call trace %r failed to leave a body", trace)


def notify_traces(traces: tuple[CallTrace, ...], method: str, *args: Any) -> None:
    """Call `trace.<method>(*args)` on each trace that has it; log what raises."""
    for trace in traces:
        handler: Callable[..., object] | None = getattr(trace, method, None)
        if handler is None:
            continue
        try:
            handler(*args)
        except Exception:
            logger.exception("toolreg: call trace %r raised in %s()", trace, method)


def end_traces(traces: tuple[CallTrace, ...], result: ToolResult[Any]) -> None:
    """Each trace sees the final result (before the observers do)."""
    notify_traces(traces, "end", result)
