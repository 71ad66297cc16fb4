"""toolreg.otel: one OpenTelemetry span per call (docs/contract.md section 15).

Spans go to the SDK's in-memory exporter through a `SimpleSpanProcessor`, so a span is
exported when it ends: a call's span before `execute` returns, a body's before the body does.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

import pytest
from _registry_helpers import (
    TRACED_FRAMES,
    WAIT,
    Caller,
    Gate,
    holds_nothing,
    open_registry,
    traced_ours,
    wait_until,
)

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanContext, SpanKind, StatusCode

import toolreg.otel
from toolreg import (
    CancelSource,
    ErrorCode,
    RetryPolicy,
    TimeoutPolicy,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
    deadline,
)
from toolreg.aio import AsyncToolRegistry

Args = Any
NS = 1e9
SLACK_NS = 2_000  # float seconds -> ns rounding, both ways


class Discard(SpanExporter):
    """An exporter that drops every span."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class Spans:
    """A tracer provider whose spans land in memory, and ways to find them."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name == name]

    def one(self, name: str) -> ReadableSpan:
        (span,) = self.named(name)
        return span

    def calls(self) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name.startswith("execute_tool ")]


@pytest.fixture
def spans() -> Iterator[Spans]:
    recorded = Spans()
    yield recorded
    recorded.provider.shutdown()


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    context: SpanContext | None = span.context  # ReadableSpan.context is unannotated
    assert context is not None
    return context.span_id


def events(span: ReadableSpan) -> list[tuple[str, dict[str, Any]]]:
    return [(event.name, dict(event.attributes or {})) for event in span.events]


def moment(result: ToolResult[Any], offset: float) -> float:
    """The wall-clock ns of `offset` seconds after the result's entry."""
    assert result.timeline is not None
    return (result.timeline.entered + offset) * NS


def instrumented(spans: Spans, **options: Any) -> AbstractContextManager[ToolRegistry]:
    """A registry (closed at the end of the block) with tracing on."""

    class Block:
        def __enter__(self) -> ToolRegistry:
            self.registry = ToolRegistry(**options)
            toolreg.otel.instrument(self.registry, tracer_provider=spans.provider)
            return self.registry

        def __exit__(self, *exc_info: object) -> None:
            self.registry.close()

    return Block()


# -- the span of a call --------------------------------------------------------------------------


def test_a_call_gets_one_span_named_after_its_tool_with_the_genai_attributes(
    spans: Spans,
) -> None:
    with instrumented(spans) as registry:
        registry.tool(name="search", description="Search the index")(lambda args, ctx: "ok")
        result = registry.execute(ToolCall("search", {"q": "x"}, call_id="call-1"))
    assert result.ok
    (span,) = spans.all()
    assert span.name == "execute_tool search"
    assert span.kind is SpanKind.INTERNAL
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search",
        "gen_ai.tool.call.id": "call-1",
        "gen_ai.tool.description": "Search the index",
        "gen_ai.tool.type": "function",
        "toolreg.dispatched": True,
    }
    assert span.status.status_code is StatusCode.UNSET
    assert span.events == ()
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "toolreg.otel"


def test_the_span_covers_the_call_from_entry_to_its_final_result(spans: Spans) -> None:
    with instrumented(spans) as registry:
        registry.tool(name="t")(lambda args, ctx: "ok")
        result = registry.execute("t")
    span = spans.one("execute_tool t")
    assert result.timeline is not None and span.start_time is not None
    assert span.end_time is not None
    assert abs(span.end_time - moment(result, result.timeline.finished)) <= SLACK_NS
    # It starts as the registry hands the call to its hooks: after entry, well before the body.
    assert moment(result, 0.0) - SLACK_NS <= span.start_time
    assert result.timeline.dispatched is not None
    assert span.start_time <= moment(result, result.timeline.dispatched) + SLACK_NS


def test_a_tool_without_a_description_has_no_description_attribute(spans: Spans) -> None:
    with instrumented(spans) as registry:
        registry.tool(name="t", description="")(lambda args, ctx: "ok")
        registry.execute("t")
    assert "gen_ai.tool.description" not in (spans.one("execute_tool t").attributes or {})


