"""What calls leave behind: nothing on a long-lived caller token, flat memory, DEBUG-only
logging with no handler added, and no lock a finalizer could deadlock on.

docs/contract.md 1.8 (listener hygiene), 4.9 (dispatch-scoped listeners are removed when the
body settles), B.17 (DEBUG logging) and A.4 (the GC and critical sections).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from _registry_helpers import (
    TRACED_FRAMES,
    Args,
    Caller,
    counting_tool,
    holds_nothing,
    open_registry,
    traced_ours,
)

import toolreg
from toolreg import (
    CancelSource,
    ToolContext,
)
from toolreg.aio import AsyncToolRegistry

MANY_CALLS = 100_000
TRACED_CALLS = 20_000


# It took about 40 s on this project's 2-core VM (2026-12-02): more room than the suite's 60 s
# before a slow machine reads as a hang.
@pytest.mark.timeout(180)
def test_long_lived_caller_token_holds_nothing_after_100000_calls_and_memory_is_flat() -> None:
    """100,000 calls on one caller token; memory traced over the last 20,000 of them."""
    with open_registry(max_workers=2) as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> int:
            n: int = args["n"]
            return n

        session = CancelSource()
        token = session.token
        untraced = MANY_CALLS - TRACED_CALLS
        for n in range(untraced):
            result = registry.execute("work", {"n": n}, token=token)
        assert result.value == untraced - 1
        assert holds_nothing(token)
        gc.collect()
        tracemalloc.start(TRACED_FRAMES)
        try:
            half = TRACED_CALLS // 2
            for n in range(half):
                registry.execute("work", {"n": n}, token=token)
            gc.collect()
            middle = traced_ours()
            for n in range(half):
                registry.execute("work", {"n": n}, token=token)
            gc.collect()
            end = traced_ours()
        finally:
            tracemalloc.stop()
        assert holds_nothing(token)
        # Per-call state would grow by hundreds of bytes per call: 10,000 calls -> megabytes.
        assert end - middle < 64 * 1024, f"grew {end - middle} bytes over {half} calls"


def test_concurrent_calls_leave_nothing_on_a_shared_caller_token() -> None:
    with open_registry(max_workers=4) as registry:
        counting_tool(registry)
        session = CancelSource()
        callers = [
            Caller(lambda: [registry.execute("work", token=session.token) for _ in range(300)])
            for _ in range(4)
        ]
        for caller in callers:
            assert all(result.ok for result in caller.join())
        assert holds_nothing(session.token)


def test_each_stage_is_logged_at_debug_and_nothing_below_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with toolreg.ToolRegistry(max_workers=1) as registry:
        registry.add_pre_execute(lambda call, token: None)
        registry.add_around(lambda dispatch, proceed: proceed())
        registry.add_post_execute(lambda result, token: None)
        registry.on_result(lambda result: None)
        registry.register(toolreg.Tool("t", lambda args, ctx: "ok"))
        with caplog.at_level(logging.INFO, logger="toolreg"):
            registry.execute(toolreg.ToolCall("t", call_id="quiet"))
        assert [r for r in caplog.records if "quiet" in r.getMessage()] == []
        with caplog.at_level(logging.DEBUG, logger="toolreg"):
            registry.execute(toolreg.ToolCall("t", call_id="loud"))
    stages = [
        r.getMessage().split(": ")[2].split(" ")[0]
        for r in caplog.records
        if "loud" in r.getMessage() and r.levelno == logging.DEBUG
    ]
    assert stages == [
        "pre_execute",
        "guards",
        "around",
        "dispatch",
        "body",
        "after_body",
        "post_execute",
        "observers",
    ]
    assert not logging.getLogger("toolreg").handlers  # the library adds no handlers


def test_a_finalizer_removing_a_hook_during_registration_does_not_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: hook and tool sets were rebuilt while holding the registry lock; a cyclic
    collection triggered by those allocations ran finalizers, and one that removed a
    registration took the same lock: a self-deadlock. Sets are now built outside the lock.
    The collection is forced exactly where the hook set is rebuilt."""
    registry = toolreg.ToolRegistry(max_workers=1)
    removed: list[bool] = []

    class Owner:
        def __init__(self) -> None:
            self.cycle = self
            self.registration = registry.add_guard(lambda call: None)

        def __del__(self) -> None:
            removed.append(self.registration.remove())

    rebuild = toolreg._hooks.HookSet.replace

    def rebuild_with_a_collection(*args: Any, **kwargs: Any) -> Any:
        gc.collect()  # what an allocation can trigger at any moment
        return rebuild(*args, **kwargs)

    def register() -> None:
        Owner()  # cyclic garbage whose finalizer needs the registry
        monkeypatch.setattr(toolreg._hooks.HookSet, "replace", rebuild_with_a_collection)
        registry.add_pre_execute(lambda call, token: None)

    worker = threading.Thread(target=register, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "deadlocked: a finalizer waited for the registry lock"
    monkeypatch.undo()
    assert removed == [True]
    registry.close()


def _left_for_the_cyclic_gc(run: Callable[[], object]) -> list[str]:
    """The toolreg objects that `run()` leaves in reference cycles: the names of their types."""
    run()  # first-use caches and threads are not what this looks for
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable stays in gc.garbage
    try:
        run()
        gc.collect()
        return sorted(
            type(item).__name__
            for item in gc.garbage
            if type(item).__module__.startswith("toolreg")
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _flushed(registry: toolreg.ToolRegistry, run: Callable[[], object]) -> Callable[[], None]:
    """`run()`, then a call on the registry's one worker: whatever ran there before has let go
    of everything (a batch runner's frame drops its references once it returns)."""

    def both() -> None:
        run()
        assert registry.execute("work").ok

    return both


@pytest.mark.parametrize("where", ["execute", "batch", "batch in a body", "awaited"])
def test_a_finished_call_or_batch_leaves_nothing_for_the_cyclic_gc(where: str) -> None:
    """Freed by reference counting alone once the caller lets go: a batch made a cycle with
    its runners (and with its Ctrl-C request on the main thread), so each batch's results and
    calls waited for a collection, and a benchmark with the cyclic GC off reused no memory."""
    calls = [toolreg.ToolCall("work", call_id=f"c{index}") for index in range(3)]
    with open_registry(max_workers=1) as registry:
        counting_tool(registry)

        @registry.tool
        def batch(args: Args, ctx: ToolContext) -> int:
            return len(registry.execute_batch(calls, max_parallel=1))

        runs: dict[str, Callable[[], object]] = {
            "execute": lambda: registry.execute("work"),
            "batch": lambda: registry.execute_batch(calls, max_parallel=1),
            "batch in a body": lambda: registry.execute("batch"),
            "awaited": lambda: asyncio.run(AsyncToolRegistry(registry).execute("work")),
        }
        assert _left_for_the_cyclic_gc(_flushed(registry, runs[where])) == []


def _import_frames(run: Callable[[], object]) -> list[str]:
    """The import-machinery frames a warm `run()` enters on this thread (a relative import
    statement inside a function enters `importlib._bootstrap` on every call, even when the
    module is loaded: about 0.8 us)."""
    run()  # loads whatever is loaded on first use
    entered: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            entered.append(frame.f_code.co_name)

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return entered


@pytest.mark.parametrize("where", ["execute", "execute, token", "batch", "awaited, token"])
def test_a_warm_call_or_batch_runs_no_import_statement(where: str) -> None:
    """Regression: `execute_batch` ran an import statement per batch twice over (loading
    `_batch`, and checking its token), each 0.8 us; the asyncio facade checked its token so."""
    calls = [toolreg.ToolCall("work", call_id="c")]
    never = toolreg.CancelToken.never()
    with open_registry(max_workers=1) as registry:
        counting_tool(registry)
        awaited = AsyncToolRegistry(registry)

        runs: dict[str, Callable[[], object]] = {
            "execute": lambda: registry.execute("work"),
            "execute, token": lambda: registry.execute("work", token=never),
            "batch": lambda: registry.execute_batch(calls, token=never),
        }
        if where == "awaited, token":
            loop = asyncio.new_event_loop()
            try:
                frames = _import_frames(
                    lambda: loop.run_until_complete(awaited.execute("work", token=never))
                )
            finally:
                loop.close()
        else:
            frames = _import_frames(runs[where])
        assert frames == []
