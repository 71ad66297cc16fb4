"""Tests for `ToolRegistry.execute_batch` (docs/contract.md section 7): scheduling and turn
cancellation.

Every batch here records what its calls went through: a pre-execute hook journals ``("start", i)``
and an observer ``("end", i)`` (the observer is a call's last stage), so a call's lifetime is an
interval of one journal, ordered by the journal's lock. Overlap, exclusivity and start order are
read off those intervals after the batch returned. Threads are ordered only with `Event`s and
`Barrier`s, and "the scheduler has done all it will do for now" is observed, not waited for: the
caller's thread is parked in toolreg's join, per its frame and the kernel (`caller_is_parked`).
The bounded waits that remain are negative checks ("still blocked after 50 ms") that a correct
implementation always passes, never used to order anything.

Ctrl-C is delivered for real (`signal.pthread_kill` on the main thread) once the caller is parked
in toolreg's join, and also injected at every line of the scheduler with a trace function (a
signal can land on any bytecode: see docs/contract.md A.2).
"""

from __future__ import annotations

import itertools
import linecache
import logging
import os
import platform
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import pytest
from _registry_helpers import (
    ABORTED,
    BEFORE,
    WAIT,
    Caller,
    Gate,
    Journal,
    default_sigint,
    frame_of,
    holds_nothing,
    occupy,
    open_registry,
    wait_until,
)

import toolreg
from toolreg import (
    Allow,
    Ask,
    CancelSource,
    CancelToken,
    ErrorCode,
    RegistryClosedError,
    ToolCall,
    ToolRegistry,
    ToolResult,
)

TOOLREG_DIR = os.path.dirname(toolreg.__file__) + os.sep


# -- recording what a batch did ------------------------------------------------------------------


@dataclass
class Trace:
    """What every stage of a registry's calls saw, keyed by call_id (thread-safe)."""

    journal: Journal = field(default_factory=Journal)
    hooked: list[str] = field(default_factory=list)  # pre-execute hook entries, in order
    observed: dict[str, list[ToolResult[Any]]] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)  # bodies that began
    finished: set[str] = field(default_factory=set)  # bodies that returned or raised
    threads: dict[str, set[int]] = field(default_factory=dict)  # stage -> thread idents
    lock: threading.Lock = field(default_factory=threading.Lock)  # guards everything above

    def hook(self, call: ToolCall, token: object) -> None:
        with self.lock:
            self.hooked.append(call.call_id)
            self.threads.setdefault("pre_execute", set()).add(threading.get_ident())
        self.journal(("start", call.call_id))

    def observe(self, result: ToolResult[Any]) -> None:
        self.journal(("end", result.call.call_id))
        with self.lock:
            self.observed.setdefault(result.call.call_id, []).append(result)
            self.threads.setdefault("observer", set()).add(threading.get_ident())

    def body_started(self, call_id: str) -> None:
        with self.lock:
            self.started.add(call_id)
            self.threads.setdefault("body", set()).add(threading.get_ident())

    def body_finished(self, call_id: str) -> None:
        with self.lock:
            self.finished.add(call_id)

    def bodies(self) -> tuple[set[str], set[str]]:
        with self.lock:
            return set(self.started), set(self.finished)

    def seen_once(self, results: Sequence[ToolResult[Any]]) -> None:
        """Each result was observed exactly once, as the very object the batch returned."""
        with self.lock:
            for result in results:
                seen = self.observed.get(result.call.call_id, [])
                assert len(seen) == 1, f"{result.call.call_id} observed {len(seen)} times: {seen}"
                assert seen[0] is result, f"{result.call.call_id}: returned != observed object"
            assert len(self.observed) == len(results), "observers saw calls outside the batch"

    def intervals(self) -> dict[str, tuple[int, int]]:
        """call_id -> (journal position of its first stage, of its observer)."""
        spans: dict[str, list[int]] = {}
        for position, (kind, call_id) in enumerate(self.journal.entries):
            span = spans.setdefault(call_id, [position, position])
            if kind == "end":
                span[1] = position
        return {call_id: (span[0], span[1]) for call_id, span in spans.items()}


def traced(registry: ToolRegistry) -> Trace:
    trace = Trace()
    registry.add_pre_execute(trace.hook)
    registry.on_result(trace.observe)
    return trace


def ids(count: int, prefix: str = "c") -> list[str]:
    return [f"{prefix}{index}" for index in range(count)]


def batch_of(names: Sequence[str], arguments: dict[str, Any] | None = None) -> list[ToolCall]:
    """One call per name, with call ids c0, c1, ... (and `{"i": index}` merged in)."""
    return [
        ToolCall(name, {**(arguments or {}), "i": index}, call_id=f"c{index}")
        for index, name in enumerate(names)
    ]


def max_in_flight(trace: Trace) -> int:
    """The most calls whose intervals overlapped at any journal position."""
    level = peak = 0
    for kind, _ in trace.journal.entries:
        level += 1 if kind == "start" else -1
        peak = max(peak, level)
    return peak


def assert_runs_alone(trace: Trace, order: Sequence[str], exclusive: str) -> None:
    """Everything before `exclusive` ended before it began; nothing after began before it ended."""
    spans = trace.intervals()
    begin, end = spans[exclusive]
    position = order.index(exclusive)
    for call_id in order[:position]:
        assert spans[call_id][1] < begin, f"{call_id} still running when {exclusive} started"
    for call_id in order[position + 1 :]:
        if call_id in spans:
            assert spans[call_id][0] > end, f"{call_id} started before {exclusive} settled"