def held_then(gate: Gate, value: str) -> Callable[[Args, ToolContext], str]:
    """A body that holds at `gate`, then returns `value`."""

    def body(args: Args, ctx: ToolContext) -> str:
        gate.hold()
        return value

    return body


def failing_registry(registry: ToolRegistry, code: ErrorCode) -> ToolCall:
    """Set `registry` up so that the call returned fails with `code`."""
    registry.tool(name="t", description="A tool")(lambda args, ctx: "ok")

    def broken(args: Args, ctx: ToolContext) -> str:
        raise ValueError("broken body")

    registry.tool(name="broken", description="Fails")(broken)
    if code is ErrorCode.UNKNOWN_TOOL:
        return ToolCall("missing", call_id="c")
    if code is ErrorCode.INVALID_ARGS:
        return ToolCall("t", {"x": float("nan")}, call_id="c")
    if code is ErrorCode.DENIED:
        registry.add_guard(lambda call: "not today")
    if code is ErrorCode.HOOK_ERROR:
        registry.add_pre_execute(lambda call, token: 1 / 0)  # type: ignore[arg-type]
    if code is ErrorCode.TOOL_ERROR:
        return ToolCall("broken", call_id="c")
    return ToolCall("t", call_id="c")


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.UNKNOWN_TOOL,
        ErrorCode.INVALID_ARGS,
        ErrorCode.DENIED,
        ErrorCode.HOOK_ERROR,
        ErrorCode.TOOL_ERROR,
    ],
)
def test_a_failure_sets_status_error_with_its_code(spans: Spans, code: ErrorCode) -> None:
    with instrumented(spans) as registry:
        call = failing_registry(registry, code)
        result = registry.execute(call)
    assert result.code is code and result.error is not None
    (span,) = spans.all()
    attributes = dict(span.attributes or {})
    assert span.name == f"execute_tool {call.name}"
    assert attributes["toolreg.code"] == attributes["error.type"] == code.value
    assert type(attributes["toolreg.code"]) is str  # a plain str, not the enum
    assert attributes["toolreg.dispatched"] is (code is ErrorCode.TOOL_ERROR)
    assert attributes["gen_ai.tool.call.id"] == "c"
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == result.error.message
    assert span.events == ()


def test_entry_failures_get_a_span_too_even_for_a_name_that_is_not_a_str(spans: Spans) -> None:
    with instrumented(spans) as registry:
        result = registry.execute(ToolCall(42, call_id="c"))  # type: ignore[arg-type]
    assert result.code == ErrorCode.UNKNOWN_TOOL
    span = spans.one("execute_tool 42")
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.tool.name"] == "42"
    assert "gen_ai.tool.description" not in attributes


# -- where the span sits -----------------------------------------------------------------------


def test_caller_span_contains_the_call_span_which_contains_what_the_body_opens(
    spans: Spans,
) -> None:
    threads: dict[str, int] = {}
    with instrumented(spans) as registry:

        @registry.tool
        def outer(args: Args, ctx: ToolContext) -> str:
            threads["outer"] = threading.get_ident()
            with spans.tracer.start_as_current_span("outer work"):
                assert ctx.execute("leaf").ok
            return "ok"

        @registry.tool
        def leaf(args: Args, ctx: ToolContext) -> str:
            with spans.tracer.start_as_current_span("leaf work"):
                return "ok"

        with spans.tracer.start_as_current_span("turn"):
            assert registry.execute("outer").ok
    assert threads["outer"] != threading.get_ident()  # the body ran on a pool worker
    turn = spans.one("turn")
    outer_call = spans.one("execute_tool outer")
    outer_work = spans.one("outer work")
    leaf_call = spans.one("execute_tool leaf")
    leaf_work = spans.one("leaf work")
    assert parent_of(outer_call) == span_id(turn)
    assert parent_of(outer_work) == span_id(outer_call)
    assert parent_of(leaf_call) == span_id(outer_work)
    assert parent_of(leaf_work) == span_id(leaf_call)
    assert len({span.context.trace_id for span in spans.all() if span.context}) == 1


