"""Regression tests for issue 19: what broke outside the lab (fork, interpreter exit, signal
handlers, hostile objects, validation, shared threads).

One test (or one parametrized test) per item, named as the claim, in the issue's order. Where
the contract (docs/contract.md) is silent the rule is: no hang, no crash, no abandoned body,
every call observed exactly once, a clear error or a failed result.

Every wait is bounded: a hang becomes a failure through `WAIT`, a subprocess timeout or a
bounded join, never through the global timeout.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import logging
import math
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest
from _registry_helpers import (
    ABORTED,
    BEFORE,
    WAIT,
    Caller,
    Gate,
    Journal,
    Observed,
    fired_by_timer,
    occupy,
    open_registry,
    wait_until,
    wait_until_main_thread_blocks,
)

from toolreg import (
    Cancelled,
    CancelSource,
    CancelToken,
    Deny,
    Dispatch,
    ErrorCode,
    FrozenDict,
    RetryPolicy,
    TimeoutPolicy,
    TimeoutReason,
    Tool,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
    WorkerPool,
    deadline,
)
from toolreg._jobs import JobThreads
from toolreg._timer import ManualClock
from toolreg.aio import AsyncToolRegistry
from toolreg.log import ResultLog
from toolreg.process import run, scrubbed_env

INVALID_ARGS = ErrorCode.INVALID_ARGS
TOOL_ERROR = ErrorCode.TOOL_ERROR
HOOK_ERROR = ErrorCode.HOOK_ERROR
SUBPROCESS_WAIT = 30.0  # seconds a child interpreter may take (import, run, exit) under load

Proceed = Callable[[], ToolResult[Any]]


def run_python(source: str, timeout: float = SUBPROCESS_WAIT) -> subprocess.CompletedProcess[str]:
    """Run `source` in a fresh interpreter; fail (not hang) if it runs for `timeout` seconds.

    A child that hangs is sent SIGABRT, which its fault handler (`-X faulthandler`: no thread,
    no file) answers with every thread's traceback: the failure shows where it hung.
    """
    argv = [sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(source)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGABRT)
            try:
                stdout, stderr = child.communicate(timeout=WAIT)
            except subprocess.TimeoutExpired:
                child.kill()
                stdout, stderr = child.communicate()
            pytest.fail(
                f"the child interpreter hung for {timeout}s; stdout: {stdout!r}\n"
                f"its threads, as SIGABRT found them:\n{stderr}"
            )
    return subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)


def test_a_hung_child_interpreter_fails_with_its_threads_tracebacks() -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        run_python("import threading; threading.Event().wait()", timeout=1.0)
    assert "hung for 1.0s" in str(failed.value)
    assert "most recent call first" in str(failed.value)  # the fault handler's traceback


def test_fired_by_timer_never_runs_the_callback_in_the_registering_thread() -> None:
    entered, release = threading.Event(), threading.Event()
    names: list[str] = []

    def block() -> None:
        names.append(threading.current_thread().name)
        entered.set()
        release.wait(WAIT)

    fired_by_timer(block, 1e-9)  # due a nanosecond after it is made: the first tries are late
    try:
        assert entered.wait(WAIT)
    finally:
        release.set()
    assert names == ["toolreg-callbacks"]


def error_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "toolreg" and r.levelno >= logging.ERROR]


def echo(args: Any, ctx: ToolContext) -> Any:
    return dict(args)


# == Field conditions ============================================================================

# -- 1. fork ------------------------------------------------------------------------------------

_FORK_PRELUDE = """
    import os, select, sys, time
    from concurrent.futures import ThreadPoolExecutor
    from toolreg import Tool, ToolRegistry

    def wait_for_child(pid):
        fd = os.pidfd_open(pid)  # readable once the child has exited
        try:
            exited = select.select([fd], [], [], 10)[0]
        finally:
            os.close(fd)
        if not exited:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return "hung"
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
"""


def test_forked_child_can_use_an_inherited_registry() -> None:
    result = run_python(
        _FORK_PRELUDE
        + """
    registry = ToolRegistry(max_workers=2)
    registry.register(Tool("echo", lambda args, ctx: args["x"]))
    assert registry.execute("echo", {"x": 1}).value == 1  # the pool has live workers now
    pid = os.fork()
    if pid == 0:
        result = registry.execute("echo", {"x": 2})
        os._exit(0 if result.ok and result.value == 2 else 3)
    print("child:", wait_for_child(pid))
    print("parent:", registry.execute("echo", {"x": 3}).value)
    registry.close()
    """
    )
    assert result.stdout.split("\n")[:2] == ["child: 0", "parent: 3"], result


def test_an_after_fork_hook_runs_in_the_child_only_while_its_object_lives() -> None:
    # The hook holds its object weakly: registered for the life of the process, it must not
    # keep the object alive, and once the object is gone it does nothing.
    result = run_python(
        _FORK_PRELUDE
        + """
    import gc
    from toolreg._jobs import after_fork_in_child

    class Owner:
        def __init__(self, label):
            self.label = label
        def after_fork(self):
            print("ran", self.label, flush=True)

    kept, dropped = Owner("kept"), Owner("dropped")
    after_fork_in_child(kept.after_fork)
    after_fork_in_child(dropped.after_fork)
    del dropped
    gc.collect()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    print("child:", wait_for_child(pid), flush=True)
    """
    )
    assert result.stdout.split("\n")[:2] == ["ran kept", "child: 0"], result


def test_forked_child_gets_a_clear_error_at_once_from_a_user_executor() -> None:
    result = run_python(
        _FORK_PRELUDE
        + """
    executor = ThreadPoolExecutor(2)
    registry = ToolRegistry(executor=executor)
    registry.register(Tool("echo", lambda args, ctx: args["x"]))
    assert registry.execute("echo", {"x": 1}).value == 1
    pid = os.fork()
    if pid == 0:
        from toolreg import ExecutorRefusedError
        try:
            registry.execute("echo", {"x": 2})
        except ExecutorRefusedError as exc:  # 17.4, B.27: the exact class, a RuntimeError
            os._exit(0 if "fork" in str(exc) and isinstance(exc, RuntimeError) else 4)
        except BaseException:
            os._exit(5)
        os._exit(3)
    print("child:", wait_for_child(pid))
    registry.close()
    executor.shutdown()
    """
    )
    assert result.stdout.split("\n")[:1] == ["child: 0"], result


def test_call_ids_get_a_new_per_process_prefix_after_fork() -> None:
    # 2.1, 17.4. Parent and child continue the same counter after fork(), so their next ids
    # would be equal unless the child's prefix is new; ids from the two must never collide.
    result = run_python(
        _FORK_PRELUDE
        + """
    from toolreg import ToolCall
    registry = ToolRegistry(max_workers=1)
    registry.register(Tool("echo", lambda args, ctx: args))
    before = ToolCall("echo").call_id
    pid = os.fork()
    if pid == 0:
        ids = [ToolCall("echo").call_id, registry.execute("echo").call.call_id]
        print("child:", *ids, flush=True)
        os._exit(0)
    print("child exit:", wait_for_child(pid))
    ids = [ToolCall("echo").call_id, registry.execute("echo").call.call_id]
    print("parent:", before, *ids)
    registry.close()
    """
    )
    lines = dict(row.split(": ", 1) for row in result.stdout.splitlines() if ": " in row)
    assert lines.get("child exit") == "0", result
    before, *parent = lines["parent"].split()
    child = lines["child"].split()
    assert len(set(parent + child + [before])) == 5, result  # all distinct, the child's too

    def prefix(call_id: str) -> str:  # the part every id of one process shares
        return call_id.rstrip("0123456789")

    assert prefix(parent[0]) == prefix(parent[1]) == prefix(before)
    assert prefix(child[0]) == prefix(child[1]) != prefix(before)


def test_a_child_forked_from_another_thread_joins_as_its_main_thread() -> None:
    # The join waits in slices only on the main thread (where a Ctrl-C can land), and reads
    # which thread that is from a value kept at import: a child forked from a worker thread has
    # that thread as its main one, so the value must follow the fork.
    result = run_python(
        _FORK_PRELUDE
        + """
    import threading
    from toolreg import _interrupts
    registry = ToolRegistry(max_workers=1)
    registry.register(Tool("echo", lambda args, ctx: args))
    forked = []

    def fork_here():
        pid = os.fork()
        if pid == 0:
            me = threading.get_ident()
            same = _interrupts.main_thread_ident == me == threading.main_thread().ident
            ok = same and registry.execute("echo").ok
            os._exit(0 if ok else 1)
        forked.append(pid)

    thread = threading.Thread(target=fork_here)
    thread.start()
    thread.join()
    print("child exit:", wait_for_child(forked[0]))
    print("parent main:", _interrupts.main_thread_ident == threading.main_thread().ident)
    registry.close()
    """
    )
    lines = dict(row.split(": ", 1) for row in result.stdout.splitlines() if ": " in row)
    assert lines.get("child exit") == "0", result
    assert lines.get("parent main") == "True", result


# -- 2. interpreter exit --------------------------------------------------------------------------


@pytest.mark.parametrize("daemon", [True, False], ids=["daemon caller", "non-daemon caller"])
def test_interpreter_exit_cancels_a_call_in_flight_joins_it_and_exits(daemon: bool) -> None:
    result = run_python(
        f"""
        import threading
        from toolreg import Tool, ToolRegistry

        registry = ToolRegistry(max_workers=2)
        started = threading.Event()

        def body(args, ctx):
            started.set()
            ctx.token.wait()  # cooperative: returns once the call is cancelled
            print("body stopped", flush=True)

        registry.register(Tool("wait", body))
        threading.Thread(target=lambda: registry.execute("wait"), daemon={daemon}).start()
        assert started.wait(10)
        print("exiting", flush=True)
        """,
        timeout=20,
    )
    assert result.returncode == 0, result
    assert result.stdout.split() == ["exiting", "body", "stopped"], result


def test_interpreter_exit_cancels_a_call_with_the_reason_interpreter_exiting() -> None:
    # 17.5: the reason the body's token carries.
    result = run_python(
        """
        import threading
        from toolreg import Tool, ToolRegistry

        registry = ToolRegistry(max_workers=2)
        started = threading.Event()

        def body(args, ctx):
            started.set()
            ctx.token.wait()
            print("reason:", repr(ctx.token.reason), flush=True)

        registry.register(Tool("wait", body))
        threading.Thread(target=lambda: registry.execute("wait"), daemon=True).start()
        assert started.wait(10)
        """,
        timeout=20,
    )
    assert result.returncode == 0, result
    assert result.stdout.strip() == "reason: 'interpreter exiting'", result


# -- 3. an exception raised by a signal handler during the join --------------------------------


class Alarm(Exception):
    """What the `signal.alarm` + raise idiom raises (TimeoutError in real code)."""


def raise_in_main_thread_when(event: threading.Event, exc_type: type[BaseException]) -> Caller:
    """Once `event` is set and the main thread blocks, make a SIGALRM handler raise there."""
    main = threading.main_thread().ident
    assert main is not None and threading.current_thread() is threading.main_thread()

    def deliver() -> None:
        assert event.wait(WAIT), "the moment to raise never came"
        wait_until_main_thread_blocks()
        signal.pthread_kill(main, signal.SIGALRM)

    def handler(signum: int, frame: object) -> None:
        signal.signal(signal.SIGALRM, signal.SIG_IGN)  # once
        raise exc_type("raised by a signal handler")

    signal.signal(signal.SIGALRM, handler)
    return Caller(deliver, name="sigalrm")


@pytest.mark.parametrize("exc_type", [TimeoutError, RuntimeError, Alarm])
@pytest.mark.parametrize("entry", ["execute", "execute_batch"])
def test_an_exception_from_a_signal_handler_cancels_joins_observes_once_then_propagates(
    registry: ToolRegistry, exc_type: type[BaseException], entry: str
) -> None:
    started, stopped, release = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []
    observed = Observed()

    def body(args: Any, ctx: ToolContext) -> str:
        ctx.token.on_cancel(release.set)
        started.set()
        release.wait(WAIT)  # ends when the call is cancelled (or the test gives up)
        seen.append(ctx.token.cancelled)
        stopped.set()
        return "done"

    registry.register(Tool("wait", body))
    registry.on_result(observed)
    previous = signal.getsignal(signal.SIGALRM)
    sender = raise_in_main_thread_when(started, exc_type)
    try:
        with pytest.raises(exc_type):
            if entry == "execute":
                registry.execute("wait")
            else:
                registry.execute_batch([ToolCall("wait")])
        body_stopped_first = stopped.is_set()
    finally:
        release.set()
        sender.join()
        signal.signal(signal.SIGALRM, previous)
    assert body_stopped_first, "execute raised while the body was still running"
    assert seen == [True]
    assert observed.codes == [ABORTED]


# -- 4. an executor that drops queued work -----------------------------------------------------


@pytest.mark.parametrize("facade", ["sync", "asyncio"])
def test_a_body_the_executor_drops_ends_the_call_at_once(facade: str) -> None:
    executor = ThreadPoolExecutor(max_workers=1)
    free = occupy(executor)  # its only worker is busy
    registry = ToolRegistry(executor=executor)
    ran = Journal()
    registry.register(Tool("t", lambda args, ctx: ran("body ran")))
    observed = Observed()
    registry.on_result(observed)

    def call() -> ToolResult[Any]:
        if facade == "sync":
            return registry.execute("t")

        async def main() -> ToolResult[Any]:
            return await asyncio.wait_for(AsyncToolRegistry(registry).execute("t"), WAIT)

        return asyncio.run(main())

    caller = Caller(call)
    try:
        wait_until(
            lambda: executor._work_queue.qsize() > 0,  # white-box: the work is queued
            "the call's work to be queued on the busy executor",
        )
        executor.shutdown(wait=False, cancel_futures=True)  # drops the queued work
        result = caller.join()
    finally:
        free.set()
        # close() cancels a stuck call, whose cancel callback claims the dropped body: bounded,
        # so that a call stuck some other way cannot hang the suite either.
        Caller(registry.close).done.wait(WAIT)
    # 17.7: "ends a call whose body it dropped at once, as ABORTED_BEFORE_DISPATCH, for sync and
    # awaited calls alike" (TOOL_ERROR is for an executor shut down *before* the hand-off).
    assert result.code == BEFORE
    assert not result.dispatched and ran.entries == []
    assert observed.results == [result]


# -- 5. close() and a garbage-collection finalizer ----------------------------------------------


def test_close_does_not_deadlock_when_a_finalizer_removes_a_hook_registration() -> None:
    result = run_python(
        """
        import gc
        from toolreg import ToolRegistry

        class Holder:
            def __init__(self, registration):
                self.cycle = self  # cyclic garbage: only a collection frees it
                self.registration = registration

            def __del__(self):
                self.registration.remove()  # takes the registry's lock

        for threshold in range(1, 40):  # a collection lands on a different allocation each time
            registry = ToolRegistry(max_workers=1)
            gc.collect()
            gc.set_threshold(threshold)
            Holder(registry.on_result(print))
            registry.close()
            gc.set_threshold(700)
        print("no deadlock")
        """,
        timeout=20,
    )
    assert result.stdout.strip() == "no deadlock", result


# -- 6. the asyncio facade without a running loop -----------------------------------------------


def test_async_execute_without_a_running_loop_raises_and_leaks_no_in_flight_count() -> None:
    registry = ToolRegistry(max_workers=1)
    registry.register(Tool("echo", echo))
    areg = AsyncToolRegistry(registry)
    pending = areg.execute("echo", {"a": 1})
    with pytest.raises(RuntimeError):
        pending.send(None)  # driven outside any event loop
    pending.close()
    closer = Caller(registry.close)
    try:
        closer.join()  # bounded: with the leak, close() waits forever
    finally:
        if not closer.done.is_set():
            # White-box clean-up: count the leaked entries out, close() then ends.
            dispatcher = registry._dispatcher
            for key in list(dispatcher._calls):
                dispatcher.untrack(key)
            closer.done.wait(WAIT)
    assert registry.closed


# == BaseExceptions and hostile objects ========================================================

# -- 7. cancel callbacks raising a BaseException ------------------------------------------------


class Custom(BaseException):
    """A BaseException that is none of the interpreter's own."""


