"""Tracing with OpenTelemetry (extra `toolreg[otel]`): one span for every tool call.

`instrument(registry)` gives each call of `registry` a span named `execute_tool <name>`, from
the call's entry to its final result, shaped by the OpenTelemetry GenAI semantic conventions
for tool execution (docs/contract.md section 15). Importing `toolreg` never imports this module
or OpenTelemetry.

Where the span sits. It is a child of the span that was current where the call was entered:
the thread calling `execute` or `execute_batch`, or the task awaiting `toolreg.aio`. Around
each start of the body it is the current span on whatever thread runs the body (a pool worker
for a sync body, the registry's loop thread for an `async def` body, the parent body's thread
for a nested call), so spans the body opens and the spans of its nested calls are its
children. Every call gets one: entry failures, denials and `ABORTED_BEFORE_DISPATCH` included.

What it carries.

* Attributes: `gen_ai.operation.name="execute_tool"`, `gen_ai.tool.name`,
  `gen_ai.tool.call.id`, `gen_ai.tool.description` (when the tool has one),
  `gen_ai.tool.type="function"`, `toolreg.dispatched` (a body started); on a failure,
  `toolreg.code` and `error.type` (both the `ErrorCode`), and status ERROR described by the
  error's message. A success leaves the status unset.
* Events: `toolreg.cancelled` (`toolreg.reason`: the reason's `str`) when the call's token was
  cancelled (by the caller, `close()`, Ctrl-C or the awaiting task) or a wrapper cancelled the
  body's token for a reason that is not a deadline; `toolreg.deadline` (`toolreg.reason`, and
  `toolreg.timeout` in seconds when known) when a wrapper's deadline fired (`TimeoutPolicy`);
  `toolreg.overdue` when the body had not settled `overdue_after` seconds after it was
  cancelled (the moment the registry logs its warning).
* Times: the span ends when the final result was materialized (`result.timeline`: `entered`
  plus `finished`). The first cancellation is stamped with `timeline.cancelled`; a cause the
  timeline does not time (say the caller cancelling after a deadline already fired) is stamped
  when toolreg saw it (the end of that body run, or the end of the call), never before the
  first. Every event lies within the span. The span starts when the registry hands the call to
  its call hooks, microseconds after entry.

How it runs. The span is started by the call hook, in the context where the call was entered;
the body scope attaches the span's context on the body's thread and, on the way out, reads the
body's token (no callback is registered on any token, so lazy tokens stay lazy). Events are
added at the end, from moments recorded on the way, so only the thread that ends the call
touches the span after it started, and an exporter sees everything when the span ends, as it
would anyway. A span the sampler drops is still made current in the body (downstream spans stay
consistently unsampled), but nothing is recorded on it.

Calls that never started. A batch or awaited call that a cancellation left unstarted goes
through the call hooks like any other, so its span is a child of the span current where it was
entered (the batch caller's, or the awaiting task's), has no body scope, and ends with its
`ABORTED_BEFORE_DISPATCH`. The call hook is all there is: no observer is installed, so a tracer
that raises is logged once and that call simply has no span.

Example::

    from opentelemetry.sdk.trace import TracerProvider
    import toolreg.otel

    provider = TracerProvider()          # with your exporter's span processor
    with toolreg.otel.instrument(registry, tracer_provider=provider):
        registry.execute("search", {"q": "x"})   # one span: "execute_tool search"
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextvars import Token
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "toolreg.otel needs the OpenTelemetry API: pip install 'toolreg-quiescent[otel]'"
    ) from exc

import toolreg

from . import ToolRegistry  # the public class, through the package (it loads with it)
from ._cancel import CancelToken, Registration, timeout_of
from ._results import ErrorCode, ToolCall, ToolResult
from ._text import safe_str

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from ._body import ToolContext
    from ._tools import Tool

__all__ = ["instrument"]

_OPERATION = "execute_tool"
_INTERNAL = SpanKind.INTERNAL
_CANCELLED = "toolreg.cancelled"
_DEADLINE = "toolreg.deadline"
_OVERDUE = "toolreg.overdue"

# Guards every _CallSpan's _causes, _call_seen, _last_exit and _overdue on the cancellation path
# (bodies of one call may end on several threads at once: a wrapper may proceed() from another
# thread; the overdue warning comes from a timer's callback thread). Held only around toolreg's
# own bookkeeping, never around user code or anything that can call back into it.
_CAUSES_LOCK = threading.Lock()


def instrument(
    registry: ToolRegistry, tracer_provider: TracerProvider | None = None
) -> Registration:
    """Trace every call of `registry` with one OpenTelemetry span; see the module docstring.

    `tracer_provider` defaults to the global one (`opentelemetry.trace.set_tracer_provider`;
    spans are dropped until one is set). Calls entered after this returns are traced; calls
    already in flight are not. Instrumenting a registry twice gives each call two spans.

    Returns a `Registration`: `remove()` stops new calls from being traced (calls in flight
    keep their spans and end them) and returns True the first time; it is also a context
    manager. Thread-safe. A tracer that raises is logged on the `toolreg` logger and never
    changes a call.
    """
    if not isinstance(registry, ToolRegistry):
        raise TypeError(f"instrument() takes a ToolRegistry, got {type(registry).__name__}")
    if tracer_provider is not None and not callable(getattr(tracer_provider, "get_tracer", None)):
        raise TypeError(
            "tracer_provider must be an OpenTelemetry TracerProvider (or None for the global "
            f"one), got {type(tracer_provider).__name__}"
        )
    tracer = trace.get_tracer(__name__, _own_version(), tracer_provider)
    return registry.add_call_hook(_Tracing(tracer, registry.get).start)


class _Tracing:
    """One instrumentation: its tracer, and the call hook that starts each call's span."""

    def __init__(self, tracer: Tracer, lookup: Callable[[str], Tool | None]) -> None:
        self.tracer = tracer
        self.lookup = lookup  # registry.get: the tool (for its description), or None

    def start(self, call: ToolCall, token: CancelToken) -> _CallSpan:
        """The call hook: start the call's span, a child of the current one."""
        parent = otel_context.get_current()
        started = time.time_ns()
        span = self.tracer.start_span(
            _span_name(call),
            parent,
            _INTERNAL,
            self._attributes(call),
            start_time=started,
        )
        return _CallSpan(span, parent, token, started)

    def _attributes(self, call: ToolCall) -> dict[str, Any]:
        name = _text(call.name)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": _OPERATION,
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": _text(call.call_id),
            "gen_ai.tool.type": "function",
        }
        if type(call.name) is str:
            tool = self.lookup(name)
            if tool is not None and tool.description:
                attributes["gen_ai.tool.description"] = tool.description
        return attributes