def test_the_span_is_current_in_an_async_body_on_the_registrys_loop_thread(
    spans: Spans,
) -> None:
    seen: dict[str, str] = {}
    with instrumented(spans) as registry:

        @registry.tool
        async def fetch(args: Args, ctx: ToolContext) -> str:
            seen["thread"] = threading.current_thread().name
            await asyncio.sleep(0)
            with spans.tracer.start_as_current_span("async work"):
                assert ctx.execute("leaf").ok
            return "ok"

        registry.tool(name="leaf")(lambda args, ctx: "ok")
        assert registry.execute("fetch").ok
    assert seen["thread"].endswith("-async")
    fetch_call = spans.one("execute_tool fetch")
    work = spans.one("async work")
    assert parent_of(work) == span_id(fetch_call)
    assert parent_of(spans.one("execute_tool leaf")) == span_id(work)


def test_an_async_body_nested_in_an_async_body_runs_under_its_call_span(spans: Spans) -> None:
    with instrumented(spans) as registry:

        @registry.tool
        async def outer(args: Args, ctx: ToolContext) -> str:
            return ctx.execute("inner").content

        @registry.tool
        async def inner(args: Args, ctx: ToolContext) -> str:
            with spans.tracer.start_as_current_span("inner work"):
                await asyncio.sleep(0)
            return "ok"

        assert registry.execute("outer").ok
    inner_call = spans.one("execute_tool inner")
    assert parent_of(inner_call) == span_id(spans.one("execute_tool outer"))
    assert parent_of(spans.one("inner work")) == span_id(inner_call)


def test_each_retry_attempt_runs_under_the_one_call_span(spans: Spans) -> None:
    attempts: list[int] = []
    with instrumented(spans) as registry:
        registry.add_around(RetryPolicy(attempts=2, backoff=0))

        @registry.tool
        def flaky(args: Args, ctx: ToolContext) -> str:
            attempts.append(1)
            with spans.tracer.start_as_current_span(f"attempt {len(attempts)}"):
                if len(attempts) == 1:
                    raise ConnectionError("once")
            return "ok"

        assert registry.execute("flaky").ok
    (call,) = spans.calls()
    assert parent_of(spans.one("attempt 1")) == span_id(call)
    assert parent_of(spans.one("attempt 2")) == span_id(call)
    assert call.status.status_code is StatusCode.UNSET


def test_batch_calls_are_children_of_the_batch_callers_span(spans: Spans) -> None:
    with instrumented(spans, max_workers=2) as registry:

        def work(args: Args, ctx: ToolContext) -> str:
            with spans.tracer.start_as_current_span(f"work {ctx.call.call_id}"):
                return "ok"

        registry.tool(name="safe", concurrency_safe=True)(work)
        registry.tool(name="alone")(work)
        batch = [ToolCall("safe", call_id="a"), ToolCall("safe", call_id="b")]
        batch.append(ToolCall("alone", call_id="c"))

        def run() -> list[ToolResult[Any]]:
            with spans.tracer.start_as_current_span("turn"):
                return registry.execute_batch(batch)

        results = Caller(run).join()
    assert all(result.ok for result in results)
    turn = spans.one("turn")
    calls = {
        cast(str, dict(span.attributes or {})["gen_ai.tool.call.id"]): span
        for span in spans.calls()
    }
    assert sorted(calls) == ["a", "b", "c"]
    for call_id, call in calls.items():
        assert parent_of(call) == span_id(turn)
        assert parent_of(spans.one(f"work {call_id}")) == span_id(call)


