"""Tests for toolreg/_cancel.py: sources, tokens, registrations, deadlines (contract section 1).

Threads are ordered with Events and Barriers, never with sleeps. The only bounded waits on time
are `join(timeout)`/`wait(timeout)` calls that turn a deadlock into a failure instead of a hang,
and short real deadlines (the timer is real; a later deadline is used as the clock that proves an
earlier one was processed). A test that must decide when a deadline fires uses the manual clock
(the `clock` fixture). Deadline callbacks run on the `toolreg-callbacks` threads, after the token
reads as cancelled: a test waits for the callbacks themselves, never for the token. White-box
reads of private fields are marked as such.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import logging
import math
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import pytest
from _registry_helpers import fired_by_timer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolreg import (
    Cancelled,
    CancelSource,
    CancelToken,
    Registration,
    TimeoutReason,
    _cancel,
    deadline,
    timeout_of,
)
from toolreg._timer import ManualClock

pytestmark = pytest.mark.usefixtures("no_leaked_threads_or_fds")

T = TypeVar("T")
S = TypeVar("S")

WAIT = 10.0  # upper bound for anything that should happen at once; only reached on failure
FLAT = 64 * 1024  # traced-memory growth allowed over 250k cycles: a quarter byte per cycle


# -- helpers ------------------------------------------------------------------------------------


def call_bounded(fn: Callable[[], T], timeout: float = WAIT) -> T:
    """Run `fn` on a daemon thread and return its result; fail (not hang) if it deadlocks."""
    outcome: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:
            outcome.append((False, exc))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"{fn!r} did not return within {timeout}s: deadlock")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def outcome(fn: Callable[[], object]) -> object:
    """What `fn()` returned (`None` included), to be recorded and compared."""
    return fn()


def start_thread(fn: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=fn)
    thread.start()
    return thread


def eager(source: CancelSource) -> CancelSource:
    """Make a (lazy) source eager, as any listener does: linked into its parents, timer armed."""
    source.token.on_cancel(lambda: None).remove()
    return source


def held_links(token: CancelToken) -> int:
    """White-box: how many child links `token` holds (dead or alive)."""
    children = token._children
    return 0 if children is None else len(children)


def traced_growth(run: Callable[[int], object], warmup: int, total: int) -> int:
    """Bytes still traced after `run` covered `total` cycles, minus after its first `warmup`."""
    tracemalloc.start()
    try:
        run(warmup)
        after_warmup = tracemalloc.get_traced_memory()[0]
        run(total - warmup)
        return tracemalloc.get_traced_memory()[0] - after_warmup
    finally:
        tracemalloc.stop()


def traced_size(make: Callable[[], object], count: int) -> int:
    """Bytes traced for `count` objects made by `make` (the holding list is not counted)."""
    holder: list[object] = [None] * count
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for index in range(count):
            holder[index] = make()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def error_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "toolreg" and r.levelno >= logging.ERROR]


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll an observable condition in short bounded slices (it never orders threads)."""
    pause = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if condition():
            return
        pause.wait(0.01)
    assert condition(), f"timed out waiting for {what}"


def run_python(source: str, timeout: float) -> subprocess.CompletedProcess[str] | None:
    """Run `source` in a fresh interpreter; None if it hung for `timeout` seconds."""
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(source)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None


def spin(rng: random.Random, most: int = 64) -> None:
    """A short random busy wait: shifts where threads meet without sleeping."""
    for _ in range(rng.randrange(most)):
        pass


@dataclass
class Race(Generic[S]):
    """Rounds of a race: fresh state per round, actors released together by a Barrier."""

    prepare: Callable[[int], S]
    actors: Sequence[Callable[[S, random.Random], object]]
    check: Callable[[S], Hashable]  # asserts the invariants; returns which way the race went
    errors: list[BaseException] = field(default_factory=list)

    def run(self, rounds: int) -> Counter[Hashable]:
        """Run the rounds; return how often each outcome of the race occurred."""
        barrier = threading.Barrier(len(self.actors) + 1, timeout=30)
        current: list[S] = []
        arrived: list[bool] = []
        outcomes: Counter[Hashable] = Counter()

        def loop(actor: Callable[[S, random.Random], object], index: int) -> None:
            rng = random.Random(index)
            try:
                for _ in range(rounds):
                    barrier.wait()  # the round's state is ready
                    # Leaving a Barrier takes a wake-up each, so the first actor out would
                    # finish before the others run; meeting again on a busy-wait keeps every
                    # actor runnable, so the GIL interleaves them inside their actions.
                    arrived[index] = True
                    while not all(arrived):
                        pass
                    spin(rng)
                    actor(current[0], rng)
                    barrier.wait()  # every actor is done: the main thread checks
            except BaseException as exc:
                self.errors.append(exc)
                barrier.abort()

        threads = [
            start_thread(functools.partial(loop, actor, index))
            for index, actor in enumerate(self.actors)
        ]
        failed = True
        try:
            for index in range(rounds):
                current[:] = [self.prepare(index)]
                arrived[:] = [False] * len(self.actors)
                barrier.wait()
                barrier.wait()
                outcomes[self.check(current[0])] += 1
            failed = False
        except threading.BrokenBarrierError:
            pass  # an actor failed; its error is raised below
        finally:
            if failed:
                # Only on failure: aborting after the last round could break actors that have
                # passed the final barrier but not yet woken up.
                barrier.abort()
            for thread in threads:
                thread.join(30)
        real = [e for e in self.errors if not isinstance(e, threading.BrokenBarrierError)]
        if real:
            raise real[0]
        assert not failed and not self.errors, "the race's barrier broke"
        return outcomes


@pytest.fixture(params=["gc-disabled", "gc-enabled"])
def cycles(request: pytest.FixtureRequest) -> int:
    """How many cycles a flat-memory test runs, with the GC off (where a leaked reference cycle
    shows as growth) and on: a quarter million. A leak of one byte per cycle shows at over three
    times `FLAT`, and the test fits the time budget: a million traced cycles took 53-67 s on
    this project's 2-core VM (2026-12-02), against the suite's 60 s timeout."""
    if request.param == "gc-disabled":
        request.getfixturevalue("gc_disabled")
    return 250_000


# -- sources and tokens ---------------------------------------------------------------------------


def test_new_source_token_is_live_with_no_reason() -> None:
    src = CancelSource()
    assert isinstance(src.token, CancelToken)
    assert src.token is src.token
    assert not src.token.cancelled
    assert src.token.reason is None
    assert not src.timed_out


def test_cancel_returns_true_only_for_the_call_that_cancelled() -> None:
    src = CancelSource()
    assert src.cancel("first") is True
    assert src.cancel("second") is False
    assert src.token.cancelled


def test_first_reason_wins() -> None:
    src = CancelSource()
    src.cancel("user pressed stop")
    src.cancel("shutdown")
    assert src.token.reason == "user pressed stop"


def test_cancel_without_a_reason_records_none() -> None:
    src = CancelSource()
    assert src.cancel()
    assert src.token.cancelled and src.token.reason is None


def test_cancel_does_not_set_timed_out() -> None:
    src = CancelSource(timeout=60.0)
    try:
        src.cancel("stop")
        assert not src.timed_out
    finally:
        src.close()


def test_cancelling_a_token_directly_is_impossible() -> None:
    with pytest.raises(TypeError):
        CancelToken()
    assert not hasattr(CancelSource().token, "cancel")


# -- propagation --------------------------------------------------------------------------------


def test_every_linked_descendant_reads_cancelled_when_cancel_returns() -> None:
    root = CancelSource()
    child = CancelSource(root.token)
    grandchild = CancelSource(child.token)
    sibling = CancelSource(root.token)
    fused = CancelSource(grandchild.token, sibling.token)
    assert root.cancel("stop")
    for src in (child, grandchild, sibling, fused):
        assert src.token.cancelled
        assert src.token.reason == "stop"


def test_descendants_already_read_cancelled_inside_a_callback_on_the_parent() -> None:
    root = CancelSource()
    child = CancelSource(root.token)
    grandchild = CancelSource(child.token)
    fused = CancelSource(grandchild.token, CancelSource().token)
    tokens = [child.token, grandchild.token, fused.token]
    seen: list[list[tuple[bool, object]]] = []
    root.token.on_cancel(lambda: seen.append([(t.cancelled, t.reason) for t in tokens]))
    root.cancel("stop")
    assert seen == [[(True, "stop")] * 3]


def test_cancelling_a_child_leaves_its_parent_and_siblings_live() -> None:
    root = CancelSource()
    child = CancelSource(root.token)
    sibling = CancelSource(root.token)
    grandchild = CancelSource(child.token)
    child.cancel("child only")
    assert grandchild.token.cancelled
    assert not root.token.cancelled
    assert not sibling.token.cancelled


