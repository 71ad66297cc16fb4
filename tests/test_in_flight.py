"""`in_flight()` snapshots and the overdue warning for a body that ignores its token.

A cancelled body still running `overdue_after` seconds later is logged once; `in_flight()` shows
each held call with its stage (docs/contract.md 4.4 and B.17).
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

import pytest
from _registry_helpers import (
    ABORTED,
    BEFORE,
    WAIT,
    Args,
    Caller,
    Gate,
    Proceed,
    counting_tool,
    open_registry,
    wait_until,
)

from toolreg import (
    Ask,
    CancelSource,
    CancelToken,
    Dispatch,
    ErrorCode,
    TimeoutPolicy,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
    deadline,
)
from toolreg._cancel import manual_clock


def test_in_flight_snapshots_each_held_call_with_its_stage() -> None:
    with open_registry(max_workers=2) as registry:
        gates = {stage: Gate() for stage in ("pre_execute", "approval", "guards", "around", "body")}

        def pre(call: ToolCall, token: CancelToken) -> Ask | None:
            if call.call_id == "pre_execute":
                gates["pre_execute"].hold()
            return Ask("?") if call.call_id == "approval" else None

        def approver(call: ToolCall, reason: str, token: CancelToken) -> bool:
            gates["approval"].hold()
            return True

        def guard(call: ToolCall) -> None:
            if call.call_id == "guards":
                gates["guards"].hold()

        def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
            if dispatch.call.call_id == "around":
                gates["around"].hold()
            return proceed()

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            if ctx.call.call_id == "body":
                gates["body"].hold()
            return "ok"

        registry.add_pre_execute(pre)
        registry.set_approver(approver)
        registry.add_guard(guard)
        registry.add_around(wrapper)
        assert registry.in_flight() == []
        callers = []
        for stage, gate in gates.items():
            callers.append(
                Caller(
                    lambda stage=stage: registry.execute(  # type: ignore[misc]
                        ToolCall("work", call_id=stage)
                    )
                )
            )
            gate.wait_reached()
        snapshot = registry.in_flight()
        assert [(c.call.call_id, c.stage) for c in snapshot] == [(s, s) for s in gates]
        assert [c.started for c in snapshot] == sorted(c.started for c in snapshot)
        assert not any(c.cancelled for c in snapshot)
        assert all(c.cancelled_at is None for c in snapshot)
        for gate in gates.values():
            gate.release()
        assert all(c.join().ok for c in callers)
        assert registry.in_flight() == []


def test_in_flight_reports_a_running_body_as_dispatched(registry: ToolRegistry) -> None:
    gate = Gate()

    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        gate.hold()
        return "ok"

    call = Caller(lambda: registry.execute("work"))
    gate.wait_reached()
    try:
        (entry,) = registry.in_flight()
        assert entry.stage == "body"
        assert entry.dispatched
    finally:
        gate.release()
        call.join()


def test_in_flight_records_when_a_call_was_cancelled_in_a_hook(registry: ToolRegistry) -> None:
    gate = Gate()
    counting_tool(registry)
    registry.add_pre_execute(lambda call, token: gate.hold())
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    caller.cancel("stop")
    try:
        (entry,) = registry.in_flight()
        assert entry.cancelled
        assert entry.cancelled_at is not None
    finally:
        gate.release()
        assert call.join().code == BEFORE


def test_in_flight_records_when_a_running_body_was_cancelled(registry: ToolRegistry) -> None:
    gate = Gate()

    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        gate.hold()
        return "ok"

    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    caller.cancel("stop")
    (entry,) = registry.in_flight()
    assert entry.cancelled
    assert entry.cancelled_at is not None
    assert entry.cancelled_at >= entry.started
    gate.release()
    assert call.join().code == ABORTED


def test_uncooperative_body_logs_exactly_one_overdue_warning_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="toolreg")
    with open_registry(max_workers=1, overdue_after=0.05) as registry:
        release = threading.Event()
        started = threading.Event()

        @registry.tool
        def stubborn(args: Args, ctx: ToolContext) -> str:
            started.set()
            release.wait(WAIT)  # ignores ctx.token until the test saw the warning
            return "late"

        def overdue() -> list[logging.LogRecord]:
            return [
                r for r in caplog.records if r.name == "toolreg" and r.levelno == logging.WARNING
            ]

        caller = CancelSource()
        call = Caller(
            lambda: registry.execute(ToolCall("stubborn", call_id="call-42"), token=caller.token)
        )
        assert started.wait(WAIT)
        caller.cancel("stop")
        wait_until(lambda: bool(overdue()), "the overdue warning")
        assert call.still_blocked()
        release.set()
        assert call.join().code == ABORTED
    warnings = overdue()
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "stubborn" in message
    assert "call-42" in message


def test_a_body_outlasting_its_timeout_policy_deadline_gets_the_overdue_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # No caller token: only the deadline is cancelled. The idle worker took the body, so the
    # joiner looks at the deadline only after its first short wait; it must still wake at the
    # due time and start the overdue watch, or nobody would (a lazy deadline pushes nothing).
    caplog.set_level(logging.WARNING, logger="toolreg")
    with open_registry(max_workers=1, overdue_after=0.05) as registry:
        registry.add_around(TimeoutPolicy())
        release = threading.Event()
        started = threading.Event()

        @registry.tool(timeout=0.05)
        def stubborn(args: Args, ctx: ToolContext) -> str:
            started.set()
            release.wait(WAIT)  # ignores ctx.token until the test saw the warning
            return "late"

        def overdue() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "has not settled" in r.getMessage()]

        call = Caller(lambda: registry.execute("stubborn"))
        assert started.wait(WAIT)
        wait_until(lambda: bool(overdue()), "the overdue warning")
        assert call.still_blocked()
        release.set()
        result = call.join()
        assert result.error is not None and result.error.code is ErrorCode.TOOL_TIMEOUT
    assert len(overdue()) == 1


def test_body_that_settles_promptly_after_cancel_logs_no_overdue_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="toolreg")
    with open_registry(max_workers=1, overdue_after=2.0) as registry:
        started = threading.Event()

        @registry.tool
        def polite(args: Args, ctx: ToolContext) -> str:
            started.set()
            ctx.token.wait(WAIT)
            return "stopped"

        caller = CancelSource()
        call = Caller(lambda: registry.execute("polite", token=caller.token))
        assert started.wait(WAIT)
        caller.cancel("stop")
        assert call.join().code == ABORTED
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_pre_aborted_uncooperative_body_also_gets_the_overdue_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="toolreg")
    with open_registry(max_workers=1, overdue_after=0.05) as registry:
        release = threading.Event()

        @registry.tool
        def stubborn(args: Args, ctx: ToolContext) -> str:
            release.wait(WAIT)  # ignores its (already cancelled) token
            return "late"

        def warned() -> bool:
            return any(
                r.levelno == logging.WARNING and "stubborn" in r.getMessage()
                for r in caplog.records
            )

        caller = CancelSource()
        caller.cancel("before the call")
        call = Caller(lambda: registry.execute("stubborn", token=caller.token))
        try:
            wait_until(warned, "the overdue warning")
        finally:
            release.set()
            call.join()


def overdue_warnings(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "toolreg" and r.levelno == logging.WARNING and name in r.getMessage()
    ]


def add_stubborn_tool(registry: ToolRegistry, started: threading.Event) -> threading.Event:
    """A body that ignores its token until the Event returned is set."""
    release = threading.Event()

    @registry.tool
    def stubborn(args: Args, ctx: ToolContext) -> str:
        started.set()
        release.wait(WAIT)
        return "late"

    return release


def cancel_once_the_call_listens(caller: CancelSource) -> None:
    """Cancel `caller` once the joining call listens on its token (white-box: `_listeners`).

    The caller registers that listener just after handing the body over, so the body may start
    first. Cancelled before, the listener (and the overdue watch) would run later, on the
    caller's thread, at a manual-clock time the test cannot know.
    """
    wait_until(lambda: bool(caller.token._listeners), "the call to listen on its caller's token")
    caller.cancel("stop")  # runs the call's listener here: the overdue watch starts now


def test_the_overdue_warning_comes_30_seconds_after_the_cancel_by_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 4.4: "after overdue_after seconds (constructor argument, default 30 ...)". The manual
    # clock (B.23) stands for the 30 s: the watch starts at the cancel and is due on that clock.
    caplog.set_level(logging.WARNING, logger="toolreg")
    with manual_clock() as clock, open_registry(max_workers=1) as registry:
        started = threading.Event()
        release = add_stubborn_tool(registry, started)
        caller = CancelSource()
        call = Caller(lambda: registry.execute("stubborn", token=caller.token))
        try:
            assert started.wait(WAIT)
            cancel_once_the_call_listens(caller)
            clock.advance(29.9)  # not due: nothing fired, nothing handed to a callback thread
            assert overdue_warnings(caplog, "stubborn") == []
            clock.advance(0.1)
            wait_until(lambda: bool(overdue_warnings(caplog, "stubborn")), "the warning at 30 s")
            assert "30s" in overdue_warnings(caplog, "stubborn")[0].getMessage()
        finally:
            release.set()
            assert call.join().code == ABORTED


@pytest.mark.parametrize("overdue_after", [0.5, None], ids=["control", "disabled"])
def test_overdue_after_none_disables_the_warning_for_a_cancelled_overrunning_body(
    caplog: pytest.LogCaptureFixture, overdue_after: float | None
) -> None:
    caplog.set_level(logging.WARNING, logger="toolreg")
    with manual_clock() as clock, open_registry(max_workers=1, overdue_after=overdue_after) as reg:
        started = threading.Event()
        release = add_stubborn_tool(reg, started)
        caller = CancelSource()
        call = Caller(lambda: reg.execute("stubborn", token=caller.token))
        try:
            assert started.wait(WAIT)
            cancel_once_the_call_listens(caller)
            # A marker due after any watch (the default one included): fired in due order, its
            # callback is queued after the watch's, and callback jobs start in queue order.
            marker, marked = deadline(None, 3600.0), threading.Event()
            marker.token.on_cancel(marked.set)
            clock.advance(3600.0)  # the body overruns its cancellation by an hour
            if overdue_after is None:
                assert marked.wait(WAIT)
                assert overdue_warnings(caplog, "stubborn") == []
            else:
                wait_until(lambda: bool(overdue_warnings(caplog, "stubborn")), "the warning")
            assert call.still_blocked()  # the call was cancelled and still overruns
        finally:
            release.set()
            assert call.join().code == ABORTED
    assert len(overdue_warnings(caplog, "stubborn")) == (0 if overdue_after is None else 1)


def test_a_call_cancelled_by_close_gets_the_overdue_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 4.4: the watch starts "for any call cancelled by close()" too.
    caplog.set_level(logging.WARNING, logger="toolreg")
    registry = ToolRegistry(max_workers=1, overdue_after=0.05)
    started = threading.Event()
    release = add_stubborn_tool(registry, started)
    call = Caller(lambda: registry.execute(ToolCall("stubborn", call_id="closing-7")))
    closer: Caller | None = None
    try:
        assert started.wait(WAIT)
        closer = Caller(registry.close)
        wait_until(lambda: bool(overdue_warnings(caplog, "closing-7")), "the overdue warning")
        assert closer.still_blocked()  # close() keeps waiting for the body
    finally:
        release.set()
        if closer is not None:
            closer.join()
        else:
            registry.close()
    assert call.join().code == ABORTED
    assert len(overdue_warnings(caplog, "closing-7")) == 1


@pytest.mark.parametrize("value", [0, -1.0, math.nan])
def test_overdue_after_must_be_positive(value: float) -> None:
    with pytest.raises(ValueError, match="overdue_after"):
        ToolRegistry(max_workers=1, overdue_after=value)