class CountingPool(ThreadPoolExecutor):
    """A thread pool that counts submissions, so a test can wait until work is queued."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers, thread_name_prefix="counting")
        self.submitted = 0
        self._count_lock = threading.Lock()  # guards submitted

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        future = super().submit(fn, *args, **kwargs)
        with self._count_lock:
            self.submitted += 1
        return future


_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())  # the futex syscall number


def _in_futex_wait(native_id: int) -> bool:
    """True if the kernel says that thread is blocked in futex() (Linux only)."""
    with open(f"/proc/self/task/{native_id}/syscall") as status:
        return status.read().split()[0] == str(_FUTEX)


def _can_see_blocking() -> bool:
    try:
        return _FUTEX is not None and isinstance(_in_futex_wait(threading.get_native_id()), bool)
    except OSError:
        return False


needs_blocking_probe = pytest.mark.skipif(
    not _can_see_blocking(), reason="needs /proc/self/task/<tid>/syscall and a known futex number"
)


def caller_is_parked(thread: threading.Thread) -> bool:
    """True once `thread` sleeps in the kernel inside a get/acquire/wait/join toolreg makes.

    Python acts on a signal only between bytecodes, or when it interrupts a blocking system
    call. A SIGINT that arrives after the interpreter's last check but before the thread enters
    futex() is not acted on until the wait returns, so "the caller waits" is checked in the
    kernel too: only then is a Ctrl-C guaranteed to land *in* the wait. Frames of `threading`
    and `queue` on top of the toolreg frame are allowed (an Event, a Condition); any other
    (say, `ThreadPoolExecutor.submit` starting a thread) is not.
    """
    assert thread.ident is not None and thread.native_id is not None
    frame: FrameType | None = frame_of(thread.ident)
    while frame is not None and not frame.f_code.co_filename.startswith(TOOLREG_DIR):
        if os.path.basename(frame.f_code.co_filename) not in ("threading.py", "queue.py"):
            return False
        frame = frame.f_back
    if frame is None:
        return False
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    if not any(word in line for word in (".get(", ".acquire(", ".wait(", ".join(")):
        return False
    return _in_futex_wait(thread.native_id)


# -- results ------------------------------------------------------------------------------------


def test_one_result_per_call_in_input_order_each_the_object_observers_saw() -> None:
    with open_registry(max_workers=4) as registry:
        trace = traced(registry)
        registry.add_guard(lambda call: "no" if call.name == "denied" else None)

        @registry.tool(concurrency_safe=True)
        def echo(args: Any, ctx: Any) -> Any:
            return args["i"]

        @registry.tool(name="denied")
        def denied(args: Any, ctx: Any) -> Any:  # pragma: no cover - the guard refuses it
            raise AssertionError("a denied call ran")

        @registry.tool(parameters={"type": "object", "properties": {"i": {"type": "string"}}})
        def typed(args: Any, ctx: Any) -> Any:  # pragma: no cover - its arguments never pass
            raise AssertionError("invalid arguments reached the body")

        @registry.tool
        def broken(args: Any, ctx: Any) -> Any:
            raise LookupError("nope")

        names = ["echo", "missing", "echo", "denied", "typed", "broken", "echo", "echo"]
        calls = batch_of(names)
        results = registry.execute_batch(calls, max_parallel=3)

    assert [result.call.call_id for result in results] == ids(len(calls))
    assert [result.code for result in results] == [
        None,
        ErrorCode.UNKNOWN_TOOL,
        None,
        ErrorCode.DENIED,
        ErrorCode.INVALID_ARGS,
        ErrorCode.TOOL_ERROR,
        None,
        None,
    ]
    assert [result.value for result in results if result.ok] == [0, 2, 6, 7]
    trace.seen_once(results)


def test_an_empty_batch_returns_an_empty_list_and_reports_no_progress() -> None:
    progress: list[tuple[int, int]] = []
    with open_registry(max_workers=1) as registry:
        assert registry.execute_batch([], on_progress=lambda *p: progress.append(p)) == []
    assert progress == []


def test_calls_accepts_any_iterable_of_calls() -> None:
    with open_registry(max_workers=2) as registry:
        registry.tool(name="echo", concurrency_safe=True)(lambda args, ctx: args["i"])
        results = registry.execute_batch(call for call in batch_of(["echo"] * 3))
    assert [result.value for result in results] == [0, 1, 2]


# -- scheduling: parallel, exclusive, start order ------------------------------------------------


@pytest.mark.parametrize("max_parallel", [1, 2, 4])
def test_parallel_calls_overlap_up_to_max_parallel_and_never_beyond(max_parallel: int) -> None:
    # Bodies meet at a Barrier(max_parallel): if fewer than max_parallel ever ran together, it
    # breaks (BrokenBarrierError -> TOOL_ERROR). A counter (bodies) and the journal (whole calls,
    # hooks to observer) prove that more never ran together.
    barrier = threading.Barrier(max_parallel, timeout=WAIT)
    running = high_water = 0
    lock = threading.Lock()  # guards running, high_water

    with open_registry(max_workers=2 * max_parallel + 1) as registry:
        trace = traced(registry)

        @registry.tool(concurrency_safe=True)
        def fetch(args: Any, ctx: Any) -> Any:
            nonlocal running, high_water
            with lock:
                running += 1
                high_water = max(high_water, running)
            try:
                barrier.wait()
            finally:
                with lock:
                    running -= 1
            return args["i"]

        calls = batch_of(["fetch"] * (3 * max_parallel))
        results = registry.execute_batch(calls, max_parallel=max_parallel)

    assert [result.code for result in results] == [None] * len(calls), results
    assert high_water == max_parallel
    assert max_in_flight(trace) == max_parallel


def test_a_segment_whose_calls_never_block_hands_over_one_runner_and_one_spare() -> None:
    # One worker: the first runner takes every call (none blocks, and no other worker could take
    # one); the spare it handed over on its first call runs after it, finds nothing and takes
    # back the rest of the chain unstarted. Handing over all eight runners up front wakes eight.
    pool = CountingPool(1)
    results = quick_batch_on(pool, 20)
    assert [result.value for result in results] == list(range(20))
    assert pool.submitted == 2


def quick_batch_on(pool: ThreadPoolExecutor, count: int) -> list[ToolResult[Any]]:
    """`count` parallel-safe calls that return at once, on a registry using `pool` (then shut)."""
    try:
        with open_registry(executor=pool) as registry:
            registry.tool(name="quick", concurrency_safe=True)(lambda args, ctx: args["i"])
            return registry.execute_batch(batch_of(["quick"] * count), max_parallel=8)
    finally:
        pool.shutdown(wait=True)


class RefusingPool(CountingPool):
    """A one-worker pool that refuses every submission after the first (as if shut down)."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.attempts = 0  # guarded by _count_lock

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        with self._count_lock:
            self.attempts += 1
            refused = self.attempts > 1
        if refused:
            raise RuntimeError("cannot schedule new futures after shutdown")
        return super().submit(fn, *args, **kwargs)


