"""Randomized stress test of the registry's cancellation invariants under many threads.

16 calling threads make 40,000 calls in all against one registry, with a random mix of bodies
(quick, cooperative waits, uncooperative sleeps, raising, nested calls), hooks (a pre-execute
hook, a guard that sometimes denies, a wrapper that sometimes substitutes its own token, a post
hook, an observer, and a thread that keeps adding and removing hooks), and cancellation: some
calls start under an already-cancelled token, others are cancelled at a random moment by
canceller threads (the caller's token or the wrapper's). After every call the invariants are
checked; after `close()` the threads, file descriptors and long-lived tokens are checked for
leaks. The seed is printed in every failure message: `STRESS_SEED=<n>` replays the mix.
"""

from __future__ import annotations

import itertools
import os
import queue
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from _registry_helpers import (
    ABORTED,
    BEFORE,
    Caller,
    Proceed,
    holds_nothing,
    open_fds,
    threads_of_our_own,
    wait_until,
)

from toolreg import (
    Allow,
    CancelSource,
    CancelToken,
    Dispatch,
    ErrorCode,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
)

pytestmark = pytest.mark.stress

THREADS = 16
CALLS_PER_THREAD = 2_500  # 40,000 calls in all
FAST_SWITCHING_CALLS_PER_THREAD = 640  # 10,240 calls with a 1 µs switch interval
CALLS_BEFORE_CLOSE = 5_000  # close() lands while the callers keep calling
CANCELLERS = 4
MODES = ("quick", "quick", "wait", "ignore", "raise", "nested")


@dataclass
class Ledger:
    """What the bodies, hooks and cancellers did, keyed by call id."""

    lock: threading.Lock = field(default_factory=threading.Lock)  # guards every field below
    starts: Counter[str] = field(default_factory=Counter)
    ends: Counter[str] = field(default_factory=Counter)
    observed: dict[str, list[ToolResult[Any]]] = field(default_factory=dict)
    cancelled: set[str] = field(default_factory=set)  # a cancellation of this call was fired
    closing: bool = False  # close() has been called: it cancels every call in flight
    scopes: dict[str, CancelSource] = field(default_factory=dict)

    def body_started(self, call_id: str) -> None:
        with self.lock:
            self.starts[call_id] += 1

    def body_ended(self, call_id: str) -> None:
        with self.lock:
            self.ends[call_id] += 1

    def observe(self, result: ToolResult[Any]) -> None:
        with self.lock:
            self.observed.setdefault(result.call.call_id, []).append(result)

    def mark_cancelled(self, call_id: str) -> None:
        with self.lock:
            self.cancelled.add(call_id)


def build_registry(ledger: Ledger) -> ToolRegistry:
    registry = ToolRegistry(max_workers=6, thread_name_prefix="stress")

    @registry.tool
    def work(args: Any, ctx: ToolContext) -> Any:
        call_id = ctx.call.call_id
        ledger.body_started(call_id)
        try:
            mode = args["mode"]
            if mode == "wait":
                ctx.token.wait(args["pause"])
                ctx.token.raise_if_cancelled()
            elif mode == "ignore":
                time.sleep(args["pause"])  # simulated uncooperative work
            elif mode == "raise":
                raise ValueError("the tool failed")
            elif mode == "nested":
                inner = ctx.execute("work", {"mode": "quick", "n": args["n"]})
                return {"inner": inner.code is None}
            return args["n"]
        finally:
            ledger.body_ended(call_id)

    def pre(call: ToolCall, token: CancelToken) -> Allow | None:
        return Allow() if len(call.call_id) % 2 else None

    def guard(call: ToolCall) -> str | None:
        return "denied by policy" if call.arguments and call.arguments.get("deny") else None

    def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        arguments = dispatch.call.arguments or {}
        if not arguments.get("scope"):
            return proceed()
        previous = dispatch.token
        with CancelSource(previous) as scope:
            with ledger.lock:
                ledger.scopes[dispatch.call.call_id] = scope
            dispatch.token = scope.token
            try:
                return proceed()
            finally:
                dispatch.token = previous

    registry.add_pre_execute(pre)
    registry.add_guard(guard)
    registry.add_around(wrapper)
    registry.add_post_execute(lambda result, token: None)
    registry.on_result(ledger.observe)
    return registry