@pytest.mark.parametrize("exc_type", [asyncio.CancelledError, GeneratorExit, Custom])
def test_a_cancel_callback_raising_a_base_exception_is_logged_and_never_escapes(
    exc_type: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    src = CancelSource()
    calls: list[str] = []

    def boom() -> None:
        raise exc_type("from a cancel callback")

    src.token.on_cancel(lambda: calls.append("before"))
    src.token.on_cancel(boom)
    src.token.on_cancel(lambda: calls.append("after"))
    assert src.cancel("stop") is True  # does not raise
    assert calls == ["before", "after"]
    src.token.on_cancel(boom)  # inline, on a cancelled token: does not raise either
    records = error_records(caplog)
    assert len(records) == 2
    assert all(r.exc_info is not None and isinstance(r.exc_info[1], exc_type) for r in records)


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_from_a_cancel_callback_propagates_after_the_other_callbacks(
    exc_type: type[BaseException],
) -> None:
    src = CancelSource()
    calls: list[str] = []

    def interrupt() -> None:
        raise exc_type

    src.token.on_cancel(interrupt)
    src.token.on_cancel(lambda: calls.append("after"))
    with pytest.raises(exc_type):
        src.cancel("stop")
    assert calls == ["after"] and src.token.cancelled
    with pytest.raises(exc_type):
        src.token.on_cancel(interrupt)  # inline: the only callback, so it propagates at once


def _call_in_flight_with_a_raising_cancel_callback(
    registry: ToolRegistry, exc_type: type[BaseException]
) -> Caller:
    """A cooperative call in flight whose token has a callback that raises `exc_type`."""
    started = threading.Event()

    def body(args: Any, ctx: ToolContext) -> None:
        started.set()
        if not ctx.token.wait(WAIT):
            raise RuntimeError("never cancelled")
        ctx.token.raise_if_cancelled()

    def raising() -> None:
        raise exc_type("from a cancel callback")

    def arm(call: ToolCall, token: CancelToken) -> None:
        token.on_cancel(raising)  # on the call's token: close() runs it

    registry.register(Tool("wait", body))
    registry.add_pre_execute(arm)
    caller = Caller(lambda: registry.execute("wait"))
    assert started.wait(WAIT)
    return caller


def test_close_completes_when_a_cancel_callback_raises_cancelled_error() -> None:
    registry = ToolRegistry(max_workers=2)
    caller = _call_in_flight_with_a_raising_cancel_callback(registry, asyncio.CancelledError)
    registry.close()  # does not raise: the callback's error is logged
    assert registry.closed
    assert caller.join().code == ABORTED


def test_close_finishes_closing_before_an_interrupt_from_a_cancel_callback_propagates() -> None:
    registry = ToolRegistry(max_workers=2)
    caller = _call_in_flight_with_a_raising_cancel_callback(registry, SystemExit)
    try:
        with pytest.raises(SystemExit):
            registry.close()
        assert registry.closed, "close() raised before it had waited for the calls"
        assert caller.join().code == ABORTED
    finally:
        Caller(registry.close).done.wait(WAIT)  # bounded clean-up after a failure


# -- 8. render raising a BaseException ----------------------------------------------------------


@pytest.mark.parametrize("exc", [GeneratorExit("render"), Cancelled("render"), Custom("render")])
def test_render_raising_a_base_exception_is_a_tool_error_observed_once(
    registry: ToolRegistry, exc: BaseException
) -> None:
    def render(value: object) -> str:
        raise exc

    observed = Observed()
    registry.on_result(observed)
    registry.register(Tool("t", lambda args, ctx: {"v": 1}, render=render))

    result = registry.execute("t")

    assert (result.ok, result.code) == (False, TOOL_ERROR)
    assert observed.results == [result]


# -- 9. batch callbacks raising a BaseException ------------------------------------------------


@pytest.mark.parametrize("exc_type", [GeneratorExit, Cancelled, Custom])
def test_a_batch_waits_for_every_call_even_if_on_progress_raises_a_base_exception(
    registry: ToolRegistry, exc_type: type[BaseException]
) -> None:
    journal = Journal()
    gate = Gate()
    progressed = threading.Event()

    def body(args: Any, ctx: ToolContext) -> str:
        if args["slow"]:
            gate.hold()
        journal(("body ended", args["slow"]))
        return "done"

    def on_progress(done: int, total: int) -> None:
        progressed.set()
        raise exc_type("from on_progress")

    registry.register(Tool("t", body, concurrency_safe=True))
    calls = [ToolCall("t", {"slow": False}), ToolCall("t", {"slow": True})]
    batch = Caller(lambda: registry.execute_batch(calls, on_progress=on_progress))
    gate.wait_reached()
    assert progressed.wait(WAIT)
    gate.release()
    results = batch.join()
    journal("batch returned")

    assert [r.ok for r in results] == [True, True]
    assert journal.entries[-2:] == [("body ended", True), "batch returned"]


@pytest.mark.parametrize("exc_type", [GeneratorExit, Cancelled, Custom])
def test_a_classifier_raising_a_base_exception_makes_the_call_exclusive(
    registry: ToolRegistry, exc_type: type[BaseException]
) -> None:
    journal = Journal()

    def classify(args: Mapping[str, Any]) -> bool:
        raise exc_type("from the classifier")

    def body(args: Any, ctx: ToolContext) -> None:
        journal(("start", args["n"]))
        journal(("end", args["n"]))

    registry.register(Tool("t", body, concurrency_safe=classify))

    results = registry.execute_batch([ToolCall("t", {"n": 1}), ToolCall("t", {"n": 2})])

    assert [r.ok for r in results] == [True, True]
    assert journal.entries == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]


