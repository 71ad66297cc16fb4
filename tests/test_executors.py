"""Threads and executors: where bodies run, which executors are accepted, and what joining means.

docs/contract.md 2.6 and B.4: bodies run on threads of this process (a process pool is refused);
A.1: the caller joins the body itself, never the executor's future, and never cancels that future.
"""

from __future__ import annotations

import inspect
import logging
import os
import random
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import pytest
from _registry_helpers import (
    BEFORE,
    WAIT,
    Args,
    Caller,
    Gate,
    holds_nothing,
    open_registry,
    wait_until,
)

from toolreg import (
    CancelSource,
    ErrorCode,
    TimeoutPolicy,
    ToolCall,
    ToolContext,
    ToolRegistry,
    WorkerPool,
    _wake,
)


@pytest.fixture(autouse=True, params=["eventfd", "lock"])
def wake_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs with workers sleeping on an eventfd, and on a lock (the kind used
    where `os.eventfd` is missing)."""
    kind: str = request.param
    if kind == "eventfd" and not hasattr(os, "eventfd"):
        pytest.skip("no os.eventfd here")
    monkeypatch.setattr(_wake, "_EVENTFD", kind == "eventfd")
    return kind


def test_body_runs_on_a_pool_thread_named_toolreg_and_the_caller_joins(
    registry: ToolRegistry,
) -> None:
    threads: list[threading.Thread] = []
    registry.tool(name="where")(lambda args, ctx: threads.append(threading.current_thread()))
    registry.add_pre_execute(lambda call, token: threads.append(threading.current_thread()))
    registry.execute("where")
    caller_thread, body_thread = threads
    assert caller_thread is threading.current_thread()
    assert body_thread is not caller_thread
    assert body_thread.name.startswith("toolreg")


def test_thread_name_prefix_names_the_pool_threads() -> None:
    with open_registry(max_workers=1, thread_name_prefix="my-tools") as registry:
        registry.tool(name="where")(lambda args, ctx: threading.current_thread().name)
        name = registry.execute("where").value
        assert name is not None and name.startswith("my-tools")


def test_given_thread_pool_runs_the_bodies_and_survives_close() -> None:
    pool = ThreadPoolExecutor(2, thread_name_prefix="given-pool")
    try:
        with ToolRegistry(executor=pool) as registry:
            registry.tool(name="where")(lambda args, ctx: threading.current_thread().name)
            name = registry.execute("where").value
            assert name is not None and name.startswith("given-pool")
        assert registry.closed
        assert pool.submit(lambda: "still open").result(WAIT) == "still open"
    finally:
        pool.shutdown(wait=True)


class InlineExecutor(Executor):
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def test_process_pool_and_other_non_thread_executors_are_rejected_with_type_error() -> None:
    processes = ProcessPoolExecutor(max_workers=1)
    try:
        with pytest.raises(TypeError, match="ThreadPoolExecutor"):
            ToolRegistry(executor=processes)
    finally:
        processes.shutdown(wait=True)
    with pytest.raises(TypeError):
        ToolRegistry(executor=InlineExecutor())


class ClientExecutor(InlineExecutor):
    """Stands for `distributed.Client.get_executor()` (the check reads the type's module)."""

    __module__ = "distributed.cfexecutor"


def test_a_dask_client_executor_is_rejected_pointing_to_toolreg_distributed() -> None:
    # docs/contract.md 14.8: it reports a running body as cancelled and abandons it.
    with pytest.raises(TypeError, match=r"toolreg\.distributed\.DaskBackend"):
        ToolRegistry(executor=ClientExecutor())


class RecordingPool(ThreadPoolExecutor):
    """Hands the registry futures that record `cancel()` and report 'done' at once."""

    def __init__(self) -> None:
        super().__init__(1, thread_name_prefix="recording-pool")
        self.cancel_calls = 0
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        super().submit(fn, *args, **kwargs)
        self.submitted += 1
        pool = self

        class LyingFuture(Future):  # type: ignore[type-arg]
            def cancel(self) -> bool:
                pool.cancel_calls += 1
                return super().cancel()

        lie: Future[Any] = LyingFuture()
        lie.set_result(None)  # claims the work finished before it even started
        return lie


def test_joining_waits_for_the_body_never_for_the_future_and_never_cancels_it() -> None:
    pool = RecordingPool()
    gate = Gate()
    try:
        with ToolRegistry(executor=pool) as registry:

            @registry.tool
            def slow(args: Args, ctx: ToolContext) -> str:
                gate.hold()
                return "done"

            blocker = Caller(lambda: registry.execute("slow"))
            gate.wait_reached()
            caller = CancelSource()
            queued = Caller(lambda: registry.execute("slow", token=caller.token))
            wait_until(lambda: pool.submitted == 2, "the second body to be queued")
            assert blocker.still_blocked()  # its future says done; the body is not
            caller.cancel("stop")
            assert queued.join().code == BEFORE
            gate.release()
            assert blocker.join().ok
        assert pool.cancel_calls == 0
    finally:
        pool.shutdown(wait=True)


# -- WorkerPool as a concurrent.futures.Executor -----------------------------------------------


class RunRecorder:
    """A pool work item that notes it ran."""

    def __init__(self) -> None:
        self.ran = threading.Event()

    def _run(self) -> None:
        self.ran.set()

    def _drop(self) -> None:
        pass


def _line_of(function: Any, text: str) -> int:
    """The line number of the first line of `function` that contains `text`."""
    lines, first = inspect.getsourcelines(function)
    return first + next(n for n, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("where", ["after the pop", "before a deferred wake-up"])
def test_a_hand_off_interrupted_halfway_leaves_no_worker_asleep_for_ever(
    wake_kind: str, where: str
) -> None:
    # A signal handler's exception lands in a hand-off after it took the only idle worker out
    # of the idle list and before it woke it. The hand-off wakes the workers it may have left
    # out (`_rescue`): the worker runs the item if it was given one, and takes new work after.
    if where == "before a deferred wake-up" and wake_kind == "lock":
        pytest.skip("a lock wake-up is made under the pool's lock, with the item")
    pool = WorkerPool(1, "test-interrupted-hand-off")
    assert pool.submit(lambda: None).result(WAIT) is None  # one worker, idle now
    if where == "after the pop":
        code, line = WorkerPool._place.__code__, _line_of(WorkerPool._place, "worker.item = item")
    else:
        code = WorkerPool._hand_over.__code__
        line = _line_of(WorkerPool._hand_over, "wake.release_deferred(goes_on)")
    item = RunRecorder()

    def interrupt(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is code:
            if event == "line" and frame.f_lineno == line:
                sys.settrace(None)
                raise KeyboardInterrupt  # as a signal handler would, on this very line
            return interrupt
        entering = event == "call" and frame.f_code is WorkerPool._hand_over.__code__
        return interrupt if entering else None

    try:
        sys.settrace(interrupt)
        with pytest.raises(KeyboardInterrupt):
            pool._hand_over(item)
        sys.settrace(None)
        if where == "before a deferred wake-up":
            assert item.ran.wait(WAIT), "the worker given the item was never woken"
        assert pool.submit(lambda: "next").result(WAIT) == "next"
    finally:
        sys.settrace(None)
        pool.shutdown(wait=True)


def test_worker_pool_shutdown_leaves_no_descriptor_open_even_if_a_traceback_keeps_a_worker(
    wake_kind: str,
) -> None:
    # Each worker's eventfd is closed as its thread leaves, not when the last reference to the
    # worker goes: here a failure's traceback (whose frames reach the worker's loop) outlives
    # the pool, as a result holding the exception would.
    fds_before = len(os.listdir("/proc/self/fd"))
    pool = WorkerPool(4, "test-descriptors")
    barrier = threading.Barrier(5)

    def fail() -> None:
        barrier.wait(WAIT)  # four at once: four threads
        raise ValueError("kept")

    futures = [pool.submit(fail) for _ in range(4)]
    barrier.wait(WAIT)
    errors = [future.exception(WAIT) for future in futures]
    assert all(isinstance(error, ValueError) for error in errors)
    assert pool._count == 4  # white-box: four threads, each with its wake-up
    pool.shutdown(wait=True)
    assert len(os.listdir("/proc/self/fd")) == fds_before
    assert all(error.__traceback__ is not None for error in errors if error is not None)


def test_worker_pool_shutdown_waits_for_a_worker_whose_thread_is_not_started_yet() -> None:
    # A hand-off with may_block=False (an event loop's) counts a new worker in and leaves its
    # thread to the helper to start: shutdown(wait=True) returned before that work ran.
    pool = WorkerPool(1, "test-late-start")
    go = threading.Event()  # lets the helper start the worker's thread
    start_later = pool._start_later

    def held_start(worker: Any, thread: threading.Thread) -> None:
        assert go.wait(WAIT), "the test never let the worker start"
        start_later(worker, thread)

    pool._start_later = held_start  # type: ignore[method-assign]
    item = RunRecorder()

    pool._hand_over(item, may_block=False)

    def shut_down() -> bool:
        pool.shutdown(wait=True)
        return item.ran.is_set()

    shutdown = Caller(shut_down, name="test-shutdown")
    wait_until(lambda: pool._shutdown, "shutdown() to begin")  # white-box
    go.set()
    assert shutdown.join() is True, "shutdown(wait=True) returned before the accepted work ran"


def test_a_worker_pool_passed_in_runs_the_bodies_and_survives_close() -> None:
    pool = WorkerPool(2, "given-workers")
    try:
        with ToolRegistry(executor=pool) as registry:
            registry.tool(name="where")(lambda args, ctx: threading.current_thread().name)
            name = registry.execute("where").value
            assert name is not None and name.startswith("given-workers-")
        assert registry.closed
        assert pool.submit(lambda: "still open").result(WAIT) == "still open"
    finally:
        pool.shutdown(wait=True)


def test_worker_pool_submit_and_map_behave_like_an_executor() -> None:
    with WorkerPool(max_workers=2) as pool:
        assert isinstance(pool, Executor) and pool.max_workers == 2
        assert pool.submit(pow, 2, 10).result(WAIT) == 1024
        assert pool.submit(lambda *, key: key, key="kw").result(WAIT) == "kw"
        failing = pool.submit(int, "not a number")
        with pytest.raises(ValueError):
            failing.result(WAIT)
        squares = pool.map(lambda x: x * x, range(10), timeout=WAIT)
        assert list(squares) == [x * x for x in range(10)]


def test_worker_pool_shutdown_runs_queued_work_then_refuses_more() -> None:
    pool = WorkerPool(1, "test-shutdown")
    gate = Gate()
    running = pool.submit(gate.hold)
    gate.wait_reached()
    queued = pool.submit(lambda: "queued ran")
    shutdown = Caller(lambda: pool.shutdown(wait=True))
    assert shutdown.still_blocked()  # a check: it waits for the work it accepted
    gate.release()
    shutdown.join()
    assert running.done() and queued.result(0) == "queued ran"  # done before shutdown returned
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
    pool.shutdown(wait=True)  # idempotent


def test_worker_pool_shutdown_with_cancel_futures_cancels_the_queued_work() -> None:
    pool = WorkerPool(1, "test-cancel-futures")
    gate = Gate()
    running = pool.submit(gate.hold)
    gate.wait_reached()
    queued = pool.submit(lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    gate.release()
    assert running.result(WAIT) is None
    pool.shutdown(wait=True)


class TimingOutWake:
    """A worker's lock wake-up whose sleeps pause on events; the first one then times out.

    It lets a test put a hand-off exactly where an idle worker's timed wait ends without one.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.deferred = inner.deferred
        self.sleeps = 0
        self.asleep = [threading.Event(), threading.Event()]
        self.go_on = [threading.Event(), threading.Event()]

    def sleep(self) -> bool:
        n = self.sleeps
        self.sleeps += 1
        if n < 2:
            self.asleep[n].set()
            assert self.go_on[n].wait(WAIT)
            if n == 0:
                return False  # the idle check's timeout, though a hand-off came meanwhile
        return bool(self.inner.sleep())

    def waking(self) -> bool:  # a hand-off asks whether the worker has woken yet
        return bool(self.inner.waking())

    def __getattr__(self, name: str) -> Any:  # the rest as the real wake-up does it
        return getattr(self.inner, name)


def test_a_hand_off_as_an_idle_workers_wait_times_out_leaves_its_wake_lock_usable(
    wake_kind: str,
) -> None:
    # The hand-off released the wake lock of a worker whose wait had just timed out: the worker
    # finds the item anyway and must take that release back, or the next hand-off, made once it
    # is idle again, would release an unlocked lock (RuntimeError in the caller). (Only a lock
    # wake-up times out; an eventfd one is driven through the same steps.)
    pool = WorkerPool(1, "test-timed-out-wake")
    wake: list[TimingOutWake] = []

    def swap() -> None:
        slot = pool._threads[threading.get_ident()]
        wake.append(TimingOutWake(slot.wake))
        slot.wake = wake[0]  # type: ignore[assignment]

    try:
        pool.submit(swap).result(WAIT)
        wake_lock = wake[0]
        assert wake_lock.asleep[0].wait(WAIT)  # idle, in the wait that will time out
        second = pool.submit(lambda: "second")  # handed over to that worker
        wake_lock.go_on[0].set()
        assert second.result(WAIT) == "second"
        assert wake_lock.asleep[1].wait(WAIT)  # idle again, about to sleep
        third = pool.submit(lambda: "third")
        wake_lock.go_on[1].set()
        assert third.result(WAIT) == "third"
    finally:
        for event in wake[0].go_on if wake else []:
            event.set()
        pool.shutdown(wait=True)


class HeldWake:
    """A worker's wake-up whose first sleep holds on `go_on` before it sleeps for real: a
    hand-off wakes it, and the worker has not woken yet (`waking()` is True).
    `waking_answers` scripts what `waking()` says first (then it tells the truth)."""

    def __init__(self, inner: Any, waking_answers: tuple[bool, ...] = ()) -> None:
        self.inner = inner
        self.deferred = inner.deferred
        self.held = False
        self.sleeping, self.go_on = threading.Event(), threading.Event()
        self.waking_answers = list(waking_answers)

    def sleep(self) -> bool:
        if not self.held:
            self.held = True
            self.sleeping.set()
            self.go_on.wait(5 * WAIT)  # past any failing wait in the test, within its timeout
        return bool(self.inner.sleep())

    def waking(self) -> bool:
        if self.waking_answers:
            return self.waking_answers.pop(0)
        return bool(self.inner.waking())

    def __getattr__(self, name: str) -> Any:  # the rest as the real wake-up does it
        return getattr(self.inner, name)


def pool_with_a_held_wake(waking_answers: tuple[bool, ...] = ()) -> tuple[WorkerPool, HeldWake]:
    """A pool of two idle workers; the one handed the next item wakes only on `go_on`."""
    pool = WorkerPool(2, "test-held-wake")
    barrier = threading.Barrier(3)
    started = [pool.submit(barrier.wait, WAIT) for _ in range(2)]  # two threads, both started
    barrier.wait(WAIT)
    for future in started:
        future.result(WAIT)
    held: list[HeldWake] = []

    def swap() -> None:  # on the worker itself, before it sleeps again (LIFO: it is next)
        slot = pool._threads[threading.get_ident()]
        held.append(HeldWake(slot.wake, waking_answers))
        slot.wake = held[0]  # type: ignore[assignment]

    pool.submit(swap).result(WAIT)
    assert held[0].sleeping.wait(WAIT)  # idle, in the wait it will be woken from
    return pool, held[0]


def test_a_hand_off_whose_caller_goes_on_still_wakes_an_idle_worker() -> None:
    # `goes_on=True` (an event loop with more to run) wakes the worker without giving up the
    # GIL; it must wake it all the same, whichever kind of wake-up it sleeps on.
    pool = WorkerPool(1)
    try:
        assert pool.submit(lambda: "warm").result(WAIT) == "warm"  # one worker, now idle
        wait_until(lambda: len(pool._idle) == 1, "the worker asleep")
        item = RunRecorder()
        assert pool._hand_over(item, goes_on=True) is True  # an idle worker took it
        assert item.ran.wait(WAIT), "the worker woken with goes_on=True never ran the item"
    finally:
        pool.shutdown(wait=True)


def test_the_gil_keeping_eventfd_write_is_libcs_and_wakes_a_reader() -> None:
    if not hasattr(os, "eventfd"):
        pytest.skip("no os.eventfd here")
    write = _wake._write_keeping_gil()
    # os.eventfd_write gives the GIL up; the fallback is only for a libc without eventfd_write.
    assert write is not os.eventfd_write
    fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    try:
        write(fd, 1)
        write(fd, 2)
        assert os.eventfd_read(fd) == 3
    finally:
        os.close(fd)


def test_an_item_queued_behind_a_worker_that_has_not_woken_yet_waits_for_no_body() -> None:
    # Handed over while the previous hand-off's worker has not woken, an item waits in the
    # backlog: that worker passes it on as it wakes, before running its own item, which here
    # blocks. Without the pass-on the second item would wait behind that body.
    pool, wake = pool_with_a_held_wake()
    release = threading.Event()
    try:
        first = pool.submit(release.wait, WAIT)
        second = pool.submit(lambda: "second")
        assert list(pool._backlog) != []  # white-box: queued behind the worker not yet awake
        wake.go_on.set()
        assert second.result(WAIT) == "second"  # on the other worker,
        assert not first.done()  # while the first body still blocks
    finally:
        wake.go_on.set()
        release.set()
        pool.shutdown(wait=True)
    assert first.result(0) is True


def test_a_worker_that_wakes_as_an_item_is_queued_behind_it_does_not_strand_it() -> None:
    # The interleaving where the worker wakes between the hand-off's two looks:
    # not yet awake, then awake (it may have looked at the backlog before the item was in).
    # The hand-off takes the item back and wakes another worker: it runs though the first
    # worker here never wakes until the end.
    # The looks: the first hand-off finds the worker that ran `swap` awake (so handed on to it
    # anew), the second finds it not awake, queues, then finds it awake.
    pool, wake = pool_with_a_held_wake(waking_answers=(False, True, False))
    try:
        first = pool.submit(lambda: "first")
        second = pool.submit(lambda: "second")  # not awake, queued; then awake: taken back
        assert list(pool._backlog) == []  # white-box: not left behind the first worker
        assert second.result(WAIT) == "second"
        assert not first.done()  # its worker is still held before waking
    finally:
        wake.go_on.set()
        pool.shutdown(wait=True)
    assert first.result(0) == "first"


def pool_with_a_busy_and_a_held_worker(
    max_workers: int, gate: threading.Event
) -> tuple[WorkerPool, HeldWake, Future[bool]]:
    """Two workers of `max_workers`: one runs `gate.wait`, the other is handed the next item and
    wakes only on `go_on`, so items handed over after that one queue behind it."""
    pool = WorkerPool(max_workers, "test-busy-and-held")
    barrier = threading.Barrier(3)
    started = [pool.submit(barrier.wait, WAIT) for _ in range(2)]  # two threads, both started
    barrier.wait(WAIT)
    for future in started:
        future.result(WAIT)
    busy = pool.submit(gate.wait, WAIT)
    held: list[HeldWake] = []

    def swap() -> None:  # on the other worker, before it sleeps again (LIFO: it is next)
        slot = pool._threads[threading.get_ident()]
        held.append(HeldWake(slot.wake))
        slot.wake = held[0]  # type: ignore[assignment]

    pool.submit(swap).result(WAIT)
    assert held[0].sleeping.wait(WAIT)
    return pool, held[0], busy


def test_a_worker_that_takes_a_queued_item_leaves_the_rest_to_the_one_waking() -> None:
    # A backlog queued behind a worker not yet awake is also drained by workers that free up,
    # without passing anything on: the worker waking passes the next item on once awake. So a
    # quick item waits behind that wake-up, never behind the blocker a busy worker took first.
    # (A pass-on from every worker that takes a queued item woke a worker per call with eight
    # callers on another CPU: 1.6x a ThreadPoolExecutor's wall time, against 1.0x.)
    gate, release = threading.Event(), threading.Event()
    blocking = threading.Event()

    def blocker_body() -> bool:
        blocking.set()
        return release.wait(WAIT)

    pool, wake, busy = pool_with_a_busy_and_a_held_worker(3, gate)
    try:
        own = pool.submit(lambda: "own")  # to the held worker
        blocker = pool.submit(blocker_body)  # queued behind it
        quick = pool.submit(lambda: "quick")  # queued behind it
        assert len(pool._backlog) == 2  # white-box
        gate.set()  # the busy worker frees up and takes the blocker from the backlog
        assert busy.result(WAIT) is True
        assert blocking.wait(WAIT)
        assert list(pool._backlog) != []  # white-box: quick still queued, passed on to nobody
        with pytest.raises(FutureTimeout):
            quick.result(0.05)  # bounded negative check: a correct pool always passes it
        wake.go_on.set()  # the held worker wakes, passes quick on, runs its own
        assert quick.result(WAIT) == "quick"  # while the blocker still blocks
        assert own.result(WAIT) == "own"
        assert not blocker.done()
    finally:
        gate.set()
        wake.go_on.set()
        release.set()
        pool.shutdown(wait=True)
    assert blocker.result(0) is True


def test_a_worker_started_to_take_a_queued_item_passes_the_next_one_on_first() -> None:
    # The held worker wakes with two items queued behind it and no idle worker: it starts a
    # thread for the first, a blocker; that thread passes the second on before it runs it.
    gate, release = threading.Event(), threading.Event()
    pool, wake, busy = pool_with_a_busy_and_a_held_worker(4, gate)
    try:
        own = pool.submit(release.wait, WAIT)  # to the held worker: it blocks once awake
        blocker = pool.submit(release.wait, WAIT)  # queued behind it
        quick = pool.submit(lambda: "quick")  # queued behind it
        assert len(pool._backlog) == 2  # white-box
        wake.go_on.set()
        assert quick.result(WAIT) == "quick"  # while all three other bodies block
        assert not (busy.done() or own.done() or blocker.done())
    finally:
        wake.go_on.set()
        gate.set()
        release.set()
        pool.shutdown(wait=True)
    assert own.result(0) is True and blocker.result(0) is True


class FailingWake:
    """A wake-up whose next sleep raises: the pool's own code failing on a worker."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def sleep(self) -> bool:
        raise MemoryError("in the worker's sleep")

    def __getattr__(self, name: str) -> Any:  # the rest as the real wake-up does it
        return getattr(self.inner, name)


def test_a_worker_that_fails_outside_a_body_is_counted_out_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = WorkerPool(2, "test-failing-wake")

    def swap() -> None:  # on the worker: its next sleep raises
        slot = pool._threads[threading.get_ident()]
        slot.wake = FailingWake(slot.wake)  # type: ignore[assignment]

    try:
        with caplog.at_level(logging.ERROR, logger="toolreg"):
            pool.submit(swap).result(WAIT)
            wait_until(lambda: pool._count == 0, "the failed worker counted out")
        assert "test-failing-wake-1 stopped on an error" in caplog.text
        assert pool.submit(lambda: "after").result(WAIT) == "after"  # on a new thread
        assert pool._idle and all(w.thread is not None for w in pool._idle)
    finally:
        pool.shutdown(wait=True)  # does not wait for the worker that is gone


@pytest.mark.parametrize("seed", range(5))
def test_worker_pool_stress_no_quick_item_waits_behind_a_blocked_body(seed: int) -> None:
    # 8 threads hand over 200 quick items each, and 4 items that block until the end at random
    # moments among them: with workers to spare, every quick item completes while the
    # blockers still block, however hand-offs, wake-ups and pass-ons interleave.
    rng = random.Random(seed)
    release = threading.Event()
    blockers_at = {(rng.randrange(8), rng.randrange(200)) for _ in range(4)}
    quick: list[Future[int]] = []
    blocked: list[Future[bool]] = []
    start = threading.Barrier(8)
    pool = WorkerPool(16, "test-stress-pool")

    def submitter(thread: int) -> None:
        start.wait(WAIT)
        for n in range(200):
            if (thread, n) in blockers_at:
                blocked.append(pool.submit(release.wait, WAIT))
            quick.append(pool.submit(int, n))  # list.append: atomic

    try:
        threads = [threading.Thread(target=submitter, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert [future.result(WAIT) for future in quick]  # all done, blockers still held
        assert len(quick) == 1600 and not any(future.done() for future in blocked)
    finally:
        release.set()
        pool.shutdown(wait=True)
    assert all(future.result(0) is True for future in blocked)
    assert list(pool._backlog) == []  # white-box: nothing stranded


def test_worker_pool_threads_are_daemons_named_prefix_dash_number() -> None:
    barrier = threading.Barrier(3)  # both workers at once, so the pool starts two threads

    def meet() -> threading.Thread:
        barrier.wait(WAIT)
        return threading.current_thread()

    with WorkerPool(2, "named") as pool:
        futures = [pool.submit(meet) for _ in range(2)]
        barrier.wait(WAIT)
        threads = [future.result(WAIT) for future in futures]
    assert sorted(thread.name for thread in threads) == ["named-1", "named-2"]
    assert all(thread.daemon for thread in threads)


@pytest.mark.parametrize("workers", [0, -1])
def test_worker_pool_and_registry_refuse_max_workers_below_one(workers: int) -> None:
    with pytest.raises(ValueError, match="max_workers"):
        WorkerPool(workers)
    with pytest.raises(ValueError, match="max_workers"):
        ToolRegistry(max_workers=workers)


def test_max_workers_and_executor_together_are_a_type_error() -> None:
    pool = WorkerPool(1)
    try:
        with pytest.raises(TypeError, match="not both"):
            ToolRegistry(max_workers=2, executor=pool)
    finally:
        pool.shutdown(wait=True)


def _shut_down_executor(kind: str) -> Executor:
    executor: Executor = WorkerPool(2) if kind == "WorkerPool" else ThreadPoolExecutor(2)
    executor.shutdown(wait=True)
    return executor


@pytest.mark.parametrize("kind", ["WorkerPool", "ThreadPoolExecutor"])
def test_a_sync_call_on_an_executor_its_owner_shut_down_is_a_tool_error(kind: str) -> None:
    # docs/contract.md 17.7: "a sync call is a TOOL_ERROR ("the executor refused the body")".
    ran: list[str] = []
    with ToolRegistry(executor=_shut_down_executor(kind)) as registry:
        registry.tool(name="t")(lambda args, ctx: ran.append("body"))
        result = registry.execute("t")
    assert result.code == ErrorCode.TOOL_ERROR and not result.dispatched
    assert result.error is not None and "the executor refused the body" in result.error.message
    assert ran == []


class _CancelsThenRefuses(ThreadPoolExecutor):
    """An executor whose owner shuts it down just as the caller cancels: `submit` first runs
    `cancel()` (the caller's cancellation, landing while the body is handed over), then refuses."""

    def __init__(self, cancel: Callable[[], object]) -> None:
        super().__init__(1)
        self.cancel = cancel

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.cancel()
        raise RuntimeError("cannot schedule new futures after shutdown")


@pytest.mark.parametrize("deadline", [False, True])
def test_a_body_the_caller_cancelled_while_the_executor_refused_it_never_started(
    deadline: bool,
) -> None:
    # docs/contract.md A.1: a call cancelled by the time the executor refuses its body is
    # ABORTED_BEFORE_DISPATCH, whether the cancellation's listener claimed the body first (a
    # deadline's body token is listened to before the hand-off) or the refusal found the call
    # cancelled (the call's own token, listened to after it). Nothing is raised or left behind.
    caller = CancelSource()
    executor = _CancelsThenRefuses(lambda: caller.cancel("stop"))
    ran: list[str] = []
    try:
        with ToolRegistry(executor=executor) as registry:
            registry.tool(name="t", timeout=30 if deadline else None)(
                lambda args, ctx: ran.append("body")
            )
            if deadline:
                registry.add_around(TimeoutPolicy())
            result = registry.execute("t", token=caller.token)
    finally:
        executor.shutdown(wait=True)
    assert result.code == BEFORE and not result.dispatched and ran == []
    assert holds_nothing(caller.token)


@pytest.mark.parametrize("kind", ["WorkerPool", "ThreadPoolExecutor"])
def test_a_batch_on_an_executor_its_owner_shut_down_is_cancelled(kind: str) -> None:
    # docs/contract.md 17.7 and 7.8: the batch is cancelled; unstarted calls are
    # ABORTED_BEFORE_DISPATCH, observed like any other.
    ran: list[str] = []
    observed: list[str] = []
    with ToolRegistry(executor=_shut_down_executor(kind)) as registry:
        registry.tool(name="t", concurrency_safe=True)(lambda args, ctx: ran.append("body"))
        registry.on_result(lambda result: observed.append(result.call.call_id))
        calls = [ToolCall("t", {}, f"c{index}") for index in range(3)]
        results = registry.execute_batch(calls)
        assert registry.wait_idle(0)
    assert [result.code for result in results] == [BEFORE] * 3
    assert sorted(observed) == ["c0", "c1", "c2"] and ran == []
