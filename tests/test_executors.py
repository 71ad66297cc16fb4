"""Threads and executors: where bodies run, which executors are accepted, and what joining means.

docs/contract.md 2.6 and B.4: bodies run on threads of this process (a process pool is refused);
A.1: the caller joins the body itself, never the executor's future, and never cancels that future.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pytest
from _registry_helpers import (
    BEFORE,
    WAIT,
    Args,
    Caller,
    Gate,
    open_registry,
    wait_until,
)

from toolreg import (
    CancelSource,
    ToolContext,
    ToolRegistry,
    WorkerPool,
)


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
        assert registry.execute("where").value.startswith("my-tools")


def test_given_thread_pool_runs_the_bodies_and_survives_close() -> None:
    pool = ThreadPoolExecutor(2, thread_name_prefix="given-pool")
    try:
        with ToolRegistry(executor=pool) as registry:
            registry.tool(name="where")(lambda args, ctx: threading.current_thread().name)
            assert registry.execute("where").value.startswith("given-pool")
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
    ran = threading.Event()

    class Item:
        def _run(self) -> None:
            ran.set()

        def _drop(self) -> None:
            pass

    pool._hand_over(Item(), may_block=False)
    shutdown = Caller(lambda: (pool.shutdown(wait=True), ran.is_set())[1], name="test-shutdown")
    wait_until(lambda: pool._shutdown, "shutdown() to begin")  # white-box
    go.set()
    assert shutdown.join() is True, "shutdown(wait=True) returned before the accepted work ran"