# -- 10. exceptions whose str() or repr() raises -------------------------------------------------


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception raises")

    def __repr__(self) -> str:
        raise RuntimeError("repr() of this exception raises")


class UnprintableReason(str):
    def __str__(self) -> str:
        raise RuntimeError("str() of this reason raises")


@pytest.mark.parametrize(
    ("where", "code"),
    [
        ("body", TOOL_ERROR),
        ("pre-execute hook", HOOK_ERROR),
        ("around wrapper", HOOK_ERROR),
        ("deny reason", ErrorCode.DENIED),
    ],
)
def test_an_unprintable_exception_or_reason_becomes_the_failed_result_it_would_have_been(
    registry: ToolRegistry, where: str, code: ErrorCode
) -> None:
    def body(args: Any, ctx: ToolContext) -> str:
        if where == "body":
            raise Unprintable
        return "done"

    def pre(call: ToolCall, token: CancelToken) -> Deny | None:
        if where == "pre-execute hook":
            raise Unprintable
        if where == "deny reason":
            return Deny(UnprintableReason("no"))
        return None

    def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        if where == "around wrapper":
            raise Unprintable
        return proceed()

    observed = Observed()
    registry.on_result(observed)
    registry.add_pre_execute(pre)
    registry.add_around(wrapper)
    registry.register(Tool("t", body))

    result = registry.execute("t")

    assert (result.ok, result.code) == (False, code)
    assert type(result.content) is str and result.content.startswith("Error: ")
    assert observed.results == [result]