def test_a_runner_whose_spare_is_refused_runs_the_rest_of_the_segment_alone() -> None:
    pool = RefusingPool(1)
    results = quick_batch_on(pool, 5)
    assert [(result.code, result.value) for result in results] == [(None, i) for i in range(5)]
    assert (pool.attempts, pool.submitted) == (2, 1)  # the spare was offered, and refused


def test_a_batch_whose_first_runner_the_executor_drops_returns_every_call_unstarted() -> None:
    # The one worker is busy, so the first runner waits in the queue with the rest of the chain
    # behind it; shutdown(cancel_futures=True) drops it, and those it would have passed on with it.
    executor = CountingPool(1)
    free = occupy(executor)
    ran = Journal()
    try:
        with open_registry(executor=executor) as registry:
            registry.tool(name="quick", concurrency_safe=True)(lambda args, ctx: ran(args["i"]))
            batch = Caller(lambda: registry.execute_batch(batch_of(["quick"] * 3), max_parallel=8))
            wait_until(lambda: executor.submitted >= 2, "the batch's first runner to be queued")
            executor.shutdown(wait=False, cancel_futures=True)
            results = batch.join()
    finally:
        free.set()
        executor.shutdown(wait=True)
    assert [result.code for result in results] == [BEFORE] * 3
    assert ran.entries == []


def test_calls_start_in_input_order() -> None:
    # One worker takes queued jobs first-in first-out, so the order the calls start in is the
    # order the batch handed them over in -- for parallel calls too.
    with open_registry(max_workers=1) as registry:
        trace = traced(registry)
        registry.tool(name="safe", concurrency_safe=True)(lambda args, ctx: None)
        registry.tool(name="alone")(lambda args, ctx: None)
        names = ["safe", "safe", "alone", "safe", "safe", "safe", "alone", "alone", "safe"]
        registry.execute_batch(batch_of(names), max_parallel=8)
    assert trace.hooked == ids(len(names))


def test_an_exclusive_call_waits_for_everything_before_it_and_runs_alone() -> None:
    names = ["p", "p", "x", "p", "p", "p", "x", "x", "p", "p"]
    order = ids(len(names))
    # Each run of consecutive parallel calls meets at a barrier of its own size: it proves those
    # calls did overlap, so the exclusives are barriers and not a sign that everything is serial.
    runs = [[0, 1], [3, 4, 5], [8, 9]]
    barriers: dict[int, threading.Barrier] = {}
    for run in runs:
        barrier = threading.Barrier(len(run), timeout=WAIT)
        barriers.update(dict.fromkeys(run, barrier))

    with open_registry(max_workers=8) as registry:
        trace = traced(registry)

        @registry.tool(name="p", concurrency_safe=True)
        def parallel(args: Any, ctx: Any) -> Any:
            barriers[args["i"]].wait()
            return "p"

        registry.tool(name="x")(lambda args, ctx: "x")
        results = registry.execute_batch(batch_of(names), max_parallel=8)

    assert [result.content for result in results] == names
    for position, name in enumerate(names):
        if name == "x":
            assert_runs_alone(trace, order, order[position])
    assert max_in_flight(trace) == 3


def classifier_raises(args: Any) -> bool:
    raise RuntimeError("cannot tell")


@pytest.mark.parametrize(
    ("concurrency_safe", "parallel"),
    [
        (True, True),
        (lambda args: True, True),
        (lambda args: args["i"] == 1, True),
        (False, False),
        (lambda args: False, False),
        (lambda args: 1, False),
        (lambda args: "yes", False),
        (lambda args: None, False),
        (classifier_raises, False),
    ],
    ids=[
        "True",
        "fn-True",
        "fn-by-args",
        "False",
        "fn-False",
        "fn-1",
        "fn-yes",
        "fn-None",
        "raises",
    ],
)
@needs_blocking_probe
def test_only_an_exact_true_classifies_a_call_as_parallel(
    concurrency_safe: Any, parallel: bool
) -> None:
    _check_classification("judged", {}, concurrency_safe, parallel, ok=True)


@pytest.mark.parametrize(
    ("name", "arguments", "code", "concurrency_safe"),
    [
        pytest.param("missing", {}, ErrorCode.UNKNOWN_TOOL, True, id="unknown-tool"),
        pytest.param(
            "judged",
            {"n": "not an int"},
            ErrorCode.INVALID_ARGS,
            lambda args: True,
            id="schema-rejects-fn",
        ),
        pytest.param(
            "judged", {"n": {1, 2}}, ErrorCode.INVALID_ARGS, lambda args: True, id="not-json-fn"
        ),
        # The two "-True" cases are regressions: a bool concurrency_safe once skipped the
        # argument check, so a True tool with bad arguments ran in parallel.
        pytest.param(
            "judged",
            {"n": "not an int"},
            ErrorCode.INVALID_ARGS,
            True,
            id="schema-rejects-True",
        ),
        pytest.param(
            "judged",
            {"n": {1, 2}},
            ErrorCode.INVALID_ARGS,
            True,
            id="not-json-True",
        ),
    ],
)
@needs_blocking_probe
def test_unknown_tools_and_bad_arguments_are_exclusive(
    name: str, arguments: dict[str, Any], code: ErrorCode, concurrency_safe: Any
) -> None:
    _check_classification(name, arguments, concurrency_safe, False, ok=False, code=code)


def _check_classification(
    name: str,
    arguments: dict[str, Any],
    concurrency_safe: Any,
    parallel: bool,
    *,
    ok: bool,
    code: ErrorCode | None = None,
) -> None:
    """Batch [p, <the call>, p] (p is parallel-safe) and check whether the middle one overlaps.

    Parallel: all three meet at a barrier. Exclusive: c0 holds until the batch's caller (this
    thread) sleeps in its join -- by then the scheduler has handed over everything it was going
    to hand over while c0 runs -- and counts the pool's submissions: c0's job alone.
    """
    together = threading.Barrier(3, timeout=WAIT)
    main = threading.current_thread()
    handed_over: list[int] = []  # pool submissions while c0 was running
    pool = CountingPool(4)
    try:
        with open_registry(executor=pool) as registry:
            trace = traced(registry)

            @registry.tool(concurrency_safe=True)
            def p(args: Any, ctx: Any) -> Any:
                if parallel:
                    together.wait()  # all three run at once
                elif args["i"] == 0:
                    wait_until(lambda: caller_is_parked(main), "the batch to wait for c0")
                    handed_over.append(pool.submitted)
                return "p"

            @registry.tool(
                concurrency_safe=concurrency_safe,
                parameters={"type": "object", "properties": {"n": {"type": "integer"}}},
            )
            def judged(args: Any, ctx: Any) -> Any:
                if parallel:
                    together.wait()
                return "judged"

            calls = [ToolCall("p", {"i": 0}, "c0"), ToolCall(name, {"i": 1, **arguments}, "c1")]
            calls.append(ToolCall("p", {"i": 2}, "c2"))
            results = registry.execute_batch(calls, max_parallel=8)
    finally:
        pool.shutdown(wait=True)

    assert [result.ok for result in results] == [True, ok, True], results
    assert results[1].code == code
    if parallel:
        assert max_in_flight(trace) == 3
    else:
        assert handed_over == [1], "c1 was handed to the pool while c0 was running"
        assert_runs_alone(trace, ids(3), "c1")