def canceller(jobs: queue.Queue[Any], ledger: Ledger) -> None:
    """Fire each queued cancellation at its moment (a random delay, not an ordering)."""
    while True:
        job = jobs.get()
        if job is None:
            return
        fire_at, call_id, source, target = job
        delay = fire_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # the random cancellation moment itself; orders nothing
        if target == "scope":
            with ledger.lock:
                scope = ledger.scopes.get(call_id)
            if scope is None:
                continue  # the wrapper has not made its scope (or never will): nothing to cancel
            ledger.mark_cancelled(call_id)
            scope.cancel("wrapper gave up")
        else:
            ledger.mark_cancelled(call_id)
            source.cancel("caller gave up")


def caller_loop(
    registry: ToolRegistry,
    ledger: Ledger,
    jobs: queue.Queue[Any],
    seed: int,
    index: int,
    session: CancelToken,
    calls: int | None,
) -> list[str]:
    """Make `calls` calls (or calls until the registry is closed), checking each result."""
    rng = random.Random(seed * 1_000 + index)
    before_dispatch: list[str] = []
    for n in itertools.count() if calls is None else range(calls):
        call_id = f"t{index}-{n}"
        mode = rng.choice(MODES)
        deny = rng.random() < 0.03
        scope = rng.random() < 0.2
        arguments = {
            "mode": mode,
            "n": n,
            "pause": rng.choice((0.0, 0.0002, 0.001)),
            "deny": deny,
            "scope": scope,
        }
        source = CancelSource(session)
        plan = rng.random()
        start_if_cancelled = True
        if plan < 0.1:
            ledger.mark_cancelled(call_id)
            source.cancel("cancelled before the call")
            start_if_cancelled = rng.random() < 0.5
        elif plan < 0.5:
            target = "scope" if scope and rng.random() < 0.5 else "caller"
            jobs.put((time.monotonic() + rng.random() * 0.002, call_id, source, target))
        try:
            result = registry.execute(
                ToolCall("work", arguments, call_id=call_id),
                token=source.token,
                start_if_cancelled=start_if_cancelled,
            )
        except RuntimeError:
            assert ledger.closing, f"seed={seed}: execute raised RuntimeError while open"
            source.close()
            return before_dispatch
        source.close()
        with ledger.lock:
            starts = ledger.starts[call_id]
            ends = ledger.ends[call_id]
            seen = list(ledger.observed.get(call_id, ()))
            cancelled = call_id in ledger.cancelled or ledger.closing
            ledger.scopes.pop(call_id, None)
        where = f"seed={seed} call={call_id} mode={mode} result={result!r}"
        assert len(seen) == 1 and seen[0] is result, f"observers saw {len(seen)} results; {where}"
        assert starts == ends, f"execute returned before the body finished; {where}"
        assert starts <= 1, f"the body ran {starts} times; {where}"
        assert result.dispatched == (starts == 1), f"dispatched is wrong; {where}"
        code = result.code
        if code is None:
            if mode == "nested":  # a pre-aborted parent's nested call starts nothing
                assert result.value == {"inner": True} or cancelled, where
            else:
                assert result.value == n, where
        elif code == BEFORE:
            assert starts == 0, f"a body started under ABORTED_BEFORE_DISPATCH; {where}"
            assert cancelled, f"aborted without a cancellation; {where}"
            before_dispatch.append(call_id)
        elif code == ABORTED:
            assert starts == 1, where
            assert cancelled, f"aborted without a cancellation; {where}"
        elif code == ErrorCode.TOOL_ERROR:
            assert mode == "raise", f"TOOL_ERROR from a body that does not raise; {where}"
        elif code == ErrorCode.DENIED:
            assert deny, where
        else:
            pytest.fail(f"unexpected code; {where}")
    return before_dispatch


def test_cancellation_invariants_hold_under_many_threads_and_random_cancellation() -> None:
    run_stress(CALLS_PER_THREAD)


def test_cancellation_invariants_hold_when_threads_switch_every_microsecond(
    fast_thread_switching: None,
) -> None:
    run_stress(FAST_SWITCHING_CALLS_PER_THREAD)