# -- 11. arguments that raise when read ---------------------------------------------------------


class ItemsRaise(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        raise RuntimeError("items() raises")


class IterationRaises(list):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        raise RuntimeError("__iter__ raises")


class GetitemRaises(Mapping[str, Any]):
    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(["a"])

    def __len__(self) -> int:
        return 1


class ReprRaises:
    def __repr__(self) -> str:
        raise RuntimeError("repr() raises")

    def __hash__(self) -> int:
        return 1


def hostile_arguments() -> dict[str, Any]:
    return {
        "mapping whose items() raises": ItemsRaise(a=1),
        "nested list whose iteration raises": {"a": IterationRaises([1, 2])},
        "mapping whose __getitem__ raises": GetitemRaises(),
        "non-str key with a raising repr": {ReprRaises(): 1},
        "nested non-str key with a raising repr": {"a": {ReprRaises(): 1}},
    }


@pytest.mark.parametrize("kind", sorted(hostile_arguments()))
def test_arguments_that_raise_when_read_are_invalid_args(registry: ToolRegistry, kind: str) -> None:
    observed = Observed()
    registry.on_result(observed)
    registry.register(Tool("t", echo))

    result = registry.execute(ToolCall("t", hostile_arguments()[kind]))

    assert (result.ok, result.code) == (False, INVALID_ARGS)
    assert result.content.startswith("Error: arguments")
    assert result.call.arguments is None
    assert observed.results == [result]


@pytest.mark.parametrize("cancelled", [False, True], ids=["live batch", "cancelled batch"])
@pytest.mark.parametrize("safe", [True, False], ids=["parallel tool", "exclusive tool"])
def test_in_a_batch_unreadable_arguments_cost_only_their_own_call(
    registry: ToolRegistry, safe: bool, cancelled: bool
) -> None:
    observed = Observed()
    registry.on_result(observed)
    registry.register(Tool("t", echo, concurrency_safe=safe))
    batch = [ToolCall("t", {"n": 1}), ToolCall("t", ItemsRaise(a=1)), ToolCall("t", {"n": 3})]
    caller = CancelSource()
    if cancelled:
        caller.cancel("turn over")

    results = registry.execute_batch(batch, token=caller.token)

    if cancelled:
        assert [r.code for r in results] == [BEFORE] * 3
    else:
        assert [r.code for r in results] == [None, INVALID_ARGS, None]
        assert [results[0].value, results[2].value] == [{"n": 1}, {"n": 3}]
    assert results[1].call.arguments is None
    assert sorted(r.call.call_id for r in observed.results) == sorted(c.call_id for c in batch)


# -- 12. malformed results from a wrapper or a post hook ----------------------------------------


def malformed(kind: str, result: ToolResult[Any]) -> ToolResult[Any]:
    failure = ToolResult.failure(result.call, TOOL_ERROR, "made up")
    if kind == "contexts=5":
        return dataclasses.replace(result, contexts=5)  # type: ignore[arg-type]
    if kind == "ok with an error":
        return dataclasses.replace(failure, ok=True)
    if kind == "failed without an error":
        return dataclasses.replace(result, ok=False)
    return dataclasses.replace(failure, error="not a ToolError")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kind", ["contexts=5", "ok with an error", "failed without an error", "error not a ToolError"]
)
@pytest.mark.parametrize("where", ["around wrapper", "post hook"])
def test_a_malformed_result_from_a_wrapper_or_post_hook_fails_closed(
    registry: ToolRegistry, where: str, kind: str
) -> None:
    def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        return malformed(kind, proceed())

    observed = Observed()
    registry.on_result(observed)
    if where == "around wrapper":
        registry.add_around(wrapper)
    else:
        registry.add_post_execute(lambda result, token: malformed(kind, result))
    registry.register(Tool("t", lambda args, ctx: "done"))

    result = registry.execute("t")

    assert (result.ok, result.code) == (False, HOOK_ERROR)
    assert observed.results == [result]