@pytest.mark.parametrize("which", [0, 1])
def test_fused_source_is_cancelled_by_any_parent_with_that_parents_reason(which: int) -> None:
    parents = [CancelSource(), CancelSource()]
    fused = CancelSource(parents[0].token, parents[1].token)
    parents[which].cancel(f"parent {which}")
    assert fused.token.cancelled
    assert fused.token.reason == f"parent {which}"
    assert not parents[1 - which].token.cancelled


def test_fused_source_keeps_the_reason_of_the_first_parent_that_cancelled() -> None:
    a, b = CancelSource(), CancelSource()
    fused = CancelSource(a.token, b.token)
    b.cancel("b first")
    a.cancel("a later")
    assert fused.token.reason == "b first"


def test_source_linked_to_a_cancelled_parent_starts_cancelled_with_its_reason() -> None:
    live, dead = CancelSource(), CancelSource()
    dead.cancel("already gone")
    for src in (CancelSource(dead.token), CancelSource(live.token, dead.token)):
        assert src.token.cancelled
        assert src.token.reason == "already gone"
    assert held_links(live.token) == 0  # white-box: the born-cancelled fused child left no link


def test_reason_is_inherited_through_every_level() -> None:
    root = CancelSource()
    leaf = CancelSource(CancelSource(CancelSource(root.token).token).token)
    reason = object()
    root.cancel(reason)
    assert leaf.token.reason is reason


# -- close --------------------------------------------------------------------------------------


def test_close_does_not_cancel() -> None:
    parent = CancelSource()
    child = CancelSource(parent.token)
    child.close()
    assert not child.token.cancelled
    assert not parent.token.cancelled


def test_closed_source_no_longer_follows_its_parents() -> None:
    a, b = CancelSource(), CancelSource()
    child = CancelSource(a.token, b.token)
    child.close()
    a.cancel("a")
    b.cancel("b")
    assert not child.token.cancelled


def test_cancel_still_works_after_close_and_reaches_its_children() -> None:
    parent = CancelSource()
    child = CancelSource(parent.token)
    grandchild = CancelSource(child.token)
    child.close()
    assert child.cancel("after close")
    assert child.token.reason == "after close"
    assert grandchild.token.reason == "after close"
    assert not parent.token.cancelled


def test_close_is_idempotent() -> None:
    parent = CancelSource()
    child = CancelSource(parent.token)
    child.close()
    child.close()
    child.cancel("x")
    child.close()
    assert child.token.cancelled


def test_context_manager_returns_the_source_and_closes_it_on_exit_even_on_error() -> None:
    parent = CancelSource()
    with pytest.raises(RuntimeError), CancelSource(parent.token) as scope:
        assert isinstance(scope, CancelSource)
        raise RuntimeError("boom")
    parent.cancel("after exit")
    assert not scope.token.cancelled


# -- links and listener hygiene (white-box reads of the parent's child set) ------------------


def test_a_lazy_child_holds_nothing_on_its_parents_until_someone_listens() -> None:
    a, b = CancelSource(), CancelSource()
    child = CancelSource(a.token, b.token)
    assert held_links(a.token) == held_links(b.token) == 0
    b.cancel("b")
    assert child.token.cancelled and child.token.reason == "b"  # resolved on read
    assert held_links(a.token) == 0


def test_closed_child_unlinks_from_every_parent_at_once() -> None:
    a, b = CancelSource(), CancelSource()
    child = eager(CancelSource(a.token, b.token))
    assert held_links(a.token) == held_links(b.token) == 1
    child.close()
    assert held_links(a.token) == held_links(b.token) == 0


def test_cancelled_child_unlinks_from_every_parent_at_once() -> None:
    a, b = CancelSource(), CancelSource()
    child = eager(CancelSource(a.token, b.token))
    assert held_links(a.token) == held_links(b.token) == 1
    child.cancel("x")
    assert held_links(a.token) == held_links(b.token) == 0


def test_fused_child_cancelled_by_one_parent_unlinks_from_the_other() -> None:
    a, b = CancelSource(), CancelSource()
    child = eager(CancelSource(a.token, b.token))
    assert held_links(b.token) == 1
    a.cancel("a")
    assert child.token.cancelled
    assert held_links(b.token) == 0


def test_closed_deadline_leaves_nothing_on_its_parent() -> None:
    parent = CancelSource()
    budget = eager(deadline(parent.token, 60.0, code="TOOL_TIMEOUT"))
    assert held_links(parent.token) == 1 and budget.token._timer is not None  # white-box
    budget.close()
    assert held_links(parent.token) == 0
    assert parent.token._listeners is None  # white-box: nothing registered either


def test_token_of_a_dropped_source_keeps_following_its_parent() -> None:
    parent = CancelSource()
    src = CancelSource(parent.token)
    source_ref = weakref.ref(src)
    token = src.token
    del src
    gc.collect()
    assert source_ref() is None  # only the token is left
    parent.cancel("still linked")
    assert token.cancelled and token.reason == "still linked"


def test_expression_form_token_keeps_following_its_parent() -> None:
    parent = CancelSource()
    token = CancelSource(parent.token).token
    gc.collect()
    parent.cancel("x")
    assert token.cancelled


def test_live_children_survive_the_sweep_of_dropped_ones() -> None:
    parent = CancelSource()
    kept = [eager(CancelSource(parent.token)) for _ in range(100)]
    for _ in range(1000):
        eager(CancelSource(parent.token))  # linked, then dropped: swept as the set doubles
    assert held_links(parent.token) < 1100
    parent.cancel("x")
    assert all(src.token._cancelled for src in kept)  # white-box: pushed, not resolved on read


