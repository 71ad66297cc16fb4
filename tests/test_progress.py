"""ctx.report_progress and the progress= callback of execute (sync and awaited)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from typing import Any

import pytest
from _registry_helpers import WAIT, Caller, Gate, open_registry

from toolreg import CancelSource, RetryPolicy, ToolContext, ToolProgress, ToolRegistry
from toolreg.aio import AsyncToolRegistry

Args = Any


def test_progress_reaches_the_callback_in_order_on_the_bodys_thread() -> None:
    seen: list[tuple[float, float | None, str | None, str]] = []
    body_thread: list[int] = []

    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            body_thread.append(threading.get_ident())
            ctx.report_progress(1, 3, "one")
            ctx.report_progress(2.5)
            ctx.report_progress(3, 3, message="done")
            return "ok"

        def record(update: ToolProgress) -> None:
            assert update.call.name == "work"
            seen.append((update.progress, update.total, update.message, str(threading.get_ident())))

        result = registry.execute("work", progress=record)
    assert result.ok
    assert [entry[:3] for entry in seen] == [(1, 3, "one"), (2.5, None, None), (3, 3, "done")]
    assert {entry[3] for entry in seen} == {str(body_thread[0])}


def test_values_not_greater_than_the_last_are_dropped() -> None:
    seen: list[float] = []
    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> None:
            for value in (1, 1, 0.5, 2, 2, 1.5, 3):
                ctx.report_progress(value)

        registry.execute("work", progress=lambda update: seen.append(update.progress))
    assert seen == [1, 2, 3]


def test_updates_from_several_threads_reach_the_callback_in_increasing_order() -> None:
    # The first update (5) is held inside the callback while the body reports 6, then 5.5: the
    # callback must still see 5 before 6 (the later report waits its turn, without blocking
    # the body) and never 5.5, and it never runs on two threads at once.
    seen: list[float] = []
    inside: list[int] = []
    overlapped: list[bool] = []
    entered = threading.Event()
    release = threading.Event()

    def record(update: ToolProgress) -> None:
        overlapped.append(bool(inside))
        inside.append(1)
        if update.progress == 5:
            entered.set()
            assert release.wait(WAIT)
        seen.append(update.progress)
        inside.pop()

    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            first = threading.Thread(target=ctx.report_progress, args=(5,))
            first.start()
            try:
                assert entered.wait(WAIT)
                ctx.report_progress(6)  # while 5 is still being delivered
                ctx.report_progress(5.5)  # not greater than 6: dropped
            finally:
                release.set()
                first.join(WAIT)
            assert not first.is_alive()
            return "ok"

        assert registry.execute("work", progress=record).ok
    assert seen == [5, 6]
    assert overlapped == [False, False]


def test_a_callback_interrupted_by_ctrl_c_does_not_stop_later_updates() -> None:
    seen: list[float] = []

    def record(update: ToolProgress) -> None:
        seen.append(update.progress)
        if update.progress == 1:
            raise KeyboardInterrupt

    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            with pytest.raises(KeyboardInterrupt):
                ctx.report_progress(1)
            ctx.report_progress(2)
            return "ok"

        assert registry.execute("work", progress=record).ok
    assert seen == [1, 2]


def test_progress_keeps_increasing_across_retry_attempts() -> None:
    seen: list[float] = []
    attempts: list[int] = []
    with open_registry() as registry:
        registry.add_around(RetryPolicy(attempts=2, backoff=0))

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            attempts.append(1)
            ctx.report_progress(len(attempts))  # 1, then 2
            ctx.report_progress(1)  # goes backwards on the second attempt: dropped
            if len(attempts) == 1:
                raise ConnectionError("flaky")
            return "ok"

        assert registry.execute("work", progress=lambda u: seen.append(u.progress)).ok
    assert seen == [1, 2]


@pytest.mark.parametrize(
    ("progress", "total", "message", "error"),
    [
        (True, None, None, TypeError),
        ("1", None, None, TypeError),
        (1, False, None, TypeError),
        (math.nan, None, None, ValueError),
        (math.inf, None, None, ValueError),
        (1, -math.inf, None, ValueError),
        (10**400, None, None, ValueError),
        pytest.param(10**5000, None, None, ValueError, id="beyond-the-int-str-digit-limit"),
        (1, -(10**400), None, ValueError),
        (1, None, 5, TypeError),
    ],
)
def test_bad_progress_values_raise_in_the_body(
    progress: Any, total: Any, message: Any, error: type[Exception]
) -> None:
    raised: list[BaseException] = []
    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            try:
                ctx.report_progress(progress, total, message)
            except BaseException as exc:
                raised.append(exc)
            return "ok"

        registry.execute("work", progress=lambda update: None)
    assert len(raised) == 1 and type(raised[0]) is error


@pytest.mark.parametrize("digits", [400, 5000])  # 5000: beyond the int-to-str digit limit
def test_a_huge_int_is_named_by_its_size_not_its_digits(digits: int) -> None:
    huge = -(10**digits)
    raised: list[BaseException] = []
    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            try:
                ctx.report_progress(1, huge)
            except ValueError as exc:
                raised.append(exc)
            return "ok"

        registry.execute("work", progress=lambda update: None)
    assert len(raised) == 1
    assert str(raised[0]) == f"total must be finite, got an int of {huge.bit_length()} bits"


def test_report_progress_after_the_body_settled_raises() -> None:
    kept: list[ToolContext] = []
    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            kept.append(ctx)
            return "ok"

        registry.execute("work", progress=lambda update: None)
    with pytest.raises(RuntimeError, match="after the tool body"):
        kept[0].report_progress(1)


def test_without_a_callback_progress_is_accepted_and_dropped() -> None:
    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            ctx.report_progress(1, 2, "x")
            return "ok"

        assert registry.execute("work").ok


def test_a_raising_callback_is_logged_and_the_call_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            ctx.report_progress(1)
            ctx.report_progress(2)
            return "ok"

        result = registry.execute("work", progress=lambda update: 1 / 0)
    assert result.ok
    assert caplog.text.count("progress callback") == 2


def test_progress_of_a_nested_calls_body_is_dropped() -> None:
    seen: list[tuple[str, float]] = []
    with open_registry() as registry:

        @registry.tool
        def inner(args: Args, ctx: ToolContext) -> str:
            ctx.report_progress(50)
            return "inner"

        @registry.tool
        def outer(args: Args, ctx: ToolContext) -> str:
            ctx.report_progress(1)
            assert ctx.execute("inner").ok
            ctx.report_progress(2)
            return "outer"

        registry.execute("outer", progress=lambda u: seen.append((u.call.name, u.progress)))
    assert seen == [("outer", 1), ("outer", 2)]


def test_progress_must_be_callable() -> None:
    with open_registry() as registry, pytest.raises(TypeError, match="progress"):
        registry.execute("anything", progress=5)  # type: ignore[arg-type]


def test_awaited_progress_runs_on_the_event_loop_in_order() -> None:
    loop_threads: list[int] = []
    seen: list[float] = []

    async def main(registry: ToolRegistry) -> None:
        loop_thread = threading.get_ident()

        def record(update: ToolProgress) -> None:
            loop_threads.append(threading.get_ident())
            seen.append(update.progress)
            assert threading.get_ident() == loop_thread

        result = await AsyncToolRegistry(registry).execute("work", progress=record)
        assert result.ok
        await asyncio.sleep(0)  # let the last scheduled updates run

    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            for value in (1, 2, 3):
                ctx.report_progress(value)
            return "ok"

        asyncio.run(main(registry))
    assert seen == [1, 2, 3]


def test_awaited_progress_is_scheduled_on_the_loop_never_awaited_by_the_body() -> None:
    # The loop-side callback blocks until the body says report_progress returned: if the body
    # waited for the callback, neither would go on (the callback would time out, unseen).
    returned = threading.Event()
    saw_it_return: list[bool] = []

    def record(update: ToolProgress) -> None:
        saw_it_return.append(returned.wait(WAIT))

    async def main(registry: ToolRegistry) -> None:
        assert (await AsyncToolRegistry(registry).execute("work", progress=record)).ok

    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            ctx.report_progress(1)
            returned.set()
            return "ok"

        asyncio.run(main(registry))
    assert saw_it_return == [True]


def test_an_awaited_progress_callbacks_exception_is_logged_not_raised_into_the_body(
    caplog: pytest.LogCaptureFixture,
) -> None:
    raised_in_body: list[BaseException] = []

    async def main(registry: ToolRegistry) -> None:
        second = asyncio.Event()

        def record(update: ToolProgress) -> None:
            if update.progress == 2:
                second.set()
            raise ValueError(f"callback failed at {update.progress}")

        assert (await AsyncToolRegistry(registry).execute("work", progress=record)).ok
        await asyncio.wait_for(second.wait(), WAIT)

    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            for value in (1, 2):
                try:
                    ctx.report_progress(value)
                except BaseException as exc:
                    raised_in_body.append(exc)
            return "ok"

        asyncio.run(main(registry))
    assert raised_in_body == []
    logged = [r for r in caplog.records if "progress callback" in r.getMessage()]
    assert [str(r.exc_info[1]) for r in logged if r.exc_info] == [
        "callback failed at 1",
        "callback failed at 2",
    ]


@pytest.mark.parametrize("field", ["call", "progress", "total", "message"])
def test_a_delivered_tool_progress_is_frozen(field: str) -> None:
    updates: list[ToolProgress] = []
    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            ctx.report_progress(1, 2, "half")
            return "ok"

        assert registry.execute("work", progress=updates.append).ok
    (update,) = updates
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(update, field, None)
    assert (update.call.name, update.progress, update.total, update.message) == (
        "work",
        1,
        2,
        "half",
    )


def test_cancel_reason_reaches_the_body_when_the_awaiting_task_is_cancelled() -> None:
    reasons: list[object] = []
    gate = Gate()

    async def main(registry: ToolRegistry) -> None:
        areg = AsyncToolRegistry(registry)
        task = asyncio.ensure_future(areg.execute("work", cancel_reason="turn stopped"))
        await asyncio.to_thread(gate.wait_reached)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            gate.reached.set()
            ctx.token.wait(WAIT)
            reasons.append(ctx.token.reason)
            return "late"

        asyncio.run(main(registry))
    assert reasons == ["turn stopped"]


def test_default_cancel_reason_names_the_task() -> None:
    reasons: list[object] = []
    gate = Gate()

    async def main(registry: ToolRegistry) -> None:
        task = asyncio.ensure_future(AsyncToolRegistry(registry).execute("work"))
        task.set_name("Task-turn")
        await asyncio.to_thread(gate.wait_reached)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            gate.reached.set()
            ctx.token.wait(WAIT)
            reasons.append(ctx.token.reason)
            return "late"

        asyncio.run(main(registry))
    assert reasons == ["asyncio task Task-turn was cancelled"]


def test_caller_cancel_during_progress_still_aborts() -> None:
    source = CancelSource()
    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            ctx.report_progress(1)
            return "done"

        result = registry.execute(
            "work", token=source.token, progress=lambda update: source.cancel("stop")
        )
    assert result.code == "ABORTED"


def test_caller_helper_runs_progress_from_another_thread() -> None:
    # The callback runs on the body's thread, not the caller's.
    caller_thread: list[int] = []
    progress_thread: list[int] = []
    with open_registry() as registry:

        @registry.tool
        def work(args: Args, ctx: ToolContext) -> str:
            ctx.report_progress(1)
            return "ok"

        def run() -> Any:
            caller_thread.append(threading.get_ident())
            return registry.execute(
                "work", progress=lambda u: progress_thread.append(threading.get_ident())
            )

        assert Caller(run).join().ok
    assert progress_thread and progress_thread[0] != caller_thread[0]
