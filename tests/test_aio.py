"""Tests for toolreg.aio: the asyncio facade, and `async def` tool bodies.

The facade must give the sync registry's results, never block the event loop, never deadlock on
a busy pool, and turn task cancellation (`Task.cancel()`, `asyncio.timeout`, `wait_for`, anyio
cancel scopes) into the call's cancellation: cancel the call's token (never the caller's), wait
until the call has settled, then raise.

Async tests are plain functions that drive `asyncio.run` (or `anyio.run`): no pytest plugin.
Threads are ordered with `threading.Event`s (a coroutine waits for a worker-side event with
`await asyncio.to_thread(event.wait, WAIT)`); bodies sleep only to play slow or uncooperative
work, never to order threads. Every wait is bounded by `WAIT`.

The regression tests at the end pin bugs these tests found (since fixed); each docstring quotes
the contract sentence at stake. Deadlocks run in a child process that reports "hung" instead of
hanging the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import gc
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import anyio
import pytest
from _adapter_helpers import still_pending
from _registry_helpers import (
    ABORTED,
    BEFORE,
    WAIT,
    Caller,
    Gate,
    Journal,
    gc_paused,
    holds_nothing,
    occupy,
    open_registry,
    wait_until,
)

from toolreg import (
    CancelSource,
    CancelToken,
    ErrorCode,
    ExecutorRefusedError,
    RegistryClosedError,
    Tool,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
)
from toolreg._pool import WorkerPool
from toolreg.aio import AsyncToolRegistry

# -- helpers ----------------------------------------------------------------------------------


class Ticker:
    """Measures how long the event loop goes without running a 1 ms ticker coroutine.

    The cyclic GC is off while it ticks (`gc_paused`): a full collection late in the suite
    stops every thread for 200-600 ms, which says nothing about what the loop was made to
    wait for.
    """

    def __init__(self) -> None:
        self.gaps: list[float] = []
        self._stop = False
        self._task: asyncio.Task[None] | None = None
        self._gc = contextlib.ExitStack()

    async def _tick(self) -> None:
        last = time.perf_counter()
        while not self._stop:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.gaps.append(now - last)
            last = now

    async def __aenter__(self) -> Ticker:
        self._gc.enter_context(gc_paused())
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0.005)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._stop = True
        try:
            assert self._task is not None
            await self._task
        finally:
            self._gc.close()

    @property
    def worst(self) -> float:
        return max(self.gaps)


class RecordingExecutor(ThreadPoolExecutor):
    """A pool that keeps every exception escaping a submitted callable (a future would hide it)."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers, thread_name_prefix="toolreg-recording")
        self.escaped: list[BaseException] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(self._keep_exception)
        return future

    def _keep_exception(self, future: Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.escaped.append(future.exception())  # type: ignore[arg-type]


def cancelled_token(reason: str = "user pressed stop") -> CancelToken:
    source = CancelSource()
    source.cancel(reason)
    return source.token


async def wait_event(event: threading.Event) -> None:
    """Wait, off the event loop, for a worker-side event."""
    assert await asyncio.to_thread(event.wait, WAIT), "the worker never reached the event"


async def until(condition: Callable[[], bool], what: str, pause: float = 0.0) -> None:
    """Yield to the loop (for `pause` seconds each time) until `condition()` holds."""
    give_up = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < give_up, f"never happened: {what}"
        await asyncio.sleep(pause)


# Python 3.10 has no `asyncio.timeout` and no `Task.cancelling()`; the facade's contract holds on
# every version, so these tests use the version's own spelling of the same behaviour. On 3.10,
# `asyncio.TimeoutError` is not the builtin `TimeoutError` (it is from 3.11 on): catch the former.


class TaskCancellingTimeout:
    """`asyncio.timeout` for 3.10: expiry cancels the task that entered the scope, and leaving
    the scope turns that cancellation into `asyncio.TimeoutError` (as `async_timeout` does).

    3.10 counts no cancellations, so one arriving from outside while the scope's own is pending
    folds into it, as under any 3.10 timeout.
    """

    def __init__(self, delay: float | None) -> None:
        self._delay = delay
        self._handle: asyncio.TimerHandle | None = None
        self._expired = False

    async def __aenter__(self) -> TaskCancellingTimeout:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self.reschedule(None if self._delay is None else self._loop.time() + self._delay)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self.reschedule(None)
        if self._expired and exc_type is asyncio.CancelledError:
            raise asyncio.TimeoutError

    def reschedule(self, when: float | None) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None if when is None else self._loop.call_at(when, self._expire)

    def expired(self) -> bool:
        return self._expired

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()


timeout_scope: Callable[[float | None], Any]
if sys.version_info >= (3, 11):
    timeout_scope = asyncio.timeout
else:
    timeout_scope = TaskCancellingTimeout


async def no_cancellation_left(task: asyncio.Task[Any]) -> None:
    """Assert that nothing will cancel `task` any more: on 3.11+ its count of requested
    cancellations is back to 0 (`asyncio.timeout` relies on it); on every version its next
    await goes through."""
    if sys.version_info >= (3, 11):
        assert task.cancelling() == 0
    await asyncio.sleep(0)


def run_with_anyio(fn: Callable[[], Awaitable[Any]]) -> Any:
    return anyio.run(fn, backend="asyncio")


@pytest.fixture(params=["anyio-imported", "asyncio-only"])
def anyio_loaded(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The facade takes another wait path when anyio is imported: run both."""
    if request.param == "asyncio-only":
        monkeypatch.delitem(sys.modules, "anyio")
        return False
    return True


# -- same results as the sync API ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One call, set up on a fresh registry, whose outcome must not depend on sync vs await."""

    name: str
    setup: Callable[[ToolRegistry, Journal], None]
    call: ToolCall
    code: ErrorCode | None
    dispatched: bool
    token: Callable[[], CancelToken | None] = lambda: None
    start_if_cancelled: bool = True


def _echo_tools(registry: ToolRegistry, journal: Journal) -> None:
    @registry.tool(parameters={"type": "object", "properties": {"q": {"type": "string"}}})
    def echo(args: Any, ctx: Any) -> Any:
        journal(("body", ctx.token.cancelled))
        ctx.defer_context({"note": "echoed"})
        return {"echo": dict(args)}

    @registry.tool
    def broken(args: Any, ctx: Any) -> Any:
        journal(("body", ctx.token.cancelled))
        raise ValueError("the index is gone")

    @registry.tool
    def cleanup(args: Any, ctx: Any) -> Any:
        journal(("body", ctx.token.cancelled))
        ctx.defer_context("released the lock")
        if ctx.token.cancelled:
            return "cleaned up after cancellation"
        return "ran"

    @registry.tool
    def gives_up(args: Any, ctx: Any) -> Any:
        journal(("body", ctx.token.cancelled))
        ctx.token.raise_if_cancelled()
        return "ran"

    registry.add_pre_execute(lambda call, token: journal(("pre", call.name)))
    registry.add_guard(lambda call: journal(("guard", call.name)))
    registry.on_result(lambda result: journal(("observer", result.code)))


def _with_denying_guard(registry: ToolRegistry, journal: Journal) -> None:
    _echo_tools(registry, journal)
    registry.add_guard(lambda call: "echo is off limits" if call.name == "echo" else None)


def _with_failing_post_hook(registry: ToolRegistry, journal: Journal) -> None:
    _echo_tools(registry, journal)

    def reject(result: ToolResult[Any], token: CancelToken) -> ToolResult[Any] | None:
        journal(("post", result.code))
        if result.ok:
            return ToolResult.failure(
                result.call, ErrorCode.TOOL_ERROR, "the post hook rejected it", result.contexts
            )
        return None

    registry.add_post_execute(reject)


SCENARIOS = [
    Scenario("success", _echo_tools, ToolCall("echo", {"q": "x"}, "c1"), None, True),
    Scenario(
        "invalid-args-schema",
        _echo_tools,
        ToolCall("echo", {"q": 1}, "c1"),
        ErrorCode.INVALID_ARGS,
        False,
    ),
    Scenario(
        "invalid-args-not-json",
        _echo_tools,
        ToolCall("echo", {"q": {1, 2}}, "c1"),
        ErrorCode.INVALID_ARGS,
        False,
    ),
    Scenario(
        "unknown-tool", _echo_tools, ToolCall("nope", {}, "c1"), ErrorCode.UNKNOWN_TOOL, False
    ),
    Scenario(
        "denied-by-guard",
        _with_denying_guard,
        ToolCall("echo", {"q": "x"}, "c1"),
        ErrorCode.DENIED,
        False,
    ),
    Scenario("tool-error", _echo_tools, ToolCall("broken", {}, "c1"), ErrorCode.TOOL_ERROR, True),
    Scenario(
        "pre-cancelled-start",
        _echo_tools,
        ToolCall("cleanup", {}, "c1"),
        None,
        True,
        token=cancelled_token,
        start_if_cancelled=True,
    ),
    Scenario(
        "pre-cancelled-body-gives-up",
        _echo_tools,
        ToolCall("gives_up", {}, "c1"),
        ABORTED,
        True,
        token=cancelled_token,
        start_if_cancelled=True,
    ),
    Scenario(
        "pre-cancelled-no-start",
        _echo_tools,
        ToolCall("cleanup", {}, "c1"),
        BEFORE,
        False,
        token=cancelled_token,
        start_if_cancelled=False,
    ),
    Scenario(
        "post-hook-fails-success",
        _with_failing_post_hook,
        ToolCall("echo", {"q": "x"}, "c1"),
        ErrorCode.TOOL_ERROR,
        True,
    ),
]


@pytest.fixture(params=SCENARIOS, ids=[scenario.name for scenario in SCENARIOS])
def scenario(request: pytest.FixtureRequest) -> Scenario:
    return request.param  # type: ignore[no-any-return]


def _outcome(scenario: Scenario, awaited: bool) -> tuple[Any, ...]:
    """Run the scenario on a fresh registry, sync or awaited; what a caller can observe."""
    journal = Journal()
    with open_registry(max_workers=2) as registry:
        scenario.setup(registry, journal)
        token = scenario.token()
        if awaited:
            areg = AsyncToolRegistry(registry)
            result = asyncio.run(
                areg.execute(
                    scenario.call, token=token, start_if_cancelled=scenario.start_if_cancelled
                )
            )
        else:
            result = registry.execute(
                scenario.call, token=token, start_if_cancelled=scenario.start_if_cancelled
            )
    return (
        result.call.name,
        result.call.call_id,
        result.call.arguments,
        result.ok,
        result.code,
        result.content,
        result.value,
        result.dispatched,
        result.contexts,
        tuple(journal.entries),
    )


def test_awaited_execute_gives_the_sync_result(scenario: Scenario) -> None:
    sync = _outcome(scenario, awaited=False)
    awaited = _outcome(scenario, awaited=True)
    assert awaited == sync
    code, dispatched = sync[4], sync[7]
    assert (code, dispatched) == (scenario.code, scenario.dispatched)


def test_awaited_batch_gives_the_sync_codes() -> None:
    calls = [
        ToolCall("echo", {"q": "a"}, "b1"),
        ToolCall("nope", {}, "b2"),
        ToolCall("echo", {"q": 1}, "b3"),
        ToolCall("broken", {}, "b4"),
        ToolCall("echo", {"q": "b"}, "b5"),
    ]

    def outcome(awaited: bool) -> list[tuple[Any, ...]]:
        with open_registry(max_workers=2) as registry:
            _echo_tools(registry, Journal())
            if awaited:
                results = asyncio.run(AsyncToolRegistry(registry).execute_batch(calls))
            else:
                results = registry.execute_batch(calls)
        return [(r.call.call_id, r.code, r.content, r.dispatched) for r in results]

    sync = outcome(awaited=False)
    assert outcome(awaited=True) == sync
    assert [code for _, code, _, _ in sync] == [
        None,
        ErrorCode.UNKNOWN_TOOL,
        ErrorCode.INVALID_ARGS,
        ErrorCode.TOOL_ERROR,
        None,
    ]


def test_hooks_and_bodies_see_the_awaiting_task_s_context_variables() -> None:
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    seen = Journal()
    with open_registry(max_workers=2) as registry:
        registry.add_pre_execute(lambda call, token: seen(("hook", request_id.get("-"))))

        @registry.tool
        def body(args: Any, ctx: Any) -> str:
            seen(("body", request_id.get("-")))
            return "ok"

        async def main() -> None:
            request_id.set("req-7")
            await AsyncToolRegistry(registry).execute("body")

        asyncio.run(main())
    assert seen.entries == [("hook", "req-7"), ("body", "req-7")]


def test_misuse_raises_at_the_await() -> None:
    registry = ToolRegistry(max_workers=1)
    areg = AsyncToolRegistry(registry)

    async def main() -> None:
        with pytest.raises(TypeError):
            await areg.execute(42)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await areg.execute("x", token=CancelSource())  # type: ignore[arg-type]
        await areg.aclose()
        assert not registry.closed  # the facade closes what it made, not what it was given
        await asyncio.to_thread(registry.close)
        with pytest.raises(RegistryClosedError, match="closed"):
            await areg.execute("x")
        with pytest.raises(RegistryClosedError, match="closed"):
            await areg.execute_batch([ToolCall("x")])

    asyncio.run(main())
    with pytest.raises(TypeError):
        AsyncToolRegistry(object())  # type: ignore[arg-type]


# -- lifecycle ----------------------------------------------------------------------------------


def test_async_with_stops_the_facades_threads_and_the_owner_closes_the_registry() -> None:
    before = set(threading.enumerate())
    registry = ToolRegistry(max_workers=2)
    inside: set[str] = set()

    @registry.tool
    def plain(args: Any, ctx: Any) -> str:
        return "plain"

    @registry.tool
    async def coroutine(args: Any, ctx: Any) -> str:
        await asyncio.sleep(0)
        return "coroutine"

    async def main() -> None:
        async with AsyncToolRegistry(registry) as areg:
            assert (await areg.execute("plain")).ok
            assert (await areg.execute("coroutine")).ok
            results = await areg.execute_batch([ToolCall("plain"), ToolCall("coroutine")])
            assert [r.ok for r in results] == [True, True]
            inside.update(t.name for t in threading.enumerate())
        assert not registry.closed  # given, not made: the facade leaves it open
        await asyncio.to_thread(registry.close)  # its creator closes it, off the loop
        assert registry.closed

    asyncio.run(main())
    # Every kind of thread the facade uses was there: pool workers, the async-body loop, and
    # the batch schedulers.
    assert any(re.fullmatch(r"toolreg-\d+", name) for name in inside)
    assert "toolreg-async" in inside
    assert any(name.startswith("toolreg-aio-batch") for name in inside)
    left = sorted(
        t.name
        for t in set(threading.enumerate()) - before
        if not t.name.startswith("toolreg-timer")
    )
    assert left == []


# -- never blocks the event loop, never deadlocks ---------------------------------------------


def test_event_loop_stays_responsive_while_hooks_and_bodies_block() -> None:
    with open_registry(max_workers=8) as registry:
        # Blocking work, simulated: hooks and bodies that hold their thread for 20 ms each.
        registry.add_pre_execute(lambda call, token: time.sleep(0.02))

        @registry.tool
        def work(args: Any, ctx: Any) -> int:
            time.sleep(0.02)  # simulated blocking work, as above
            return int(args["i"])

        async def main() -> tuple[float, float]:
            areg = AsyncToolRegistry(registry)
            # Start the pool's threads first: starting them from the loop is a separate bug
            # (test_awaited_calls_start_no_thread_on_the_event_loop_thread).
            await asyncio.gather(*(areg.execute("work", {"i": i}) for i in range(8)))
            async with Ticker() as ticker:
                began = time.perf_counter()
                results = await asyncio.gather(*(areg.execute("work", {"i": i}) for i in range(50)))
                elapsed = time.perf_counter() - began
            assert [r.value for r in results] == list(range(50))
            return ticker.worst, elapsed

        worst, elapsed = asyncio.run(main())
    print(f"\nworst event-loop gap {worst * 1000:.1f} ms over {elapsed:.2f} s, 50 blocking calls")
    assert worst < 0.05


def test_one_worker_and_a_hundred_awaited_calls_with_nested_calls_do_not_deadlock() -> None:
    with open_registry(max_workers=1) as registry:

        @registry.tool
        def leaf(args: Any, ctx: Any) -> int:
            return int(args["i"])

        @registry.tool
        async def async_leaf(args: Any, ctx: Any) -> int:
            await asyncio.sleep(0)
            return int(args["i"])

        @registry.tool
        def parent(args: Any, ctx: Any) -> int:
            leaf_name = "async_leaf" if args["i"] % 10 == 0 else "leaf"
            nested = ctx.execute(leaf_name, {"i": args["i"]})
            assert nested.ok, nested
            return int(nested.value) * 2

        async def main() -> list[int | None]:
            areg = AsyncToolRegistry(registry)
            tasks = [asyncio.create_task(areg.execute("parent", {"i": i})) for i in range(100)]
            _, pending = await asyncio.wait(tasks, timeout=WAIT)
            assert not pending, f"{len(pending)} calls never finished: deadlock"
            return [task.result().value for task in tasks]

        assert asyncio.run(main()) == [i * 2 for i in range(100)]


# -- cancelling the awaiting task ---------------------------------------------------------------


class Held:
    """Work that goes on after its cancellation until the test releases it.

    `hold()` runs on the worker once it has seen the cancellation; `release_while_pending(f)`
    on the loop waits for that, checks that `f` (what awaits the work) has not finished while
    the work is held, and then releases it (always: a failed check never leaves it held).
    """

    def __init__(self) -> None:
        self.holding = threading.Event()
        self.release = threading.Event()

    def hold(self) -> None:
        self.holding.set()
        assert self.release.wait(WAIT), "never released"

    async def release_while_pending(self, awaiting: asyncio.Future[Any]) -> None:
        try:
            await wait_event(self.holding)
            assert await still_pending(awaiting), "it finished while the work was still going on"
        finally:
            self.release.set()


def _stubborn_tool(
    registry: ToolRegistry, journal: Journal, started: threading.Event, held: Held
) -> None:
    """A body that notices cancellation, then keeps working until `held` is released."""

    @registry.tool
    def stubborn(args: Any, ctx: Any) -> str:
        started.set()
        assert ctx.token.wait(WAIT)
        journal(("body saw cancel", time.monotonic(), ctx.token.reason))
        held.hold()  # cleanup after the cancellation, until the test has looked
        journal(("body returned", time.monotonic()))
        return "late"

    registry.on_result(lambda result: journal(("result", result.code, result.dispatched)))


def test_cancelling_the_task_cancels_the_call_waits_for_the_body_then_raises(
    anyio_loaded: bool,
) -> None:
    journal, started, held = Journal(), threading.Event(), Held()
    caller = CancelSource()
    with open_registry(max_workers=2) as registry:
        _stubborn_tool(registry, journal, started, held)

        async def main() -> None:
            areg = AsyncToolRegistry(registry)
            task = asyncio.create_task(areg.execute("stubborn", token=caller.token))
            await wait_event(started)
            journal(("cancel", time.monotonic()))
            task.cancel()
            await held.release_while_pending(task)  # the task waits out the stubborn body
            with pytest.raises(asyncio.CancelledError):
                await task
            journal(("task raised", time.monotonic()))

        asyncio.run(main())
    kinds = [entry[0] for entry in journal.entries]
    assert kinds == ["cancel", "body saw cancel", "body returned", "result", "task raised"]
    reason = str(journal.entries[1][2])
    assert "asyncio" in reason and "cancel" in reason, reason
    assert journal.entries[3] == ("result", ABORTED, True)
    assert journal.entries[4][1] >= journal.entries[2][1]  # raised after the body returned
    assert not caller.token.cancelled
    assert holds_nothing(caller.token)


def test_cancelling_the_task_during_a_pre_execute_hook_never_starts_the_body() -> None:
    journal, in_hook, held = Journal(), threading.Event(), Held()
    with open_registry(max_workers=2) as registry:
        registry.on_result(lambda result: journal(("result", result.code, result.dispatched)))

        def slow_policy(call: ToolCall, token: CancelToken) -> None:
            in_hook.set()
            assert token.wait(WAIT)
            journal("hook saw cancel")
            held.hold()  # finishes its own work first
            journal("hook returned")

        registry.add_pre_execute(slow_policy)

        @registry.tool
        def body(args: Any, ctx: Any) -> str:
            journal("body ran")
            return "ran"

        async def main() -> None:
            task = asyncio.create_task(AsyncToolRegistry(registry).execute("body"))
            await wait_event(in_hook)
            task.cancel()
            await held.release_while_pending(task)
            with pytest.raises(asyncio.CancelledError):
                await task
            journal("task raised")

        asyncio.run(main())
    assert journal.entries == [
        "hook saw cancel",
        "hook returned",
        ("result", BEFORE, False),
        "task raised",
    ]


def test_cancelling_a_queued_call_never_starts_its_body() -> None:
    journal, started, release = Journal(), threading.Event(), threading.Event()
    with open_registry(max_workers=1) as registry:
        registry.on_result(lambda result: journal((result.call.name, result.code)))

        @registry.tool
        def blocker(args: Any, ctx: Any) -> str:
            started.set()
            assert release.wait(WAIT)
            return "blocker"

        @registry.tool
        def queued(args: Any, ctx: Any) -> str:
            journal("queued body ran")
            return "queued"

        async def main() -> None:
            areg = AsyncToolRegistry(registry)
            first = asyncio.create_task(areg.execute("blocker"))
            await wait_event(started)
            second = asyncio.create_task(areg.execute("queued"))
            await asyncio.sleep(0)  # the second call is handed to the (busy) pool
            second.cancel()
            # `cancel()` only schedules the CancelledError; the task turns it into the call's
            # cancellation when it next runs, which is before this task resumes (FIFO ready
            # queue). Releasing the worker earlier would let the call start, correctly.
            await asyncio.sleep(0)
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await second
            assert (await first).ok

        asyncio.run(main())
    # The unstarted call's result may be observed before the blocker's: it never waits for it.
    expected = [("blocker", None), ("queued", BEFORE)]
    assert sorted(journal.entries, key=str) == sorted(expected, key=str)


@pytest.mark.parametrize("how", ["timeout scope", "asyncio.wait_for"])
def test_timeout_around_execute_raises_after_the_body_settled(how: str, anyio_loaded: bool) -> None:
    journal, started, held = Journal(), threading.Event(), Held()
    with open_registry(max_workers=2) as registry:
        _stubborn_tool(registry, journal, started, held)

        @registry.tool
        def quick(args: Any, ctx: Any) -> str:
            return "quick"

        async def main() -> None:
            areg = AsyncToolRegistry(registry)
            task = asyncio.current_task()
            assert task is not None
            raised = asyncio.get_running_loop().create_future()  # the timeout raised here
            releaser = asyncio.create_task(held.release_while_pending(raised))
            if how == "timeout scope":
                loop = asyncio.get_running_loop()
                with pytest.raises(asyncio.TimeoutError):
                    async with timeout_scope(None) as scope:

                        async def expire_once_started() -> None:
                            await wait_event(started)
                            scope.reschedule(loop.time())

                        trigger = asyncio.create_task(expire_once_started())
                        await areg.execute("stubborn")
                await trigger
            else:
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(areg.execute("stubborn"), 0.3)
            raised.set_result(None)
            await releaser
            journal(("timeout raised", time.monotonic()))
            # No cancellation is left over: the task goes on awaiting and calling.
            await no_cancellation_left(task)
            assert (await areg.execute("quick")).ok

        asyncio.run(main())
    kinds = [entry[0] for entry in journal.entries]
    assert kinds == ["body saw cancel", "body returned", "result", "timeout raised", "result"]
    assert journal.entries[2] == ("result", ABORTED, True)


def test_inner_timeout_inside_an_outer_one_is_handled_by_the_inner() -> None:
    journal, started, held = Journal(), threading.Event(), Held()
    with open_registry(max_workers=2) as registry:
        _stubborn_tool(registry, journal, started, held)

        async def main() -> None:
            areg = AsyncToolRegistry(registry)
            loop = asyncio.get_running_loop()
            task = asyncio.current_task()
            assert task is not None
            raised = loop.create_future()  # the inner timeout raised here
            releaser = asyncio.create_task(held.release_while_pending(raised))
            async with timeout_scope(WAIT) as outer:
                with pytest.raises(asyncio.TimeoutError):
                    async with timeout_scope(None) as inner:

                        async def expire_inner() -> None:
                            await wait_event(started)
                            inner.reschedule(loop.time())

                        trigger = asyncio.create_task(expire_inner())
                        await areg.execute("stubborn")
                raised.set_result(None)
                await releaser
                await trigger
                journal(("inner timeout raised", time.monotonic()))
                await no_cancellation_left(task)  # still inside the outer scope, not cancelled
            assert inner.expired() and not outer.expired()
            await no_cancellation_left(task)

        asyncio.run(main())
    kinds = [entry[0] for entry in journal.entries]
    assert kinds == ["body saw cancel", "body returned", "result", "inner timeout raised"]


def test_outer_timeout_expiring_while_the_inner_one_drains_wins() -> None:
    journal, started, saw_cancel = Journal(), threading.Event(), threading.Event()
    release = threading.Event()
    with open_registry(max_workers=2) as registry:
        registry.on_result(lambda result: journal(("result", result.code)))

        @registry.tool
        def stubborn(args: Any, ctx: Any) -> str:
            started.set()
            assert ctx.token.wait(WAIT)
            saw_cancel.set()
            assert release.wait(WAIT)  # keeps going until both timeouts have fired
            journal("body returned")
            return "late"

        async def main() -> None:
            areg = AsyncToolRegistry(registry)
            loop = asyncio.get_running_loop()
            task = asyncio.current_task()
            assert task is not None

            async def expire_both() -> None:
                await wait_event(started)
                inner.reschedule(loop.time())
                await wait_event(saw_cancel)
                outer.reschedule(loop.time())
                await until(outer.expired, "the outer timeout fired (cancelling the task again)")
                release.set()

            with pytest.raises(asyncio.TimeoutError):
                async with timeout_scope(None) as outer:
                    async with timeout_scope(None) as inner:
                        trigger = asyncio.create_task(expire_both())
                        await areg.execute("stubborn")
                    journal("after the inner block")  # never: the outer deadline passed too
            journal("outer timeout raised")
            await trigger
            assert inner.expired() and outer.expired()
            await no_cancellation_left(task)

        asyncio.run(main())
    assert journal.entries == ["body returned", ("result", ABORTED), "outer timeout raised"]


def test_a_closed_loop_does_not_break_the_worker_that_finishes_its_call() -> None:
    executor = RecordingExecutor(2)
    registry = ToolRegistry(executor=executor)
    started, release = threading.Event(), threading.Event()
    results: list[ToolResult[Any]] = []
    observed = threading.Event()

    def observe(result: ToolResult[Any]) -> None:
        results.append(result)
        observed.set()

    registry.on_result(observe)

    @registry.tool
    def slow(args: Any, ctx: Any) -> str:
        started.set()
        assert release.wait(WAIT)
        return "finished"

    async def until_started() -> None:
        await until(started.is_set, "the body started", pause=0.001)

    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(AsyncToolRegistry(registry).execute("slow"))
        loop.run_until_complete(until_started())
    finally:
        loop.close()  # with the call in flight: its worker will try to wake a closed loop
    task._log_destroy_pending = False  # type: ignore[attr-defined]  # dropping it is the point
    del task
    release.set()
    assert observed.wait(WAIT)  # the call finished on its own, before close() could cancel it
    registry.close()
    executor.shutdown(wait=True)  # the worker has tried to wake the loop and returned
    gc.collect()  # the dropped task's coroutine is closed here, not in a later test
    assert registry.closed
    assert executor.escaped == []
    assert [(r.ok, r.value) for r in results] == [(True, "finished")]
    assert not any(t.name.startswith("toolreg-recording") for t in threading.enumerate())


# -- anyio ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["cancel-scope", "move_on_after"])
def test_anyio_cancellation_waits_for_the_body_without_spinning(how: str) -> None:
    journal, started = Journal(), threading.Event()
    figures: dict[str, float] = {}
    with open_registry(max_workers=2) as registry:
        registry.on_result(lambda result: journal(("result", result.code)))

        @registry.tool
        def uncooperative(args: Any, ctx: ToolContext) -> str:
            started.set()
            # The cancellation reaches the body first (a handshake, not a guess at how long
            # the start takes), and the body then keeps working for a while regardless.
            if not ctx.token.wait(WAIT):
                raise AssertionError("the awaiting task's cancellation never reached the body")
            time.sleep(0.4)  # simulated work that ignores the cancellation it has seen
            journal("body returned")
            return "late"

        async def main() -> None:
            areg = AsyncToolRegistry(registry)
            if how == "cancel-scope":
                async with anyio.create_task_group() as group:
                    with anyio.CancelScope() as scope:

                        async def cancel_once_started() -> None:
                            await anyio.to_thread.run_sync(started.wait, WAIT)
                            figures["wall"], figures["cpu"] = (
                                time.perf_counter(),
                                time.process_time(),
                            )
                            scope.cancel()

                        group.start_soon(cancel_once_started)
                        await areg.execute("uncooperative")
            else:
                figures["wall"], figures["cpu"] = time.perf_counter(), time.process_time()
                with anyio.move_on_after(0.2) as scope:
                    await areg.execute("uncooperative")
            figures["wall"] = time.perf_counter() - figures["wall"]
            figures["cpu"] = time.process_time() - figures["cpu"]
            journal("scope exited")
            assert scope.cancelled_caught

        with gc_paused():  # the CPU share measured is the join's, not a collection's
            run_with_anyio(main)
    assert journal.entries == ["body returned", ("result", ABORTED), "scope exited"]
    share = figures["cpu"] / figures["wall"]
    print(
        f"\nanyio {how}: waited {figures['wall']:.3f} s for the body using "
        f"{figures['cpu'] * 1000:.1f} ms of CPU ({share:.1%})"
    )
    assert figures["wall"] >= 0.3
    assert share < 0.30


# -- async def tool bodies ------------------------------------------------------------------------


def test_async_body_runs_on_the_registry_loop_thread_and_sees_its_token() -> None:
    with open_registry(max_workers=2) as registry:

        @registry.tool
        async def where(args: Any, ctx: Any) -> dict[str, Any]:
            await asyncio.sleep(0)
            return {
                "thread": threading.current_thread().name,
                "loop": id(asyncio.get_running_loop()),
                "token": isinstance(ctx.token, CancelToken),
                "cancelled": ctx.token.cancelled,
            }

        from_sync = registry.execute("where")

        async def main() -> tuple[ToolResult[Any], int]:
            result = await AsyncToolRegistry(registry).execute("where")
            return result, id(asyncio.get_running_loop())

        from_async, caller_loop = asyncio.run(main())
    for result in (from_sync, from_async):
        assert result.ok, result
        assert result.value is not None
        assert result.value["thread"].endswith("-async")
        assert result.value["token"] is True and result.value["cancelled"] is False
    assert from_async.value is not None and from_sync.value is not None
    assert from_async.value["loop"] == from_sync.value["loop"] != caller_loop


@pytest.mark.parametrize("ending", ["re-raises", "returns"])
def test_token_cancellation_cancels_an_async_body_and_is_joined(ending: str) -> None:
    journal, started = Journal(), threading.Event()
    source = CancelSource()
    with open_registry(max_workers=2) as registry:

        @registry.tool
        async def stubborn(args: Any, ctx: Any) -> str:
            started.set()
            try:
                await asyncio.sleep(WAIT)
            except asyncio.CancelledError:
                journal(("body cancelled", ctx.token.reason))
                await asyncio.sleep(0.2)  # keeps awaiting after its task was cancelled
                journal("body finished")
                if ending == "re-raises":
                    raise
            return "late"

        outcome: list[ToolResult[Any]] = []
        caller = threading.Thread(
            target=lambda: outcome.append(registry.execute("stubborn", token=source.token))
        )
        caller.start()
        assert started.wait(WAIT)
        source.cancel("user pressed stop")
        caller.join(WAIT)
        journal("execute returned")
    assert journal.entries == [
        ("body cancelled", "user pressed stop"),
        "body finished",
        "execute returned",
    ]
    assert outcome[0].code == ABORTED and outcome[0].dispatched


def test_cancelling_the_awaiting_task_cancels_an_async_body_and_waits_for_it() -> None:
    journal, started = Journal(), threading.Event()
    with open_registry(max_workers=2) as registry:

        @registry.tool
        async def stubborn(args: Any, ctx: Any) -> str:
            started.set()
            try:
                await asyncio.sleep(WAIT)
            except asyncio.CancelledError:
                journal("body cancelled")
                await asyncio.sleep(0.2)
                journal("body finished")
                raise
            return "never"

        registry.on_result(lambda result: journal(("result", result.code)))

        async def main() -> None:
            task = asyncio.create_task(AsyncToolRegistry(registry).execute("stubborn"))
            await wait_event(started)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            journal("task raised")

        asyncio.run(main())
    assert journal.entries == [
        "body cancelled",
        "body finished",
        ("result", ABORTED),
        "task raised",
    ]


def test_async_body_can_call_another_async_tool_through_ctx_execute() -> None:
    with open_registry(max_workers=1) as registry:

        @registry.tool
        async def double(args: Any, ctx: Any) -> int:
            await asyncio.sleep(0)
            return int(args["n"]) * 2

        @registry.tool
        async def outer(args: Any, ctx: Any) -> list[Any]:
            await asyncio.sleep(0)
            nested = ctx.execute("double", {"n": 21})
            assert nested.ok, nested
            return [nested.value, ctx.token.cancelled]

        outcome: list[ToolResult[Any]] = []
        caller = threading.Thread(target=lambda: outcome.append(registry.execute("outer")))
        caller.start()
        caller.join(WAIT)
        assert not caller.is_alive(), "deadlock: an async body's nested async call never returned"

        async def main() -> ToolResult[Any]:
            return await asyncio.wait_for(AsyncToolRegistry(registry).execute("outer"), WAIT)

        awaited = asyncio.run(main())
    assert outcome[0].value == awaited.value == [42, False]


# -- batches --------------------------------------------------------------------------------------


def test_a_nested_async_body_runs_on_a_loop_of_its_own_with_the_outer_body_s_context() -> None:
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    with open_registry(max_workers=1) as registry:

        @registry.tool
        async def inner(args: Any, ctx: Any) -> list[str]:
            await asyncio.sleep(0)
            return [request_id.get("-"), threading.current_thread().name]

        @registry.tool
        async def outer(args: Any, ctx: Any) -> list[Any]:
            request_id.set("req-7")
            nested = ctx.execute("inner")
            assert nested.ok, nested
            return [nested.value, threading.current_thread().name]

        result = Caller(lambda: registry.execute("outer")).join()
    (seen, inner_thread), outer_thread = result.value
    assert seen == "req-7"
    assert inner_thread != outer_thread and inner_thread.endswith("-async")


def test_cancelling_the_awaiting_task_cancels_and_drains_the_batch() -> None:
    journal, started, held = Journal(), threading.Event(), Held()
    with open_registry(max_workers=2) as registry:
        registry.on_result(lambda result: journal((result.call.call_id, result.code)))

        @registry.tool
        def stubborn(args: Any, ctx: Any) -> str:
            started.set()
            assert ctx.token.wait(WAIT)
            held.hold()  # still working after the cancellation
            journal("stubborn returned")
            return "late"

        @registry.tool
        def later(args: Any, ctx: Any) -> str:
            journal("later ran")
            return "later"

        calls = [
            ToolCall("stubborn", {}, "s"),
            ToolCall("later", {}, "l1"),
            ToolCall("later", {}, "l2"),
        ]

        async def main() -> None:
            task = asyncio.create_task(AsyncToolRegistry(registry).execute_batch(calls))
            await wait_event(started)
            task.cancel()
            await held.release_while_pending(task)
            with pytest.raises(asyncio.CancelledError):
                await task
            journal("task raised")

        asyncio.run(main())
    assert journal.entries == [
        "stubborn returned",
        ("s", ABORTED),
        ("l1", BEFORE),
        ("l2", BEFORE),
        "task raised",
    ]


def test_awaited_batches_with_one_worker_do_not_deadlock() -> None:
    with open_registry(max_workers=1) as registry:

        @registry.tool
        def leaf(args: Any, ctx: Any) -> int:
            return int(args["i"])

        @registry.tool(concurrency_safe=True)
        def parent(args: Any, ctx: Any) -> int:
            return int(ctx.execute("leaf", {"i": args["i"]}).value) + 1

        async def main() -> list[list[Any]]:
            areg = AsyncToolRegistry(registry)
            batches = [
                [ToolCall("parent", {"i": i}) for i in range(start, start + 5)]
                for start in (0, 10, 20)
            ]
            gathered = asyncio.gather(*(areg.execute_batch(batch) for batch in batches))
            results = await asyncio.wait_for(gathered, WAIT)
            return [[r.value for r in batch] for batch in results]

        assert asyncio.run(main()) == [
            [1, 2, 3, 4, 5],
            [11, 12, 13, 14, 15],
            [21, 22, 23, 24, 25],
        ]


# -- regressions: bugs found by these tests, fixed ----------------------------------------------


def test_awaited_calls_start_no_thread_on_the_event_loop_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/contract.md 8.1: "It never blocks the event loop" (A.5: Thread.start() on the loop
    thread blocks until the new thread runs). Measured: each submit that starts a worker takes
    0.15-6 ms on the loop; 50 calls on a cold pool with two busy CPUs gave a 41 ms loop stall."""
    started_from: list[tuple[str, str]] = []
    original = threading.Thread.start

    def recording_start(thread: threading.Thread) -> None:
        started_from.append((thread.name, threading.current_thread().name))
        original(thread)

    monkeypatch.setattr(threading.Thread, "start", recording_start)
    with open_registry(max_workers=4, thread_name_prefix="toolreg-cold") as registry:

        @registry.tool
        def quick(args: Any, ctx: Any) -> str:
            return "quick"

        async def main() -> str:
            areg = AsyncToolRegistry(registry)
            await asyncio.gather(*(areg.execute("quick") for _ in range(4)))
            await areg.execute_batch([ToolCall("quick"), ToolCall("quick")])
            return threading.current_thread().name

        loop_thread = asyncio.run(main())
    on_loop = [name for name, starter in started_from if starter == loop_thread]
    assert [name for name in on_loop if name.startswith("toolreg")] == []


def test_cancelling_the_task_runs_no_token_callback_on_the_event_loop() -> None:
    """docs/contract.md 8.1: "It never blocks the event loop"; a body's `ctx.token.on_cancel`
    callback that blocks 200 ms (say, a remote stop request) stalled the loop 203 ms."""
    started, callback_ran = threading.Event(), threading.Event()
    callback_threads: list[str] = []
    with open_registry(max_workers=2) as registry:

        @registry.tool
        def with_callback(args: Any, ctx: Any) -> str:
            def stop_remote_job() -> None:
                callback_threads.append(threading.current_thread().name)
                callback_ran.set()

            with ctx.token.on_cancel(stop_remote_job):
                started.set()
                assert callback_ran.wait(WAIT)
            return "stopped"

        async def main() -> str:
            task = asyncio.create_task(AsyncToolRegistry(registry).execute("with_callback"))
            await wait_event(started)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return threading.current_thread().name

        loop_thread = asyncio.run(main())
    assert len(callback_threads) == 1
    assert callback_threads[0] != loop_thread


def test_close_settles_an_awaited_call_that_is_still_queued() -> None:
    """docs/contract.md: "Entry is the moment the caller calls ... areg.execute"; 4.10:
    "close() cancels every call in flight, waits for all of them"; 3.4: "execute ... raises only
    for misuse"."""
    started = threading.Event()
    observed: list[tuple[str, ErrorCode | None]] = []
    registry = ToolRegistry(max_workers=1)
    registry.on_result(lambda result: observed.append((result.call.name, result.code)))

    @registry.tool
    def blocker(args: Any, ctx: Any) -> str:
        started.set()
        assert ctx.token.wait(WAIT)
        return "blocker"

    @registry.tool
    def queued(args: Any, ctx: Any) -> str:
        return "queued"

    async def main() -> tuple[ToolResult[Any] | BaseException, ToolResult[Any] | BaseException]:
        areg = AsyncToolRegistry(registry)
        first = asyncio.create_task(areg.execute("blocker"))
        await wait_event(started)
        second = asyncio.create_task(areg.execute("queued"))
        await asyncio.sleep(0)  # entered: handed to the busy pool
        await asyncio.to_thread(registry.close)
        # Bound first: in a return's context mypy picks gather's overload that returns Any.
        results = await asyncio.gather(first, second, return_exceptions=True)
        return results

    first, second = asyncio.run(main())
    assert isinstance(first, ToolResult), f"the blocker raised {first!r}"
    assert first.code == ABORTED
    assert isinstance(second, ToolResult), f"the queued call raised {second!r}"
    assert second.code == BEFORE
    assert sorted(observed) == [("blocker", ABORTED), ("queued", BEFORE)]


def test_cancelling_a_queued_call_does_not_wait_for_a_busy_worker() -> None:
    """docs/contract.md 8.2: cancelling "waits until the call has settled": a queued call has
    nothing to settle, yet `asyncio.timeout(0.05)` around it fired only when the 0.5 s blocker
    ahead of it returned (the sync API with a 0.05 s deadline returns ABORTED_BEFORE_DISPATCH in
    0.05 s)."""
    started, release = threading.Event(), threading.Event()
    with open_registry(max_workers=1) as registry:

        @registry.tool
        def blocker(args: Any, ctx: Any) -> str:
            started.set()
            release.wait(2.0)  # bounded, so that the buggy path still ends
            return "blocker"

        @registry.tool
        def queued(args: Any, ctx: Any) -> str:
            return "queued"

        async def main() -> bool:
            areg = AsyncToolRegistry(registry)
            first = asyncio.create_task(areg.execute("blocker"))
            await wait_event(started)
            second = asyncio.create_task(areg.execute("queued"))
            await asyncio.sleep(0)
            second.cancel()
            try:
                done, _ = await asyncio.wait({second}, timeout=0.5)
                return second in done
            finally:
                release.set()
                await asyncio.gather(first, second, return_exceptions=True)

        assert asyncio.run(main()), "the cancelled queued call waited for the busy worker"


def test_pre_aborted_async_body_can_await_its_cleanup() -> None:
    """docs/contract.md 4.6: pre-aborted entry "reaches the body, which sees a cancelled token and
    may clean up or translate the cancellation; the body's own outcome is what the caller gets"."""
    with open_registry(max_workers=1) as registry:

        @registry.tool
        async def cleanup(args: Any, ctx: Any) -> str:
            if ctx.token.cancelled:
                await asyncio.sleep(0)  # say, `await session.close()`
                return "cleaned up"
            return "ran"

        result = registry.execute("cleanup", token=cancelled_token())
    assert (result.ok, result.value) == (True, "cleaned up")


class Hung(Exception):
    """The child process reported a deadlock."""


_DEADLOCK_SCRIPT = """
import asyncio, os, threading
from toolreg import ToolCall, ToolRegistry
from toolreg.aio import AsyncToolRegistry

registry = ToolRegistry(max_workers=1)
areg = AsyncToolRegistry(registry)

@registry.tool
def leaf(args, ctx):
    return "leaf"

@registry.tool
{kind}def outer(args, ctx):
{body}

outcome = []
caller = threading.Thread(target=lambda: outcome.append(registry.execute("outer")), daemon=True)
caller.start()
caller.join(2.0)
print(repr(outcome[0].content) if outcome else "hung", flush=True)
os._exit(0)
"""

_NESTED_ENTRY = {
    "close": """
    try:
        registry.close()
    except RuntimeError as exc:
        return "refused: " + str(exc)
    return "closed itself"
""",
    "execute_batch": """
    return [r.content for r in registry.execute_batch([ToolCall("leaf"), ToolCall("leaf")])]
""",
    "awaited execute": """
    return (await areg.execute("leaf", token=ctx.token)).content
""",
}
_EXPECTED = {
    "close": "refused",
    "execute_batch": '["leaf", "leaf"]',
    "awaited execute": "leaf",
}


def _run_outer(kind: str, entry: str) -> str:
    script = _DEADLOCK_SCRIPT.format(kind=kind, body=textwrap.indent(_NESTED_ENTRY[entry], "    "))
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    assert child.returncode == 0, child.stderr
    return child.stdout.strip()


@pytest.mark.parametrize("entry", ["close", "execute_batch"])
def test_sync_body_entry_points_do_not_deadlock(entry: str) -> None:
    """The control for the next test: the same child script, with a sync body."""
    assert _EXPECTED[entry] in _run_outer("", entry)


@pytest.mark.parametrize("entry", ["close", "execute_batch", "awaited execute"])
def test_async_body_entry_points_do_not_deadlock(entry: str) -> None:
    """docs/contract.md 4.10: "close() from inside one of the registry's own calls raises
    InsideCallError instead of waiting for itself"; 7.5: "no call ever waits for a worker that
    another waiting call holds"; 8.1: "never deadlocks when more calls are in flight than the
    executor has workers". `max_workers=1` and an `async def` body that calls each entry point;
    the same sync body passes (test_sync_body_entry_points_do_not_deadlock)."""
    printed = _run_outer("async ", entry)
    if printed == "hung":
        raise Hung(f"{entry} from an async body deadlocked")
    assert _EXPECTED[entry] in printed


@pytest.mark.parametrize("warm", [True, False], ids=["warm-pool", "cold-pool"])
def test_an_executor_that_refuses_the_call_fails_it_and_close_does_not_hang(warm: bool) -> None:
    """Regression: a shut-down executor's RuntimeError was raised (or, via the helper thread,
    only logged) after the call was counted in: the task hung or close() waited forever."""
    pool = ThreadPoolExecutor(2)
    if warm:  # both workers exist, so the facade submits directly from the loop
        started = threading.Barrier(3)
        for _ in range(2):
            pool.submit(started.wait, WAIT)
        started.wait(WAIT)
    pool.shutdown(wait=True)
    registry = ToolRegistry(executor=pool)
    registry.register(Tool("t", lambda args, ctx: "ok"))

    async def main() -> None:
        with pytest.raises(ExecutorRefusedError, match="refused"):
            await asyncio.wait_for(AsyncToolRegistry(registry).execute("t"), WAIT)

    asyncio.run(main())
    closer = threading.Thread(target=registry.close)
    closer.start()
    closer.join(WAIT)
    assert not closer.is_alive(), "close() waits for a call the executor never took"


# -- calls that never start -------------------------------------------------------------------


def occupy_schedulers(areg: AsyncToolRegistry) -> threading.Event:
    """White-box: the facade's batch schedulers are one busy thread, so an awaited batch waits
    in their queue until the returned event is set."""
    schedulers = WorkerPool(1, "test-schedulers")
    release = occupy(schedulers)
    areg._schedulers = schedulers
    return release


def test_a_call_hook_raising_an_interrupt_for_an_unstarted_awaited_batch_leaves_it_observed() -> (
    None
):
    """docs/contract.md 7.2/8.3: every unstarted call is observed, even when a call hook raises
    an interrupt for one of them (it ended the list of results there: the others were lost)."""

    def hook(call: ToolCall, token: CancelToken) -> None:
        if call.call_id == "c1":
            raise SystemExit("hook says stop")

    observed = Journal()
    with open_registry(max_workers=2) as registry:
        registry.add_call_hook(hook)
        registry.on_result(lambda result: observed((result.call.call_id, result.code)))
        registry.tool(name="t")(lambda args, ctx: "ok")
        calls = [ToolCall("t", {}, f"c{index}") for index in range(3)]

        async def main() -> None:
            areg = AsyncToolRegistry(registry)
            release = occupy_schedulers(areg)
            try:
                task = asyncio.create_task(areg.execute_batch(calls))
                await asyncio.sleep(0)  # entered: queued behind the busy scheduler
                assert len(areg._schedulers._backlog) == 1  # type: ignore[union-attr]
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.wait_for(task, WAIT)
            finally:
                release.set()
                await areg.aclose()

        asyncio.run(main())
        assert registry.wait_idle(0)
    assert sorted(observed.entries) == [(f"c{index}", BEFORE) for index in range(3)]


def test_an_interrupt_from_a_call_hook_of_a_dropped_awaited_call_is_raised_after_it() -> None:
    """docs/contract.md 7.4/17.6 for awaited calls: an interrupt a call hook raised is re-raised
    once the call was observed, also for a call the executor dropped (it was swallowed)."""
    gate = Gate()
    observed = Journal()

    def hook(call: ToolCall, token: CancelToken) -> None:
        if call.name == "queued":
            raise SystemExit("hook says stop")

    pool = WorkerPool(1, "test-given")
    try:
        with ToolRegistry(executor=pool) as registry:
            registry.add_call_hook(hook)
            registry.on_result(lambda result: observed((result.call.name, result.code)))
            registry.tool(name="blocker")(lambda args, ctx: gate.hold())
            registry.tool(name="queued")(lambda args, ctx: "queued")
            blocker = Caller(lambda: registry.execute("blocker"))
            gate.wait_reached()

            async def main() -> BaseException | None:
                task = asyncio.create_task(awaited())
                await asyncio.sleep(0)  # entered: queued behind the busy worker
                assert len(pool._backlog) == 1
                pool.shutdown(wait=False, cancel_futures=True)  # drops the awaited call
                return await asyncio.wait_for(task, WAIT)

            async def awaited() -> BaseException | None:
                # Caught in the task: a SystemExit leaving a task stops the loop itself.
                try:
                    await AsyncToolRegistry(registry).execute("queued")
                except SystemExit as exc:
                    return exc
                return None

            raised = asyncio.run(main())
            assert isinstance(raised, SystemExit) and str(raised) == "hook says stop"
            assert observed.entries == [("queued", BEFORE)]
            gate.release()
            assert blocker.join().ok
    finally:
        gate.release()
        pool.shutdown(wait=True)


def test_call_hooks_of_an_unstarted_awaited_batch_see_the_awaiting_task_s_context() -> None:
    """docs/contract.md 3.6 and 15.7: a batch call that never started goes through the call
    hooks "in the awaiting task's" context (they ran in the helper thread's)."""
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    seen = Journal()
    with open_registry(max_workers=2) as registry:
        registry.add_call_hook(lambda call, token: seen((call.call_id, request_id.get("-"))))
        registry.tool(name="t")(lambda args, ctx: "ok")
        calls = [ToolCall("t", {}, f"c{index}") for index in range(2)]

        async def main() -> None:
            request_id.set("req-7")
            areg = AsyncToolRegistry(registry)
            release = occupy_schedulers(areg)
            try:
                task = asyncio.create_task(areg.execute_batch(calls))
                await asyncio.sleep(0)  # entered: queued behind the busy scheduler
                assert len(areg._schedulers._backlog) == 1  # type: ignore[union-attr]
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.wait_for(task, WAIT)
            finally:
                release.set()
                await areg.aclose()

        asyncio.run(main())
    assert seen.entries == [("c0", "req-7"), ("c1", "req-7")]


def test_an_awaited_call_cancelled_by_a_close_that_began_during_its_admission_is_counted_out() -> (
    None
):
    """Regression: admission cancels an entry that finds the registry closing (close() listed
    the table before it); the helper then finished the unstarted call and counted it out under
    key 0 before admit() returned the real key, so the entry stayed and close() waited forever.
    The interleaving is replayed white-box: close() lists the table just before the job enters
    it, and the helper counts the job out before admission returns."""
    gate = Gate()
    observed = Journal()
    registry = ToolRegistry(max_workers=2)
    registry.on_result(lambda result: observed((result.call.name, result.code)))
    registry.tool(name="stubborn")(lambda args, ctx: gate.hold())  # keeps close() waiting
    registry.tool(name="t")(lambda args, ctx: "ok")
    dispatcher = registry._dispatcher
    track, untrack = dispatcher.track, dispatcher.untrack
    counted_out = threading.Event()
    closer: list[Caller] = []

    def untrack_and_tell(key: int) -> None:
        untrack(key)
        counted_out.set()

    def track_while_closing(entry: Any) -> int:
        closer.append(Caller(registry.close, name="test-closer"))
        wait_until(lambda: dispatcher._idle_waiters > 0, "close() to wait for the table")
        key = track(entry)  # finds the registry closing: cancels the job, the helper ends it
        assert counted_out.wait(WAIT), "the helper never counted the cancelled job out"
        return key

    async def main() -> ToolResult[Any]:
        return await asyncio.wait_for(AsyncToolRegistry(registry).execute("t"), WAIT)

    stubborn = Caller(lambda: registry.execute("stubborn"))
    try:
        gate.wait_reached()
        dispatcher.track = track_while_closing  # type: ignore[method-assign]
        dispatcher.untrack = untrack_and_tell  # type: ignore[method-assign]
        result = asyncio.run(main())
    finally:
        gate.release()
    assert stubborn.join().code == ABORTED
    closer[0].join()  # close() returns: nothing was left counted in
    assert result.code == BEFORE
    assert sorted(observed.entries) == [("stubborn", ABORTED), ("t", BEFORE)]
    assert registry.closed and dispatcher.active() == 0


# -- the outbox and the inbox: calls handed over and outcomes handed back in batches ------------


def test_calls_that_must_all_run_at_once_each_get_a_worker() -> None:
    """docs/contract.md 8.1: the facade "never deadlocks when more calls are in flight than the
    executor has workers"; calls queued together are served by one runner, which must still
    give every call that blocks a worker of its own: eight bodies wait for each other here."""
    together = threading.Barrier(8)
    with open_registry(max_workers=8) as registry:
        registry.tool(name="meet")(lambda args, ctx: together.wait(WAIT))

        async def main() -> list[ToolResult[Any]]:
            areg = AsyncToolRegistry(registry)
            calls = [areg.execute("meet") for _ in range(8)]
            return await asyncio.wait_for(asyncio.gather(*calls), WAIT)

        results = asyncio.run(main())
    assert [result.ok for result in results] == [True] * 8
    # Each value is the int Barrier.wait() returned (ToolResult[Any] cannot say so).
    assert sorted(cast(int, result.value) for result in results) == list(range(8))


@pytest.mark.parametrize("order", ["queued-together", "queued-while-it-runs"])
def test_a_call_queued_behind_a_blocking_body_does_not_wait_for_it(order: str) -> None:
    """docs/contract.md 8.1, A.5: the first body waits for the second call's body, which must
    start on another worker whether it was queued with the first call or while the first ran."""
    second_ran, first_started = threading.Event(), threading.Event()
    with open_registry(max_workers=2) as registry:

        @registry.tool
        def first(args: Any, ctx: Any) -> str:
            first_started.set()
            assert second_ran.wait(WAIT), "the second call waited for the first"
            return "first"

        @registry.tool
        def second(args: Any, ctx: Any) -> str:
            second_ran.set()
            return "second"

        async def main() -> list[ToolResult[Any]]:
            areg = AsyncToolRegistry(registry)
            if order == "queued-together":
                calls = [areg.execute("first"), areg.execute("second")]
                return await asyncio.wait_for(asyncio.gather(*calls), WAIT)
            running = asyncio.create_task(areg.execute("first"))
            await wait_event(first_started)
            later = await asyncio.wait_for(areg.execute("second"), WAIT)
            return [await asyncio.wait_for(running, WAIT), later]

        results = asyncio.run(main())
    assert [result.value for result in results] == ["first", "second"]


@pytest.mark.parametrize("shape", ["one call alone", "eight calls gathered"])
def test_the_outbox_wakes_its_runner_keeping_the_gil_only_while_the_loop_has_more_to_run(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner handed over while other callbacks are ready on the loop (the rest of a
    `gather`) is woken without being given the CPU, so those calls queue behind it instead of
    each waiting for the loop to get the GIL back; a loop about to wait hands over the usual
    way (the worker then runs at once). The calls run either way."""
    handed: list[tuple[str, bool]] = []  # (work item's class, goes_on), in hand-off order
    original = WorkerPool._hand_over

    def spy(pool: WorkerPool, item: Any, *, may_block: bool = True, goes_on: bool = False) -> bool:
        handed.append((type(item).__name__, goes_on))
        return original(pool, item, may_block=may_block, goes_on=goes_on)

    monkeypatch.setattr(WorkerPool, "_hand_over", spy)
    count = 1 if shape == "one call alone" else 8
    with open_registry(max_workers=4) as registry:
        registry.tool(name="t")(lambda args, ctx: "ok")

        async def main() -> list[ToolResult[Any]]:
            areg = AsyncToolRegistry(registry)
            return await asyncio.wait_for(
                asyncio.gather(*(areg.execute("t") for _ in range(count))), WAIT
            )

        results = asyncio.run(main())
    assert [result.value for result in results] == ["ok"] * count
    # The loop's first hand-off is the outbox's runner; others come from workers (standbys).
    assert handed[0] == ("_Runner", count > 1)
    assert all(not goes_on for _, goes_on in handed[1:])


def test_a_worker_pool_passed_in_and_shut_down_refuses_every_call_queued_for_it() -> None:
    """docs/contract.md 8.8: "an executor that refuses the call (shut down by its owner)
    ExecutorRefusedError", for every call queued together, and close() does not hang."""
    pool = WorkerPool(2)
    pool.shutdown(wait=True)
    registry = ToolRegistry(executor=pool)
    registry.tool(name="t")(lambda args, ctx: "ok")

    async def main() -> list[Any]:
        areg = AsyncToolRegistry(registry)
        calls = [areg.execute("t") for _ in range(3)]
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), WAIT)

    outcomes = asyncio.run(main())
    assert [type(outcome) for outcome in outcomes] == [ExecutorRefusedError] * 3
    closer = Caller(registry.close, name="test-closer")
    closer.join()  # nothing was left counted in


def test_a_call_whose_runner_the_pool_drops_never_starts_and_is_observed() -> None:
    """docs/contract.md 8.3: a call still queued "never starts: ABORTED_BEFORE_DISPATCH,
    observers notified off the loop", when the pool it waits for is shut down with
    `cancel_futures=True` (it drops the runner that would have served the call)."""
    gate = Gate()
    observed = Journal()
    pool = WorkerPool(1)
    registry = ToolRegistry(executor=pool)
    registry.on_result(lambda result: observed((result.call.name, result.code)))
    registry.tool(name="blocker")(lambda args, ctx: gate.hold())
    ran: list[str] = []
    registry.tool(name="queued")(lambda args, ctx: ran.append("queued"))

    async def main() -> ToolResult[Any]:
        areg = AsyncToolRegistry(registry)
        outbox = areg._outbox
        assert outbox is not None
        queued = asyncio.create_task(areg.execute("queued"))
        await until(lambda: len(outbox._jobs) == 1, "the call queued in the outbox")
        await asyncio.to_thread(pool.shutdown, wait=False, cancel_futures=True)
        return await asyncio.wait_for(queued, WAIT)

    blocker = Caller(lambda: registry.execute("blocker"))
    try:
        gate.wait_reached()
        result = asyncio.run(main())
    finally:
        gate.release()
    assert blocker.join().ok
    assert result.code == BEFORE
    assert ran == []
    registry.close()
    assert sorted(observed.entries) == [("blocker", None), ("queued", BEFORE)]


def test_calls_from_loops_in_several_threads_each_come_back_to_their_own_loop() -> None:
    """docs/contract.md 8.1: each loop's outcomes are handed back to that loop, when loops in
    several threads share one facade and their calls finish interleaved."""
    loops = 4
    together = threading.Barrier(loops)
    with open_registry(max_workers=4) as registry:
        registry.tool(name="echo")(lambda args, ctx: args["n"])
        areg = AsyncToolRegistry(registry)

        async def calls(first: int) -> list[Any]:
            await asyncio.to_thread(together.wait, WAIT)  # every loop is running
            numbers = range(first, first + 50)
            results = await asyncio.gather(*(areg.execute("echo", {"n": n}) for n in numbers))
            return [result.value for result in results]

        def in_a_thread(first: int) -> Caller:
            return Caller(lambda: asyncio.run(calls(first)), name=f"test-loop-{first}")

        callers = [in_a_thread(100 * index) for index in range(loops)]
        values = [caller.join() for caller in callers]
    assert values == [list(range(100 * index, 100 * index + 50)) for index in range(loops)]


def test_a_loop_closed_with_outcomes_in_its_inbox_leaves_the_next_loop_working() -> None:
    """docs/contract.md 8.1, A.5: outcomes that reach a loop after it stopped (the drain they
    share scheduled on it, or refused because it is closed) are let go when it closes; nothing
    stays counted in, and the next loop on the same thread gets its outcomes."""
    gate = Gate()
    with open_registry(max_workers=2) as registry:
        registry.tool(name="held")(lambda args, ctx: gate.hold())
        registry.tool(name="t")(lambda args, ctx: "ok")
        areg = AsyncToolRegistry(registry)
        loop = asyncio.new_event_loop()
        try:
            tasks = [loop.create_task(areg.execute("held")) for _ in range(2)]
            loop.run_until_complete(until(gate.reached.is_set, "a body started"))
            gate.release()  # both finish while the loop is stopped
            assert registry.wait_idle(WAIT)
        finally:
            loop.close()
        for task in tasks:
            task._log_destroy_pending = False  # type: ignore[attr-defined]  # dropped on purpose
        del tasks
        gc.collect()
        result = asyncio.run(asyncio.wait_for(areg.execute("t"), WAIT))
        assert result.value == "ok"
        assert registry.wait_idle(WAIT)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_a_call_waits_for_a_runner_can_run_calls() -> None:
    """docs/contract.md 8.1 and the fork rules of A.5: a fork while a call waits in the outbox
    for a runner (every worker busy) leaves the child's facade able to hand its own calls over:
    the parent's runner does not exist in the child."""
    gate = Gate()
    registry = ToolRegistry(max_workers=1)
    registry.tool(name="held")(lambda args, ctx: gate.hold())
    registry.tool(name="t")(lambda args, ctx: "ok")
    areg = AsyncToolRegistry(registry)
    outbox = areg._outbox
    assert outbox is not None
    loop = asyncio.new_event_loop()
    loop_thread = Caller(loop.run_forever, name="test-parent-loop")
    try:
        asyncio.run_coroutine_threadsafe(areg.execute("held"), loop)
        gate.wait_reached()
        queued = asyncio.run_coroutine_threadsafe(areg.execute("t"), loop)
        wait_until(lambda: outbox._standby is not None and len(outbox._jobs) == 1, "a queued call")
        pid = os.fork()
        if pid == 0:  # the child: report through the exit status only
            code = 3
            try:
                result = asyncio.run(asyncio.wait_for(areg.execute("t"), WAIT))
                code = 0 if result.value == "ok" else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child's call never came back"
    finally:
        gate.release()
    assert queued.result(WAIT).value == "ok"
    loop.call_soon_threadsafe(loop.stop)
    loop_thread.join()
    loop.close()
    registry.close()


@pytest.mark.parametrize("when", ["before-the-hand-over", "after-the-hand-over"])
def test_an_interrupt_landing_while_a_runner_is_handed_over_leaves_the_facade_working(
    when: str,
) -> None:
    """docs/contract.md 3.6 and A.6: an exception a signal handler raises can land wherever the
    loop thread runs. Landing in the hand-over of a runner, it must not leave the outbox
    counting on a runner that may never have reached the pool: every later call would hang."""
    with open_registry(max_workers=2) as registry:
        registry.tool(name="t")(lambda args, ctx: "ok")
        areg = AsyncToolRegistry(registry)
        dispatcher = registry._dispatcher
        hand_over = dispatcher.hand_over
        landed: list[Any] = []

        def interrupted_hand_over(item: Any, may_block: bool = True, goes_on: bool = False) -> None:
            if landed:
                hand_over(item, may_block, goes_on)
                return
            landed.append(item)
            if when == "after-the-hand-over":
                hand_over(item, may_block, goes_on)
            raise KeyboardInterrupt

        dispatcher.hand_over = interrupted_hand_over  # type: ignore[method-assign]

        async def main() -> list[ToolResult[Any]]:
            with pytest.raises(KeyboardInterrupt):
                await areg.execute("t")
            later = [areg.execute("t") for _ in range(3)]
            return await asyncio.wait_for(asyncio.gather(*later), WAIT)

        results = asyncio.run(main())
        assert [result.value for result in results] == ["ok"] * 3
        assert registry.wait_idle(WAIT)