def test_a_classifier_sees_the_arguments_of_its_call() -> None:
    seen: list[Any] = []

    def classify(args: Any) -> bool:
        seen.append(dict(args))
        return True

    with open_registry(max_workers=2) as registry:
        registry.tool(name="judged", concurrency_safe=classify)(lambda args, ctx: None)
        registry.execute_batch(batch_of(["judged"] * 2, {"q": "x"}))
    assert sorted(seen, key=lambda args: args["i"]) == [{"q": "x", "i": 0}, {"q": "x", "i": 1}]


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make_batch", "error"),
    [
        (lambda: [ToolCall("t", call_id="a"), "t"], TypeError),
        (lambda: [ToolCall("t", call_id="a"), {"name": "t"}], TypeError),
        (lambda: [ToolCall("t", call_id="a"), None], TypeError),
        (lambda: "t", TypeError),
        (
            lambda: [
                ToolCall("t", call_id="a"),
                ToolCall("t", call_id="b"),
                ToolCall("t", call_id="a"),
            ],
            ValueError,
        ),
    ],
    ids=["str-item", "dict-item", "None-item", "a-str", "duplicate-call-id"],
)
def test_bad_items_raise_before_anything_starts(
    make_batch: Callable[[], list[Any]], error: type[Exception]
) -> None:
    # The same misuse as in execute() gets the same exception: a non-ToolCall is a TypeError.
    with open_registry(max_workers=2) as registry:
        trace = traced(registry)
        registry.tool(name="t")(lambda args, ctx: trace.body_started(ctx.call.call_id))
        with pytest.raises(error):
            registry.execute_batch(make_batch())
    assert trace.hooked == [] and trace.observed == {} and trace.started == set()


@pytest.mark.parametrize(
    ("token", "match"),
    [(CancelSource(), "pass source.token"), ("soon", "must be a CancelToken")],
    ids=["a-source", "a-str"],
)
def test_a_token_that_is_not_a_cancel_token_is_refused_before_anything_starts(
    token: Any, match: str
) -> None:
    """As in execute(): the same TypeError, and the same hint for a source passed instead."""
    with open_registry(max_workers=2) as registry:
        trace = traced(registry)
        registry.tool(name="t")(lambda args, ctx: trace.body_started(ctx.call.call_id))
        with pytest.raises(TypeError, match=match):
            registry.execute_batch([ToolCall("t")], token=token)
        assert trace.hooked == [] and trace.observed == {} and trace.started == set()
        # Any CancelToken is one, the shared never-cancelled token included.
        assert registry.execute_batch([ToolCall("t")], token=CancelToken.never())[0].ok


@pytest.mark.parametrize(
    ("max_parallel", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (1.5, TypeError),
        (True, TypeError),
        (False, TypeError),
        ("2", TypeError),
        (None, TypeError),
    ],
)
def test_max_parallel_must_be_an_int_of_at_least_one(
    max_parallel: Any, error: type[Exception]
) -> None:
    with open_registry(max_workers=2) as registry:
        trace = traced(registry)
        registry.tool(name="t")(lambda args, ctx: trace.body_started(ctx.call.call_id))
        with pytest.raises(error, match="max_parallel"):
            registry.execute_batch([ToolCall("t")], max_parallel=max_parallel)
    assert trace.hooked == [] and trace.observed == {} and trace.started == set()


# -- progress -----------------------------------------------------------------------------------


def test_on_progress_runs_on_the_joining_thread_monotonic_up_to_total() -> None:
    progress: list[tuple[int, int, int]] = []
    with open_registry(max_workers=4) as registry:
        registry.tool(name="safe", concurrency_safe=True)(lambda args, ctx: None)
        registry.tool(name="alone")(lambda args, ctx: None)
        calls = batch_of(["safe", "safe", "alone", "safe", "safe", "safe", "alone"])
        registry.execute_batch(
            calls,
            max_parallel=2,
            on_progress=lambda done, total: progress.append((done, total, threading.get_ident())),
        )
    assert [(done, total) for done, total, _ in progress] == [(n, 7) for n in range(1, 8)]
    assert {ident for _, _, ident in progress} == {threading.get_ident()}


def test_on_progress_counts_unstarted_calls_too() -> None:
    progress: list[tuple[int, int]] = []
    source = CancelSource()
    source.cancel("turn over")
    with open_registry(max_workers=2) as registry:
        registry.tool(name="t")(lambda args, ctx: None)
        registry.execute_batch(
            batch_of(["t"] * 3), token=source.token, on_progress=lambda *p: progress.append(p)
        )
    assert progress == [(1, 3), (2, 3), (3, 3)]


def test_a_raising_on_progress_is_logged_and_the_batch_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def on_progress(done: int, total: int) -> None:
        raise RuntimeError(f"progress bar broke at {done}/{total}")

    with open_registry(max_workers=2) as registry, caplog.at_level(logging.ERROR, "toolreg"):
        registry.tool(name="t", concurrency_safe=True)(lambda args, ctx: args["i"])
        results = registry.execute_batch(batch_of(["t"] * 3), on_progress=on_progress)

    assert [result.value for result in results] == [0, 1, 2]
    errors = [record for record in caplog.records if record.name == "toolreg"]
    assert len(errors) == 3 and all(record.exc_info for record in errors)


def test_on_progress_must_be_callable() -> None:
    with open_registry(max_workers=1) as registry:
        registry.tool(name="t")(lambda args, ctx: None)
        with pytest.raises(TypeError):
            registry.execute_batch([ToolCall("t")], on_progress=42)  # type: ignore[arg-type]