def test_a_batch_call_left_unstarted_by_a_cancel_gets_its_span_under_the_caller(
    spans: Spans,
) -> None:
    gate = Gate()
    turn_source = CancelSource()
    with instrumented(spans, max_workers=2) as registry:
        registry.tool(name="hold")(held_then(gate, "late"))
        registry.tool(name="next")(lambda args, ctx: "never")
        batch = [ToolCall("hold", call_id="a"), ToolCall("next", call_id="b")]

        def run() -> list[ToolResult[Any]]:
            with spans.tracer.start_as_current_span("turn"):
                return registry.execute_batch(batch, token=turn_source.token)

        caller = Caller(run)
        gate.wait_reached()
        turn_source.cancel("user pressed stop")
        gate.release()
        results = caller.join()
    assert [result.code for result in results] == [
        ErrorCode.ABORTED,
        ErrorCode.ABORTED_BEFORE_DISPATCH,
    ]
    turn = spans.one("turn")
    unstarted = spans.one("execute_tool next")
    assert parent_of(unstarted) == span_id(turn)
    attributes = dict(unstarted.attributes or {})
    assert attributes["toolreg.code"] == "ABORTED_BEFORE_DISPATCH"
    assert attributes["toolreg.dispatched"] is False
    assert attributes["gen_ai.tool.call.id"] == "b"
    timeline = results[1].timeline
    assert timeline is not None and unstarted.start_time is not None
    # Traced by the call hooks like any call: it starts after entry, before its result.
    assert moment(results[1], 0.0) - SLACK_NS <= unstarted.start_time
    assert unstarted.start_time <= moment(results[1], timeline.finished) + SLACK_NS
    assert len(spans.calls()) == 2  # one span per call, never two


def test_awaited_calls_and_batches_are_children_of_the_awaiting_tasks_span(
    spans: Spans,
) -> None:
    with instrumented(spans, max_workers=2) as registry:

        def work(args: Args, ctx: ToolContext) -> str:
            with spans.tracer.start_as_current_span(f"work {ctx.call.call_id}"):
                return "ok"

        registry.tool(name="t", concurrency_safe=True)(work)
        areg = AsyncToolRegistry(registry)

        async def main() -> None:
            with spans.tracer.start_as_current_span("task"):
                assert (await areg.execute(ToolCall("t", call_id="single"))).ok
                batch = [ToolCall("t", call_id="x"), ToolCall("t", call_id="y")]
                assert all(result.ok for result in await areg.execute_batch(batch))

        asyncio.run(main())
    task = spans.one("task")
    calls = spans.calls()
    assert len(calls) == 3
    for call in calls:
        assert parent_of(call) == span_id(task)
        call_id = dict(call.attributes or {})["gen_ai.tool.call.id"]
        assert parent_of(spans.one(f"work {call_id}")) == span_id(call)


def test_an_awaited_call_cancelled_while_queued_still_gets_a_span(spans: Spans) -> None:
    gate = Gate()
    with instrumented(spans, max_workers=1) as registry:
        registry.tool(name="hold")(held_then(gate, "ok"))
        registry.tool(name="queued")(lambda args, ctx: "never")
        observed: list[ToolResult[Any]] = []
        registry.on_result(observed.append)
        holder = Caller(lambda: registry.execute("hold"))
        gate.wait_reached()  # the only worker is busy: the awaited call waits in the queue
        areg = AsyncToolRegistry(registry)

        async def main() -> None:
            task = asyncio.ensure_future(areg.execute("queued"))
            await asyncio.sleep(0)  # the task runs up to its await: the call is queued
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        try:
            asyncio.run(main())
        finally:
            gate.release()
        holder.join()
        assert registry.wait_idle(WAIT)
    assert [result.code for result in observed] == [
        ErrorCode.ABORTED_BEFORE_DISPATCH,
        None,
    ]
    span = spans.one("execute_tool queued")
    assert dict(span.attributes or {})["toolreg.code"] == "ABORTED_BEFORE_DISPATCH"
    assert dict(span.attributes or {})["toolreg.dispatched"] is False


def test_an_awaited_call_cancelled_while_queued_is_a_child_of_the_tasks_span(
    spans: Spans,
) -> None:
    gate = Gate()
    with instrumented(spans, max_workers=1) as registry:
        registry.tool(name="hold")(held_then(gate, "ok"))
        registry.tool(name="queued")(lambda args, ctx: "never")
        holder = Caller(lambda: registry.execute("hold"))
        gate.wait_reached()
        areg = AsyncToolRegistry(registry)

        async def main() -> None:
            with spans.tracer.start_as_current_span("task"):
                task = asyncio.ensure_future(areg.execute("queued"))
                await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

        try:
            asyncio.run(main())
        finally:
            gate.release()
        holder.join()
        assert registry.wait_idle(WAIT)
    assert parent_of(spans.one("execute_tool queued")) == span_id(spans.one("task"))


