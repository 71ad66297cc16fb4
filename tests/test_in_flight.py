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
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
)


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


@pytest.mark.parametrize("value", [0, -1.0, math.nan])
def test_overdue_after_must_be_positive(value: float) -> None:
    with pytest.raises(ValueError, match="overdue_after"):
        ToolRegistry(max_workers=1, overdue_after=value)