# -- threads ------------------------------------------------------------------------------------


def test_every_stage_of_a_batch_call_runs_off_the_callers_thread() -> None:
    caller = threading.get_ident()
    threads = Journal()

    def note(stage: str) -> str:
        threads((stage, threading.get_ident()))
        return stage

    with open_registry(max_workers=4) as registry:
        registry.add_pre_execute(lambda call, token: (note("pre_execute"), Ask("sure?"))[1])
        registry.set_approver(lambda call, reason, token: (note("approver"), True)[1])
        registry.add_guard(lambda call: (note("guard"), None)[1])
        registry.add_around(lambda dispatch, proceed: (note("around"), proceed())[1])
        registry.add_post_execute(lambda result, token: (note("post_execute"), None)[1])
        registry.on_result(lambda result: note("observer"))
        registry.tool(name="safe", concurrency_safe=True)(lambda args, ctx: note("body"))
        registry.tool(name="alone")(lambda args, ctx: note("body"))
        results = registry.execute_batch(
            batch_of(["safe", "safe", "alone", "safe"]),
            on_progress=lambda done, total: note("on_progress"),
        )

    assert all(result.ok for result in results), results
    stages: dict[str, set[int]] = {}
    for stage, ident in threads.entries:
        stages.setdefault(stage, set()).add(ident)
    assert stages.pop("on_progress") == {caller}
    assert set(stages) == {
        "pre_execute",
        "approver",
        "guard",
        "around",
        "post_execute",
        "observer",
        "body",
    }
    assert all(caller not in idents for idents in stages.values()), stages


@pytest.mark.parametrize("outer", ["execute", "execute_batch"])
def test_a_batch_inside_a_body_does_not_deadlock_a_single_worker(outer: str) -> None:
    with open_registry(max_workers=1) as registry:
        trace = traced(registry)
        registry.tool(name="leaf", concurrency_safe=True)(lambda args, ctx: args["i"])
        registry.tool(name="lone")(lambda args, ctx: -args["i"])

        @registry.tool
        def fan_out(args: Any, ctx: Any) -> Any:
            calls = batch_of(["leaf", "leaf", "lone", "leaf"])
            calls = [
                ToolCall(c.name, c.arguments, f"{ctx.call.call_id}/{c.call_id}") for c in calls
            ]
            results = registry.execute_batch(calls, token=ctx.token, max_parallel=4)
            return [result.value for result in results]

        def run_outer() -> Any:
            if outer == "execute":
                return registry.execute("fan_out")
            return registry.execute_batch([ToolCall("fan_out"), ToolCall("fan_out")])[-1]

        result = Caller(run_outer).join()

    assert result.ok, result
    assert result.value == [0, 1, -2, 3]
    assert all(len(seen) == 1 for seen in trace.observed.values())


# -- cancellation -------------------------------------------------------------------------------


def test_a_pre_cancelled_batch_starts_nothing_and_every_call_is_observed() -> None:
    source = CancelSource()
    source.cancel("turn over")
    with open_registry(max_workers=2) as registry:
        trace = traced(registry)
        registry.add_guard(lambda call: pytest.fail("a guard saw an unstarted call"))
        registry.add_around(lambda dispatch, proceed: pytest.fail("a wrapper saw it"))
        registry.tool(name="t")(lambda args, ctx: trace.body_started(ctx.call.call_id))
        registry.tool(name="s", concurrency_safe=True)(
            lambda args, ctx: trace.body_started(ctx.call.call_id)
        )
        calls = batch_of(["s", "s", "t", "s"])
        results = registry.execute_batch(calls, token=source.token)

    assert [result.call.call_id for result in results] == ids(4)
    assert all(r.code == BEFORE and not r.dispatched for r in results), results
    assert [r.content for r in results] == ["Error: tool call aborted before dispatch"] * 4
    assert trace.hooked == [] and trace.started == set()
    trace.seen_once(results)


def test_a_running_batch_listens_on_the_callers_token_and_links_nothing_into_it() -> None:
    # White-box: the batch's own token stays lazy (making it eager would link it into the
    # caller's token and unlink it again, 1.7 us a batch); its one listener is on the caller's
    # token, and the caller's cancellation still reaches the running call through it.
    turn = CancelSource()
    seen: list[tuple[int, bool]] = []
    inside = threading.Event()

    with open_registry() as registry:

        @registry.tool(concurrency_safe=True)
        def look(args: Any, ctx: Any) -> Any:
            token = turn.token
            seen.append((len(token._listeners or ()), bool(token._children)))
            inside.set()
            return ctx.token.wait(WAIT)  # True once the caller's token is cancelled

        batch = Caller(lambda: registry.execute_batch(batch_of(["look"]), token=turn.token))
        assert inside.wait(WAIT)
        turn.cancel("stop")
        results = batch.join()
    assert seen == [(1, False)]
    assert [result.code for result in results] == [ABORTED]
    assert holds_nothing(turn.token)


def test_cancelling_mid_batch_skips_unstarted_calls_and_drains_started_ones() -> None:
    # c0..c3 run together (max_parallel=4) and wait, cooperatively, for the turn to be cancelled;
    # c4 (exclusive) and c5 are never handed over: they must not reach any hook.
    turn = CancelSource()
    arrived = threading.Barrier(5, timeout=WAIT)  # four bodies and this test
    with open_registry(max_workers=8) as registry:
        trace = traced(registry)

        @registry.tool(concurrency_safe=True)
        def slow(args: Any, ctx: Any) -> Any:
            trace.body_started(ctx.call.call_id)
            try:
                arrived.wait()
                assert ctx.token.wait(WAIT), "never cancelled"
                ctx.defer_context("cleaned up")
                ctx.token.raise_if_cancelled()
            finally:
                trace.body_finished(ctx.call.call_id)

        registry.tool(name="alone")(lambda args, ctx: trace.body_started(ctx.call.call_id))

        def run_batch() -> tuple[list[ToolResult[Any]], tuple[set[str], set[str]]]:
            calls = batch_of(["slow"] * 4 + ["alone", "slow"])
            results = registry.execute_batch(calls, token=turn.token, max_parallel=4)
            return results, trace.bodies()

        batch = Caller(run_batch)
        arrived.wait()
        turn.cancel("user pressed stop")
        results, (started, finished) = batch.join()

    assert started == finished == set(ids(4))  # every started body settled before the return
    assert [r.code for r in results] == [ABORTED] * 4 + [BEFORE] * 2
    assert [r.dispatched for r in results] == [True] * 4 + [False] * 2
    assert all(r.contexts == ("cleaned up",) for r in results[:4])
    assert sorted(trace.hooked) == ids(4)
    trace.seen_once(results)


