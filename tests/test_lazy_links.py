"""Lazy links: a source links into its parents and arms its timer only when someone listens.

Until then reading `.cancelled`/`.reason` resolves it against its parents and its due time, and
every reader must see exactly what eager links would have shown. White-box reads of private
fields are marked as such.
"""

from __future__ import annotations

import inspect
import sys
import threading
from typing import Any

import pytest
from _registry_helpers import WAIT, Caller, counting_tool, fired_by_timer

from toolreg import (
    CancelSource,
    CancelToken,
    ErrorCode,
    TimeoutReason,
    ToolRegistry,
    _cancel,
    deadline,
    timeout_of,
)


def test_a_lazy_child_inherits_the_parents_reason_and_moment() -> None:
    parent = CancelSource()
    child = CancelSource(parent.token)
    parent.cancel("stop")
    assert child.token._cancelled is False  # white-box: nothing was pushed to it
    assert child.token.reason == "stop"
    assert child.token._cancelled_at == parent.token._cancelled_at  # white-box


# Due times here run on the manual clock: a real one would let a thread held up under load
# read a deadline after its due time where the test means before it.


def test_a_lazy_deadline_reads_as_timed_out_after_its_due_time_without_a_timer() -> None:
    with _cancel.manual_clock() as clock:
        budget = deadline(None, 0.01, code="TOOL_TIMEOUT")
        assert budget.token._timer is None  # white-box: nothing armed
        for _ in range(9):
            clock.advance(0.001)
            assert not budget.token.cancelled
        clock.advance(0.001)
        assert budget.token.cancelled and budget.timed_out
        assert budget.token.reason == TimeoutReason("TOOL_TIMEOUT", 0.01)
        assert budget.token._timer is None  # white-box: still never armed
        assert timeout_of(budget.token, "TOOL_TIMEOUT") is not None


def test_a_deadline_closed_before_its_due_time_never_times_out() -> None:
    with _cancel.manual_clock() as clock:
        budget = deadline(None, 0.01)
        budget.close()
        clock.advance(0.03)
        assert not budget.token.wait(0)
        assert not budget.timed_out and not budget.token.cancelled


def test_a_deadline_closed_after_its_due_time_has_timed_out() -> None:
    with _cancel.manual_clock() as clock:
        budget = deadline(None, 0.001)
        clock.advance(0.005)
        budget.close()
        assert budget.timed_out and budget.token.cancelled


def test_the_parent_wins_when_it_was_cancelled_before_the_due_time() -> None:
    with _cancel.manual_clock() as clock:
        parent = CancelSource()
        budget = deadline(parent.token, 0.005)
        parent.cancel("caller")
        clock.advance(0.01)  # read only after the due time: the order is what counts
        assert budget.token.reason == "caller"
        assert not budget.timed_out


def test_the_timer_wins_when_the_parent_was_cancelled_after_the_due_time() -> None:
    with _cancel.manual_clock() as clock:
        parent = CancelSource()
        budget = deadline(parent.token, 0.002)
        clock.advance(0.01)
        parent.cancel("caller, late")
        assert budget.timed_out
        assert budget.token.reason == TimeoutReason("TIMEOUT", 0.002)


def test_the_earliest_of_several_lazy_parents_is_the_cause() -> None:
    a, b = CancelSource(), CancelSource()
    mid_a, mid_b = CancelSource(a.token), CancelSource(b.token)
    child = CancelSource(mid_b.token, mid_a.token)
    b.cancel("first")
    a.cancel("second")
    assert child.token.reason == "first"
    assert mid_a.token.reason == "second"


def test_a_callback_on_a_lazy_token_whose_parent_was_cancelled_runs_at_once() -> None:
    parent = CancelSource()
    child = CancelSource(parent.token)
    parent.cancel("gone")
    ran: list[int] = []
    child.token.on_cancel(lambda: ran.append(threading.get_ident()))
    assert ran == [threading.get_ident()]


def test_a_callback_makes_a_lazy_deadline_fire_from_the_timer() -> None:
    names: list[str] = []
    done = threading.Event()

    def note_the_thread() -> None:
        names.append(threading.current_thread().name)
        done.set()

    # Registered before its due time (`fired_by_timer`), so no read resolves it: only the
    # timer can have fired it, and the callback runs on a callback thread.
    budget = fired_by_timer(note_the_thread, 0.01)
    assert budget.token._timer is not None or budget.token.cancelled  # white-box: armed
    assert done.wait(WAIT)
    assert names == ["toolreg-callbacks"] and budget.timed_out  # fired by the timer thread


