"""Call hooks: one trace per call, from entry (entry failures included) to the final result,
with a scope around each body start on the body's own thread."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _registry_helpers import Caller, Gate, Journal, open_registry, wait_until

from toolreg import CancelSource, CancelToken, RetryPolicy, ToolCall, ToolContext, ToolResult
from toolreg.aio import AsyncToolRegistry

Args = Any
current: contextvars.ContextVar[str] = contextvars.ContextVar("current", default="-")


class Recorder:
    """A call hook whose traces journal what happens to each call, with where it happened."""

    def __init__(self) -> None:
        self.journal = Journal()

    def __call__(self, call: ToolCall, token: CancelToken) -> Trace:
        self.journal(("start", call.name, current.get(), threading.get_ident()))
        return Trace(self.journal, call.name)


class Trace:
    def __init__(self, journal: Journal, name: str) -> None:
        self.journal = journal
        self.name = name

    @contextlib.contextmanager
    def body(self, ctx: ToolContext) -> Iterator[None]:
        self.journal(("body", self.name, threading.get_ident()))
        yield
        self.journal(("left", self.name))

    def overdue(self, ctx: ToolContext) -> None:
        self.journal(("overdue", self.name))

    def end(self, result: ToolResult[Any]) -> None:
        self.journal(("end", self.name, result.code))


def test_a_trace_follows_a_call_from_entry_through_the_body_to_the_end() -> None:
    recorder = Recorder()
    body_thread: list[int] = []
    with open_registry() as registry:
        registry.add_call_hook(recorder)
        registry.on_result(lambda result: recorder.journal(("observed", result.call.name)))
        registry.tool(name="t")(lambda args, ctx: body_thread.append(threading.get_ident()))
        registry.execute("t")
    me = threading.get_ident()
    assert recorder.journal.entries == [
        ("start", "t", "-", me),
        ("body", "t", body_thread[0]),
        ("left", "t"),
        ("end", "t", None),
        ("observed", "t"),
    ]


@pytest.mark.parametrize("call", [ToolCall("missing"), ToolCall("t", {"bad": {1, 2}})])
def test_entry_failures_are_traced_too(call: ToolCall) -> None:
    recorder = Recorder()
    with open_registry() as registry:
        registry.add_call_hook(recorder)
        registry.tool(name="t")(lambda args, ctx: "never")
        result = registry.execute(call)
    kinds = [entry[0] for entry in recorder.journal.entries]
    assert kinds == ["start", "end"] and recorder.journal.entries[-1][2] == result.code


def test_each_retry_attempt_runs_inside_the_trace() -> None:
    recorder = Recorder()
    attempts: list[int] = []
    with open_registry() as registry:
        registry.add_call_hook(recorder)
        registry.add_around(RetryPolicy(attempts=2, backoff=0))

        @registry.tool
        def flaky(args: Args, ctx: ToolContext) -> str:
            attempts.append(1)
            if len(attempts) == 1:
                raise ConnectionError("once")
            return "ok"

        assert registry.execute("flaky").ok
    kinds = [entry[0] for entry in recorder.journal.entries]
    assert kinds == ["start", "body", "left", "body", "left", "end"]


def test_the_hook_runs_in_the_callers_context_for_batches_and_awaited_calls() -> None:
    recorder = Recorder()
    with open_registry(max_workers=2) as registry:
        registry.add_call_hook(recorder)
        registry.tool(name="t", concurrency_safe=True)(lambda args, ctx: "ok")
        current.set("batch caller")
        registry.execute_batch([ToolCall("t"), ToolCall("t")])

        async def awaited() -> None:
            current.set("awaiting task")
            await AsyncToolRegistry(registry).execute("t")

        asyncio.run(awaited())
    starts = [entry[2] for entry in recorder.journal.entries if entry[0] == "start"]
    assert starts == ["batch caller", "batch caller", "awaiting task"]


def test_a_call_refused_because_its_turn_was_cancelled_is_traced_with_a_cancelled_token() -> None:
    """3.6: the hook gets the call's token. A batch call that never started (7.2) was refused
    because the batch's token was cancelled, like a model-driven call refused at entry (4.7):
    both hooks see a cancelled token with the caller's reason (the batch's was a live, fresh
    one)."""
    seen: list[tuple[bool, object]] = []

    def hook(call: ToolCall, token: CancelToken) -> None:
        seen.append((token.cancelled, token.reason))

    turn = CancelSource()
    turn.cancel("turn over")
    with open_registry() as registry:
        registry.add_call_hook(hook)
        registry.tool(name="t")(lambda args, ctx: "never")
        registry.execute("t", token=turn.token, start_if_cancelled=False)
        registry.execute_batch([ToolCall("t"), ToolCall("t")], token=turn.token)
    assert seen == [(True, "turn over")] * 3


def test_an_overdue_body_is_reported_to_its_trace() -> None:
    recorder = Recorder()
    gate = Gate()
    caller = CancelSource()
    with open_registry(overdue_after=0.01) as registry:
        registry.add_call_hook(recorder)

        def stubborn(args: Args, ctx: ToolContext) -> str:
            gate.hold()
            return "late"

        registry.tool(name="stubborn")(stubborn)
        call = Caller(lambda: registry.execute("stubborn", token=caller.token))
        gate.wait_reached()
        caller.cancel("stop")
        try:
            wait_until(lambda: ("overdue", "stubborn") in recorder.journal.entries, "overdue")
        finally:
            gate.release()
        call.join()


def test_a_failing_hook_or_trace_is_logged_and_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        @contextlib.contextmanager
        def body(self, ctx: ToolContext) -> Iterator[None]:
            yield
            raise RuntimeError("exit")

        def end(self, result: ToolResult[Any]) -> None:
            raise RuntimeError("end")

    with open_registry() as registry:
        registry.add_call_hook(lambda call, token: 1 / 0)
        registry.add_call_hook(lambda call, token: Broken())
        registry.tool(name="t")(lambda args, ctx: "ok")
        result = registry.execute("t")
    assert result.ok and result.value == "ok"
    assert "call hook" in caplog.text and "failed to leave a body" in caplog.text
    assert "raised in end()" in caplog.text


class NotAnInterrupt(BaseException):
    """A `BaseException` that is neither an interrupt nor an `Exception`."""


class RaisingTrace:
    """A trace whose method `where` raises `exc` (`enter`/`exit` are its body scope's)."""

    def __init__(self, where: str, exc: BaseException) -> None:
        self.where = where
        self.exc = exc

    @contextlib.contextmanager
    def body(self, ctx: ToolContext) -> Iterator[None]:
        if self.where == "enter":
            raise self.exc
        yield
        if self.where == "exit":
            raise self.exc

    def end(self, result: ToolResult[Any]) -> None:
        if self.where == "end":
            raise self.exc


@pytest.mark.parametrize("exc", [GeneratorExit(), NotAnInterrupt()], ids=type)
@pytest.mark.parametrize("where", ["hook", "enter", "exit", "end"])
def test_a_hook_or_trace_raising_a_base_exception_is_logged_and_the_call_observed_once(
    where: str, exc: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    observed: list[ToolResult[Any]] = []

    def hook(call: ToolCall, token: CancelToken) -> RaisingTrace:
        if where == "hook":
            raise exc
        return RaisingTrace(where, exc)

    with open_registry() as registry:
        registry.add_call_hook(hook)
        registry.on_result(observed.append)
        registry.tool(name="t")(lambda args, ctx: "ran")
        result = registry.execute("t")
    assert result.ok and result.value == "ran"  # the call's outcome stands
    assert observed == [result]
    assert type(exc).__name__ in caplog.text


def test_removing_the_hook_stops_the_traces() -> None:
    recorder = Recorder()
    with open_registry() as registry:
        registration = registry.add_call_hook(recorder)
        registry.tool(name="t")(lambda args, ctx: "ok")
        registry.execute("t")
        registration.remove()
        registry.execute("t")
    assert [entry[0] for entry in recorder.journal.entries].count("start") == 1


def test_a_call_hook_raising_an_interrupt_aborts_the_call_and_leaves_nothing_in_flight() -> None:
    def interrupting(call: ToolCall, token: CancelToken) -> None:
        raise KeyboardInterrupt

    with open_registry() as registry:
        registry.add_call_hook(interrupting)
        ran: list[str] = []
        registry.tool(name="t")(lambda args, ctx: ran.append("body"))
        registry.on_result(lambda result: ran.append(str(result.code)))
        with pytest.raises(KeyboardInterrupt):
            registry.execute("t")
        assert registry.in_flight() == [] and registry.wait_idle(0)
    # The interrupt is the call's: its token is cancelled before the gate, so the body never
    # starts, and the observers see the one aborted result before the interrupt re-raises.
    assert ran == ["ABORTED_BEFORE_DISPATCH"]


def test_a_trace_end_raising_an_interrupt_still_lets_the_observers_see_the_result() -> None:
    class Ends:
        def end(self, result: ToolResult[Any]) -> None:
            raise SystemExit

    observed: list[ToolResult[Any]] = []
    with open_registry() as registry:
        registry.add_call_hook(lambda call, token: Ends())
        registry.on_result(observed.append)
        registry.tool(name="t")(lambda args, ctx: "ok")
        with pytest.raises(SystemExit):
            registry.execute("t")
    assert len(observed) == 1 and observed[0].ok


def test_an_inline_body_cancelled_through_its_caller_is_watched_for_overdue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder()
    gate = Gate()
    turn = CancelSource()
    with open_registry(overdue_after=0.01) as registry:
        registry.add_call_hook(recorder)
        registry.tool(name="stubborn", concurrency_safe=True)(lambda args, ctx: gate.hold())
        batch = Caller(lambda: registry.execute_batch([ToolCall("stubborn")], token=turn.token))
        gate.wait_reached()
        turn.cancel("stop")
        try:
            wait_until(lambda: ("overdue", "stubborn") in recorder.journal.entries, "overdue")
        finally:
            gate.release()
        batch.join()
    assert "has not settled" in caplog.text