def test_an_uncooperative_started_call_is_waited_for() -> None:
    turn = CancelSource()
    gate = Gate()
    events = Journal()
    with open_registry(max_workers=2) as registry:
        trace = traced(registry)

        @registry.tool
        def stubborn(args: Any, ctx: Any) -> Any:
            gate.hold()  # ignores ctx.token
            events("body returned")
            return "done anyway"

        registry.tool(name="next")(lambda args, ctx: trace.body_started(ctx.call.call_id))

        def run_batch() -> list[ToolResult[Any]]:
            results = registry.execute_batch(batch_of(["stubborn", "next"]), token=turn.token)
            events("batch returned")
            return results

        batch = Caller(run_batch)
        gate.wait_reached()
        turn.cancel("user pressed stop")
        assert batch.still_blocked(), "execute_batch returned before its started call settled"
        gate.release()
        results = batch.join()

    assert events.entries == ["body returned", "batch returned"]
    assert [r.code for r in results] == [ABORTED, BEFORE]  # its success came after the cancel
    assert results[0].dispatched and not results[1].dispatched
    assert trace.hooked == ["c0"] and trace.started == set()
    trace.seen_once(results)


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "wrapped"])
@pytest.mark.parametrize("inside", [False, True], ids=["on runners", "inside a body"])
def test_every_uncooperative_call_of_a_cancelled_batch_gets_one_overdue_warning(
    caplog: pytest.LogCaptureFixture, inside: bool, wrapped: bool
) -> None:
    # 4.4 for batch calls: the batch token's cancellation starts the overdue watch of every body
    # running under it (one listener for the batch, not one per call), and nothing of it stays
    # on the caller's token. Three parallel calls on runners; inside a body, one runs inline.
    # Wrapped: a call with an around wrapper keeps a listener of its own as well, and is still
    # warned about once.
    caplog.set_level(logging.WARNING, logger="toolreg")
    count = 1 if inside else 3
    turn = CancelSource()
    release = threading.Event()
    started = [threading.Event() for _ in range(count)]
    with open_registry(max_workers=4, overdue_after=0.01) as registry:
        if wrapped:
            registry.add_around(lambda dispatch, proceed: proceed())

        @registry.tool(concurrency_safe=True)
        def stubborn(args: Any, ctx: Any) -> Any:
            started[args["i"]].set()
            release.wait(WAIT)  # ignores ctx.token until the test saw the warnings
            return "late"

        box: list[list[ToolResult[Any]]] = []

        def outer(args: Any, ctx: Any) -> Any:
            token = ctx.token if inside else turn.token
            box.append(registry.execute_batch(batch_of(["stubborn"] * count), token=token))

        registry.tool(name="outer")(outer)

        def warned() -> set[str]:
            return {
                call_id
                for record in caplog.records
                if record.levelno == logging.WARNING
                for call_id in ids(count)
                if f"call {call_id})" in record.getMessage()
            }

        if inside:  # the outer call is cancelled too, and it waits for its batch
            batch = Caller(lambda: registry.execute("outer", token=turn.token))
        else:
            batch = Caller(lambda: outer({}, None))
        for event in started:
            assert event.wait(WAIT)
        turn.cancel("user pressed stop")
        wait_until(lambda: warned() == set(ids(count)), "an overdue warning for every call")
        assert batch.still_blocked()
        release.set()
        batch.join()
    (results,) = box
    assert [r.code for r in results] == [ABORTED] * count
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "'stubborn'" in w]) == count, warnings
    assert holds_nothing(turn.token)


def test_calls_queued_in_a_saturated_pool_never_start_once_the_batch_is_cancelled() -> None:
    # One worker, held by a blocker: the batch's first runner sits in the pool's queue (the
    # others are handed over by a runner that started). Once the batch is cancelled,
    # execute_batch returns at once (before the blocker ends), and when the worker finally
    # reaches that job, it starts no hook and no body.
    pool = CountingPool(1)
    blocker = Gate()
    turn = CancelSource()
    try:
        with open_registry(executor=pool) as registry:
            trace = traced(registry)
            registry.tool(name="blocker")(lambda args, ctx: blocker.hold())

            @registry.tool(concurrency_safe=True)
            def work(args: Any, ctx: Any) -> Any:  # pragma: no cover - must never run
                trace.body_started(ctx.call.call_id)

            holding = Caller(lambda: registry.execute(ToolCall("blocker", None, "blocker")))
            blocker.wait_reached()
            calls = batch_of(["work"] * 5)
            batch = Caller(lambda: registry.execute_batch(calls, token=turn.token, max_parallel=8))
            wait_until(lambda: pool.submitted >= 2, "the batch's first runner to be queued")
            turn.cancel("user pressed stop")
            results = batch.join()  # promptly: the blocker still holds the only worker
            assert not blocker.released.is_set()

            blocker.release()
            assert holding.join().ok
            # The worker runs whatever was queued before this call, first in first out.
            assert registry.execute(ToolCall("blocker", None, "after")).ok
    finally:
        pool.shutdown(wait=True)

    assert [r.code for r in results] == [BEFORE] * 5
    assert not any(r.dispatched for r in results)
    assert trace.started == set()
    assert trace.hooked == ["blocker", "after"]
    with trace.lock:
        assert all(len(trace.observed[call_id]) == 1 for call_id in ids(5))
        assert all(trace.observed[r.call.call_id][0] is r for r in results)