# -- events ------------------------------------------------------------------------------------


def test_a_cancel_mid_body_is_an_event_with_its_reason_at_its_moment(spans: Spans) -> None:
    gate = Gate()
    caller = CancelSource()
    with instrumented(spans) as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            gate.hold()
            ctx.token.raise_if_cancelled()
            return "late"

        call = Caller(lambda: registry.execute("work", token=caller.token))
        gate.wait_reached()
        caller.cancel("user pressed stop")
        gate.release()
        result = call.join()
    assert result.code == ErrorCode.ABORTED and result.timeline is not None
    span = spans.one("execute_tool work")
    assert events(span) == [("toolreg.cancelled", {"toolreg.reason": "user pressed stop"})]
    assert result.timeline.cancelled is not None
    assert abs(span.events[0].timestamp - moment(result, result.timeline.cancelled)) <= SLACK_NS
    attributes = dict(span.attributes or {})
    assert attributes["toolreg.code"] == "ABORTED" and attributes["toolreg.dispatched"] is True


def test_cancelling_the_awaiting_task_is_a_cancelled_event(spans: Spans) -> None:
    started = threading.Event()
    with instrumented(spans) as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            started.set()
            ctx.token.wait(WAIT)
            ctx.token.raise_if_cancelled()
            return "late"

        areg = AsyncToolRegistry(registry)

        async def main() -> None:
            task = asyncio.ensure_future(areg.execute("work", cancel_reason="task gone"))
            assert await asyncio.to_thread(started.wait, WAIT)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task  # raised once the call has settled: its span has ended

        asyncio.run(main())
    span = spans.one("execute_tool work")
    assert events(span) == [("toolreg.cancelled", {"toolreg.reason": "task gone"})]
    attributes = dict(span.attributes or {})
    assert attributes["toolreg.code"] == "ABORTED" and attributes["toolreg.dispatched"] is True
    assert span.start_time is not None and span.end_time is not None
    assert span.start_time <= span.events[0].timestamp <= span.end_time


def test_a_call_cancelled_before_dispatch_has_the_event_and_no_body(spans: Spans) -> None:
    caller = CancelSource()
    caller.cancel("turn over")
    with instrumented(spans) as registry:
        registry.tool(name="t")(lambda args, ctx: "never")
        result = registry.execute("t", token=caller.token, start_if_cancelled=False)
    assert result.code == ErrorCode.ABORTED_BEFORE_DISPATCH
    span = spans.one("execute_tool t")
    assert events(span) == [("toolreg.cancelled", {"toolreg.reason": "turn over"})]
    assert span.start_time is not None and span.end_time is not None
    assert span.start_time <= span.events[0].timestamp <= span.end_time
    assert dict(span.attributes or {})["toolreg.dispatched"] is False


def test_a_pre_aborted_direct_call_keeps_its_bodys_success_and_shows_the_cancel(
    spans: Spans,
) -> None:
    caller = CancelSource()
    caller.cancel(ValueError("already"))
    with instrumented(spans) as registry:
        registry.tool(name="t")(lambda args, ctx: "cleaned up")
        result = registry.execute("t", token=caller.token)
    assert result.ok
    span = spans.one("execute_tool t")
    assert span.status.status_code is StatusCode.UNSET
    assert events(span) == [("toolreg.cancelled", {"toolreg.reason": "already"})]
    assert span.events[0].timestamp == span.start_time  # it was cancelled before entry


def test_close_cancels_with_its_reason(spans: Spans) -> None:
    started = threading.Event()
    with instrumented(spans) as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            started.set()
            assert ctx.token.wait(WAIT)
            return "late"

        call = Caller(lambda: registry.execute("work"))
        assert started.wait(WAIT)
        registry.close()
        result = call.join()
    assert result.code == ErrorCode.ABORTED
    assert events(spans.one("execute_tool work")) == [
        ("toolreg.cancelled", {"toolreg.reason": "registry closed"})
    ]


