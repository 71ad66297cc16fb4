"""Tests for toolreg.mcp.mount: upstream MCP servers' tools as registry tools.

Two real upstreams, started by the tests: a toolreg registry served over stdio by `python -m
toolreg mcp mcp_upstream` (its bodies report on a FIFO: `_mcp_upstreams.Fifos`), and the SDK's
own `MCPServer` over streamable HTTP on 127.0.0.1 (in a thread; its tools hand-shake through
Events), once speaking 2026-07-28 and once only the 2025 handshake. Every wait is on a report,
an Event or a result, bounded by `WAIT`; nothing sleeps to order anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("mcp")
pytest.importorskip("uvicorn")

from _mcp_upstreams import (
    WAIT,
    Fifos,
    HttpUpstream,
    children,
    exists,
    http_upstream,
    mount_threads,
    stdio_entry,
)

from toolreg import CancelSource, Deny, ErrorCode, Tool, ToolRegistry
from toolreg.aio import AsyncToolRegistry
from toolreg.mcp import (
    Mount,
    UpstreamError,
    UpstreamToolError,
    UpstreamUnavailable,
    mount,
)

GRACE = 0.2  # cancel_grace of the tests' mounts: every cancelled call waits this long


@pytest.fixture(scope="module")
def stdio(fifos: Fifos) -> Iterator[tuple[ToolRegistry, Mount]]:
    """One registry with the stdio upstream mounted as `up.*`, for the tests that keep it."""
    with ToolRegistry(max_workers=8) as registry:
        mounted = mount(registry, stdio_entry(fifos), prefix="up.", cancel_grace=GRACE)
        yield registry, mounted
        mounted.close()


@pytest.fixture(scope="module", params=["2026-07-28", "2025-11-25"])
def web(request: pytest.FixtureRequest) -> Iterator[HttpUpstream]:
    with http_upstream(legacy=request.param == "2025-11-25") as upstream:
        yield upstream


def wait_for(condition: Any, what: str) -> None:
    """Block on a condition signalled through a registry callback (see the callers)."""
    assert condition.wait(WAIT), f"timed out waiting for {what}"


# -- catalog ---------------------------------------------------------------------------------


def test_mounted_tools_carry_the_upstreams_name_description_schema_title_and_annotations(
    stdio: tuple[ToolRegistry, Mount],
) -> None:
    registry, mounted = stdio
    assert mounted.tools == ("up.add", "up.echo", "up.fails", "up.held", "up.pid", "up.steps")
    schemas = {schema["name"]: schema for schema in registry.schemas("mcp")}
    assert schemas["up.add"] == {
        "name": "up.add",
        "title": "Adder",
        "description": "Add two integers",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
        "annotations": {"readOnlyHint": True, "idempotentHint": True},
    }
    assert "title" not in schemas["up.echo"] and "annotations" not in schemas["up.echo"]
    assert repr(mounted).endswith("tools=6 open>")


def test_names_keeps_only_those_upstream_tools_and_prefix_none_keeps_their_names(
    web: HttpUpstream,
) -> None:
    with ToolRegistry(max_workers=2) as registry:
        with mount(registry, web.url, names=["echo", "missing"]) as mounted:
            assert mounted.tools == ("echo",)
            assert registry.get("echo") is not None and registry.get("slow") is None
            assert registry.get("echo").title == "Echo"  # type: ignore[union-attr]
        assert registry.tools() == ()


# -- calls -----------------------------------------------------------------------------------


def test_success_is_the_structured_content_else_the_text_and_is_error_a_tool_error(
    stdio: tuple[ToolRegistry, Mount],
) -> None:
    registry, _ = stdio
    added = registry.execute("up.add", {"a": 2, "b": 3})
    assert added.ok and added.value == {"sum": 5}
    echoed = registry.execute("up.echo", {"text": "plain"})
    assert echoed.ok and echoed.value == "plain"
    failed = registry.execute("up.fails")
    assert failed.error is not None and failed.error.code == ErrorCode.TOOL_ERROR
    assert isinstance(failed.error.exception, UpstreamToolError)
    assert str(failed.error.exception) == "Error: ValueError: nope, said the upstream"
    assert failed.dispatched


def test_the_pipeline_runs_on_the_callers_side_before_anything_is_sent(web: HttpUpstream) -> None:
    start = len(web.calls)
    with ToolRegistry(max_workers=2) as registry, mount(registry, web.url, prefix="w."):
        seen: list[str] = []
        registry.on_result(lambda result: seen.append(result.call.name))
        with registry.add_pre_execute(lambda call, token: Deny("not today")):
            denied = registry.execute("w.echo", {"text": "x"})
        invalid = registry.execute("w.echo", {"text": 3})  # the upstream's schema, checked here
        stopped = CancelSource()
        stopped.cancel("before it began")
        pre_aborted = registry.execute("w.echo", {"text": "x"}, token=stopped.token)
        before = web.calls[start:]
        echoed = registry.execute("w.echo", {"text": "x"})
    assert denied.error is not None and denied.error.code == ErrorCode.DENIED
    assert invalid.error is not None and invalid.error.code == ErrorCode.INVALID_ARGS
    assert pre_aborted.error is not None and pre_aborted.error.code == ErrorCode.ABORTED
    assert before == []  # neither the denied, the invalid nor the aborted call was sent
    assert echoed.value == {"text": "x"} and web.calls[start:] == ["echo"]
    assert seen == ["w.echo"] * 4


def test_a_protocol_error_answer_is_an_upstream_error_with_its_code(
    stdio: tuple[ToolRegistry, Mount],
) -> None:
    registry, mounted = stdio
    # A registration naming a tool the upstream does not have, as after it dropped one
    # without saying so; toolreg answers that with the protocol error -32602.
    body = mounted._body("no_such_tool")  # white-box: the body a listing would register
    with registry.register(Tool("up.ghost", body)):
        ghost = registry.execute("up.ghost")
    assert ghost.error is not None and ghost.error.code == ErrorCode.TOOL_ERROR
    error = ghost.error.exception
    assert type(error) is UpstreamError and error.code == -32602
    assert "unknown tool 'no_such_tool'" in str(error)


# -- cancellation ----------------------------------------------------------------------------


def test_a_callers_cancel_reaches_the_upstream_body_with_its_reason_then_the_call_aborts(
    stdio: tuple[ToolRegistry, Mount], fifos: Fifos
) -> None:
    registry, _ = stdio
    source = CancelSource()
    results = []
    caller = threading.Thread(
        target=lambda: results.append(registry.execute("up.held", token=source.token))
    )
    caller.start()
    fifos.expect("STARTED")
    source.cancel("user hit stop")
    cancelled_at = time.monotonic()
    reason = fifos.expect("CANCELLED")
    caller.join(WAIT)
    waited = time.monotonic() - cancelled_at
    (result,) = results
    assert reason.startswith("MCP request ") and reason.endswith(
        "cancelled by the client: user hit stop"
    )
    assert result.error is not None and result.error.code == ErrorCode.ABORTED
    assert result.dispatched
    assert waited >= GRACE  # a spec-abiding upstream never answers: the grace runs out


def test_a_cancel_names_its_own_request_among_concurrent_calls_on_one_connection(
    stdio: tuple[ToolRegistry, Mount], fifos: Fifos
) -> None:
    registry, _ = stdio
    first, second = CancelSource(), CancelSource()
    results: dict[str, Any] = {}

    def call(name: str, source: CancelSource) -> None:
        results[name] = registry.execute("up.held", token=source.token)

    threads = [
        threading.Thread(target=call, args=("first", first)),
        threading.Thread(target=call, args=("second", second)),
    ]
    for thread in threads:
        thread.start()
    started = {fifos.expect("STARTED").split()[0], fifos.expect("STARTED").split()[0]}
    second.cancel("only the second")
    assert fifos.expect("CANCELLED").endswith("cancelled by the client: only the second")
    threads[1].join(WAIT)
    assert results["second"].error.code == ErrorCode.ABORTED
    assert "first" not in results  # its body still runs: the cancel named the other request
    first.cancel("now the first")
    assert fifos.expect("CANCELLED").endswith("cancelled by the client: now the first")
    threads[0].join(WAIT)
    assert results["first"].error.code == ErrorCode.ABORTED
    assert len(started) == 2  # two requests, two upstream call ids


def test_the_mount_token_cancels_every_call_made_through_the_mount(
    web: HttpUpstream, request: pytest.FixtureRequest
) -> None:
    session = CancelSource()
    cancels = len(web.cancels)
    with (
        ToolRegistry(max_workers=2) as registry,
        mount(registry, web.url, token=session.token, cancel_grace=GRACE),
    ):
        web.started.clear()
        web.cancelled.clear()
        results = []
        caller = threading.Thread(target=lambda: results.append(registry.execute("slow")))
        caller.start()
        assert web.started.wait(WAIT)
        session.cancel("the session ended")
        assert web.cancelled.wait(WAIT)  # the upstream's own tool saw its cancellation
        caller.join(WAIT)
        later = registry.execute("echo", {"text": "x"})
    (result,) = results
    # Not the caller's cancellation: a failure that says what happened, not ABORTED.
    assert result.error is not None and result.error.code == ErrorCode.TOOL_ERROR
    assert isinstance(result.error.exception, UpstreamUnavailable)
    assert "the call was cancelled: the session ended" in result.error.message
    assert later.error is not None and "the session ended" in later.error.message
    assert "echo" not in web.calls[-1:]  # the later call was never sent
    if request.node.callspec.params["web"] == "2025-11-25":  # one cancel, with our reason
        assert web.cancels[cancels:] == ["the session ended"]
    else:  # 2026-07-28 over HTTP: the cancel is the closing of the request's stream
        assert web.cancels[cancels:] == []


@pytest.mark.stress
def test_a_call_under_a_cancelled_mount_token_is_never_sent_however_threads_interleave(
    fast_thread_switching: None,
) -> None:
    session = CancelSource()
    session.cancel("over")
    with (
        http_upstream() as upstream,
        ToolRegistry(max_workers=2) as registry,
        mount(registry, upstream.url, token=session.token),
    ):
        results = [registry.execute("echo", {"text": "x"}) for _ in range(100)]
    assert upstream.calls == []
    assert all(r.error is not None and "cancelled: over" in r.error.message for r in results)


def test_upstream_progress_reaches_report_progress_on_the_bodys_thread(
    stdio: tuple[ToolRegistry, Mount], fifos: Fifos
) -> None:
    registry, _ = stdio
    updates: list[tuple[float, float | None, str | None, str]] = []
    arrived = threading.Event()

    def progress(update: Any) -> None:
        updates.append(
            (update.progress, update.total, update.message, threading.current_thread().name)
        )
        if update.progress == 3:
            arrived.set()

    results = []
    caller = threading.Thread(
        target=lambda: results.append(registry.execute("up.steps", progress=progress))
    )
    caller.start()
    fifos.expect("STEPPED")
    wait_for(arrived, "progress 3")
    fifos.release()
    caller.join(WAIT)
    assert results[0].value == "stepped"
    assert [update[:3] for update in updates][-1] == (3, 3, "step 3")
    assert [update[0] for update in updates] == sorted({update[0] for update in updates})
    assert all(update[3].startswith("toolreg") for update in updates)  # a registry worker
    assert not any(update[3] == "toolreg-mcp-mount" for update in updates)


def test_an_awaited_call_through_toolreg_aio_runs_and_its_task_cancel_aborts_it(
    web: HttpUpstream,
) -> None:
    async def main(registry: ToolRegistry) -> tuple[Any, Any]:
        areg = AsyncToolRegistry(registry)
        echoed = await areg.execute("w.echo", {"text": "awaited"})
        web.started.clear()
        web.cancelled.clear()
        task = asyncio.ensure_future(areg.execute("w.slow"))
        await asyncio.get_running_loop().run_in_executor(None, web.started.wait, WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return echoed, await areg.execute("w.echo", {"text": "after"})

    with (
        ToolRegistry(max_workers=2) as registry,
        mount(registry, web.url, prefix="w.", cancel_grace=GRACE),
    ):
        observed: list[Any] = []
        registry.on_result(observed.append)
        echoed, after = asyncio.run(main(registry))
    assert echoed.value == {"text": "awaited"} and after.value == {"text": "after"}
    assert web.cancelled.wait(WAIT)  # the upstream's own tool saw its cancellation
    assert [result.error.code if result.error else None for result in observed] == [
        None,
        ErrorCode.ABORTED,
        None,
    ]


def test_the_wire_records_each_calls_request_id_and_drops_only_a_duplicate_cancel() -> None:
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    from toolreg.mcp._wire import CURRENT_CALL, OWN_CANCEL, Outbound  # white-box: the seam

    class Call:
        request_id: Any = None

    class Sink:
        def __init__(self) -> None:
            self.sent: list[Any] = []

        async def send(self, item: SessionMessage) -> None:
            self.sent.append(item.message)

    def cancel(request_id: int, reason: str) -> SessionMessage:
        params = {"requestId": request_id, "reason": reason}
        message = types.JSONRPCNotification(
            jsonrpc="2.0", method="notifications/cancelled", params=params
        )
        return SessionMessage(message)

    async def main() -> tuple[Call, list[Any]]:
        sink, call = Sink(), Call()
        wire = Outbound(sink, notified={7})
        CURRENT_CALL.set(call)
        request = types.JSONRPCRequest(
            jsonrpc="2.0", id=7, method="tools/call", params={"name": "x"}
        )
        await wire.send(SessionMessage(request))
        await wire.send(cancel(7, "caller cancelled"))  # the SDK's courtesy cancel: dropped
        await wire.send(cancel(8, "caller cancelled"))  # a request we never told about
        OWN_CANCEL.set(True)
        await wire.send(cancel(7, "user hit stop"))  # ours
        return call, sink.sent

    call, sent = asyncio.run(main())
    assert call.request_id == 7
    reasons = [(m.params["requestId"], m.params["reason"]) for m in sent[1:]]
    assert reasons == [(8, "caller cancelled"), (7, "user hit stop")]


# -- a dead upstream, list changes, closing, starting --------------------------------------


def test_an_upstream_killed_mid_call_fails_the_call_naming_it_and_the_next_call_reconnects(
    fifos: Fifos,
) -> None:
    with (
        ToolRegistry(max_workers=2) as registry,
        mount(registry, stdio_entry(fifos), cancel_grace=GRACE) as mounted,
    ):
        results = []
        caller = threading.Thread(target=lambda: results.append(registry.execute("held")))
        caller.start()
        pid = int(fifos.expect("STARTED").split()[1])
        os.kill(pid, signal.SIGKILL)
        caller.join(WAIT)
        again = registry.execute("pid")
        tools = mounted.tools
    (result,) = results
    assert result.error is not None and result.error.code == ErrorCode.TOOL_ERROR
    assert isinstance(result.error.exception, UpstreamUnavailable)
    assert "MCP upstream " in result.error.message and "mcp_upstream" in result.error.message
    assert "the connection ended during the call" in result.error.message
    assert again.ok and int(str(again.value)) != pid  # a new process
    assert "held" in tools  # listed again on reconnecting
    assert not exists(pid)  # the killed one was reaped


def test_a_list_changed_while_serving_registers_the_new_tool_and_fires_on_tools_changed(
    web: HttpUpstream,
) -> None:
    with ToolRegistry(max_workers=2) as registry:
        fresh = threading.Event()

        def changed() -> None:
            if registry.get("w.fresh") is not None:
                fresh.set()

        registry.on_tools_changed(changed)
        with mount(registry, web.url, prefix="w.", names=["grow", "fresh"]) as mounted:
            before = mounted.tools
            assert registry.execute("w.grow").ok
            wait_for(fresh, "w.fresh to be registered")
            after = mounted.tools
            called = registry.execute("w.fresh")
    assert before == ("w.grow",) and after == ("w.fresh", "w.grow")
    assert called.value == "fresh!"


def test_close_cancels_calls_in_flight_unregisters_and_leaves_no_subprocess_or_thread(
    fifos: Fifos,
) -> None:
    before_children, before_threads = children(), mount_threads()
    with ToolRegistry(max_workers=2) as registry:
        changes = []
        registry.on_tools_changed(lambda: changes.append(len(registry.tools())))
        mounted = mount(registry, stdio_entry(fifos), cancel_grace=GRACE)
        upstream = children() - before_children
        assert len(upstream) == 1 and mount_threads() == before_threads + 1
        results = []
        caller = threading.Thread(target=lambda: results.append(registry.execute("held")))
        caller.start()
        fifos.expect("STARTED")
        mounted.close()
        assert fifos.expect("CANCELLED").endswith("by the client: the mount was closed")
        caller.join(WAIT)
        assert registry.tools() == () and mounted.tools == ()
        mounted.close()  # idempotent
    (pid,) = upstream
    assert not exists(pid)  # stopped and reaped
    assert children() == before_children
    assert mount_threads() == before_threads
    assert changes[-1] == 0
    (result,) = results
    assert result.error is not None and result.error.code == ErrorCode.TOOL_ERROR
    assert "the mount was closed" in result.error.message
    assert repr(mounted).endswith("tools=0 closed>")


@pytest.mark.parametrize(
    "upstream",
    [
        pytest.param([sys.executable, "-c", "import sys; sys.stdin.read()"], id="silent"),
        pytest.param([sys.executable, "-c", "print('not MCP', flush=True)"], id="exits"),
        pytest.param(["/nonexistent/mcp-server"], id="missing"),
        pytest.param("http://127.0.0.1:9/mcp", id="refused"),
    ],
)
def test_a_mount_that_cannot_start_raises_within_its_timeout_and_registers_nothing(
    upstream: Any,
) -> None:
    before = children()
    with ToolRegistry(max_workers=1) as registry:
        started = time.monotonic()
        with pytest.raises(UpstreamUnavailable, match="MCP upstream ") as raised:
            mount(registry, upstream, timeout=0.5)
        took = time.monotonic() - started
        assert registry.tools() == ()
    assert took < 0.5 + 0.5  # the timeout, and the time to say so
    if upstream[0] == sys.executable and "stdin" in upstream[-1]:
        assert "within 0.5s" in str(raised.value)
    for pid in children() - before:  # one still being stopped: its stdin is closed already
        assert _exits(pid), f"child {pid} of a failed mount was left running"


def _exits(pid: int) -> bool:
    """True once the child `pid` has exited (whoever reaps it), within `WAIT`."""

    def wait() -> None:
        with contextlib.suppress(ChildProcessError):  # already reaped
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # blocks; reaps nothing

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(WAIT)
    return not waiter.is_alive()


def test_mount_refuses_bad_arguments_before_anything_starts() -> None:
    threads = threading.active_count()
    with ToolRegistry(max_workers=1) as registry:
        calls: list[tuple[tuple[Any, ...], type[Exception]]] = [
            ((object(), "cmd"), TypeError),
            ((registry, 42), TypeError),
            ((registry, ""), ValueError),
            ((registry, []), ValueError),
            ((registry, {"command": "x", "url": "http://h/mcp"}), ValueError),
            ((registry, {"command": "x", "colour": "red"}), ValueError),
            ((registry, {"url": "ftp://h/mcp"}), ValueError),
            ((registry, {"command": "x", "args": "not a list"}), TypeError),
            ((registry, {"command": "x", "env": {"A": 1}}), TypeError),
            ((registry, {"url": "http://h/mcp", "type": "stdio"}), ValueError),
        ]
        for bad, error in calls:
            with pytest.raises(error):
                mount(*bad)
        keywords: list[tuple[dict[str, Any], type[Exception]]] = [
            ({"prefix": "bad prefix"}, ValueError),
            ({"prefix": 3}, TypeError),
            ({"names": "echo"}, TypeError),
            ({"names": [1]}, TypeError),
            ({"token": CancelSource()}, TypeError),
            ({"cancel_grace": -1}, ValueError),
            ({"cancel_grace": True}, TypeError),
            ({"cancel_grace": "1"}, TypeError),
            ({"timeout": True}, TypeError),
            ({"timeout": 0}, ValueError),
            ({"timeout": float("inf")}, ValueError),
        ]
        for options, error in keywords:
            with pytest.raises(error):
                mount(registry, "cmd", **options)
    assert threading.active_count() <= threads  # nothing was started


def test_a_name_already_registered_is_a_value_error_at_mount_and_nothing_stays(
    web: HttpUpstream,
) -> None:
    with ToolRegistry(max_workers=1) as registry:
        registry.tool(lambda args, ctx: "mine", name="echo")
        threads = mount_threads()
        with pytest.raises(
            ValueError, match=r"'echo' is already registered \(give mount\(\) a prefix"
        ):
            mount(registry, web.url)
        assert [tool.name for tool in registry.tools()] == ["echo"]
        assert mount_threads() == threads


# -- stress ----------------------------------------------------------------------------------


@pytest.mark.stress
def test_many_threads_calling_and_cancelling_at_random_all_settle_correctly() -> None:
    rng = random.Random(38)
    with (
        http_upstream() as upstream,
        ToolRegistry(max_workers=16) as registry,
        mount(registry, upstream.url, cancel_grace=0.05) as mounted,
    ):
        results: list[tuple[bool, Any]] = []
        lock = threading.Lock()

        def caller(seed: int) -> None:
            own = random.Random(seed)
            for _ in range(6):
                source = CancelSource()
                cancel_after = own.choice([None, 0.0, 0.001, 0.005])
                if cancel_after is not None:
                    threading.Timer(cancel_after, source.cancel, ("random",)).start()
                result = registry.execute("echo", {"text": "x"}, token=source.token)
                with lock:
                    results.append((cancel_after is not None, result))

        threads = [threading.Thread(target=caller, args=(rng.random(),)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert mounted.tools == ("echo", "grow", "slow", "steps")
    assert len(results) == 48
    for cancelled, result in results:
        if result.ok:
            assert result.value == {"text": "x"}
        else:  # only a cancelled call may fail, and only as a cancellation
            assert cancelled, result
            assert result.error.code in (ErrorCode.ABORTED, ErrorCode.ABORTED_BEFORE_DISPATCH)
