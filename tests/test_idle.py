"""wait_idle: quiescence on demand, for every way a call can be in flight."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from _registry_helpers import WAIT, Caller, Gate, open_registry

from toolreg import InsideCallError, ToolCall, ToolContext, ToolRegistry
from toolreg.aio import AsyncToolRegistry

Args = Any


def add_held_tool(registry: ToolRegistry, gate: Gate) -> None:
    @registry.tool(concurrency_safe=True)
    def held(args: Args, ctx: ToolContext) -> str:
        gate.hold()
        return "done"


def test_an_idle_registry_is_idle_at_once() -> None:
    with open_registry() as registry:
        assert registry.wait_idle() is True
        assert registry.wait_idle(0) is True


def test_wait_idle_waits_for_a_direct_call_including_its_observers() -> None:
    gate = Gate()
    observed: list[str] = []
    with open_registry() as registry:
        add_held_tool(registry, gate)
        registry.on_result(lambda result: observed.append("observed"))
        call = Caller(lambda: registry.execute("held"))
        gate.wait_reached()
        assert registry.wait_idle(0.01) is False
        waiter = Caller(lambda: registry.wait_idle(WAIT))
        assert waiter.still_blocked()
        gate.release()
        assert waiter.join() is True
        assert observed == ["observed"]  # the call's observers ran before it counted out
        assert call.join().ok


def test_wait_idle_waits_for_a_batch() -> None:
    gate = Gate()
    with open_registry() as registry:
        add_held_tool(registry, gate)
        batch = Caller(lambda: registry.execute_batch([ToolCall("held"), ToolCall("held")]))
        gate.wait_reached()
        assert registry.wait_idle(0.01) is False
        gate.release()
        assert registry.wait_idle(WAIT) is True
        assert all(result.ok for result in batch.join())


def test_wait_idle_waits_for_an_awaited_call() -> None:
    gate = Gate()

    async def main(registry: ToolRegistry) -> None:
        areg = AsyncToolRegistry(registry)
        task = asyncio.ensure_future(areg.execute("held"))
        await asyncio.to_thread(gate.wait_reached)
        assert await areg.wait_idle(0.01) is False
        idle = asyncio.ensure_future(areg.wait_idle(WAIT))
        await asyncio.sleep(0)
        assert not idle.done()
        gate.release()
        assert await idle is True
        assert (await task).ok
        assert await areg.wait_idle() is True

    with open_registry() as registry:
        add_held_tool(registry, gate)
        asyncio.run(main(registry))


def test_wait_idle_from_inside_a_call_raises() -> None:
    raised: list[BaseException] = []
    with open_registry() as registry:

        @registry.tool
        def body(args: Args, ctx: ToolContext) -> str:
            try:
                registry.wait_idle(WAIT)
            except InsideCallError as exc:
                raised.append(exc)
            return "ok"

        def observer(result: Any) -> None:
            try:
                registry.wait_idle(WAIT)
            except InsideCallError as exc:
                raised.append(exc)

        registry.on_result(observer)
        assert registry.execute("body").ok
    assert len(raised) == 2  # from the body and from the observer


def test_awaited_wait_idle_from_an_async_body_raises() -> None:
    raised: list[BaseException] = []
    with open_registry() as registry:
        areg = AsyncToolRegistry(registry)

        @registry.tool
        async def body(args: Args, ctx: ToolContext) -> str:
            try:
                await areg.wait_idle(WAIT)
            except InsideCallError as exc:
                raised.append(exc)
            return "ok"

        assert registry.execute("body").ok
    assert len(raised) == 1


@pytest.mark.parametrize(
    ("timeout", "error"), [("1", TypeError), (True, TypeError), (float("nan"), ValueError)]
)
def test_wait_idle_checks_its_timeout(timeout: Any, error: type[Exception]) -> None:
    with open_registry() as registry:
        with pytest.raises(error):
            registry.wait_idle(timeout)

        async def main() -> None:
            with pytest.raises(error):
                await AsyncToolRegistry(registry).wait_idle(timeout)

        asyncio.run(main())


def test_a_negative_timeout_means_do_not_wait() -> None:
    # docs/contract.md 11.2: "a negative one means do not wait".
    gate = Gate()
    with open_registry() as registry:
        assert registry.wait_idle(-1) is True  # idle: True at once
        add_held_tool(registry, gate)
        call = Caller(lambda: registry.execute("held"))
        gate.wait_reached()
        try:
            assert registry.wait_idle(-1) is False  # busy: False at once, without waiting

            async def main() -> bool:
                return await AsyncToolRegistry(registry).wait_idle(-5.0)

            assert asyncio.run(main()) is False
        finally:
            gate.release()
        assert call.join().ok
        assert registry.wait_idle(WAIT) is True


@pytest.mark.parametrize("where", ["pre_execute", "call_hook", "post_execute"])
def test_wait_idle_from_inside_a_hook_raises_inside_call_error(where: str) -> None:
    raised: list[BaseException] = []

    def hook(*args: Any) -> None:
        try:
            registry.wait_idle(WAIT)
        except InsideCallError as exc:
            raised.append(exc)

    with open_registry() as registry:
        registry.tool(name="t")(lambda args, ctx: "ok")
        if where == "pre_execute":
            registry.add_pre_execute(hook)
        elif where == "call_hook":
            registry.add_call_hook(hook)
        else:
            registry.add_post_execute(hook)
        assert registry.execute("t").ok
    assert len(raised) == 1, raised


def test_an_abandoned_awaited_wait_leaves_nothing_behind() -> None:
    gate = Gate()

    async def main(registry: ToolRegistry) -> None:
        areg = AsyncToolRegistry(registry)
        task = asyncio.ensure_future(areg.execute("held"))
        await asyncio.to_thread(gate.wait_reached)
        for _ in range(100):
            assert await areg.wait_idle(0) is False
        assert registry._dispatcher._idle_callbacks == {}  # white-box
        gate.release()
        await task

    with open_registry() as registry:
        add_held_tool(registry, gate)
        asyncio.run(main(registry))


class _LeavesWhileRead(dict):  # type: ignore[type-arg]
    """The in-flight table, white-box: the first time `call_when_idle` reads whether anything
    is in flight, the last entry leaves on another thread right after that read."""

    def __init__(self, table: dict[int, Any], leave: Any) -> None:
        super().__init__(table)
        self.leave = leave
        self.armed = True

    def __len__(self) -> int:
        seen = dict.__len__(self)
        if self.armed and seen and threading.get_ident() == threading.main_thread().ident:
            self.armed = False
            self.leave()
        return seen  # what the reader had read before the entry left


def test_awaited_wait_idle_sees_the_last_call_leave_right_after_it_looked() -> None:
    # The last call leaves (its lock-free pop and check) between wait_idle's look at the table
    # and its next step: its wake-up must not be lost.
    class Entry:
        def cancel(self, reason: object) -> None:
            pass

    with open_registry() as registry:
        dispatcher = registry._dispatcher
        key = dispatcher.track(Entry())
        passed = threading.Event()  # the leaving thread is done with its check
        notify = dispatcher._notify_idle

        def notify_idle() -> None:
            passed.set()  # it is about to wake the waiters (blocked until the reader is done)
            notify()

        dispatcher._notify_idle = notify_idle  # type: ignore[method-assign]

        def leave() -> None:
            def untrack() -> None:
                try:
                    dispatcher.untrack(key)
                finally:
                    passed.set()

            threading.Thread(target=untrack, name="test-leaver", daemon=True).start()
            assert passed.wait(WAIT), "the leaving thread never got past its check"

        dispatcher._calls = _LeavesWhileRead(dispatcher._calls, leave)

        async def main() -> bool:
            return await AsyncToolRegistry(registry).wait_idle(WAIT)

        assert asyncio.run(main()) is True
        assert dispatcher.active() == 0 and dispatcher._idle_callbacks == {}