# -- 13. frozen means frozen --------------------------------------------------------------------


def test_a_hook_cannot_change_the_frozen_arguments_even_through_init(
    registry: ToolRegistry,
) -> None:
    attempts: list[str] = []
    received: list[dict[str, Any]] = []

    def tamper(call: ToolCall, token: CancelToken) -> None:
        arguments: Any = call.arguments
        arguments.__init__(q="evil", extra=1)  # a no-op: it was filled at construction
        tampering: list[tuple[str, Callable[[], object]]] = [
            ("__class__", lambda: setattr(arguments, "__class__", dict)),
            ("__setitem__", lambda: arguments.__setitem__("q", "evil")),
            ("update", lambda: arguments.update(q="evil")),
            ("|=", lambda: arguments.__ior__({"q": "evil"})),
            ("setdefault", lambda: arguments.setdefault("new", 1)),
            ("pop", lambda: arguments.pop("q")),
            ("clear", lambda: arguments.clear()),
        ]
        for name, attempt in tampering:
            try:
                attempt()
            except TypeError:
                attempts.append(name)

    def body(args: Any, ctx: ToolContext) -> None:
        received.append(dict(args))
        assert type(args) is FrozenDict

    registry.add_pre_execute(tamper)
    registry.register(Tool("t", body))

    result = registry.execute("t", {"q": "x"})

    assert result.ok
    assert received == [{"q": "x"}]
    assert attempts == ["__class__", "__setitem__", "update", "|=", "setdefault", "pop", "clear"]
    assert result.call.arguments == {"q": "x"}


def test_frozen_arguments_still_copy_and_pickle() -> None:
    frozen = FrozenDict({"a": 1, "b": FrozenDict({"c": (1, 2)})})
    assert copy.copy(frozen) is frozen and copy.deepcopy(frozen) is frozen
    restored = pickle.loads(pickle.dumps(frozen))
    assert restored == frozen and type(restored) is FrozenDict
    assert type(restored["b"]) is FrozenDict
    assert FrozenDict([("x", 1)], y=2) == {"x": 1, "y": 2}  # the dict constructor forms work


# == Validation and policy ======================================================================

# -- 14. overdue_after --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (math.inf, ValueError),
        (10**400, ValueError),
        (True, TypeError),
        ("5", TypeError),
        (0, ValueError),
        (-1.0, ValueError),
        (math.nan, ValueError),
    ],
)
def test_overdue_after_is_validated_at_construction(value: object, error: type) -> None:
    with pytest.raises(error, match="overdue_after"):
        ToolRegistry(max_workers=1, overdue_after=value)  # type: ignore[arg-type]


def test_an_infinite_overdue_after_is_refused_with_a_hint_to_pass_none() -> None:
    with pytest.raises(ValueError, match="None"):
        ToolRegistry(max_workers=1, overdue_after=math.inf)
    with open_registry(max_workers=1, overdue_after=None) as registry:
        registry.register(Tool("echo", echo))
        assert registry.execute("echo", {"a": 1}).ok


# -- 15. every bad number is a ValueError, never OverflowError ----------------------------------

HUGE = 10**400  # an int no float can hold


def _process_run(**options: Any) -> None:
    run(["true"], token=CancelSource().token, **options)


OVERFLOWING: dict[str, Callable[[], object]] = {
    "Tool(timeout=)": lambda: Tool("t", echo, timeout=HUGE),
    "TimeoutPolicy(default=)": lambda: TimeoutPolicy(default=HUGE),
    "RetryPolicy(backoff=)": lambda: RetryPolicy(backoff=HUGE),
    "process.run(timeout=)": lambda: _process_run(timeout=HUGE),
    "process.run(grace=)": lambda: _process_run(grace=HUGE),
    "CancelSource(timeout=)": lambda: CancelSource(timeout=HUGE),
    "deadline(seconds)": lambda: deadline(None, HUGE),
    "ToolRegistry(overdue_after=)": lambda: ToolRegistry(max_workers=1, overdue_after=HUGE),
}


