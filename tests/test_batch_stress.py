"""Randomized stress test of `execute_batch`: 1,000-call batches under random turn cancellation.

Each round builds a fresh registry (random pool size) and a batch of 1,000 calls (random
`max_parallel`) mixing parallel-safe calls, exclusive calls and calls whose classifier answers
True, 1, "yes" or raises; their bodies return at once, wait cooperatively on `ctx.token`, ignore
it for a moment, or raise. A canceller thread cancels the turn once a random number of results
has been observed (a handshake on an Event, never a sleep); one round runs to completion and one
starts pre-cancelled. After each round the invariants of docs/contract.md section 7 are checked: one
result per call in input order, each the object the observer saw exactly once; every body that
started had finished when `execute_batch` returned and none started afterwards; no body of a
call reported `ABORTED_BEFORE_DISPATCH`; a call no hook saw is `ABORTED_BEFORE_DISPATCH`; a call
whose hook saw a cancelled token never reached its body; exclusive calls ran alone and no more
than `max_parallel` calls overlapped; progress ran on the caller's thread up to (total, total).
The seed is printed in every failure message: `STRESS_SEED=<n>` replays the mix.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from _registry_helpers import ABORTED, BEFORE, WAIT, Caller

from toolreg import CancelSource, ErrorCode, ToolCall, ToolRegistry, ToolResult

pytestmark = pytest.mark.stress

CALLS = 1_000
ROUNDS = 8
FAST_SWITCHING_ROUNDS = 2
MODES = ("quick", "quick", "wait", "ignore", "raise")
VERDICTS = (True, True, 1, "yes", "raise")  # what the `judged` tool's classifier answers


@dataclass
class Ledger:
    """What one round's hooks, bodies and observer saw (thread-safe)."""

    lock: threading.Lock = field(default_factory=threading.Lock)  # guards every field below
    journal: list[tuple[str, int]] = field(default_factory=list)  # ("start"|"end", index)
    hooked: set[int] = field(default_factory=set)
    hooked_cancelled: set[int] = field(default_factory=set)  # its hook saw a cancelled token
    started: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    entered_cancelled: set[int] = field(default_factory=set)  # body began under a cancelled token
    observed: dict[int, list[ToolResult[Any]]] = field(default_factory=dict)
    progress: list[tuple[int, int, int]] = field(default_factory=list)
    trigger_at: int | None = None  # set `trigger` once this many results were observed
    trigger: threading.Event = field(default_factory=threading.Event)

    def hook(self, call: ToolCall, token: Any) -> None:
        index = int(call.call_id)
        cancelled = token.cancelled
        with self.lock:
            self.hooked.add(index)
            if cancelled:
                self.hooked_cancelled.add(index)
            self.journal.append(("start", index))

    def observe(self, result: ToolResult[Any]) -> None:
        index = int(result.call.call_id)
        with self.lock:
            self.journal.append(("end", index))
            self.observed.setdefault(index, []).append(result)
            if self.trigger_at is not None and len(self.observed) >= self.trigger_at:
                self.trigger.set()

    def body(self, args: Any, ctx: Any) -> Any:
        index = int(ctx.call.call_id)
        with self.lock:
            self.started.add(index)
            if ctx.token.cancelled:
                self.entered_cancelled.add(index)
        try:
            mode = args["mode"]
            if mode == "wait":
                ctx.token.wait(0.002)
            elif mode == "ignore":
                threading.Event().wait(0.001)  # does not look at its token
            elif mode == "raise":
                raise ValueError("tool failed")
            return index
        finally:
            with self.lock:
                self.finished.add(index)


def classify(args: Any) -> Any:
    verdict = args["verdict"]
    if verdict == "raise":
        raise RuntimeError("cannot tell")
    return verdict


@dataclass(frozen=True)
class Plan:
    seed: int
    workers: int
    max_parallel: int
    cancel: str  # "never", "before" (pre-cancelled) or "after <n> results"
    calls: list[ToolCall]
    parallel: list[bool]  # the classification the contract requires, per call


def make_plan(seed: int, cancel: str | None = None) -> Plan:
    rng = random.Random(seed)
    calls: list[ToolCall] = []
    parallel: list[bool] = []
    for index in range(CALLS):
        kind = rng.choices(("safe", "alone", "judged"), weights=(6, 2, 2))[0]
        arguments: dict[str, Any] = {"mode": rng.choice(MODES)}
        if kind == "judged":
            arguments["verdict"] = rng.choice(VERDICTS)
        calls.append(ToolCall(kind, arguments, str(index)))
        parallel.append(kind == "safe" or (kind == "judged" and arguments["verdict"] is True))
    if cancel is None:
        cancel = f"after {rng.randrange(1, CALLS)} results"
    max_parallel = rng.choice((1, 2, 3, 4, 8, 16))
    # Mostly more workers than max_parallel (so the limit is the batch's), sometimes fewer.
    workers = rng.choice((max_parallel + 1, max_parallel + 4, 1, 2))
    return Plan(seed, workers, max_parallel, cancel, calls, parallel)