def test_a_wrapper_deadline_that_fires_is_a_deadline_event_not_a_cancel(spans: Spans) -> None:
    with instrumented(spans) as registry:
        registry.add_around(TimeoutPolicy())

        @registry.tool(timeout=0.05)
        def slow(args: Args, ctx: ToolContext) -> str:
            assert ctx.token.wait(WAIT)
            ctx.token.raise_if_cancelled()
            return "never"

        result = registry.execute("slow")
    assert result.code == ErrorCode.TOOL_TIMEOUT and result.timeline is not None
    span = spans.one("execute_tool slow")
    assert events(span) == [
        (
            "toolreg.deadline",
            {"toolreg.reason": "TOOL_TIMEOUT: timed out after 0.05s", "toolreg.timeout": 0.05},
        )
    ]
    assert result.timeline.cancelled is not None
    assert abs(span.events[0].timestamp - moment(result, result.timeline.cancelled)) <= SLACK_NS
    assert dict(span.attributes or {})["error.type"] == "TOOL_TIMEOUT"
    assert span.status.status_code is StatusCode.ERROR


def test_the_callers_own_deadline_is_a_cancel_not_a_wrapper_deadline(spans: Spans) -> None:
    with instrumented(spans) as registry:

        @registry.tool
        def slow(args: Args, ctx: ToolContext) -> str:
            assert ctx.token.wait(WAIT)
            ctx.token.raise_if_cancelled()
            return "never"

        result = registry.execute("slow", token=deadline(None, 0.05).token)
    assert result.code == ErrorCode.ABORTED
    assert events(spans.one("execute_tool slow")) == [
        ("toolreg.cancelled", {"toolreg.reason": "TIMEOUT: timed out after 0.05s"})
    ]


def test_a_deadline_then_a_cancel_are_two_events_in_order(spans: Spans) -> None:
    caller = CancelSource()
    timed_out = threading.Event()
    cancelled = threading.Event()
    with instrumented(spans) as registry:
        registry.add_around(TimeoutPolicy())

        @registry.tool(timeout=0.05)
        def stubborn(args: Args, ctx: ToolContext) -> str:
            assert ctx.token.wait(WAIT)
            timed_out.set()
            assert cancelled.wait(WAIT)
            return "late"

        call = Caller(lambda: registry.execute("stubborn", token=caller.token))
        assert timed_out.wait(WAIT)
        caller.cancel("user pressed stop")
        cancelled.set()
        result = call.join()
    assert result.code == ErrorCode.TOOL_TIMEOUT and result.timeline is not None
    span = spans.one("execute_tool stubborn")
    assert [name for name, _ in events(span)] == ["toolreg.deadline", "toolreg.cancelled"]
    deadline, cancel = span.events
    assert result.timeline.cancelled is not None
    assert abs(deadline.timestamp - moment(result, result.timeline.cancelled)) <= SLACK_NS
    assert dict(cancel.attributes or {}) == {"toolreg.reason": "user pressed stop"}
    # Seen at the end of the body run, and never stamped before the deadline it followed.
    assert span.end_time is not None and deadline.timestamp <= cancel.timestamp <= span.end_time


def test_an_overdue_body_gets_an_overdue_event(
    spans: Spans, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="toolreg")
    gate = Gate()
    caller = CancelSource()
    with instrumented(spans, overdue_after=0.01) as registry:
        registry.tool(name="stubborn")(held_then(gate, "late"))
        call = Caller(lambda: registry.execute("stubborn", token=caller.token))
        gate.wait_reached()
        before_cancel = time.time_ns()
        caller.cancel("stop")
        try:
            wait_until(lambda: "has not settled" in caplog.text, "the overdue warning")
        finally:
            gate.release()
        result = call.join()
    assert result.code == ErrorCode.ABORTED
    span = spans.one("execute_tool stubborn")
    assert [name for name, _ in events(span)] == ["toolreg.cancelled", "toolreg.overdue"]
    _, overdue = span.events
    assert span.end_time is not None
    # Read from the same (wall) clock as the warning's moment, just before the cancel.
    assert before_cancel + 0.01 * NS <= overdue.timestamp <= span.end_time