def run_stress(calls_per_thread: int) -> None:
    seed = int(os.environ.get("STRESS_SEED", random.randrange(1_000_000)))
    threads_before = threads_of_our_own()
    fds_before = open_fds()
    ledger = Ledger()
    jobs: queue.Queue[Any] = queue.Queue()
    registry = build_registry(ledger)
    sessions = [CancelSource() for _ in range(THREADS)]
    stop_churn = threading.Event()

    def churn() -> int:
        rounds = 0
        while not (rounds and stop_churn.wait(0.001)):  # at least one round
            first = registry.add_pre_execute(lambda call, token: None)
            second = registry.add_post_execute(lambda result, token: None)
            assert first.remove() and second.remove()
            rounds += 1
        return rounds

    cancellers = [
        Caller(lambda: canceller(jobs, ledger), name=f"canceller-{i}") for i in range(CANCELLERS)
    ]
    churner = Caller(churn, name="hook-churn")
    try:
        callers = [
            Caller(
                lambda i=i: caller_loop(  # type: ignore[misc]
                    registry, ledger, jobs, seed, i, sessions[i].token, calls_per_thread
                ),
                name=f"stress-caller-{i}",
            )
            for i in range(THREADS)
        ]
        before_dispatch = [call_id for c in callers for call_id in c.join(timeout=120)]
    finally:
        stop_churn.set()
        for _ in cancellers:
            jobs.put(None)
        for worker in cancellers:
            worker.join()
        registry.close()
    assert churner.join() > 0
    total = THREADS * calls_per_thread
    # Every call reached the observers exactly once (nested calls included).
    assert sum(len(results) for results in ledger.observed.values()) >= total
    assert all(len(results) == 1 for results in ledger.observed.values()), f"seed={seed}"
    # No body started late, after its call was reported ABORTED_BEFORE_DISPATCH.
    late = [call_id for call_id in before_dispatch if ledger.starts[call_id]]
    assert late == [], f"seed={seed}: bodies started after ABORTED_BEFORE_DISPATCH: {late}"
    assert ledger.starts == ledger.ends
    # Long-lived tokens hold nothing; threads and descriptors are back to the baseline.
    assert all(holds_nothing(session.token) for session in sessions), f"seed={seed}"
    assert threads_of_our_own() == threads_before
    assert open_fds() == fds_before
    codes = Counter(str(r[0].code) for r in ledger.observed.values())
    assert codes["None"] and codes[str(ABORTED)] and codes[str(BEFORE)], codes


def test_close_under_load_cancels_in_flight_calls_and_waits_for_every_body() -> None:
    seed = int(os.environ.get("STRESS_SEED", random.randrange(1_000_000)))
    threads_before = threads_of_our_own()
    fds_before = open_fds()
    ledger = Ledger()
    jobs: queue.Queue[Any] = queue.Queue()
    registry = build_registry(ledger)
    sessions = [CancelSource() for _ in range(THREADS)]
    cancellers = [
        Caller(lambda: canceller(jobs, ledger), name=f"canceller-{i}") for i in range(CANCELLERS)
    ]
    try:
        callers = [
            Caller(
                lambda i=i: caller_loop(  # type: ignore[misc]
                    registry, ledger, jobs, seed, i, sessions[i].token, None
                ),
                name=f"stress-caller-{i}",
            )
            for i in range(THREADS)
        ]
        wait_until(lambda: len(ledger.observed) >= CALLS_BEFORE_CLOSE, "calls to pile up")
        with ledger.lock:
            ledger.closing = True
    finally:
        registry.close()
        with ledger.lock:
            starts_at_close, ends_at_close = Counter(ledger.starts), Counter(ledger.ends)
        for _ in cancellers:
            jobs.put(None)
        for worker in cancellers:
            worker.join()
    before_dispatch = [call_id for c in callers for call_id in c.join()]
    assert starts_at_close == ends_at_close, f"seed={seed}: close() returned before a body did"
    assert ledger.starts == starts_at_close, f"seed={seed}: a body started after close()"
    late = [call_id for call_id in before_dispatch if ledger.starts[call_id]]
    assert late == [], f"seed={seed}: bodies started after ABORTED_BEFORE_DISPATCH: {late}"
    assert all(len(results) == 1 for results in ledger.observed.values()), f"seed={seed}"
    assert registry.in_flight() == []
    assert all(holds_nothing(session.token) for session in sessions), f"seed={seed}"
    assert threads_of_our_own() == threads_before
    assert open_fds() == fds_before