def run_round(plan: Plan) -> None:
    ledger = Ledger()
    turn = CancelSource()
    caller = threading.get_ident()
    if plan.cancel == "before":
        turn.cancel("turn over")
    elif plan.cancel != "never":
        ledger.trigger_at = int(plan.cancel.split()[1])

    def cancel_when_triggered() -> None:
        if ledger.trigger.wait(WAIT):
            turn.cancel("user pressed stop")

    registry = ToolRegistry(max_workers=plan.workers, thread_name_prefix="batch-stress")
    try:
        registry.add_pre_execute(ledger.hook)
        registry.on_result(ledger.observe)
        registry.tool(name="safe", concurrency_safe=True)(ledger.body)
        registry.tool(name="alone")(ledger.body)
        registry.tool(name="judged", concurrency_safe=classify)(ledger.body)
        canceller = Caller(cancel_when_triggered, name="canceller")
        results = registry.execute_batch(
            plan.calls,
            token=turn.token,
            max_parallel=plan.max_parallel,
            on_progress=lambda done, total: ledger.progress.append(
                (done, total, threading.get_ident())
            ),
        )
        with ledger.lock:
            started_at_return = set(ledger.started)
            finished_at_return = set(ledger.finished)
        ledger.trigger.set()  # a round that finished before its trigger: release the canceller
        canceller.join()
    finally:
        registry.close()  # waits for anything left behind: a late start shows up below
    check_round(plan, ledger, results, started_at_return, finished_at_return, caller)


def check_round(
    plan: Plan,
    ledger: Ledger,
    results: list[ToolResult[Any]],
    started_at_return: set[int],
    finished_at_return: set[int],
    caller: int,
) -> None:
    where = (
        f"STRESS_SEED={plan.seed} (workers={plan.workers}, max_parallel={plan.max_parallel}, "
        f"cancel {plan.cancel})"
    )
    assert [result.call.call_id for result in results] == [c.call_id for c in plan.calls], where
    assert started_at_return == finished_at_return, f"{where}: returned with bodies running"
    assert ledger.started == started_at_return, f"{where}: bodies started after the return"

    for index, result in enumerate(results):
        seen = ledger.observed.get(index, [])
        assert len(seen) == 1 and seen[0] is result, f"{where}: call {index} observed {seen}"
        mode = plan.calls[index].arguments["mode"]  # type: ignore[index]
        if index in ledger.started:
            assert result.dispatched, f"{where}: {result}"
            assert result.code in (None, ABORTED, ErrorCode.TOOL_ERROR), f"{where}: {result}"
        else:
            assert not result.dispatched, f"{where}: {result}"
        if result.code == BEFORE:
            assert index not in ledger.started, f"{where}: {index} reported {BEFORE} but ran"
        if index not in ledger.hooked:
            assert result.code == BEFORE, f"{where}: {index} skipped every hook: {result}"
        if index in ledger.hooked_cancelled:
            assert index not in ledger.started, f"{where}: {index} ran after a cancelled hook"
            assert result.code == BEFORE, f"{where}: {result}"
        if index in ledger.entered_cancelled and mode != "raise":
            assert result.code == ABORTED, f"{where}: a success after cancellation: {result}"
        if plan.cancel == "never":
            expected = ErrorCode.TOOL_ERROR if mode == "raise" else None
            assert result.code == expected, f"{where}: {result}"
        if plan.cancel == "before":
            assert result.code == BEFORE and not ledger.hooked, f"{where}: {result}"
    assert len(ledger.observed) == CALLS, where

    check_schedule(plan, ledger, where)
    assert [(done, total) for done, total, _ in ledger.progress] == [
        (done, CALLS) for done in range(1, CALLS + 1)
    ], f"{where}: progress {ledger.progress[:5]}..."
    assert {ident for _, _, ident in ledger.progress} == {caller}, where


def check_schedule(plan: Plan, ledger: Ledger, where: str) -> None:
    """Exclusive calls ran alone, in order; at most max_parallel calls overlapped."""
    running: set[int] = set()
    exclusive_running: int | None = None
    highest_started = -1
    for kind, index in ledger.journal:
        if index not in ledger.hooked:
            continue  # never started: its observer is not part of a running interval
        if kind == "start":
            assert exclusive_running is None, f"{where}: {index} overlapped {exclusive_running}"
            if not plan.parallel[index]:
                assert not running, f"{where}: exclusive {index} overlapped {sorted(running)}"
                assert index > highest_started, f"{where}: {index} started out of order"
                exclusive_running = index
            running.add(index)
            assert len(running) <= plan.max_parallel, f"{where}: {sorted(running)} overlapped"
            highest_started = max(highest_started, index)
        else:
            running.discard(index)
            if exclusive_running == index:
                exclusive_running = None


def seeds(count: int, offset: int) -> Iterator[int]:
    base = int(os.environ.get("STRESS_SEED", random.randrange(2**32)))
    return (base + offset + n for n in range(count))


def test_thousand_call_batches_under_random_cancellation_keep_every_invariant() -> None:
    plans = []
    for n, seed in enumerate(seeds(ROUNDS, 0)):
        cancel = {0: "never", 1: "before"}.get(n)
        plans.append(make_plan(seed, cancel))
    for plan in plans:
        run_round(plan)


@pytest.mark.usefixtures("fast_thread_switching")
def test_thousand_call_batches_with_fast_thread_switching() -> None:
    for seed in seeds(FAST_SWITCHING_ROUNDS, ROUNDS):
        run_round(make_plan(seed))