class _Cause:
    """Something that stopped (or asked to stop) the call: a cancellation or a deadline."""

    __slots__ = ("event", "reason", "seen", "timeout")

    def __init__(self, event: str, reason: object, seen: int, timeout: float | None = None):
        self.event = event
        self.reason = reason
        self.seen = seen  # time.time_ns() when toolreg first saw it
        self.timeout = timeout


class _CallSpan:
    """The trace of one call (`CallTrace`): its span, and what happened to it on the way.

    Written by the threads of the call only: its stage thread (where the hook and `end` run),
    each body's thread (its scope) and the overdue warning's thread. Only the stage thread
    touches the span: it starts it, and it records everything and ends it once every body of
    the call has settled.
    """

    __slots__ = (
        "_call_seen",
        "_causes",
        "_last_exit",
        "_overdue",
        "_parent",
        "_recording",
        "_span",
        "_started",
        "_token",
    )

    def __init__(self, span: Span, parent: Context, token: CancelToken, started: int) -> None:
        self._span = span
        self._parent = parent
        self._token = token  # the call's own token
        self._started = started
        self._recording = span.is_recording()
        # Made on first use (most calls are never cancelled); see _CAUSES_LOCK.
        self._causes: list[_Cause] | None = None  # in the order the body runs saw them
        self._last_exit: _Cause | None = None  # what the latest body run ended under
        self._call_seen: int | None = None  # when a body run first saw the call's token cancelled
        self._overdue: list[int] | None = None  # when the overdue warnings came

    def body(self, ctx: ToolContext) -> _BodyScope:
        """Around one start of the body, on its thread: the span is current there."""
        return _BodyScope(self, ctx)

    def overdue(self, ctx: ToolContext) -> None:
        now = time.time_ns()
        with _CAUSES_LOCK:
            if self._overdue is None:
                self._overdue = []
            self._overdue.append(now)

    def end(self, result: ToolResult[Any]) -> None:
        span = self._span
        if not self._recording:
            span.end()
            return
        timeline = result.timeline
        started = self._started
        if timeline is None:  # never for a final result
            ended = max(started, time.time_ns())
            _finish(span, result, None, None, started, ended)
            return
        entered = _ns(timeline.entered)
        ended = max(started, entered + _ns(timeline.finished))
        first = self._causes_at_end(result)
        exact = None if timeline.cancelled is None else entered + _ns(timeline.cancelled)
        _finish(span, result, (first, exact), self._causes, started, ended, self._overdue)

    def _causes_at_end(self, result: ToolResult[Any]) -> _Cause | None:
        """Add the causes only the end can see; return the one `timeline.cancelled` times.

        The timeline's moment is the first cancellation of the call's token or of the token
        the last body run observed. That body token follows the call's token, so when it was
        cancelled its first cause is the earliest one: the cause the last body run ended
        under. Without one, it is a deadline that fired while the body waited for a worker
        (`TOOL_TIMEOUT`), else the call's own cancellation.
        """
        token = self._token
        timed_out = result.code is ErrorCode.TOOL_TIMEOUT
        if not (timed_out or token.cancelled):
            return self._last_exit  # the common case: nothing more to add
        now = time.time_ns()
        with _CAUSES_LOCK:
            if self._causes is None:
                self._causes = []
            causes = self._causes
            first = self._last_exit
            if timed_out and not any(cause.event is _DEADLINE for cause in causes):
                assert result.error is not None
                fired = _Cause(_DEADLINE, result.error.message, now)
                causes.append(fired)
                if first is None:
                    first = fired
            if token.cancelled:
                own = _known(causes, token.reason)
                if own is None:
                    own = _Cause(_CANCELLED, token.reason, self._call_seen or now)
                    causes.append(own)
                if first is None:
                    first = own
        return first


