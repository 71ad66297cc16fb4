"""`close()`: it cancels every call in flight, waits for them, refuses new calls, is idempotent.

docs/contract.md 4.10: the caller's token is never touched, and a `close()` interrupted by
Ctrl-C keeps waiting for the calls it cancelled, then re-raises.
"""

from __future__ import annotations

import threading

import pytest
from _registry_helpers import (
    ABORTED,
    BEFORE,
    WAIT,
    Args,
    Caller,
    Gate,
    counting_tool,
    default_sigint,
    holds_nothing,
    send_ctrl_c_when,
    wait_until,
)

from toolreg import (
    CancelSource,
    RegistryClosedError,
    ToolCall,
    ToolContext,
    ToolRegistry,
)


def test_context_manager_closes_and_close_is_idempotent() -> None:
    with ToolRegistry(max_workers=1) as registry:
        counting_tool(registry)
        assert registry.execute("work").ok
        closed_inside = registry.closed  # a name: mypy would keep registry.closed False below
        assert not closed_inside
    assert registry.closed
    registry.close()
    assert registry.closed
    with pytest.raises(RegistryClosedError, match="closed"):
        registry.execute(ToolCall("work"))


def test_new_calls_are_refused_while_close_waits_for_in_flight_ones() -> None:
    registry = ToolRegistry(max_workers=2)
    gate = Gate()
    cancelled = threading.Event()

    @registry.tool
    def stubborn(args: Args, ctx: ToolContext) -> str:
        ctx.token.on_cancel(cancelled.set)
        gate.hold()
        return "late"

    call = Caller(lambda: registry.execute("stubborn"))
    gate.wait_reached()
    closer = Caller(registry.close)
    assert cancelled.wait(WAIT)  # close() has begun
    with pytest.raises(RegistryClosedError, match="closed"):
        registry.execute("stubborn")
    gate.release()
    closer.join()
    assert call.join().code == ABORTED


def test_ctrl_c_in_close_cancels_waits_for_the_calls_then_reraises() -> None:
    # Like an interrupted execute: the calls are cancelled already, so close() keeps waiting
    # for them (never abandoning a body), finishes, and only then re-raises.
    registry = ToolRegistry(max_workers=1, thread_name_prefix="interrupted-close")
    gate = Gate()

    def slow(args: Args, ctx: ToolContext) -> str:
        gate.hold()
        return "late"

    registry.tool(name="slow")(slow)
    call = Caller(lambda: registry.execute("slow"))
    gate.wait_reached()
    with default_sigint():
        presser = send_ctrl_c_when(gate.reached)  # close() blocks waiting for the body

        def release_after_the_press() -> None:
            presser.join()
            gate.release()

        releaser = Caller(release_after_the_press)
        with pytest.raises(KeyboardInterrupt):
            registry.close()
        releaser.join()
    assert call.join().code == ABORTED
    assert registry.closed
    registry.close()  # idempotent
    leaked = [t for t in threading.enumerate() if t.name.startswith("interrupted-close")]
    assert leaked == []


def test_close_leaves_the_callers_token_alone(registry: ToolRegistry) -> None:
    gate = Gate()
    registry.add_pre_execute(lambda call, token: gate.hold())
    counting_tool(registry)
    caller = CancelSource()
    call = Caller(lambda: registry.execute("work", token=caller.token))
    gate.wait_reached()
    closer = Caller(registry.close)
    wait_until(lambda: registry.in_flight()[0].cancelled, "close() to cancel the call")
    gate.release()
    closer.join()
    assert call.join().code == BEFORE
    assert not caller.token.cancelled
    assert holds_nothing(caller.token)