def test_a_reader_during_a_concurrent_link_sees_a_cancellation_that_already_happened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Hold the thread making the child eager exactly inside its link into the parent.
    parent = CancelSource()
    child = CancelSource(parent.token)
    linking, release = threading.Event(), threading.Event()
    real_attach = CancelToken._attach

    def held_attach(self: CancelToken, ref: Any) -> bool:
        if self is parent.token:
            linking.set()
            assert release.wait(WAIT)
        return real_attach(self, ref)

    monkeypatch.setattr(CancelToken, "_attach", held_attach)
    ran: list[str] = []
    listener = Caller(lambda: child.token.on_cancel(lambda: ran.append("callback")))
    assert linking.wait(WAIT)
    parent.cancel("stop")  # completes while the child is half linked
    assert child.token.cancelled and child.token.reason == "stop"
    release.set()
    listener.join()
    assert ran == ["callback"]


def test_a_lazy_child_read_while_its_parent_is_being_marked_reads_cancelled() -> None:
    """A lock-free reader of a lazy token whose parent is in the middle of being marked
    cancelled (its own cause is older) must read cancelled, at every line of the marking.

    The parent cleared its lazy fields before it set `_cancelled`: in between, the child's fast
    path took it for an eager, live parent and read live, although every ancestor had been
    cancelled (found by tests/contract's concurrent layer: a body read its token live under a
    cancelled caller). The read is made on the marking thread itself, from a line tracer, as a
    finalizer could (the token lock is reentrant, A.4), once per line of `_mark`.
    """
    lines, first = inspect.getsourcelines(CancelToken._mark)
    seen = {line: read_child_while_marking(line) for line in range(first + 1, first + len(lines))}
    live = [line for line, read in seen.items() if read is False]
    assert live == [] and any(read for read in seen.values()), f"read live at lines {live}"


def read_child_while_marking(target: int) -> bool | None:
    """What a lazy child reads when its parent's marking reaches line `target` (None: it
    never does)."""
    mark = CancelToken._mark.__code__
    cause = CancelSource()
    parent = CancelSource(cause.token, CancelSource().token)  # lazy, two parents: no fast path
    child = CancelSource(parent.token)  # lazy, one parent: the fast path reads the parent
    cause.cancel("stop")  # the parent is not marked yet: nobody has read it
    read: list[bool] = []

    def at_line(frame: Any) -> None:
        if frame.f_locals.get("self") is parent.token and not read:
            read.append(child.token.cancelled)

    # Resolving the parent marks it, under the tracer.
    assert traced(mark, target, at_line, lambda: parent.token.cancelled)
    assert child.token.cancelled
    return read[0] if read else None


def traced(code: Any, target: int, at_line: Any, run: Any) -> Any:
    """`run()` with `at_line(frame)` called whenever `code` reaches line `target`."""

    def local(frame: Any, event: str, arg: object) -> Any:
        if event == "line" and frame.f_lineno == target:
            at_line(frame)
        return local

    def tracer(frame: Any, event: str, arg: object) -> Any:
        return local if frame.f_code is code else None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return run()
    finally:
        sys.settrace(previous)


@pytest.mark.parametrize(
    "reader",
    [vars(CancelToken)["cancelled"].fget, _cancel._resolve, _cancel._first_cause],
    ids=["cancelled", "_resolve", "_first_cause"],
)
def test_a_lazy_child_reads_cancelled_when_its_parent_is_marked_during_the_read(
    reader: Any,
) -> None:
    """The reader's side of the race above: the parent (lazy, its cause older than the read)
    is marked cancelled between any two lines of the child's read, by another reader resolving
    it or by a thread making it eager. The child must still read cancelled.

    A reader looked at the parent's flag first (unset) and its lazy fields after (gone by the
    marking just begun), and took the parent for an eager, live one. The marking is made from
    a line tracer on the reading thread, once per line of each reading function.
    """
    lines, first = inspect.getsourcelines(reader)
    for target in range(first + 1, first + len(lines)):
        read = read_child_with_parent_marked_at(reader.__code__, target)
        assert read, f"read live with the parent marked at line {target} of {reader.__name__}"


def read_child_with_parent_marked_at(code: Any, target: int) -> bool:
    """A lazy child's read, its parent marked (with an older cause) when the reading function
    `code`, looking at the parent, reaches line `target`."""
    cause = CancelSource()
    parent = CancelSource(cause.token, CancelSource().token)  # lazy, two parents
    child = CancelSource(parent.token)  # lazy, one parent
    cause.cancel("stop")  # an old cause the parent has not been marked with yet
    marked: list[int] = []

    def at_line(frame: Any) -> None:
        looking = parent.token in (frame.f_locals.get("node"), frame.f_locals.get("parent"))
        if looking and not marked:
            marked.append(target)
            assert parent.token.cancelled  # resolves the parent: marks it, right here

    read: bool = traced(code, target, at_line, lambda: child.token.cancelled)
    return read