@pytest.mark.parametrize("where", sorted(OVERFLOWING))
def test_a_number_too_large_for_a_float_is_a_value_error_with_the_same_message(
    where: str,
) -> None:
    with pytest.raises(ValueError) as raised:
        OVERFLOWING[where]()
    least = (
        "zero or more"
        if where in ("RetryPolicy(backoff=)", "process.run(grace=)")
        else ("more than zero")
    )
    message = str(raised.value)
    assert f"must be a finite number of seconds, {least}; got an int of 1329 bits" in message


@pytest.mark.parametrize("value", [True, "1", [1]])
def test_a_non_number_of_seconds_is_a_type_error_everywhere(value: Any) -> None:
    makers: list[Callable[[], object]] = [
        lambda: Tool("t", echo, timeout=value),
        lambda: CancelSource(timeout=value),
        lambda: deadline(None, value),
        lambda: _process_run(timeout=value),
        lambda: ToolRegistry(max_workers=1, overdue_after=value),
        lambda: TimeoutPolicy(default=value),
    ]
    for make in makers:
        with pytest.raises(TypeError, match="must be a number of seconds"):
            make()


# -- 15b. every count and seconds argument: TypeError for a wrong type, ValueError for a bad one


def _batch(max_parallel: Any) -> None:
    with open_registry(max_workers=1) as registry:
        registry.register(Tool("echo", echo))
        registry.execute_batch([ToolCall("echo")], max_parallel=max_parallel)


def _awaited_batch(max_parallel: Any) -> None:
    async def main(registry: ToolRegistry) -> None:
        async with AsyncToolRegistry(registry) as facade:
            await facade.execute_batch([ToolCall("echo")], max_parallel=max_parallel)

    with open_registry(max_workers=1) as registry:
        registry.register(Tool("echo", echo))
        asyncio.run(main(registry))


def _result_log(tmp_path: Path, **options: Any) -> None:
    ResultLog(tmp_path / "calls.jsonl", **options).close()


# Each public entry point with a count or a seconds argument: how to call it with `value`, the
# name its errors give, and a value of the right type that is out of range. A bool would be in
# range everywhere (True is 1) if it were taken for a number.
NUMBER_ARGUMENTS: dict[str, tuple[Callable[[Any, Path], object], str, object]] = {
    "WorkerPool(max_workers=)": (lambda v, _: WorkerPool(v), "max_workers", 0),
    "ToolRegistry(max_workers=)": (lambda v, _: ToolRegistry(max_workers=v), "max_workers", 0),
    "ToolRegistry(overdue_after=)": (
        lambda v, _: ToolRegistry(max_workers=1, overdue_after=v),
        "overdue_after",
        0,
    ),
    "execute_batch(max_parallel=)": (lambda v, _: _batch(v), "max_parallel", 0),
    "aio execute_batch(max_parallel=)": (lambda v, _: _awaited_batch(v), "max_parallel", 0),
    "RetryPolicy(attempts=)": (lambda v, _: RetryPolicy(attempts=v), "attempts", 0),
    "RetryPolicy(backoff=)": (lambda v, _: RetryPolicy(backoff=v), "backoff", -1),
    "TimeoutPolicy(default=)": (lambda v, _: TimeoutPolicy(default=v), "default", 0),
    "Tool(timeout=)": (lambda v, _: Tool("t", echo, timeout=v), "timeout", 0),
    "CancelSource(timeout=)": (lambda v, _: CancelSource(timeout=v), "timeout", 0),
    "deadline(seconds)": (lambda v, _: deadline(None, v), "seconds", 0),
    "ResultLog(max_bytes=)": (lambda v, p: _result_log(p, max_bytes=v), "max_bytes", -1),
    "ResultLog(backup_count=)": (
        lambda v, p: _result_log(p, backup_count=v),
        "backup_count",
        -1,
    ),
    "ResultLog(linger=)": (lambda v, p: _result_log(p, linger=v), "linger", 2.0),
    "process.run(timeout=)": (lambda v, _: _process_run(timeout=v), "timeout", 0),
    "process.run(grace=)": (lambda v, _: _process_run(grace=v), "grace", -1),
    "process.run(max_output=)": (lambda v, _: _process_run(max_output=v), "max_output", -1),
}


@pytest.mark.parametrize("where", sorted(NUMBER_ARGUMENTS))
@pytest.mark.parametrize(
    ("case", "error"),
    [("a str", TypeError), ("a bool", TypeError), ("out of range", ValueError)],
)
def test_every_count_and_seconds_argument_raises_type_error_for_a_type_value_error_for_a_value(
    where: str, case: str, error: type[Exception], tmp_path: Path
) -> None:
    make, name, bad = NUMBER_ARGUMENTS[where]
    value = {"a str": "1", "a bool": True, "out of range": bad}[case]
    threads = threading.active_count()
    with pytest.raises(error, match=name):
        make(value, tmp_path)
    assert threading.active_count() == threads  # refused before anything started


@pytest.mark.parametrize("value", [2.0, 1.5])
def test_a_float_is_not_a_count(value: float) -> None:
    with pytest.raises(TypeError, match="max_workers must be an int, got float"):
        WorkerPool(value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="attempts must be an int, got float"):
        RetryPolicy(attempts=value)  # type: ignore[arg-type]


# -- 16. the caller's earlier cancellation wins under an unlinked dispatch.token ----------------