def test_close_during_a_batch_cancels_it_and_waits_for_it() -> None:
    # c0 stops when told; c1 sees the cancellation, then ignores it until the gate opens.
    events = Journal()
    both_running = threading.Barrier(3, timeout=WAIT)  # two bodies and this test
    stubborn_told = threading.Event()
    gate = Gate()
    registry = ToolRegistry(max_workers=4)
    trace = traced(registry)

    @registry.tool(concurrency_safe=True)
    def cooperative(args: Any, ctx: Any) -> Any:
        both_running.wait()
        ctx.token.wait(WAIT)
        events("cooperative returned")
        ctx.token.raise_if_cancelled()

    @registry.tool(concurrency_safe=True)
    def stubborn(args: Any, ctx: Any) -> Any:
        both_running.wait()
        if ctx.token.wait(WAIT):
            stubborn_told.set()
        gate.hold()
        events("stubborn returned")
        return "late"

    registry.tool(name="alone")(lambda args, ctx: trace.body_started(ctx.call.call_id))

    batch = Caller(lambda: registry.execute_batch(batch_of(["cooperative", "stubborn", "alone"])))
    both_running.wait()

    def close() -> None:
        registry.close()
        events("close returned")

    closer = Caller(close, name="closer")
    assert stubborn_told.wait(WAIT), "close() did not cancel the batch's calls"
    assert closer.still_blocked(), "close() returned while a batch call was running"
    gate.release()
    closer.join()
    results = batch.join()

    assert events.entries[-1] == "close returned"
    assert sorted(events.entries[:2]) == ["cooperative returned", "stubborn returned"]
    assert [r.code for r in results] == [ABORTED, ABORTED, BEFORE]
    assert trace.started == set() and sorted(trace.hooked) == ["c0", "c1"]
    trace.seen_once(results)
    with pytest.raises(RegistryClosedError):
        registry.execute_batch([ToolCall("alone")])


# -- Ctrl-C -------------------------------------------------------------------------------------


def test_a_batch_on_the_main_thread_swaps_sigint_without_the_signal_modules_wrappers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The deferral goes through `_signal`: `signal.signal` and `signal.getsignal` convert every
    # number and handler to an enum and back, 6 us of a batch. Its handler is in place while the
    # calls run, and Python's default one is back afterwards.
    seen: list[object] = []

    def refuse(*args: Any) -> None:  # pragma: no cover - must not be called
        raise AssertionError("a batch used the signal module's wrappers")

    with default_sigint(), open_registry() as registry:
        import _signal  # type: ignore[import-not-found]  # no stub; a builtin module

        registry.tool(name="look")(lambda args, ctx: seen.append(_signal.getsignal(signal.SIGINT)))
        monkeypatch.setattr(signal, "signal", refuse)
        monkeypatch.setattr(signal, "getsignal", refuse)
        results = registry.execute_batch(batch_of(["look"]))
        monkeypatch.undo()
        after = signal.getsignal(signal.SIGINT)
    assert threading.current_thread() is threading.main_thread()
    assert [result.ok for result in results] == [True]
    assert len(seen) == 1 and seen[0] is not signal.default_int_handler
    assert after is signal.default_int_handler


@needs_blocking_probe
def test_ctrl_c_while_the_batch_waits_cancels_it_drains_it_then_re_raises() -> None:
    caller_source = CancelSource()
    body_waiting = threading.Event()
    parked = threading.Event()
    main = threading.main_thread()
    assert threading.current_thread() is main
    with open_registry(max_workers=4) as registry:
        trace = traced(registry)

        @registry.tool(concurrency_safe=True)
        def slow(args: Any, ctx: Any) -> Any:
            trace.body_started(ctx.call.call_id)
            try:
                body_waiting.set()
                assert ctx.token.wait(WAIT), "Ctrl-C did not cancel the batch"
                ctx.token.raise_if_cancelled()
            finally:
                trace.body_finished(ctx.call.call_id)

        registry.tool(name="alone")(lambda args, ctx: trace.body_started(ctx.call.call_id))

        def press_ctrl_c() -> None:
            assert body_waiting.wait(WAIT)
            wait_until(lambda: caller_is_parked(main), "the caller to park in its join")
            parked.set()
            assert main.ident is not None
            signal.pthread_kill(main.ident, signal.SIGINT)

        with default_sigint():
            sender = Caller(press_ctrl_c, name="ctrl-c")
            calls = batch_of(["slow", "alone", "slow"])
            with pytest.raises(KeyboardInterrupt):
                registry.execute_batch(calls, token=caller_source.token)
            started, finished = trace.bodies()
            sender.join()

    assert parked.is_set()
    assert not caller_source.token.cancelled  # the batch's token, never the caller's
    assert started == finished == {"c0"}
    assert trace.hooked == ["c0"]
    with trace.lock:
        codes = {call_id: [r.code for r in seen] for call_id, seen in trace.observed.items()}
    assert codes == {"c0": [ABORTED], "c1": [BEFORE], "c2": [BEFORE]}


_PENDING_CTRL_C_CHILD = """
import os, signal, sys, threading
sys.path.insert(0, {tests!r})
from test_batch import caller_is_parked
from toolreg import ToolCall, ToolRegistry

signal.signal(signal.SIGINT, signal.default_int_handler)
main = threading.main_thread()
registry = ToolRegistry(max_workers=2)


def body(args, ctx):
    pause = threading.Event()
    while not caller_is_parked(main):
        pause.wait(0.01)
    # To this (worker) thread: the C handler runs here and only marks the signal pending; the
    # main thread acts on it as soon as it runs bytecode again, i.e. as its wait returns.
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)
    return "ok"


registry.tool(name="t")(body)
returned = threading.Event()


def watchdog():
    if not returned.wait({bound}):
        print("HANG: execute_batch never returned", flush=True)
        os._exit(3)


threading.Thread(target=watchdog, daemon=True).start()
try:
    results = registry.execute_batch([ToolCall("t", None, "c0"), ToolCall("t", None, "c1")])
    print("returned", [r.code for r in results], flush=True)
except KeyboardInterrupt:
    print("re-raised", flush=True)
returned.set()
registry.close()
"""


@needs_blocking_probe
def test_a_ctrl_c_pending_when_the_wait_returns_a_completion_does_not_hang_the_batch() -> None:
    # In a child process: the bug is a hang, and only the main thread receives Ctrl-C.
    bound = 4.0  # seconds; the whole batch takes milliseconds
    script = _PENDING_CTRL_C_CHILD.format(tests=os.path.dirname(__file__), bound=bound)
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=bound + WAIT
    )
    assert child.returncode == 0 and child.stdout.strip() == "re-raised", (
        child.stdout + child.stderr
    )


@dataclass
class _Injection:
    reached: bool  # the run got as far as the chosen line
    where: str
    problems: list[str]