@pytest.mark.stress
def test_child_create_close_cycles_keep_memory_flat(cycles: int) -> None:
    token = CancelSource().token

    def run(count: int) -> None:
        for _ in range(count):
            eager(CancelSource(token)).close()

    assert traced_growth(run, cycles // 10, cycles) < FLAT
    assert held_links(token) == 0


@pytest.mark.stress
def test_on_cancel_remove_cycles_keep_memory_flat(cycles: int) -> None:
    token = CancelSource().token

    def run(count: int) -> None:
        for _ in range(count):
            token.on_cancel(int).remove()

    assert traced_growth(run, cycles // 10, cycles) < FLAT
    assert not token._listeners  # white-box: no per-registration state left


@pytest.mark.stress
@pytest.mark.usefixtures("gc_disabled")
def test_dropped_children_keep_memory_flat() -> None:
    token = CancelSource().token

    def run(count: int) -> None:
        for _ in range(count):
            eager(CancelSource(token))  # linked, then dropped without close()

    assert traced_growth(run, 10_000, 100_000) < FLAT
    assert held_links(token) <= 2 * _cancel._FIRST_SWEEP


@pytest.mark.stress
def test_deadline_create_close_cycles_keep_memory_and_the_timer_heap_flat() -> None:
    token = CancelSource().token

    def run(count: int) -> None:
        for _ in range(count):
            eager(deadline(token, 60.0, code="TOOL_TIMEOUT")).close()  # armed, then disarmed

    assert traced_growth(run, 10_000, 100_000) < FLAT
    assert held_links(token) == 0
    assert len(_cancel._TIMER._heap) < 1_000  # white-box: closed deadlines are compacted away


# -- wait and raise_if_cancelled ------------------------------------------------------------------


def test_wait_returns_true_when_another_thread_cancels() -> None:
    src = CancelSource()
    waiting = threading.Event()
    results: list[bool] = []

    def waiter() -> None:
        waiting.set()
        results.append(src.token.wait(WAIT))

    thread = start_thread(waiter)
    assert waiting.wait(WAIT)
    src.cancel("wake up")
    thread.join(WAIT)
    assert results == [True]


def test_wait_on_a_cancelled_token_returns_true_at_once() -> None:
    src = CancelSource()
    src.cancel()
    assert src.token.wait() is True
    assert src.token.wait(0) is True


def test_wait_times_out_with_false() -> None:
    src = CancelSource()
    started = time.monotonic()
    assert src.token.wait(0.02) is False
    assert time.monotonic() - started >= 0.015
    assert src.token.wait(0) is False


def test_raise_if_cancelled_is_silent_while_live() -> None:
    CancelSource().token.raise_if_cancelled()


def test_raise_if_cancelled_raises_cancelled_carrying_the_reason() -> None:
    src = CancelSource()
    reason = object()
    src.cancel(reason)
    with pytest.raises(Cancelled) as caught:
        src.token.raise_if_cancelled()
    assert caught.value.reason is reason


def test_cancelled_is_a_base_exception_that_except_exception_cannot_swallow() -> None:
    assert issubclass(Cancelled, BaseException)
    assert not issubclass(Cancelled, Exception)


def test_idle_token_creates_no_event_until_someone_waits() -> None:
    src = CancelSource()
    src.token.on_cancel(int)
    assert src.token._event is None  # white-box: created lazily
    src.token.wait(0)
    assert src.token._event is not None


def test_idle_source_takes_under_35_percent_of_an_events_memory() -> None:
    count = 10_000
    token_bytes = traced_size(CancelSource, count)
    event_bytes = traced_size(threading.Event, count)
    assert token_bytes < 0.35 * event_bytes


# -- on_cancel and callbacks --------------------------------------------------------------------


def test_callbacks_run_once_in_registration_order_in_the_cancelling_thread() -> None:
    src = CancelSource()
    calls: list[tuple[int, int]] = []

    def record(index: int) -> None:
        calls.append((index, threading.get_ident()))

    for index in range(5):
        src.token.on_cancel(functools.partial(record, index))
    call_bounded(lambda: src.cancel("x"))  # cancels on another thread
    src.cancel("again")
    assert [index for index, _ in calls] == [0, 1, 2, 3, 4]
    assert len({ident for _, ident in calls}) == 1
    assert calls[0][1] != threading.get_ident()


def test_callback_sees_its_token_already_cancelled() -> None:
    src = CancelSource()
    seen: list[tuple[bool, object]] = []
    src.token.on_cancel(lambda: seen.append((src.token.cancelled, src.token.reason)))
    src.cancel("stop")
    assert seen == [(True, "stop")]


def test_on_cancel_on_a_cancelled_token_runs_inline_before_returning() -> None:
    src = CancelSource()
    src.cancel("x")
    calls: list[int] = []
    registration = src.token.on_cancel(lambda: calls.append(threading.get_ident()))
    assert calls == [threading.get_ident()]
    assert isinstance(registration, Registration)
    assert registration.remove() is False  # it already ran


def test_callback_runs_once_even_if_the_token_is_cancelled_again_and_through_two_parents() -> None:
    a, b = CancelSource(), CancelSource()
    fused = CancelSource(a.token, b.token)
    calls: list[str] = []
    fused.token.on_cancel(lambda: calls.append("ran"))
    a.cancel("a")
    b.cancel("b")
    fused.cancel("direct")
    assert calls == ["ran"]


def test_raising_callback_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    src = CancelSource()
    calls: list[str] = []

    def boom() -> None:
        raise RuntimeError("callback failed")

    src.token.on_cancel(lambda: calls.append("before"))
    src.token.on_cancel(boom)
    src.token.on_cancel(lambda: calls.append("after"))
    assert src.cancel("x") is True  # cancel() does not raise
    assert calls == ["before", "after"]
    [record] = error_records(caplog)
    assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)


def test_raising_inline_callback_is_logged_and_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    src = CancelSource()
    src.cancel("x")

    def boom() -> None:
        raise ValueError("inline failure")

    src.token.on_cancel(boom)
    [record] = error_records(caplog)
    assert record.exc_info is not None and isinstance(record.exc_info[1], ValueError)


def test_raising_callback_on_a_descendant_does_not_stop_propagation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    root = CancelSource()
    child = CancelSource(root.token)
    later = CancelSource(root.token)
    calls: list[str] = []
    child.token.on_cancel(lambda: 1 / 0)
    later.token.on_cancel(lambda: calls.append("later"))
    root.cancel("x")
    assert calls == ["later"]
    assert len(error_records(caplog)) == 1


def test_callbacks_after_one_raising_keyboard_interrupt_still_run() -> None:
    src = CancelSource()
    calls: list[str] = []

    def interrupt() -> None:
        raise KeyboardInterrupt

    src.token.on_cancel(interrupt)
    src.token.on_cancel(lambda: calls.append("after"))
    with contextlib.suppress(KeyboardInterrupt):  # whether Ctrl-C propagates is not specified
        src.cancel("x")
    assert calls == ["after"]
    assert src.token.cancelled


def test_callback_raising_cancelled_is_logged_and_does_not_escape_cancel(
    caplog: pytest.LogCaptureFixture,
) -> None:
    src = CancelSource()
    src.token.on_cancel(src.token.raise_if_cancelled)  # a natural mistake in a callback
    assert src.cancel("x") is True
    assert len(error_records(caplog)) == 1


def test_non_callable_callback_is_a_type_error() -> None:
    for token in (CancelSource().token, CancelToken.never()):
        with pytest.raises(TypeError):
            token.on_cancel(None)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            token.on_cancel("not callable")  # type: ignore[arg-type]


# -- no toolreg lock is held while user code runs ----------------------------------------------


def test_cancelled_and_reason_read_without_a_lock() -> None:
    src = CancelSource()
    with src.token._lock:  # white-box: a reader that needed this lock would block
        assert call_bounded(lambda: (src.token.cancelled, src.token.reason)) == (False, None)
    src.cancel("x")
    with src.token._lock:
        assert call_bounded(lambda: (src.token.cancelled, src.token.reason)) == (True, "x")
        assert call_bounded(lambda: src.token.wait(0)) is True


def test_callback_registering_on_its_own_token_runs_the_new_callback_inline() -> None:
    src = CancelSource()
    calls: list[str] = []

    def outer() -> None:
        calls.append("outer start")
        src.token.on_cancel(lambda: calls.append("inner"))
        calls.append("outer end")

    src.token.on_cancel(outer)
    call_bounded(lambda: src.cancel("x"))
    assert calls == ["outer start", "inner", "outer end"]


def test_remove_from_inside_its_own_callback_returns_false_without_waiting() -> None:
    src = CancelSource()
    removed: list[bool] = []
    registrations: list[Registration] = []
    registrations.append(src.token.on_cancel(lambda: removed.append(registrations[0].remove())))
    call_bounded(lambda: src.cancel("x"))
    assert removed == [False]


def test_callback_can_use_its_own_and_other_tokens() -> None:
    src, other, parent = CancelSource(), CancelSource(), CancelSource()
    child = CancelSource(src.token)
    pending = other.token.on_cancel(int)
    results: dict[str, object] = {}

    def callback() -> None:
        results["cancel self"] = src.cancel("again")
        results["close self"] = outcome(src.close)
        results["cancel other"] = other.cancel("from a callback")
        results["remove other"] = pending.remove()
        results["new child"] = CancelSource(src.token).token.cancelled
        results["close child"] = outcome(child.close)
        results["register on parent"] = parent.token.on_cancel(int).remove()
        results["wait"] = child.token.wait(0)

    src.token.on_cancel(callback)
    call_bounded(lambda: src.cancel("x"))
    assert results == {
        "cancel self": False,
        "close self": None,
        "cancel other": True,
        "remove other": False,
        "new child": True,
        "close child": None,
        "register on parent": True,
        "wait": True,
    }


def test_callback_can_wait_for_a_token_another_thread_cancels() -> None:
    src, other = CancelSource(), CancelSource()
    entered = threading.Event()
    woke: list[bool] = []

    def callback() -> None:
        entered.set()
        woke.append(other.token.wait(WAIT))

    src.token.on_cancel(callback)
    canceller = start_thread(lambda: src.cancel("x"))
    assert entered.wait(WAIT)
    other.cancel("from the main thread")
    canceller.join(WAIT)
    assert woke == [True]


def test_deadline_callback_can_schedule_another_deadline() -> None:
    fired: list[CancelSource] = []
    scheduled = threading.Event()

    def schedule_another() -> None:
        fired.append(deadline(None, 0.01))
        scheduled.set()

    fired_by_timer(schedule_another, 0.01)
    assert scheduled.wait(WAIT)
    assert fired[0].token.wait(WAIT)
    assert fired[0].timed_out


# -- Registration.remove ---------------------------------------------------------------------


def test_remove_before_cancel_returns_true_and_the_callback_never_runs() -> None:
    src = CancelSource()
    calls: list[str] = []
    registration = src.token.on_cancel(lambda: calls.append("ran"))
    assert registration.remove() is True
    assert registration.remove() is False  # only the call that removed it says True
    src.cancel("x")
    assert calls == []


def test_remove_after_the_callback_ran_returns_false() -> None:
    src = CancelSource()
    registration = src.token.on_cancel(int)
    src.cancel("x")
    assert registration.remove() is False


def test_registration_is_a_context_manager_that_removes_on_exit() -> None:
    src = CancelSource()
    calls: list[str] = []
    with src.token.on_cancel(lambda: calls.append("ran")) as registration:
        assert isinstance(registration, Registration)
    src.cancel("x")
    assert calls == []


def test_remove_waits_for_the_callback_running_on_another_thread() -> None:
    src = CancelSource()
    entered, release, removed_returned = threading.Event(), threading.Event(), threading.Event()
    finished: list[str] = []

    def slow_callback() -> None:
        entered.set()
        release.wait(WAIT)
        finished.append("callback done")

    registration = src.token.on_cancel(slow_callback)
    canceller = start_thread(lambda: src.cancel("x"))
    assert entered.wait(WAIT)
    results: list[bool] = []

    def remover() -> None:
        results.append(registration.remove())
        removed_returned.set()

    remover_thread = start_thread(remover)
    remover_thread.join(0.2)  # give a wrong implementation the chance to return early
    assert not removed_returned.is_set() and remover_thread.is_alive()
    release.set()
    remover_thread.join(WAIT)
    canceller.join(WAIT)
    assert results == [False]
    assert finished == ["callback done"]


def test_an_interrupt_landing_as_a_callback_starts_never_leaves_remove_waiting() -> None:
    # A Ctrl-C (any asynchronous exception) can land on any line the cancelling thread runs.
    # Injected with a line tracer, deterministically, on the line that picks up the callback
    # right after the listener was marked running: `remove()` on another thread must not wait
    # for a callback that will never run.
    run = _cancel._Listener._run
    lines, first = inspect.getsourcelines(run)
    target = [first + i for i, line in enumerate(lines) if line.strip() == "fn = self._fn"]
    assert len(target) == 1
    injected: list[int] = []

    def local(frame: Any, event: str, arg: object) -> Any:
        if event == "line" and frame.f_lineno == target[0] and not injected:
            injected.append(frame.f_lineno)
            raise KeyboardInterrupt("landed as the callback starts")
        return local

    def tracer(frame: Any, event: str, arg: object) -> Any:
        return local if frame.f_code is run.__code__ else None

    src = CancelSource()
    ran: list[str] = []
    registration = src.token.on_cancel(lambda: ran.append("ran"))
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            src.cancel("x")
    finally:
        sys.settrace(previous)
    assert injected and ran == []
    results: list[bool] = []
    # A daemon: with the bug it would wait forever.
    remover = threading.Thread(target=lambda: results.append(registration.remove()), daemon=True)
    remover.start()
    remover.join(WAIT)
    assert not remover.is_alive(), "remove() waits for a callback that will never run"
    assert results == [False]


# -- depth and width ----------------------------------------------------------------------------


def deep_chain(root: CancelToken, depth: int) -> CancelToken:
    token = root
    for _ in range(depth):
        token = CancelSource(token).token
    return token


def test_100k_deep_chain_cancels_without_recursion_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    root = CancelSource()
    leaf = deep_chain(root.token, 100_000)
    reached: list[str] = []
    leaf.on_cancel(lambda: reached.append("leaf callback"))
    root.cancel("deep")
    assert leaf.cancelled and leaf.reason == "deep"
    assert reached == ["leaf callback"]
    assert not error_records(caplog)


def test_100k_deep_chain_under_a_deadline_is_cancelled_by_the_timer(
    caplog: pytest.LogCaptureFixture, clock: ManualClock
) -> None:
    # The manual clock: the deadline fires only once the whole chain is built and made eager
    # (a callback on the leaf), so the timer's firing is pushed down all 100k links at once.
    root = deadline(None, 0.001)
    root.token.on_cancel(lambda: None)  # eager: armed on the (manual) timer
    leaf = deep_chain(root.token, 100_000)
    fired: list[str] = []
    done = threading.Event()

    def note_the_thread() -> None:
        fired.append(threading.current_thread().name)
        done.set()

    leaf.on_cancel(note_the_thread)
    assert not leaf.cancelled
    clock.advance(0.001)
    assert leaf._cancelled  # white-box: pushed, not resolved on read
    assert done.wait(WAIT)
    assert root.timed_out and leaf.reason == TimeoutReason("TIMEOUT", 0.001)
    assert fired == ["toolreg-callbacks"]
    assert not error_records(caplog)


def test_100k_deep_lazy_chain_reads_its_deadline_without_recursion_error() -> None:
    root = deadline(None, 0.001)
    leaf = deep_chain(root.token, 100_000)
    assert leaf.wait(WAIT)  # a lazy chain resolves (and links) iteratively
    assert leaf.reason == TimeoutReason("TIMEOUT", 0.001) and root.timed_out


def test_100k_wide_fan_out_cancels_every_child() -> None:
    root = CancelSource()
    children = [CancelSource(root.token) for _ in range(100_000)]
    root.cancel("wide")
    assert all(child.token.reason == "wide" for child in children)
    assert root.token._children is None  # white-box: the cancelled parent dropped its set


def test_100k_deep_chain_dropped_without_cancel_is_freed() -> None:
    token = CancelSource().token
    for _ in range(100_000):
        token = CancelSource(token).token
    leaf_ref = weakref.ref(token)
    del token
    assert leaf_ref() is None


# -- deadlines and the shared timer -------------------------------------------------------------


def test_deadline_fires_with_its_code_and_seconds_and_not_early() -> None:
    started = time.monotonic()
    budget = deadline(None, 0.05, code="TOOL_TIMEOUT")
    assert budget.token.wait(WAIT)
    assert time.monotonic() - started >= 0.05
    assert budget.timed_out
    assert budget.token.reason == TimeoutReason("TOOL_TIMEOUT", 0.05)


def test_deadline_default_code_is_timeout_and_source_timeout_uses_it() -> None:
    for src in (deadline(None, 0.01), CancelSource(timeout=0.01)):
        assert src.token.wait(WAIT)
        assert src.token.reason == TimeoutReason("TIMEOUT", 0.01)
        assert src.timed_out


def test_deadline_is_also_cancelled_by_its_parent() -> None:
    parent = CancelSource()
    budget = deadline(parent.token, 60.0)
    parent.cancel("user")
    assert budget.token.reason == "user"
    assert not budget.timed_out
    assert timeout_of(budget.token) is None


def test_deadline_without_seconds_has_no_timer() -> None:
    parent = CancelSource()
    for budget in (deadline(None, None), deadline(parent.token, None)):
        assert budget.token._timer is None  # white-box: nothing scheduled
        assert not budget.token.cancelled
    assert deadline(parent.token, None).cancel("x")


def test_deadline_under_a_cancelled_parent_starts_cancelled_without_a_timer() -> None:
    parent = CancelSource()
    parent.cancel("gone")
    budget = deadline(parent.token, 60.0)
    assert budget.token.reason == "gone"
    assert budget.token._timer is None  # white-box


def test_deadline_callbacks_run_on_a_callback_thread_never_on_the_timer() -> None:
    names: list[str] = []
    all_ran = threading.Event()

    def record() -> None:
        names.append(threading.current_thread().name)
        if len(names) == 20:
            all_ran.set()

    for index in range(20):
        fired_by_timer(record, 0.01 + index / 1000)
    assert all_ran.wait(WAIT)
    assert names == ["toolreg-callbacks"] * 20


def test_a_dropped_deadline_still_runs_its_callbacks_when_due() -> None:
    # The token's listeners refer back to it, so a dropped deadline lives on as a reference
    # cycle until the cyclic collector runs: its callbacks must not depend on when that is.
    ran = threading.Event()
    with _cancel.manual_clock() as clock:
        budget = deadline(None, 1.0)
        budget.token.on_cancel(ran.set)
        token = weakref.ref(budget.token)
        del budget
        gc.collect()
        assert token() is not None  # held by the timer while its callback waits
        clock.advance(1.0)
        assert ran.wait(WAIT)
    gc.collect()
    assert token() is None  # and let go once it fired


def test_a_deadline_the_timer_holds_for_a_callback_is_let_go_when_closed() -> None:
    with _cancel.manual_clock() as clock:
        budget = deadline(None, 1.0)
        registration = budget.token.on_cancel(lambda: None)
        token = weakref.ref(budget.token)
        budget.close()
        del budget, registration
        gc.collect()
        assert token() is None
        clock.advance(1.0)


def test_a_dropped_deadline_without_callbacks_is_collected_before_it_is_due() -> None:
    with _cancel.manual_clock() as clock:
        budget = deadline(None, 1.0)
        assert budget.token.wait(0) is False  # eager: armed on the timer
        token = weakref.ref(budget.token)
        del budget
        gc.collect()
        assert token() is None
        clock.advance(1.0)  # its entry is skipped


def test_one_timer_thread_serves_a_thousand_deadlines() -> None:
    before = threading.active_count()
    deadlines = [deadline(None, 60.0 + index) for index in range(1000)]
    try:
        assert threading.active_count() - before <= 1
        names = [thread.name for thread in threading.enumerate()]
        assert names.count("toolreg-timer") == 1
    finally:
        for budget in deadlines:
            budget.close()


@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt, SystemExit])
def test_raising_deadline_callback_does_not_kill_the_timer(
    exc_type: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    def boom() -> None:
        raise exc_type("from a deadline callback")

    first = fired_by_timer(boom, 0.01)  # on the callback thread, never raised in this one
    assert first.token.wait(WAIT)
    later = deadline(None, 0.01)
    assert later.token.wait(WAIT)
    assert later.timed_out
    wait_for(  # logged on the callback thread, which may still be on its way there
        lambda: any(
            r.exc_info is not None and isinstance(r.exc_info[1], exc_type)
            for r in error_records(caplog)
        ),
        "the callback's exception to be logged",
    )


def test_closed_deadline_never_fires() -> None:
    closed = deadline(None, 0.01)
    closed.close()
    clock = deadline(None, 0.05)  # due after `closed` was: once it fires, `closed` had its turn
    assert clock.token.wait(WAIT)
    assert not closed.token.cancelled
    assert not closed.timed_out


def test_deadline_closed_before_it_came_due_never_fires(clock: ManualClock) -> None:
    closed = deadline(None, 0.01)
    kept = deadline(None, 0.01)  # same delay, created later: due right after `closed`
    closed.close()  # its entry stays in the heap, disarmed
    clock.advance(0.01)
    assert kept.token.cancelled and kept.timed_out
    assert not closed.token.cancelled and not closed.timed_out


def test_eager_deadline_closed_after_its_due_time_reads_as_timed_out_like_a_lazy_one(
    clock: ManualClock,
) -> None:
    lazy = deadline(None, 1.0)
    eager = deadline(None, 1.0)
    not_yet = deadline(None, 3.0)
    ran = threading.Event()
    eager.token.on_cancel(ran.set)  # eager: linked, its timer armed
    not_yet.token.on_cancel(lambda: None)
    clock._now += 2.0  # white-box: time passes, and the timer has not got to `eager` yet
    lazy.close()
    eager.close()
    not_yet.close()  # closed before its due time: never times out
    assert lazy.timed_out and eager.timed_out
    assert eager.token.reason == lazy.token.reason == TimeoutReason("TIMEOUT", 1.0)
    assert eager.token._cancelled_at == lazy.token._cancelled_at == 1.0  # white-box: at due
    assert ran.wait(WAIT)  # its callback runs where the timer's would have
    clock.advance(2.0)
    assert not not_yet.token.cancelled and not not_yet.timed_out


def test_close_after_the_timer_fired_keeps_the_cancellation() -> None:
    budget = deadline(None, 0.01)
    assert budget.token.wait(WAIT)
    budget.close()
    assert budget.token.cancelled and budget.timed_out


def test_timed_out_is_true_only_for_the_sources_own_timer() -> None:
    own = deadline(None, 0.01)
    assert own.token.wait(WAIT)
    assert own.timed_out

    outer = CancelSource(timeout=0.01)
    inner = deadline(outer.token, 60.0)
    child = CancelSource(outer.token)
    assert inner.token.wait(WAIT)
    assert isinstance(inner.token.reason, TimeoutReason)
    assert not inner.timed_out and not child.timed_out

    cancelled = deadline(None, 0.01)
    cancelled.cancel("by hand")
    deadline(None, 0.05).token.wait(WAIT)  # `cancelled`'s timer would have fired by now
    assert not cancelled.timed_out
    assert cancelled.token.reason == "by hand"


def test_nested_deadlines_with_different_codes() -> None:
    turn = deadline(None, 0.01, code="TURN_TIMEOUT")
    tool = deadline(turn.token, 60.0, code="TOOL_TIMEOUT")
    assert tool.token.wait(WAIT)
    assert turn.timed_out and not tool.timed_out
    assert timeout_of(tool.token) == TimeoutReason("TURN_TIMEOUT", 0.01)
    assert timeout_of(tool.token, "TURN_TIMEOUT") == TimeoutReason("TURN_TIMEOUT", 0.01)
    assert timeout_of(tool.token, "TOOL_TIMEOUT") is None  # reads as ordinary cancellation

    outer = deadline(None, 60.0, code="TURN_TIMEOUT")
    inner = deadline(outer.token, 0.01, code="TOOL_TIMEOUT")
    try:
        assert inner.token.wait(WAIT)
        assert inner.timed_out and not outer.token.cancelled
        assert timeout_of(inner.token, "TOOL_TIMEOUT") == TimeoutReason("TOOL_TIMEOUT", 0.01)
    finally:
        outer.close()


def test_a_lazy_chain_read_takes_the_due_time_that_came_first_anywhere_up_the_chain(
    clock: ManualClock,
) -> None:
    # Nothing listens, so every link stays lazy: the read walks the chain and must pick the
    # earliest cause by when it happened, not by how near it is to the reader.
    outer = deadline(None, 5.0, code="TURN_TIMEOUT")
    inner = deadline(outer.token, 10.0, code="TOOL_TIMEOUT")
    leaf = CancelSource(inner.token)
    clock.advance(6.0)
    assert timeout_of(leaf.token) == TimeoutReason("TURN_TIMEOUT", 5.0)
    assert timeout_of(inner.token) == TimeoutReason("TURN_TIMEOUT", 5.0)
    assert not inner.timed_out

    outer = deadline(None, 10.0, code="TURN_TIMEOUT")
    inner = deadline(outer.token, 5.0, code="TOOL_TIMEOUT")
    leaf = CancelSource(inner.token)
    clock.advance(12.0)  # both are past due when first read: the inner one came first
    assert timeout_of(leaf.token) == TimeoutReason("TOOL_TIMEOUT", 5.0)


@pytest.mark.parametrize("cancel_at", [1.0, 3.0])
def test_a_lazy_read_weighs_an_ancestors_cancel_against_its_own_due_time(
    clock: ManualClock, cancel_at: float
) -> None:
    root = CancelSource()
    own = deadline(root.token, 2.0, code="TOOL_TIMEOUT")
    leaf = CancelSource(own.token)
    clock.advance(cancel_at)
    root.cancel("by hand")
    clock.advance(4.0 - cancel_at)
    if cancel_at < 2.0:
        assert leaf.token.reason == "by hand" and not own.timed_out
    else:
        assert timeout_of(leaf.token) == TimeoutReason("TOOL_TIMEOUT", 2.0)
        assert own.timed_out


@pytest.mark.parametrize("listened", [False, True])
def test_cancel_after_a_parent_cancelled_keeps_the_parents_reason_lazy_or_eager(
    listened: bool,
) -> None:
    # A lazy child reads as cancelled by its parent from the parent's cancel() on: cancelling it
    # afterwards changes nothing and says so (False), as for an eager (listened-to) child.
    parent = CancelSource()
    child = CancelSource(parent.token)
    if listened:
        child.token.on_cancel(lambda: None)
    parent.cancel("by the parent")
    between = time.monotonic()
    assert child.cancel("by the child") is False
    assert child.token.reason == "by the parent"
    assert child.token._cancelled_at <= between  # the parent's moment, not the child's cancel


@pytest.mark.parametrize("listened", [False, True])
def test_cancel_after_a_due_time_passed_keeps_the_timeout_lazy_or_eager(
    clock: ManualClock, listened: bool
) -> None:
    budget = deadline(None, 2.0, code="TOOL_TIMEOUT")
    if listened:
        budget.token.on_cancel(lambda: None)
    clock.advance(3.0)  # fires a listened-to deadline's timer; a lazy one is only due
    assert budget.cancel("by hand") is False
    assert timeout_of(budget.token) == TimeoutReason("TOOL_TIMEOUT", 2.0)
    assert budget.timed_out


def test_a_calls_token_cancelled_after_its_callers_keeps_the_callers_reason() -> None:
    # close() and interrupts cancel a call's token directly; a caller that cancelled first
    # stays the cause, lazy links or not.
    caller = CancelSource()
    token = _cancel.child_token(caller.token)
    caller.cancel("user pressed stop")
    assert _cancel.cancel_token(token, "registry closed") is False
    assert token.reason == "user pressed stop"


def test_timeout_of_tokens_and_reasons() -> None:
    reason = TimeoutReason("TOOL_TIMEOUT", 2.5)
    assert timeout_of(reason) is reason
    assert timeout_of(reason, "TOOL_TIMEOUT") is reason
    assert timeout_of(reason, "TIMEOUT") is None
    assert timeout_of("user pressed stop") is None
    assert timeout_of(None) is None
    live = CancelSource()
    assert timeout_of(live.token) is None
    live.cancel(reason)  # a TimeoutReason passed by hand is still the token's timeout reason
    assert timeout_of(live.token) is reason
    assert timeout_of(live.token, "OTHER") is None


def test_timeout_reason_is_a_value() -> None:
    assert TimeoutReason("TIMEOUT", 1.0) == TimeoutReason("TIMEOUT", 1.0)
    assert hash(TimeoutReason("TIMEOUT", 1.0)) == hash(TimeoutReason("TIMEOUT", 1.0))
    assert str(TimeoutReason("TOOL_TIMEOUT", 2.5)) == "TOOL_TIMEOUT: timed out after 2.5s"


# -- reprs and the never-cancelled token -----------------------------------------------------


def test_token_repr_shows_its_state() -> None:
    src = CancelSource()
    assert "cancelled" not in repr(src.token)
    src.cancel("shutdown")
    assert repr(src.token) == "<CancelToken cancelled reason='shutdown'>"


def test_source_repr_shows_cancelled_timed_out_and_closed() -> None:
    src = CancelSource()
    src.close()
    assert "closed" in repr(src) and "cancelled" not in repr(src)
    budget = deadline(None, 0.01)
    assert budget.token.wait(WAIT)
    assert "cancelled" in repr(budget) and "timed_out" in repr(budget)


def test_never_token_is_never_cancelled() -> None:
    never = CancelToken.never()
    assert never is CancelToken.never()
    assert not never.cancelled and never.reason is None
    never.raise_if_cancelled()
    assert never.wait(0.01) is False
    assert "never" in repr(never)


def test_never_token_stores_nothing() -> None:
    never = CancelToken.never()

    def cycles(count: int) -> None:
        for _ in range(count):
            never.on_cancel(int)
            CancelSource(never)
            with never.on_cancel(int):
                pass

    assert traced_growth(cycles, 1_000, 100_000) < 4096
    assert never._listeners is None and never._children is None  # white-box


def test_source_linked_to_never_works_and_is_cancelled_only_by_itself() -> None:
    never = CancelToken.never()
    src = CancelSource(never)
    fused = CancelSource(never, src.token)
    assert not src.token.cancelled
    assert src.cancel("own")
    assert fused.token.reason == "own"
    src.close()


# -- misuse -------------------------------------------------------------------------------------


@pytest.mark.parametrize("parent", [None, "token", object(), CancelSource()])
def test_parents_must_be_tokens(parent: object) -> None:
    with pytest.raises(TypeError):
        CancelSource(parent)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        CancelSource(CancelSource().token, parent)  # type: ignore[arg-type]


def test_passing_a_source_as_parent_says_to_pass_its_token() -> None:
    with pytest.raises(TypeError, match="token"):
        CancelSource(CancelSource())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="token"):
        deadline(CancelSource(), 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("seconds", [0, 0.0, -0.0, -1, -1e-9, math.nan, math.inf, -math.inf])
def test_non_positive_nan_or_infinite_seconds_are_value_errors(seconds: float) -> None:
    with pytest.raises(ValueError):
        deadline(None, seconds)
    with pytest.raises(ValueError):
        CancelSource(timeout=seconds)


@pytest.mark.parametrize("seconds", [True, False, "1", b"1", [1.0]])
def test_non_numeric_seconds_are_type_errors(seconds: object) -> None:
    with pytest.raises(TypeError):
        deadline(None, seconds)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        CancelSource(timeout=seconds)  # type: ignore[arg-type]


def test_integer_seconds_are_accepted() -> None:
    budget = deadline(None, 60)
    budget.close()
    assert not budget.token.cancelled


def test_failed_construction_leaves_no_link_on_the_parent() -> None:
    parent = CancelSource()
    with pytest.raises(ValueError):
        CancelSource(parent.token, timeout=-1)
    with pytest.raises(TypeError):
        CancelSource(parent.token, "not a token")  # type: ignore[arg-type]
    assert held_links(parent.token) == 0


# -- races, deterministic: hold one thread exactly inside the window -----------------------------


class HeldCancel:
    """Cancels a source on a thread that is held inside the source's first callback."""

    def __init__(self, src: CancelSource) -> None:
        self.src = src
        self.entered, self.release = threading.Event(), threading.Event()
        src.token.on_cancel(self._block)  # registered first: runs before any later callback

    def _block(self) -> None:
        self.entered.set()
        self.release.wait(WAIT)

    def start(self, reason: object = "first") -> None:
        self.thread = start_thread(lambda: self.src.cancel(reason))
        assert self.entered.wait(WAIT)  # the token reads cancelled; later callbacks are pending

    def finish(self) -> None:
        self.release.set()
        self.thread.join(WAIT)


def test_callback_registered_during_an_unfinished_cancel_runs_inline_exactly_once() -> None:
    src = CancelSource()
    held = HeldCancel(src)
    held.start()
    calls: list[int] = []
    registration = src.token.on_cancel(lambda: calls.append(threading.get_ident()))
    assert calls == [threading.get_ident()]
    assert registration.remove() is False
    held.finish()
    assert calls == [threading.get_ident()]


def test_callback_removed_while_queued_behind_a_running_one_never_runs() -> None:
    src = CancelSource()
    held = HeldCancel(src)
    calls: list[str] = []
    queued = src.token.on_cancel(lambda: calls.append("ran"))
    held.start()
    assert queued.remove() is True  # the cancelling thread has not reached it yet
    held.finish()
    assert calls == []


def test_second_cancel_during_an_unfinished_cancel_returns_false_keeping_the_first_reason() -> None:
    src = CancelSource()
    child = CancelSource(src.token)
    held = HeldCancel(src)
    held.start("first")
    assert src.cancel("second") is False
    assert src.token.reason == child.token.reason == "first"
    held.finish()


def test_child_created_during_an_unfinished_cancel_starts_cancelled() -> None:
    src = CancelSource()
    held = HeldCancel(src)
    held.start("first")
    child = CancelSource(src.token)
    assert child.token.reason == "first"
    held.finish()
    assert held_links(src.token) == 0


# -- the races' windows, held open ---------------------------------------------------------------
# Each randomized race below checks its invariants on whatever interleavings the scheduler
# produces; whether a given window is hit depends on the machine's load. The tests here hold a
# thread on an Event exactly inside each window, so every outcome those races allow is covered
# on every run.


class Pause:
    """Holds a thread at one point of its work until the test releases it."""

    def __init__(self) -> None:
        self.reached, self.resume = threading.Event(), threading.Event()

    def hold(self) -> None:
        """Called by the held thread."""
        self.reached.set()
        assert self.resume.wait(WAIT)


def test_cancel_between_two_registrations_runs_the_earlier_callbacks_in_the_canceller() -> None:
    src = CancelSource()
    between = Pause()
    calls: list[tuple[int, int]] = []  # (registration index, thread that ran it)
    registrar: list[int] = []

    def record(index: int) -> None:
        calls.append((index, threading.get_ident()))

    def register() -> None:
        registrar.append(threading.get_ident())
        for index in range(8):
            if index == 4:
                between.hold()
            src.token.on_cancel(functools.partial(record, index))

    thread = start_thread(register)
    assert between.reached.wait(WAIT)
    assert src.cancel("x") is True
    canceller = threading.get_ident()
    assert calls == [(index, canceller) for index in range(4)]
    between.resume.set()
    thread.join(WAIT)
    assert calls == [(index, canceller) for index in range(4)] + [
        (index, registrar[0])
        for index in range(4, 8)  # registered late: run inline, once each
    ]


@pytest.mark.parametrize("first", range(4))
def test_the_first_of_concurrent_cancels_wins_whichever_thread_makes_it(first: int) -> None:
    src = CancelSource()
    child = CancelSource(src.token)
    held = HeldCancel(src)
    calls: list[str] = []
    child.token.on_cancel(lambda: calls.append("child callback"))
    results: dict[int, bool] = {}
    go = [threading.Event() for _ in range(4)]

    def canceller(index: int) -> None:
        assert go[index].wait(WAIT)
        results[index] = src.cancel(f"t{index}")

    threads = [start_thread(functools.partial(canceller, index)) for index in range(4)]
    go[first].set()
    assert held.entered.wait(WAIT)  # `first` marked the tokens; its callbacks are under way
    for index in range(4):
        go[index].set()
    for index, thread in enumerate(threads):
        if index != first:
            thread.join(WAIT)
    assert results == {index: False for index in range(4) if index != first}
    held.release.set()
    threads[first].join(WAIT)
    assert results[first] is True
    assert src.token.reason == child.token.reason == f"t{first}"
    assert calls == ["child callback"]


def test_cancel_between_child_links_reaches_the_linked_and_later_ones_start_cancelled() -> None:
    parent, other = CancelSource(), CancelSource()
    between = Pause()
    children: list[CancelSource] = []
    born_cancelled: list[bool] = []

    def create() -> None:
        for index in range(8):
            if index == 4:
                between.hold()
            children.append(eager(CancelSource(other.token, parent.token)))
            born_cancelled.append(children[-1].token.cancelled)

    thread = start_thread(create)
    try:
        assert between.reached.wait(WAIT)
        assert held_links(other.token) == held_links(parent.token) == 4
        parent.cancel("parent")
    finally:
        between.resume.set()
        thread.join(WAIT)
    assert born_cancelled == [False] * 4 + [True] * 4
    assert all(child.token.reason == "parent" for child in children)
    assert held_links(other.token) == held_links(parent.token) == 0


def test_close_during_an_unfinished_parent_cancel_keeps_the_child_cancelled_and_unlinked() -> None:
    parent, other = CancelSource(), CancelSource()
    held = HeldCancel(parent)
    child = CancelSource(parent.token, other.token)
    calls: list[str] = []
    child.token.on_cancel(lambda: calls.append("ran"))
    held.start("parent")  # the child reads cancelled; its callback is queued behind the hold
    child.close()
    assert calls == []
    held.finish()
    assert child.token.cancelled and child.token.reason == "parent"
    assert calls == ["ran"]
    assert held_links(other.token) == held_links(parent.token) == 0


# -- races, randomized stress ------------------------------------------------------------------


@pytest.mark.stress
@pytest.mark.usefixtures("fast_thread_switching")
def test_register_racing_cancel_runs_every_callback_exactly_once() -> None:
    count = 32

    @dataclass
    class Round:
        src: CancelSource = field(default_factory=CancelSource)
        calls: list[tuple[int, bool]] = field(default_factory=list)

    def register(state: Round, rng: random.Random) -> None:
        me = threading.get_ident()

        def record(index: int) -> None:
            state.calls.append((index, threading.get_ident() == me))

        for index in range(count):
            state.src.token.on_cancel(functools.partial(record, index))
            spin(rng)

    def check(state: Round) -> Hashable:
        assert sorted(index for index, _ in state.calls) == list(range(count))
        inline = [index for index, ran_inline in state.calls if ran_inline]
        assert inline == list(range(count - len(inline), count))  # a suffix: registered late
        return "split" if 0 < len(inline) < count else "all one side"

    # The split (cancel between two registrations) is pinned by
    # test_cancel_between_two_registrations_runs_the_earlier_callbacks_in_the_canceller.
    Race(lambda _: Round(), [register, lambda s, _: s.src.cancel("x")], check).run(800)


@pytest.mark.stress
@pytest.mark.usefixtures("fast_thread_switching")
def test_remove_racing_cancel_returns_true_iff_the_callback_never_ran() -> None:
    @dataclass
    class Round:
        src: CancelSource = field(default_factory=CancelSource)
        started: int = 0
        finished: int = 0
        removed: bool | None = None
        running_when_remove_called: bool = False
        finished_when_remove_returned: int = -1
        registration: Registration | None = None

    def prepare(_: int) -> Round:
        state = Round()

        def callback() -> None:
            state.started += 1
            time.sleep(0)  # releases the GIL mid-callback (a yield, not a wait): remove() lands
            state.finished += 1

        state.registration = state.src.token.on_cancel(callback)
        return state

    def remove(state: Round, rng: random.Random) -> None:
        assert state.registration is not None
        state.running_when_remove_called = state.started == 1 and state.finished == 0
        state.removed = state.registration.remove()
        state.finished_when_remove_returned = state.finished

    def check(state: Round) -> Hashable:
        if state.removed:
            assert state.started == 0
            return "removed"
        # It ran, and had finished before remove() returned, waiting for it if need be.
        assert state.started == state.finished_when_remove_returned == 1
        return "waited" if state.running_when_remove_called else "ran before"

    # "removed" and "waited" are pinned by test_callback_removed_while_queued_behind_a_running_one_
    # never_runs and test_remove_waits_for_the_callback_running_on_another_thread.
    Race(prepare, [remove, lambda s, _: s.src.cancel("x")], check).run(1500)


@pytest.mark.stress
@pytest.mark.usefixtures("fast_thread_switching")
def test_concurrent_cancels_exactly_one_wins_and_its_reason_is_recorded() -> None:
    @dataclass
    class Round:
        src: CancelSource = field(default_factory=CancelSource)
        child: CancelSource | None = None
        wins: list[str] = field(default_factory=list)
        calls: list[str] = field(default_factory=list)

    def prepare(_: int) -> Round:
        state = Round()
        state.child = CancelSource(state.src.token)
        state.child.token.on_cancel(lambda: state.calls.append("child callback"))
        return state

    def canceller(name: str) -> Callable[[Round, random.Random], None]:
        def act(state: Round, rng: random.Random) -> None:
            if state.src.cancel(name):
                state.wins.append(name)

        return act

    def check(state: Round) -> Hashable:
        assert state.child is not None
        assert len(state.wins) == 1
        assert state.src.token.reason == state.child.token.reason == state.wins[0]
        assert state.calls == ["child callback"]
        return state.wins[0]

    # Each thread winning is pinned by test_the_first_of_concurrent_cancels_wins_whichever_thread_
    # makes_it.
    Race(prepare, [canceller(f"t{i}") for i in range(4)], check).run(500)


@pytest.mark.stress
@pytest.mark.usefixtures("fast_thread_switching")
def test_child_linking_racing_parent_cancel_always_ends_cancelled_and_unlinked() -> None:
    @dataclass
    class Round:
        parent: CancelSource = field(default_factory=CancelSource)
        other: CancelSource = field(default_factory=CancelSource)
        children: list[CancelSource] = field(default_factory=list)
        born_cancelled: list[bool] = field(default_factory=list)

    def create(state: Round, rng: random.Random) -> None:
        for _ in range(16):
            state.children.append(CancelSource(state.other.token, state.parent.token))
            state.born_cancelled.append(state.children[-1].token.cancelled)
            spin(rng)

    def check(state: Round) -> Hashable:
        assert all(child.token.reason == "parent" for child in state.children)
        assert held_links(state.other.token) == 0  # cancelled children left the other parent
        return "split" if 0 < sum(state.born_cancelled) < 16 else "all one side"

    # The split is pinned by
    # test_cancel_between_child_links_reaches_the_linked_and_later_ones_start_cancelled.
    Race(lambda _: Round(), [create, lambda s, _: s.parent.cancel("parent")], check).run(800)


@pytest.mark.stress
@pytest.mark.usefixtures("fast_thread_switching")
def test_close_racing_parent_cancel_leaves_no_link() -> None:
    @dataclass
    class Round:
        parent: CancelSource = field(default_factory=CancelSource)
        other: CancelSource = field(default_factory=CancelSource)
        child: CancelSource | None = None
        calls: list[str] = field(default_factory=list)

    def prepare(_: int) -> Round:
        state = Round()
        state.child = CancelSource(state.parent.token, state.other.token)
        state.child.token.on_cancel(lambda: state.calls.append("ran"))
        return state

    def close(state: Round, rng: random.Random) -> None:
        assert state.child is not None
        state.child.close()

    def check(state: Round) -> Hashable:
        assert state.child is not None
        assert held_links(state.other.token) == 0
        assert state.calls == (["ran"] if state.child.token.cancelled else [])
        return state.child.token.cancelled

    # Both sides and the window between them are pinned by test_closed_source_no_longer_follows_
    # its_parents, test_cancelled_child_unlinks_from_every_parent_at_once and
    # test_close_during_an_unfinished_parent_cancel_keeps_the_child_cancelled_and_unlinked.
    Race(prepare, [close, lambda s, _: s.parent.cancel("parent")], check).run(1500)


@pytest.mark.stress
@pytest.mark.usefixtures("fast_thread_switching")
def test_close_racing_the_timer_either_fired_before_close_returned_or_never_fires() -> None:
    rng = random.Random(1234)
    outcomes: list[tuple[CancelSource, bool]] = []
    for _ in range(10):
        batch = [deadline(None, rng.uniform(0.0005, 0.004)) for _ in range(200)]
        for budget in batch:
            for _ in range(rng.randrange(2000)):  # close at random points around the due time
                pass
            budget.close()
            outcomes.append((budget, budget.token.cancelled))
    assert deadline(None, 0.02).token.wait(WAIT)  # due after every deadline above
    for budget, cancelled_at_close in outcomes:
        assert budget.token.cancelled == cancelled_at_close == budget.timed_out
        if cancelled_at_close:
            assert isinstance(budget.token.reason, TimeoutReason)
    # Which side each close lands on depends on the machine's load; both sides are pinned by
    # test_deadline_closed_while_the_timer_is_busy_never_fires and
    # test_close_after_the_timer_fired_keeps_the_cancellation.


# -- random trees against a reference model ----------------------------------------------------


@dataclass
class ModelNode:
    source: CancelSource | None
    token: CancelToken
    parents: list[int]
    closed: bool = False
    cancelled: bool = False
    reason: object = None
    fired: int = 0


class TreeModel:
    """A sequential reference model of linking, closing and cancelling."""

    def __init__(self) -> None:
        self.nodes: list[ModelNode] = []
        self.snapshots: list[tuple[bool, ...]] = []

    def state(self) -> tuple[bool, ...]:
        return tuple(node.token.cancelled for node in self.nodes)

    def create(self, parents: list[int], with_never: bool) -> None:
        tokens = [self.nodes[i].token for i in parents]
        if with_never:
            tokens.append(CancelToken.never())
        source = CancelSource(*tokens)
        index = len(self.nodes)
        node = ModelNode(source, source.token, parents)
        self.nodes.append(node)
        cancelled_parents = [self.nodes[i] for i in parents if self.nodes[i].cancelled]
        if cancelled_parents:
            node.cancelled = True
            assert source.token.reason in [p.reason for p in cancelled_parents]
            node.reason = source.token.reason
        source.token.on_cancel(lambda: self.fire(index))

    def fire(self, index: int) -> None:
        self.nodes[index].fired += 1
        self.snapshots.append(self.state())

    def cancel(self, index: int, reason: str) -> None:
        node = self.nodes[index]
        assert node.source is not None
        expected = not node.cancelled
        worklist = [index] if expected else []
        if expected:
            node.cancelled, node.reason = True, reason
        while worklist:
            current = worklist.pop()
            for i, child in enumerate(self.nodes):
                if current in child.parents and not child.cancelled and not child.closed:
                    child.cancelled, child.reason = True, reason
                    worklist.append(i)
        assert node.source.cancel(reason) is expected

    def close(self, index: int) -> None:
        node = self.nodes[index]
        assert node.source is not None
        node.source.close()
        node.closed = True

    def drop_source(self, index: int) -> None:
        # A source is freed at once (no cycles); its token alone must keep following its parents.
        self.nodes[index].source = None

    def check(self) -> None:
        final = self.state()
        assert all(snapshot == final for snapshot in self.snapshots), "callback ran too early"
        self.snapshots.clear()
        for index, node in enumerate(self.nodes):
            assert node.token.cancelled == node.cancelled
            assert node.token.reason == node.reason
            assert node.fired == int(node.cancelled)
            # White-box hygiene: a parent links exactly its live, open, uncancelled children.
            linked = {
                i
                for i, child in enumerate(self.nodes)
                if index in child.parents and not child.closed and not child.cancelled
            }
            children = node.token._children
            held = {self.index_of(ref()) for ref in children} if children else set()
            assert held == (set() if node.cancelled else linked)

    def index_of(self, token: CancelToken | None) -> int:
        return next(i for i, node in enumerate(self.nodes) if node.token is token)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_trees_of_sources_match_the_reference_model(data: st.DataObject) -> None:
    model = TreeModel()
    for step in range(data.draw(st.integers(1, 30), label="steps")):
        live = [i for i, n in enumerate(model.nodes) if n.source is not None]
        kinds = ["create"] + (["cancel", "close", "drop"] if live else [])
        kind = data.draw(st.sampled_from(kinds), label="op")
        if kind == "create":
            parents = data.draw(
                st.lists(st.sampled_from(range(len(model.nodes))), max_size=3, unique=True)
                if model.nodes
                else st.just([]),
                label="parents",
            )
            model.create(parents, data.draw(st.booleans(), label="with never"))
        else:
            index = data.draw(st.sampled_from(live), label="node")
            if kind == "cancel":
                model.cancel(index, f"reason {step}")
            elif kind == "close":
                model.close(index)
            else:
                model.drop_source(index)
        model.check()


# -- fork ----------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_deadlines_fire_in_a_forked_child() -> None:
    inherited = deadline(None, 0.05)  # pending across fork(); also starts the parent's timer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads running
        pid = os.fork()
    if pid == 0:
        status = 1
        try:
            fresh = deadline(None, 0.01)
            ok = fresh.token.wait(WAIT) and fresh.timed_out
            ok = ok and inherited.token.wait(WAIT) and inherited.timed_out
            status = 0 if ok else 1
        finally:
            os._exit(status)
    try:
        _, status = call_bounded(lambda: os.waitpid(pid, 0), timeout=30)
    except BaseException:
        os.kill(pid, signal.SIGKILL)  # a hung child: reap it, then report the failure
        with contextlib.suppress(ChildProcessError):  # the bounded waiter may reap it first
            os.waitpid(pid, 0)
        raise
    assert os.waitstatus_to_exitcode(status) == 0
    assert inherited.token.wait(WAIT)  # and the parent's timer still serves it


# -- regressions: bugs these tests found in toolreg/_cancel.py, since fixed (run in a subprocess:
# -- before the fix they broke the timer or hung the interpreter).


def test_deadline_beyond_the_platform_wait_limit_does_not_kill_the_timer() -> None:
    result = run_python(
        """
        import threading
        from toolreg import deadline
        far = deadline(None, 1e10)  # finite and positive: valid per docs/contract.md
        far.token.on_cancel(lambda: None)  # armed on the shared timer
        [timer] = [t for t in threading.enumerate() if t.name == "toolreg-timer"]
        timer.join(2.0)  # with the bug it dies at once, waiting for `far`
        near = deadline(None, 0.05)
        print("fired" if near.token.wait(1.0) else "never fired")
        """,
        timeout=30,
    )
    assert result is not None and result.stdout.strip() == "fired", result


def test_finalizer_touching_the_parent_during_a_children_sweep_does_not_deadlock() -> None:
    result = run_python(
        """
        import gc
        from toolreg import CancelSource

        class Watcher:
            def __init__(self, token):
                self.cycle = self  # cyclic garbage: only a GC pass frees it
                self.registration = token.on_cancel(lambda: None)

            def __del__(self):
                self.registration.remove()  # takes the parent token's lock

        for threshold in range(1, 60):  # a GC pass lands on a different allocation each time
            parent = CancelSource()
            kept = [CancelSource(parent.token) for _ in range(63)]  # the 64th attach sweeps
            for child in kept:
                child.token.wait(0)  # a token someone waits on is linked to its parent
            gc.collect()
            gc.set_threshold(threshold)
            Watcher(parent.token)
            CancelSource(parent.token).token.wait(0)
        gc.set_threshold(700)
        print("no deadlock")
        """,
        timeout=5,
    )
    assert result is not None and result.stdout.strip() == "no deadlock", "deadlocked"


def test_finalizer_using_a_token_while_its_thread_holds_the_token_lock_does_not_deadlock() -> None:
    # From 3.12 on, an allocation only schedules a collection; it runs at the thread's next call
    # or loop back-edge, so it can land at any call inside a critical section, whatever that
    # section allocates. Its finalizers then use the token whose lock this thread holds: linking
    # a child, registering, waiting, removing, closing and cancelling must all go through.
    # (`linked` waits on each child once: a token someone waits on is surely linked to its
    # parent, so the parent's critical sections really run.)
    result = run_python(
        """
        import gc
        from toolreg import CancelSource

        def linked(parent):
            child = CancelSource(parent.token)
            child.token.wait(0)
            return child

        class Watcher:
            def __init__(self, parent, kept, cancel):
                self.cycle = self  # cyclic garbage: only a collection frees it
                self.parent, self.kept, self.cancel = parent, kept, cancel
                self.registration = parent.token.on_cancel(lambda: None)

            def __del__(self):
                token = self.parent.token
                self.registration.remove()
                token.on_cancel(lambda: None).remove()
                linked(self.parent).close()
                token.wait(0)
                if self.kept:
                    self.kept.pop().close()
                if self.cancel:
                    self.parent.cancel("finalizer")

        for kept_count in (0, 8, 62):  # 62: the attaches below cross the 64-children sweep
            for threshold in range(1, 40):  # the collection lands at a different call each time
                parent = CancelSource()
                kept = [linked(parent) for _ in range(kept_count)]
                gc.collect()
                gc.set_threshold(threshold)
                Watcher(parent, kept[:], cancel=threshold % 4 == 0)
                for child in kept[-3:]:
                    child.close()
                for _ in range(3):
                    parent.token.on_cancel(lambda: None).remove()
                    linked(parent)
                parent.token.wait(0)
                parent.cancel("main")
                assert parent.token.reason in ("main", "finalizer")
                gc.set_threshold(700)
        print("no deadlock")
        """,
        timeout=15,
    )
    assert result is not None, "deadlocked"
    assert result.stdout.strip() == "no deadlock", result.stderr


# Process-wide daemon helpers: the shared timer, the threads that run its deadlines' callbacks,
# and toolreg's helper thread (the asyncio facade and the pool hand it small jobs). A Dask
# cluster of threads run earlier in the session (tests/contract runs first) leaves the worker
# side's cancel threads and distributed's own offload thread, process-wide as well.
PROCESS_WIDE = {"toolreg-timer", "toolreg-callbacks", "toolreg-helper", "toolreg-remote-cancel"}
FOREIGN_PROCESS_WIDE = ("Dask-Offload_",)


def test_no_thread_but_the_shared_timer_outlives_the_tests_above() -> None:
    # Placed last on purpose: every test above has run (the hygiene fixture also checks each one).
    strays = [
        thread.name
        for thread in threading.enumerate()
        if thread is not threading.main_thread()
        and thread.name not in PROCESS_WIDE
        and not thread.name.startswith(FOREIGN_PROCESS_WIDE)
        and not isinstance(thread, threading.Timer)  # pytest-timeout's watchdog for this test
    ]
    assert strays == []
    assert [t.name for t in threading.enumerate()].count("toolreg-timer") == 1


def test_tokens_and_sources_refuse_to_pickle_naming_what_they_are() -> None:
    # docs/contract.md 14.8: a cancellation belongs to its process; a cluster relays it instead.
    source = CancelSource()
    for thing, name in ((source.token, "CancelToken"), (CancelToken.never(), "CancelToken")):
        with pytest.raises(TypeError, match=f"a {name} cannot be pickled"):
            pickle.dumps(thing)
    with pytest.raises(TypeError, match="a CancelSource cannot be pickled"):
        pickle.dumps(source)
    with pytest.raises(TypeError, match="a CancelSource cannot be pickled"):
        pickle.dumps(deadline(None, 60.0))