# -- turning it off, and staying out of the way ------------------------------------------------


def test_remove_stops_new_spans(spans: Spans) -> None:
    with open_registry() as registry:
        registry.tool(name="t")(lambda args, ctx: "ok")
        registration = toolreg.otel.instrument(registry, tracer_provider=spans.provider)
        registry.execute("t")
        assert registration.remove() is True
        assert registration.remove() is False
        registry.execute("t")
        registry.execute("missing")
    assert len(spans.calls()) == 1


def test_remove_while_a_call_is_in_flight_lets_that_call_end_its_span(spans: Spans) -> None:
    gate = Gate()
    with open_registry() as registry:
        registry.tool(name="t")(held_then(gate, "ok"))
        registration = toolreg.otel.instrument(registry, tracer_provider=spans.provider)
        call = Caller(lambda: registry.execute("t"))
        gate.wait_reached()  # the body runs under the call's span
        assert registration.remove() is True
        gate.release()
        result = call.join()
        assert registry.execute("t").ok  # entered after remove(): not traced
    assert result.ok
    [span] = spans.calls()
    assert span.end_time is not None and span.status.status_code is StatusCode.UNSET
    assert dict(span.attributes or {})["toolreg.dispatched"] is True


def test_instrumenting_twice_gives_two_spans_per_call(spans: Spans) -> None:
    with open_registry() as registry:
        registry.tool(name="t")(lambda args, ctx: "ok")
        first = toolreg.otel.instrument(registry, tracer_provider=spans.provider)
        second = toolreg.otel.instrument(registry, tracer_provider=spans.provider)
        with spans.tracer.start_as_current_span("turn"):
            registry.execute("t")
        assert first.remove() is True
        registry.execute("t")  # the second one alone
        second.remove()
        registry.execute("t")
    calls = spans.calls()
    assert [span.name for span in calls] == ["execute_tool t"] * 3
    turn = spans.one("turn")
    assert [parent_of(span) for span in calls[:2]] == [span_id(turn)] * 2
    assert parent_of(calls[2]) is None


def test_the_registration_is_a_context_manager(spans: Spans) -> None:
    with open_registry() as registry:
        registry.tool(name="t")(lambda args, ctx: "ok")
        with toolreg.otel.instrument(registry, tracer_provider=spans.provider):
            registry.execute("t")
        registry.execute("t")
    assert len(spans.calls()) == 1


def test_traced_calls_leave_nothing_on_the_callers_token_and_memory_is_flat() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Discard()))
    session = CancelSource()
    with open_registry(max_workers=2) as registry:
        toolreg.otel.instrument(registry, tracer_provider=provider)
        registry.tool(name="t")(lambda args, ctx: "ok")
        for _ in range(2_000):
            registry.execute("t", token=session.token)
        gc.collect()
        tracemalloc.start(TRACED_FRAMES)
        try:
            for _ in range(2_000):
                registry.execute("t", token=session.token)
            gc.collect()
            middle = traced_ours()
            for _ in range(2_000):
                registry.execute("t", token=session.token)
            gc.collect()
            end = traced_ours()
        finally:
            tracemalloc.stop()
        assert holds_nothing(session.token)
    provider.shutdown()
    # Anything kept per call (a span, a result, a context) would be kilobytes per call.
    assert end - middle < 64 * 1024, f"grew {end - middle} bytes over 2,000 calls"


def test_a_span_the_sampler_drops_is_still_current_in_the_body(spans: Spans) -> None:
    provider = TracerProvider(sampler=ALWAYS_OFF)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen: list[trace.SpanContext] = []
    with open_registry() as registry:
        toolreg.otel.instrument(registry, tracer_provider=provider)
        registry.tool(name="t")(
            lambda args, ctx: seen.append(trace.get_current_span().get_span_context())
        )
        assert registry.execute("t").ok
    assert exporter.get_finished_spans() == ()
    (context,) = seen
    assert context.is_valid and not context.trace_flags.sampled
    provider.shutdown()


