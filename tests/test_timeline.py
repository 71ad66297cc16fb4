"""ToolResult.timeline: when each moment of a call happened, on every path a call can take."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _registry_helpers import WAIT, Caller, Gate, open_registry

from toolreg import (
    CallTimeline,
    CancelSource,
    ErrorCode,
    RetryPolicy,
    TimeoutPolicy,
    ToolCall,
    ToolContext,
    ToolRegistry,
)
from toolreg.log import ResultLog

Args = Any


def ordered(*moments: float | None) -> bool:
    present = [moment for moment in moments if moment is not None]
    return present == sorted(present)


def test_an_ok_call_has_every_moment_but_cancelled_in_order() -> None:
    before = time.time()
    with open_registry() as registry:
        registry.tool(name="t")(lambda args, ctx: "ok")
        result = registry.execute("t")
    timeline = result.timeline
    assert isinstance(timeline, CallTimeline)
    assert before <= timeline.entered <= time.time()
    assert timeline.entered_at.tzinfo is not None
    assert timeline.cancelled is None
    assert timeline.dispatched is not None and timeline.settled is not None
    assert ordered(0.0, timeline.dispatched, timeline.settled, timeline.finished)
    assert timeline.finished == result.duration


def test_a_timeline_is_frozen() -> None:
    with open_registry() as registry:
        registry.tool(name="t")(lambda args, ctx: "ok")
        timeline = registry.execute("t").timeline
    assert isinstance(timeline, CallTimeline)
    fields = ("entered", "dispatched", "cancelled", "settled", "finished")
    before = [getattr(timeline, field) for field in fields]
    for field in fields:
        with pytest.raises(AttributeError):
            setattr(timeline, field, 0.0)
    with pytest.raises(AttributeError):
        timeline.extra = 1  # type: ignore[attr-defined]
    assert [getattr(timeline, field) for field in fields] == before  # nothing changed it


def test_a_retried_call_spans_its_first_dispatch_to_its_last_settle() -> None:
    # 16.1: `dispatched` is the first start of a body when a wrapper retried, `settled` the last
    # return. The body stamps each attempt on the same monotonic clock: the first start of a body
    # comes after `dispatched` and the last return before `settled`, so settled - dispatched
    # covers them all. The real backoff (50 ms, then 100 ms) is simulated waiting, not ordering:
    # it makes a timeline of one attempt only (the first or the last) measurably shorter.
    stamps: list[tuple[str, float]] = []
    with open_registry() as registry:
        registry.add_around(RetryPolicy(attempts=3, backoff=0.05))

        @registry.tool
        def flaky(args: Args, ctx: ToolContext) -> str:
            stamps.append(("start", time.monotonic()))
            attempt = sum(kind == "start" for kind, _ in stamps)
            stamps.append(("end", time.monotonic()))
            if attempt < 3:
                raise ConnectionError(f"attempt {attempt} failed")
            return "third time lucky"

        result = registry.execute("flaky")
    timeline = result.timeline
    assert result.ok and result.value == "third time lucky" and timeline is not None
    assert [kind for kind, _ in stamps] == ["start", "end"] * 3
    assert timeline.dispatched is not None and timeline.settled is not None
    first_start, last_end = stamps[0][1], stamps[-1][1]
    assert timeline.settled - timeline.dispatched >= last_end - first_start >= 0.14
    assert ordered(0.0, timeline.dispatched, timeline.settled, timeline.finished)


def test_a_body_cancelled_midway_records_the_cancel_between_dispatch_and_settle() -> None:
    gate = Gate()
    caller = CancelSource()
    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            gate.hold()
            ctx.token.raise_if_cancelled()
            return "late"

        call = Caller(lambda: registry.execute("work", token=caller.token))
        gate.wait_reached()
        caller.cancel("stop")
        gate.release()
        result = call.join()
    timeline = result.timeline
    assert result.code == ErrorCode.ABORTED and timeline is not None
    assert timeline.dispatched is not None and timeline.cancelled is not None
    assert timeline.settled is not None
    assert ordered(timeline.dispatched, timeline.cancelled, timeline.settled, timeline.finished)


def test_an_uncooperative_body_settles_well_after_its_cancellation() -> None:
    gate = Gate()
    caller = CancelSource()
    with open_registry() as registry:

        def stubborn(args: Args, ctx: ToolContext) -> str:
            gate.hold()
            return "done"

        registry.tool(name="stubborn")(stubborn)
        call = Caller(lambda: registry.execute("stubborn", token=caller.token))
        gate.wait_reached()
        caller.cancel("stop")
        threading.Event().wait(0.05)  # the body ignores its token for a while (plays stubborn)
        gate.release()
        result = call.join()
    timeline = result.timeline
    assert timeline is not None and timeline.cancelled is not None and timeline.settled is not None
    assert timeline.settled - timeline.cancelled >= 0.04


def test_a_call_cancelled_before_dispatch_has_no_body_moments() -> None:
    gate = Gate()
    caller = CancelSource()
    with open_registry() as registry:
        registry.add_pre_execute(lambda call, token: gate.hold())
        registry.tool(name="t")(lambda args, ctx: "never")
        call = Caller(lambda: registry.execute("t", token=caller.token))
        gate.wait_reached()
        caller.cancel("stop")
        gate.release()
        result = call.join()
    timeline = result.timeline
    assert result.code == ErrorCode.ABORTED_BEFORE_DISPATCH and timeline is not None
    assert timeline.dispatched is None and timeline.settled is None
    assert timeline.cancelled is not None and timeline.cancelled <= timeline.finished


@pytest.mark.parametrize(
    "call", [ToolCall("missing"), ToolCall("t", {"x": float("nan")})], ids=["unknown", "invalid"]
)
def test_an_entry_failure_has_only_entered_and_finished(call: ToolCall) -> None:
    with open_registry() as registry:
        registry.tool(name="t")(lambda args, ctx: "never")
        result = registry.execute(call)
    timeline = result.timeline
    assert not result.ok and timeline is not None
    assert (timeline.dispatched, timeline.cancelled, timeline.settled) == (None, None, None)
    assert timeline.finished == result.duration >= 0


def test_a_timeout_records_when_the_deadline_cancelled_the_body() -> None:
    with open_registry() as registry:
        registry.add_around(TimeoutPolicy())

        @registry.tool(timeout=0.05)
        def slow(args: Args, ctx: ToolContext) -> str:
            assert ctx.token.wait(WAIT)
            ctx.token.raise_if_cancelled()
            return "never"

        result = registry.execute("slow")
    timeline = result.timeline
    assert result.code == ErrorCode.TOOL_TIMEOUT and timeline is not None
    assert timeline.cancelled is not None and timeline.cancelled >= 0.05
    assert ordered(timeline.dispatched, timeline.cancelled, timeline.settled, timeline.finished)


def test_a_pre_aborted_call_was_cancelled_at_entry() -> None:
    caller = CancelSource()
    caller.cancel("already")
    with open_registry() as registry:
        registry.tool(name="t")(lambda args, ctx: "cleaned up")
        result = registry.execute("t", token=caller.token)
    timeline = result.timeline
    assert result.ok and timeline is not None and timeline.cancelled == 0.0


def test_result_log_writes_the_timeline_on_each_line(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    with open_registry() as registry, ResultLog(path) as log:
        registry.on_result(log)
        registry.tool(name="t")(lambda args, ctx: "ok")
        result = registry.execute("t")
    (line,) = [json.loads(text) for text in path.read_text().splitlines()]
    timeline = result.timeline
    assert timeline is not None
    logged = line["timeline"]
    assert logged["entered"].endswith("Z")
    assert logged["dispatched"] == round(timeline.dispatched or 0.0, 6)
    assert logged["cancelled"] is None
    assert logged["finished"] == round(timeline.finished, 6)


def test_a_batch_and_an_awaited_call_carry_timelines() -> None:
    import asyncio

    from toolreg.aio import AsyncToolRegistry

    registry = ToolRegistry(max_workers=2)
    registry.tool(name="t", concurrency_safe=True)(lambda args, ctx: "ok")
    try:
        results = registry.execute_batch([ToolCall("t"), ToolCall("t")])
        awaited = asyncio.run(AsyncToolRegistry(registry).execute("t"))
    finally:
        registry.close()
    for result in [*results, awaited]:
        assert result.timeline is not None and result.timeline.dispatched is not None