def _unlinked_token_wrapper(unrelated: CancelSource) -> Callable[[Dispatch, Proceed], Any]:
    def replaces_token(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        previous, dispatch.token = dispatch.token, unrelated.token
        try:
            return proceed()
        finally:
            dispatch.token = previous

    return replaces_token


def test_the_callers_earlier_cancel_wins_over_a_deadline_firing_during_cleanup(
    registry: ToolRegistry, clock: ManualClock
) -> None:
    caller = CancelSource()
    started = threading.Event()
    seen: list[object] = []

    def body(args: Any, ctx: ToolContext) -> None:
        started.set()
        if not ctx.token.wait(WAIT):
            raise RuntimeError("never cancelled")
        seen.append(ctx.token.reason)
        clock.advance(1.0)  # cleanup runs past the tool's deadline
        ctx.token.raise_if_cancelled()

    registry.add_around(_unlinked_token_wrapper(CancelSource()))
    registry.add_around(TimeoutPolicy())
    registry.register(Tool("t", body, timeout=0.5))
    call = Caller(lambda: registry.execute("t", token=caller.token))
    assert started.wait(WAIT)
    caller.cancel("user stop")
    result = call.join()

    assert seen == ["user stop"]
    assert (result.code, result.content) == (ABORTED, "Error: tool call aborted")


def test_a_deadline_firing_before_the_callers_cancel_is_still_a_timeout_under_an_unlinked_token(
    registry: ToolRegistry, clock: ManualClock
) -> None:
    caller = CancelSource()

    def body(args: Any, ctx: ToolContext) -> None:
        clock.advance(0.5)
        seen = ctx.token.reason
        caller.cancel("user stop")  # after the deadline fired
        assert seen == TimeoutReason("TOOL_TIMEOUT", 0.5)
        ctx.token.raise_if_cancelled()

    registry.add_around(_unlinked_token_wrapper(CancelSource()))
    registry.add_around(TimeoutPolicy())
    registry.register(Tool("t", body, timeout=0.5))

    result = registry.execute("t", token=caller.token)

    assert result.code == ErrorCode.TOOL_TIMEOUT, result.content


# == Security ==================================================================================

# -- 17. schema references stay inside the schema -----------------------------------------------


@pytest.fixture
def fetches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every URL anything tried to open during the test (nothing is actually fetched)."""
    opened: list[str] = []

    def urlopen(url: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(getattr(url, "full_url", url)))
        raise OSError("the test forbids fetching")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return opened


@pytest.mark.parametrize(
    "ref",
    [
        "http://127.0.0.1:9/schema.json",
        "https://example.com/schema.json#/definitions/a",
        "other.json#/definitions/a",
        "urn:example:schema",
        "FILE",  # a real local file: replaced by its file:// URL
    ],
)
@pytest.mark.parametrize("place", ["root", "property", "inside enum data"])
def test_a_schema_ref_outside_the_schema_is_refused_at_registration_and_nothing_is_fetched(
    registry: ToolRegistry, fetches: list[str], tmp_path: Path, ref: str, place: str
) -> None:
    if ref == "FILE":
        local = tmp_path / "schema.json"
        local.write_text('{"type": "object"}')
        ref = local.as_uri()
    pointer = {"$ref": ref}
    schemas: dict[str, dict[str, Any]] = {
        "root": pointer,
        "property": {"type": "object", "properties": {"a": pointer}},
        "inside enum data": {"type": "object", "properties": {"a": {"enum": [pointer]}}},
    }
    schema = schemas[place]

    with pytest.raises(ValueError, match="schema"):
        registry.register(Tool("t", echo, parameters=schema))

    assert registry.get("t") is None
    assert fetches == []


def test_a_nested_id_cannot_turn_an_inside_ref_into_a_fetch(
    registry: ToolRegistry, fetches: list[str]
) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"$id": "http://127.0.0.1:9/elsewhere", "$ref": "#/definitions/s"}},
    }
    with pytest.raises(ValueError):
        registry.register(Tool("t", echo, parameters=schema))
    assert fetches == []


def test_refs_inside_the_schema_are_enforced_and_advertised_exactly(
    registry: ToolRegistry, fetches: list[str]
) -> None:
    schema = {
        "type": "object",
        "definitions": {"name": {"type": "string", "maxLength": 3}},
        "properties": {"a": {"$ref": "#/definitions/name"}, "self": {"$ref": "#"}},
    }
    registry.register(Tool("t", echo, parameters=schema))

    assert registry.execute("t", {"a": "abc"}).ok
    assert registry.execute("t", {"a": "abcd"}).code == INVALID_ARGS
    assert registry.execute("t", {"a": 1}).code == INVALID_ARGS
    [advertised] = registry.schemas("mcp")
    assert advertised["inputSchema"] == schema
    assert fetches == []


@pytest.mark.parametrize(
    ("where", "looping", "loop"),
    [
        ("parameters", {"$ref": "#/$defs/b"}, "#/$defs/a -> #/$defs/b -> #/$defs/a"),
        ("parameters", {"allOf": [{"$ref": "#/$defs/a"}]}, "#/$defs/a -> #/$defs/a/allOf/0"),
        ("output_schema", {"$ref": "#/$defs/b"}, "#/$defs/a -> #/$defs/b -> #/$defs/a"),
    ],
)
def test_a_ref_loop_that_never_descends_into_the_value_is_refused_at_registration(
    registry: ToolRegistry, where: str, looping: dict[str, Any], loop: str
) -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/a"}},
        "$defs": {"a": looping, "b": {"$ref": "#/$defs/a"}},
    }
    with pytest.raises(ValueError, match="references loop without descending") as refused:
        options: dict[str, Any] = {where: schema}
        registry.register(Tool("t", echo, **options))
    assert loop in str(refused.value)
    assert registry.get("t") is None


def test_a_ref_loop_that_descends_into_the_value_is_a_recursive_schema_and_works(
    registry: ToolRegistry,
) -> None:
    tree = {"type": "object", "properties": {"children": {"items": {"$ref": "#/$defs/tree"}}}}
    schema = {"type": "object", "properties": {"tree": {"$ref": "#/$defs/tree"}}, "$defs": {}}
    schema["$defs"] = {"tree": tree, "unused": {"$ref": "#/$defs/unused"}}  # never reached
    registry.register(Tool("t", echo, parameters=schema))
    assert registry.execute("t", {"tree": {"children": [{"children": []}]}}).ok
    assert registry.execute("t", {"tree": {"children": [1]}}).code == INVALID_ARGS


# -- 18. process.run env=None drops credentials in values too -----------------------------------

SECRET_VALUES = {
    "DATABASE_URL": "postgres://app:hunter2@db.internal/app",
    "REDIS_URL": "redis://:hunter2@cache:6379/0",
    "PIP_EXTRA_INDEX_URL": "https://pypi.org/simple https://u:p@private.example/simple",
}
SECRET_NAMES = {"GITHUB_PAT": "x", "SMTP_PASS": "x", "DB_PWD": "x", "PROXY_AUTH": "x"}
KEPT = {
    "HOME_PAGE": "https://example.com/path?q=1",
    "GIT_REMOTE": "ssh://git@github.com/org/repo",  # a user name, no password
    "TOOLREG_PLAIN": "user@example.com",
}


def test_env_none_drops_url_passwords_and_token_suffixes_and_keeps_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {**SECRET_VALUES, **SECRET_NAMES, **KEPT}.items():
        monkeypatch.setenv(name, value)

    shown = scrubbed_env()
    result = run(["env"], token=CancelSource().token, text=True)

    assert result.stdout is not None  # captured (capture_output=True)
    pairs = (line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    child = {name: value for name, value in pairs}
    for name in (*SECRET_VALUES, *SECRET_NAMES):
        assert name not in shown and name not in child, name
    for name, value in KEPT.items():
        assert shown[name] == value and child[name] == value, name
    assert "PWD" not in os.environ or shown["PWD"] == os.environ["PWD"]  # not a *_PWD suffix


# -- 19. freezing turns subclasses into plain builtins ------------------------------------------


class AlwaysEqual(str):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


class Level(IntEnum):
    HIGH = 3


class Ratio(float):
    pass


def test_a_str_subclass_with_a_hostile_eq_cannot_pass_an_enum_check(
    registry: ToolRegistry,
) -> None:
    ran = Journal()
    registry.register(
        Tool(
            "t",
            lambda args, ctx: ran(args["mode"]),
            parameters={"type": "object", "properties": {"mode": {"enum": ["safe"]}}},
        )
    )

    result = registry.execute("t", {"mode": AlwaysEqual("rm -rf /")})

    assert result.code == INVALID_ARGS
    assert ran.entries == []


def test_str_int_float_subclasses_reach_the_body_as_plain_builtins(
    registry: ToolRegistry,
) -> None:
    received: list[dict[str, Any]] = []
    registry.register(Tool("t", lambda args, ctx: received.append(dict(args))))

    result = registry.execute(
        "t",
        {"s": AlwaysEqual("x"), "i": Level.HIGH, "f": Ratio(0.5), "b": True, "l": [Level.HIGH]},
    )

    assert result.ok
    [args] = received
    assert {key: type(value) for key, value in args.items()} == {
        "s": str,
        "i": int,
        "f": float,
        "b": bool,
        "l": tuple,
    }
    assert args == {"s": "x", "i": 3, "f": 0.5, "b": True, "l": (3,)}
    assert type(args["l"][0]) is int


# == Shared threads ============================================================================

# -- 20. a slow cancel callback never delays another deadline -----------------------------------


def test_a_slow_deadline_callback_does_not_delay_other_deadlines_or_their_callbacks() -> None:
    entered, release = threading.Event(), threading.Event()
    other_ran = threading.Event()
    names: list[str] = []

    def slow() -> None:
        entered.set()
        release.wait(WAIT)

    def note_the_thread() -> None:
        names.append(threading.current_thread().name)
        other_ran.set()

    fired_by_timer(slow)
    try:
        assert entered.wait(WAIT)  # a callback thread is blocked in the slow callback
        other = fired_by_timer(note_the_thread)
        assert other.token.wait(WAIT) and other.timed_out  # fired while the slow one blocks
        assert other_ran.wait(WAIT)  # and its callback ran, on another callback thread
        assert not release.is_set()
    finally:
        release.set()
    assert names == ["toolreg-callbacks"]


def test_job_threads_run_every_job_while_one_job_blocks() -> None:
    jobs = JobThreads("test-jobs", keep=2, limit=4, linger=0.05)
    journal = Journal()
    release = threading.Event()
    all_done = threading.Event()

    def blocker() -> None:
        journal("blocker")
        release.wait(WAIT)

    try:
        jobs.call_soon(blocker)
        wait_until(lambda: journal.entries == ["blocker"], "the blocker to start")
        for n in range(5):
            jobs.call_soon(functools.partial(journal, n))
        jobs.call_soon(all_done.set)
        assert all_done.wait(WAIT)  # while the blocker still blocks
        assert journal.entries[0] == "blocker" and sorted(journal.entries[1:]) == [0, 1, 2, 3, 4]
        assert all(t.daemon for t in threading.enumerate() if t.name == "test-jobs")
    finally:
        release.set()
    # Extra workers leave after `linger`; `keep` of them stay, until close().
    wait_until(
        lambda: sum(t.name == "test-jobs" for t in threading.enumerate()) == 2,
        "the extra workers to leave",
    )
    jobs.close()
    wait_until(
        lambda: not any(t.name == "test-jobs" for t in threading.enumerate()),
        "the workers to leave after close()",
    )


def test_a_job_that_raises_is_logged_and_the_workers_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    jobs = JobThreads("test-raising-jobs")
    done = threading.Event()

    def boom() -> None:
        raise Custom("from a job")

    try:
        jobs.call_soon(boom)
        jobs.call_soon(done.set)
        assert done.wait(WAIT)
        wait_until(lambda: bool(error_records(caplog)), "the job's error to be logged")
        [record] = error_records(caplog)
        assert record.exc_info is not None and isinstance(record.exc_info[1], Custom)
    finally:
        jobs.close()


def test_callback_threads_never_keep_the_interpreter_alive_and_survive_fork() -> None:
    # `fired_by_timer`: a callback registered after its deadline came due would run (and
    # block) in the main thread itself, under load.
    result = run_python(
        f"""
        import os, select, sys, threading, time, warnings
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from _registry_helpers import fired_by_timer

        def ran_on_a_callback_thread():
            ran, names = threading.Event(), []
            fired_by_timer(lambda: (names.append(threading.current_thread().name), ran.set()))
            return ran.wait(10) and names == ["toolreg-callbacks"]

        # In a forked child, deadlines fire and their callbacks run on fresh threads.
        assert ran_on_a_callback_thread()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
            pid = os.fork()
        if pid == 0:
            os._exit(0 if ran_on_a_callback_thread() else 1)
        pidfd = os.pidfd_open(pid)  # readable once the child has exited
        exited = select.select([pidfd], [], [], 15)[0]
        os.close(pidfd)
        if not exited:
            os.kill(pid, 9)  # hung: reap it and say so
        status = os.waitpid(pid, 0)[1]
        print("child", os.waitstatus_to_exitcode(status) if exited else "hung", flush=True)

        # A callback that blocks forever does not keep the interpreter from exiting.
        entered = threading.Event()
        fired_by_timer(lambda: (entered.set(), threading.Event().wait()))
        assert entered.wait(10)
        print("exiting", flush=True)
        """,
        timeout=30,
    )
    assert result.returncode == 0, result
    assert result.stdout.split("\n")[:2] == ["child 0", "exiting"], result