class _BodyScope:
    """Makes the call's span current on the body's thread; notes how the body run ended."""

    __slots__ = ("_ctx", "_detach", "_trace")

    def __init__(self, call_span: _CallSpan, ctx: ToolContext) -> None:
        self._trace = call_span
        self._ctx = ctx
        self._detach: Token[Context] | None = None

    def __enter__(self) -> None:
        call_span = self._trace
        self._detach = otel_context.attach(
            trace.set_span_in_context(call_span._span, call_span._parent)
        )

    def __exit__(self, *exc_info: object) -> None:
        detach = self._detach
        if detach is not None:
            self._detach = None
            otel_context.detach(detach)
        call_span = self._trace
        if not call_span._recording:
            return
        token = self._ctx.token
        if not token.cancelled:
            call_span._last_exit = None
            return
        reason = token.reason
        now = time.time_ns()
        own = call_span._token
        ours = own.cancelled and own.reason is reason  # the call's own cancellation
        deadline = None if ours else timeout_of(reason)
        with _CAUSES_LOCK:
            if own.cancelled and call_span._call_seen is None:
                call_span._call_seen = now
            causes = call_span._causes
            if causes is None:
                causes = call_span._causes = []
            cause = _known(causes, reason)  # an earlier run ended under it too
            if cause is None:
                if deadline is not None:
                    cause = _Cause(_DEADLINE, reason, now, deadline.seconds)
                else:
                    cause = _Cause(_CANCELLED, reason, now)
                causes.append(cause)
            call_span._last_exit = cause


def _known(causes: list[_Cause], reason: object) -> _Cause | None:
    """The cause recorded for `reason` (the same object), if any."""
    for cause in causes:
        if cause.reason is reason:
            return cause
    return None


def _finish(
    span: Span,
    result: ToolResult[Any],
    timed: tuple[_Cause | None, int | None] | None,
    causes: list[_Cause] | None,
    started: int,
    ended: int,
    overdue: list[int] | None = None,
) -> None:
    """Set the result's attributes, status and events on `span` and end it at `ended`."""
    attributes: dict[str, Any] = {"toolreg.dispatched": result.dispatched}
    error = result.error
    if error is not None:
        code = ErrorCode(error.code).value
        attributes["toolreg.code"] = code
        attributes["error.type"] = code
        span.set_status(Status(StatusCode.ERROR, _text(error.message)))
    span.set_attributes(attributes)
    # (moment, rank, name, attributes); the rank keeps the first cause first on a tie.
    events: list[tuple[int, int, str, dict[str, Any]]] = []
    first, exact = timed if timed is not None else (None, None)
    for cause in causes or ():
        if exact is None:
            at = cause.seen
        elif cause is first:
            at = exact
        else:
            # Timeline moments come from the monotonic clock placed on the wall clock at entry,
            # and `seen` straight from the wall clock; the two frames can differ by the few
            # microseconds between the registry's two clock reads at entry. Every other cause
            # came after the first, so it is never stamped before it.
            at = max(cause.seen, exact)
        details: dict[str, Any] = {"toolreg.reason": _text(cause.reason)}
        if cause.timeout is not None:
            details["toolreg.timeout"] = cause.timeout
        rank = 0 if cause is first else 1
        events.append((min(max(at, started), ended), rank, cause.event, details))
    for at in overdue or ():
        events.append((min(max(at, started), ended), 2, _OVERDUE, {}))
    events.sort(key=_order)
    for at, _, name, details in events:
        span.add_event(name, details, at)
    span.end(end_time=ended)


def _order(event: tuple[int, int, str, dict[str, Any]]) -> tuple[int, int]:
    return event[0], event[1]


def _span_name(call: ToolCall) -> str:
    return f"{_OPERATION} {_text(call.name)}"


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _text(value: object) -> str:
    """`str(value)` for an attribute, or a placeholder naming its type if that raises anything
    (a `GeneratorExit` too: without tracing, such a reason leaves the call unchanged)."""
    return value if type(value) is str else safe_str(value)


def _own_version() -> str | None:
    version: str = toolreg.__version__  # from the distribution's metadata, read once
    return None if version == "0+unknown" else version  # "0+unknown": run from a source tree