def _batch_interrupted_at(point: int, files: tuple[str, ...]) -> _Injection:
    """Run a small batch and raise KeyboardInterrupt at the `point`-th line run in `files`.

    Only the caller's thread is traced: that is where a Ctrl-C lands. `with` lines are skipped:
    the trace also fires there on the way out, after the body and before `__exit__`, a spot no
    real signal reaches. One worker, so a sentinel call queued afterwards runs only once
    everything the batch queued has been through it.
    """
    trace = Trace()
    registry = ToolRegistry(max_workers=1)
    registry.add_pre_execute(trace.hook)
    registry.on_result(trace.observe)

    def body(args: Any, ctx: Any) -> Any:
        trace.body_started(ctx.call.call_id)
        trace.body_finished(ctx.call.call_id)

    registry.tool(name="p", concurrency_safe=True)(body)
    registry.tool(name="x")(body)
    lines = itertools.count(1)
    where = ""

    def local(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal where
        if event != "line":
            return local
        code = frame.f_code
        if linecache.getline(code.co_filename, frame.f_lineno).lstrip().startswith("with "):
            return local
        if next(lines) == point:
            where = f"{os.path.basename(code.co_filename)}:{frame.f_lineno} ({code.co_name})"
            raise KeyboardInterrupt(where)
        return local

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        return local(frame, event, arg) if frame.f_code.co_filename in files else None

    problems: list[str] = []
    sys.settrace(tracer)
    try:
        registry.execute_batch(batch_of(["p", "p", "x"]), max_parallel=2)
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    if not where:
        registry.close()
        return _Injection(False, "", [])
    started, finished = trace.bodies()
    if started != finished:
        problems.append(f"returned with bodies running: {started - finished}")
    # On another thread, bounded: a registry left in a broken state must not hang the suite.
    sentinel = Caller(lambda: registry.execute(ToolCall("p", None, "sentinel")))
    sentinel.join()
    if trace.bodies()[0] - {"sentinel"} != started:
        problems.append(f"bodies started after the return: {trace.bodies()[0] - started}")
    with trace.lock:
        hooked = set(trace.hooked) - {"sentinel"}
        seen = {call_id: len(results) for call_id, results in trace.observed.items()}
    seen.pop("sentinel", None)
    if any(count != 1 for count in seen.values()):
        problems.append(f"observed more than once: {seen}")
    if hooked and set(seen) != set(ids(3)):
        problems.append(f"calls never observed: {sorted(set(ids(3)) - set(seen))}")
    if "in_flight=0" not in repr(registry):
        problems.append(f"in-flight count leaked ({registry!r}): close() would wait forever")
        return _Injection(True, where, problems)
    try:
        registry.close()
    except RuntimeError as exc:
        problems.append(f"close() refused: {exc}")
        Caller(registry.close).join()
    return _Injection(True, where, problems)


@pytest.mark.xfail(
    strict=True,
    reason="KNOWN LIMIT: a KeyboardInterrupt *raised* (here injected by a trace function; in "
    "life only by an application's own SIGINT handler) on the first or last lines of "
    "execute_batch, outside the scheduler's guarded loops, leaks the in-flight count. With "
    "Python's default handler a Ctrl-C is deferred for the whole batch and cannot land there",
)
def test_ctrl_c_landing_on_any_line_of_the_scheduler_still_drains_the_batch() -> None:
    batch_file = os.path.join(TOOLREG_DIR, "_batch.py")
    registry_file = os.path.join(TOOLREG_DIR, "_registry.py")
    failures: list[str] = []
    for point in itertools.count(1):
        injection = _batch_interrupted_at(point, (batch_file, registry_file))
        if not injection.reached:
            break
        failures.extend(f"{injection.where}: {problem}" for problem in injection.problems)
        assert point < 5_000, "the scheduler never finished a run without an interrupt"
    assert point > 20, "the trace function never reached the scheduler"
    assert failures == []


def test_ctrl_c_in_an_observer_of_an_unstarted_call_leaves_every_call_observed() -> None:
    source = CancelSource()
    source.cancel("turn over")
    seen: list[str] = []

    def observer(result: ToolResult[Any]) -> None:
        seen.append(result.call.call_id)
        if len(seen) == 1:
            raise KeyboardInterrupt

    with open_registry(max_workers=2) as registry:
        registry.tool(name="t")(lambda args, ctx: None)
        registry.on_result(observer)
        with pytest.raises(KeyboardInterrupt):
            registry.execute_batch(batch_of(["t"] * 3), token=source.token)
    assert seen == ids(3)


@pytest.mark.parametrize("exit_exc", [SystemExit, KeyboardInterrupt])
def test_an_interrupt_raised_by_a_hook_on_a_worker_is_still_observed_once(
    exit_exc: type[BaseException],
) -> None:
    def hook(call: ToolCall, token: object) -> Allow:
        if call.call_id == "c1":
            raise exit_exc
        return Allow()

    with open_registry(max_workers=2) as registry:
        trace = traced(registry)
        registry.add_pre_execute(hook)
        registry.tool(name="t")(lambda args, ctx: "ok")
        try:
            results: list[ToolResult[Any]] | None = registry.execute_batch(batch_of(["t"] * 3))
        except exit_exc:
            results = None
    with trace.lock:
        counts = {call_id: len(seen) for call_id, seen in trace.observed.items()}
    assert counts.get("c1") == 1, counts
    if results is not None:
        trace.seen_once(results)


@pytest.mark.parametrize("exit_exc", [SystemExit, KeyboardInterrupt])
def test_a_call_hook_raising_an_interrupt_for_an_unstarted_call_leaves_it_observed(
    exit_exc: type[BaseException],
) -> None:
    # docs/contract.md 7.2 and 7.4: the unstarted call is still observed, then the batch raises.
    def hook(call: ToolCall, token: object) -> None:
        if call.call_id == "c1":
            raise exit_exc("hook says stop")

    source = CancelSource()
    source.cancel("turn over")
    with open_registry(max_workers=2) as registry:
        trace = traced(registry)
        registry.add_call_hook(hook)
        registry.tool(name="t")(lambda args, ctx: "ok")
        with pytest.raises(exit_exc, match="hook says stop"):
            registry.execute_batch(batch_of(["t"] * 3), token=source.token)
        assert registry.wait_idle(0)
    with trace.lock:
        assert {call_id: len(seen) for call_id, seen in trace.observed.items()} == {
            call_id: 1 for call_id in ids(3)
        }
        assert all(seen[0].code == BEFORE for seen in trace.observed.values())