def test_a_tracer_that_raises_never_changes_a_call(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def start_span(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("tracer down")

    class Provider:
        def get_tracer(self, *args: Any, **kwargs: Any) -> Broken:
            return Broken()

    with open_registry() as registry:
        toolreg.otel.instrument(registry, tracer_provider=Provider())  # type: ignore[arg-type]
        registry.tool(name="t")(lambda args, ctx: "ok")
        result = registry.execute("t")
    assert result.ok and result.value == "ok"
    # Logged once: nothing calls the failing tracer a second time for the same call.
    failures = [record for record in caplog.records if record.exc_info is not None]
    assert len(failures) == 1 and "tracer down" in caplog.text


class NotAnInterrupt(BaseException):
    """A `BaseException` that is neither an interrupt nor an `Exception`."""


def test_a_span_processor_raising_a_base_exception_never_changes_a_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Raising(SpanProcessor):
        def __init__(self, exc: BaseException) -> None:
            self.exc = exc

        def on_end(self, span: ReadableSpan) -> None:
            raise self.exc

    for exc in (GeneratorExit(), NotAnInterrupt()):
        provider = TracerProvider()
        provider.add_span_processor(Raising(exc))
        observed: list[ToolResult[Any]] = []
        with open_registry() as registry:
            toolreg.otel.instrument(registry, tracer_provider=provider)
            registry.on_result(observed.append)
            registry.tool(name="t")(lambda args, ctx: "ran")
            result = registry.execute("t")
        assert result.ok and result.value == "ran"
        assert observed == [result]  # observed once, after the trace failed
        assert type(exc).__name__ in caplog.text
        provider.shutdown()


def test_a_cancel_reason_whose_str_raises_anything_is_a_placeholder(spans: Spans) -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise GeneratorExit("no text")  # not an Exception

    caller = CancelSource()
    caller.cancel(Unprintable())
    with instrumented(spans) as registry:
        registry.tool(name="t")(lambda args, ctx: "never")
        result = registry.execute("t", token=caller.token, start_if_cancelled=False)
    assert result.code == ErrorCode.ABORTED_BEFORE_DISPATCH  # as without tracing
    span = spans.one("execute_tool t")
    reason = "<Unprintable whose str() raised>"
    assert events(span) == [("toolreg.cancelled", {"toolreg.reason": reason})]


def test_instrument_refuses_what_is_not_a_registry_or_a_provider(spans: Spans) -> None:
    with pytest.raises(TypeError, match="ToolRegistry"):
        toolreg.otel.instrument(object())  # type: ignore[arg-type]
    with open_registry() as registry, pytest.raises(TypeError, match="TracerProvider"):
        toolreg.otel.instrument(registry, tracer_provider=object())  # type: ignore[arg-type]


def test_the_public_names_of_toolreg_otel_are_pinned() -> None:
    assert toolreg.otel.__all__ == ["instrument"]


def run_python(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT * 3
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_importing_toolreg_never_imports_opentelemetry() -> None:
    code = (
        "import sys, toolreg, toolreg.aio, toolreg.log\n"
        "with toolreg.ToolRegistry() as registry:\n"
        "    registry.tool(name='t')(lambda args, ctx: 'ok')\n"
        "    registry.execute('t')\n"
        "print(sorted(m for m in sys.modules\n"
        "             if m.split('.')[0] == 'opentelemetry' or m == 'toolreg.otel'))\n"
    )
    assert run_python(code) == "[]"


def test_without_a_provider_it_uses_the_global_one() -> None:
    code = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import "
        "InMemorySpanExporter\n"
        "import toolreg, toolreg.otel\n"
        "with toolreg.ToolRegistry() as registry:\n"
        "    toolreg.otel.instrument(registry)\n"
        "    registry.tool(name='t')(lambda args, ctx: 'ok')\n"
        "    registry.execute('t')  # no provider yet: dropped\n"
        "    exporter = InMemorySpanExporter()\n"
        "    provider = TracerProvider()\n"
        "    provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        "    trace.set_tracer_provider(provider)\n"
        "    registry.execute('t')\n"
        "print([span.name for span in exporter.get_finished_spans()])\n"
    )
    assert run_python(code) == "['execute_tool t']"