def test_a_million_lazy_children_leave_nothing_on_their_parent() -> None:
    parent = CancelSource()
    for _ in range(1_000_000 // 50):
        children = [CancelSource(parent.token) for _ in range(50)]
        del children
    assert parent.token._children is None and parent.token._listeners is None  # white-box


def test_eager_and_lazy_tokens_agree_under_racing_cancels() -> None:
    for _ in range(200):
        parent = CancelSource()
        lazy = CancelSource(parent.token)
        eager = CancelSource(parent.token)
        eager.token.on_cancel(lambda: None)
        barrier = threading.Barrier(2)

        def read(lazy: CancelSource = lazy, barrier: threading.Barrier = barrier) -> object:
            barrier.wait(WAIT)
            return lazy.token.reason if lazy.token.cancelled else None

        reader = Caller(read)
        barrier.wait(WAIT)
        parent.cancel("x")
        assert reader.join() in (None, "x")  # never cancelled with anything else
        assert lazy.token.cancelled and eager.token.cancelled
        assert lazy.token.reason == eager.token.reason == "x"


@pytest.mark.parametrize("cause", ["caller", "call", "due", "none"])
def test_a_deadline_under_a_lazy_call_token_under_a_caller_reads_each_cause(cause: str) -> None:
    # TimeoutPolicy's shape with a caller token: a deadline below the call's own lazy token,
    # itself below the caller's eager one. `.cancelled` reads it without a walk while nothing
    # fired; each cause must still show at once, with its own reason.
    with _cancel.manual_clock() as clock:
        caller = CancelSource()
        caller.token.on_cancel(lambda: None)  # an eager caller, as one that is listened to
        call_token = _cancel.child_token(caller.token)
        budget = _cancel.deadline_token(call_token, 5.0, "TOOL_TIMEOUT")
        assert not budget.cancelled  # live: the walk-free read
        if cause == "caller":
            caller.cancel("caller stopped")
        elif cause == "call":
            _cancel._cancel(call_token, "registry closed")
        elif cause == "due":
            clock.advance(5.0)
        assert budget.cancelled is (cause != "none")
        expected = {
            "caller": "caller stopped",
            "call": "registry closed",
            "due": TimeoutReason("TOOL_TIMEOUT", 5.0),
            "none": None,
        }[cause]
        assert budget.reason == expected
        assert _cancel.timed_out(budget) is (cause == "due")
        assert call_token.cancelled is (cause in ("caller", "call"))
        _cancel.close_token(budget)


@pytest.mark.parametrize("cause", ["parent cancelled", "due time passed"])
@pytest.mark.parametrize("start_if_cancelled", [False, True], ids=["model", "direct"])
def test_a_lazy_caller_token_cancelled_before_the_call_is_read_as_cancelled_at_entry(
    registry: ToolRegistry, cause: str, start_if_cancelled: bool
) -> None:
    """The entry reads a lazy caller token through its parents and due time. Cancelled by
    either, it is a pre-cancelled entry: a model-driven call starts nothing; a direct one still
    starts its body, to clean up, since no recheck applies to a call that entered cancelled."""
    starts = counting_tool(registry)
    parent = CancelSource()
    with _cancel.manual_clock() as clock:
        if cause == "parent cancelled":
            caller = CancelSource(parent.token).token
            parent.cancel("stop")
        else:
            caller = deadline(parent.token, 5.0).token
            clock.advance(5.0)
        assert caller._pending is not None  # white-box: still lazy, so the entry resolves it
        result = registry.execute("work", token=caller, start_if_cancelled=start_if_cancelled)
    if start_if_cancelled:
        assert result.dispatched and len(starts) == 1
    else:
        assert result.code == ErrorCode.ABORTED_BEFORE_DISPATCH
        assert starts == []


def test_a_policy_deadline_closes_without_a_last_read_and_leaves_nothing_on_the_call() -> None:
    """`close_token` (TimeoutPolicy's deadline, closed after the body was joined) drops a cause
    nobody read; one a listener made eager is unlinked from the call's token and its timer
    disarmed (white-box: `_children`)."""
    with _cancel.manual_clock() as clock:
        call = CancelSource()
        unread = _cancel.deadline_token(call.token, 0.01, "T")
        clock.advance(0.02)  # due, and nobody has read it
        _cancel.close_token(unread)
        assert not unread.cancelled and not _cancel.timed_out(unread)
        heard: list[str] = []
        listened = _cancel.deadline_token(call.token, 0.01, "T")
        listened.on_cancel(lambda: heard.append("fired"))
        assert call.token._children  # linked into the call's token, its timer armed
        _cancel.close_token(listened)
        assert not call.token._children
        clock.advance(0.02)
        assert not listened.cancelled and heard == []
