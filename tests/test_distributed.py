"""`toolreg.distributed`: tool bodies on a Dask cluster, under the contract (docs/contract.md, 14).

Two `LocalCluster`s, started here and shared by the module: one of threads (the scheduler and a
worker in this process) and one of processes (for pickling and for killing a worker), each one
worker with two threads. The bodies live in `_dask_bodies`, which the workers import; test and
bodies hand over through `distributed.Event`s (never sleeps), and every wait is bounded. After
each test, nothing of its calls stays on the scheduler or the workers: no task, no board
record (checked by the `remote` fixture).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import pickle
import random
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

distributed = pytest.importorskip("distributed")

import _dask_bodies as bodies  # noqa: E402
from _registry_helpers import (  # noqa: E402
    ABORTED,
    BEFORE,
    WAIT,
    Caller,
    Observed,
    default_sigint,
    send_ctrl_c_when,
    wait_until,
)
from distributed import Client, Event, LocalCluster  # noqa: E402

from toolreg import (  # noqa: E402
    CancelSource,
    ErrorCode,
    RetryPolicy,
    TimeoutPolicy,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
)
from toolreg._cancel import manual_clock  # noqa: E402
from toolreg.aio import AsyncToolRegistry  # noqa: E402
from toolreg.distributed import (  # noqa: E402
    DaskBackend,
    RemoteContext,
    RemoteToolError,
    RemoteTraceback,
    RemoteWorkerLost,
)

KINDS = ["threads", "processes"]


# -- clusters and the per-test set-up -----------------------------------------------------------


def _start(processes: bool) -> tuple[LocalCluster, Client]:
    cluster = LocalCluster(
        n_workers=1,
        threads_per_worker=2,
        processes=processes,
        dashboard_address=":0",  # a free port: other clusters may run on this machine
    )
    return cluster, Client(cluster)


@pytest.fixture(scope="module")
def threads_client() -> Iterator[Client]:
    cluster, client = _start(processes=False)
    with cluster, client:
        yield client


@pytest.fixture(scope="module")
def processes_client() -> Iterator[Client]:
    cluster, client = _start(processes=True)
    with cluster, client:
        yield client


@pytest.fixture(params=KINDS)
def client(request: pytest.FixtureRequest) -> Client:
    kind: str = request.param
    found: Client = request.getfixturevalue(f"{kind}_client")
    return found


class Remote:
    """A registry, a backend on `client`, an observer, and the test's own Events."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.backend = DaskBackend(client)
        self.registry = ToolRegistry(max_workers=4)
        self.observed = Observed()
        self.registry.on_result(self.observed)
        self._events: list[str] = []

    def tool(self, fn: Callable[..., Any], name: str | None = None, **options: Any) -> None:
        self.registry.tool(name=name or fn.__name__, **options)(self.backend.remote(fn))

    def event(self, what: str) -> str:
        """A fresh Event name for this test (cleared when the test ends)."""
        name = f"{what}-{uuid.uuid4().hex}"
        self._events.append(name)
        return name

    def wait(self, name: str) -> None:
        assert Event(name, client=self.client).wait(WAIT), f"event {name} never came"

    def is_set(self, name: str) -> bool:
        return bool(Event(name, client=self.client).is_set())

    def set(self, name: str) -> None:
        Event(name, client=self.client).set()

    def close(self) -> None:
        for name in self._events:
            Event(name, client=self.client).clear()
        self.registry.close()
        self.backend.close()


def scheduler_tasks(client: Client, prefix: str = "toolreg-") -> dict[str, Any]:
    """The scheduler's tasks whose key starts with `prefix`: key -> (state, worker or None)."""

    def read(dask_scheduler: Any) -> dict[str, Any]:
        return {
            key: (task.state, task.processing_on and task.processing_on.address)
            for key, task in dask_scheduler.tasks.items()
            if str(key).startswith(prefix)
        }

    found: dict[str, Any] = client.run_on_scheduler(read)
    return found


def worker_task_count(client: Client) -> int:
    def read(dask_worker: Any) -> int:
        return len(dask_worker.state.tasks)

    counts: dict[str, int] = client.run(read)
    return sum(counts.values())


def settled(client: Client, backend: DaskBackend) -> bool:
    """Nothing of the calls left: no toolreg task or record, no task held by a worker."""
    return (
        not scheduler_tasks(client)
        and backend.board_state()["records"] == 0
        and worker_task_count(client) == 0
    )


@pytest.fixture
def remote(client: Client) -> Iterator[Remote]:
    setup = Remote(client)
    try:
        yield setup
        wait_until(lambda: settled(client, setup.backend), "the calls' tasks and records to go")
    finally:
        setup.close()


@pytest.fixture
def threads_remote(threads_client: Client) -> Iterator[Remote]:
    setup = Remote(threads_client)
    try:
        yield setup
        wait_until(lambda: settled(threads_client, setup.backend), "the calls to leave nothing")
    finally:
        setup.close()


@pytest.fixture
def processes_remote(processes_client: Client) -> Iterator[Remote]:
    setup = Remote(processes_client)
    try:
        yield setup
        wait_until(lambda: settled(processes_client, setup.backend), "the calls to leave nothing")
    finally:
        setup.close()


# -- results --------------------------------------------------------------------------------------


def test_a_remote_call_returns_the_body_value(remote: Remote) -> None:
    remote.tool(bodies.add)
    result = remote.registry.execute("add", {"a": 2, "b": 3})
    assert result.ok and result.value == 5 and result.content == "5"
    assert result.dispatched
    assert remote.observed.results == [result]


def test_a_remote_exception_is_a_tool_error_with_the_remote_traceback(remote: Remote) -> None:
    remote.tool(bodies.fail)
    result = remote.registry.execute("fail", {"what": "here"})
    assert result.code == ErrorCode.TOOL_ERROR and result.dispatched
    assert result.error is not None and result.error.message == "ValueError: bad input here"
    # 14.7: the remote exception itself, rebuilt on the caller, not a wrapper of it.
    assert type(result.error.exception) is ValueError
    assert result.error.exception.args == ("bad input here",)
    cause = result.error.exception.__cause__
    assert isinstance(cause, RemoteTraceback) and "_dask_bodies.py" in cause.text


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (bodies.lock_value, "_thread.lock"),
        (bodies.lock_error, "LockedError"),
        (bodies.two_part_error, "TwoPartError"),
        (bodies.lock_context, "_thread.lock"),
    ],
)
def test_what_cannot_be_pickled_is_a_tool_error_naming_its_type(
    remote: Remote, body: Callable[..., Any], named: str
) -> None:
    remote.tool(body, name="unpicklable")
    result = remote.registry.execute("unpicklable")
    assert result.code == ErrorCode.TOOL_ERROR and result.dispatched
    assert result.error is not None and named in result.error.message
    assert isinstance(result.error.exception, RemoteToolError)
    if body is bodies.lock_context:
        assert result.contexts == ({"kept": True},)  # the contexts that pickled are kept


def test_a_body_that_cannot_be_pickled_is_a_tool_error(threads_remote: Remote) -> None:
    lock = threading.Lock()

    def holds_a_lock(args: Any, ctx: Any) -> bool:
        return lock.locked()

    threads_remote.tool(holds_a_lock)
    result = threads_remote.registry.execute("holds_a_lock")
    assert result.code == ErrorCode.TOOL_ERROR
    assert result.error is not None and "cannot be pickled" in result.error.message


def test_progress_reaches_the_callers_callback_on_the_joining_thread(remote: Remote) -> None:
    remote.tool(bodies.report)
    seen: list[tuple[float, float | None, str | None, int]] = []

    def progress(update: Any) -> None:
        seen.append((update.progress, update.total, update.message, threading.get_ident()))

    result = remote.registry.execute("report", progress=progress)
    assert result.ok
    assert seen, "no progress arrived"
    values = [entry[0] for entry in seen]
    assert values == sorted(set(values)) and values[-1] == 3  # increasing, the last one kept
    assert {entry[3] for entry in seen} == {threading.get_ident()}


def test_a_remote_context_refuses_nested_calls_and_pickling(remote: Remote) -> None:
    remote.tool(bodies.nested)
    remote.tool(bodies.pickled_context)
    nested = remote.registry.execute("nested")
    assert nested.ok and nested.value is not None
    assert nested.value.startswith("RuntimeError: ctx.execute() is not available")
    pickled = remote.registry.execute("pickled_context")
    assert pickled.ok and pickled.value is not None
    assert "RemoteContext cannot be pickled" in pickled.value


# -- cancellation ---------------------------------------------------------------------------------


def test_a_call_cancelled_while_queued_on_a_busy_worker_returns_at_once_and_never_starts(
    remote: Remote,
) -> None:
    remote.tool(bodies.hold)
    remote.tool(bodies.mark, name="queued")
    release = remote.event("release")
    blockers = []
    for n in range(2):  # both worker threads
        args = {"started": remote.event(f"hold{n}"), "release": release}
        blockers.append(Caller(functools.partial(remote.registry.execute, "hold", args)))
        remote.wait(args["started"])
    queued_started = remote.event("queued")
    caller = CancelSource()
    queued = Caller(
        lambda: remote.registry.execute("queued", {"started": queued_started}, token=caller.token)
    )

    # The worker holds the task already (Dask sends a little more than it has threads for).
    def on_the_worker() -> bool:
        tasks = scheduler_tasks(remote.client, "toolreg-queued")
        return any(worker for _, worker in tasks.values())

    wait_until(on_the_worker, "the queued task to reach the worker")
    caller.cancel("not needed")
    result: ToolResult[Any] = queued.join()
    assert result.code == BEFORE and not result.dispatched
    assert not any(blocker.done.is_set() for blocker in blockers)  # every thread still busy
    remote.set(release)
    assert [blocker.join().value for blocker in blockers] == ["released", "released"]
    wait_until(lambda: settled(remote.client, remote.backend), "the worker to drop the task")
    assert not remote.is_set(queued_started)  # the worker's copy of the task was refused


def test_grouped_calls_cancelled_at_random_moments_keep_the_contract(remote: Remote) -> None:
    """Many callers at once, so their messages travel in groups, each cancelled after a random
    pause (or not at all): a call refused before its body started never starts on a worker,
    and every other call ran its body and reports it."""
    remote.tool(bodies.mark, concurrency_safe=True)
    seed = random.randrange(2**32)
    chooser = random.Random(seed)
    calls = 24
    started = [remote.event(f"started{n}") for n in range(calls)]
    sources = [CancelSource() for _ in range(calls)]
    pauses = [chooser.choice([None, 0.0, 0.001, 0.003, 0.01]) for _ in range(calls)]
    results: list[ToolResult[Any] | None] = [None] * calls

    def call(index: int) -> None:
        args = {"started": started[index]}
        results[index] = remote.registry.execute("mark", args, token=sources[index].token)

    def cancel(index: int) -> None:
        pause = pauses[index]
        if pause is not None:
            threading.Event().wait(pause)  # a random moment, not a handshake
            sources[index].cancel("random")

    threads = [threading.Thread(target=call, args=(n,)) for n in range(calls)]
    threads += [threading.Thread(target=cancel, args=(n,)) for n in range(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert not any(thread.is_alive() for thread in threads), f"seed {seed}"
    for index, result in enumerate(results):
        assert result is not None, f"seed {seed}"
        if result.code == BEFORE:
            assert not result.dispatched and not remote.is_set(started[index]), f"seed {seed}"
        else:
            assert result.dispatched and remote.is_set(started[index]), f"seed {seed}: {result}"
            assert result.ok or result.code == ABORTED, f"seed {seed}: {result}"
            assert result.ok or pauses[index] is not None, f"seed {seed}: {result}"


def test_cancel_mid_body_reaches_the_body_with_its_reason_and_the_caller_waits(
    remote: Remote,
) -> None:
    remote.tool(bodies.wait_for_cancel)
    started, saw, release = remote.event("started"), remote.event("saw"), remote.event("release")
    caller = CancelSource()
    args = {"started": started, "saw": saw, "release": release}
    call = Caller(lambda: remote.registry.execute("wait_for_cancel", args, token=caller.token))
    remote.wait(started)
    caller.cancel("user pressed stop")
    remote.wait(saw)  # the body saw the cancellation and is still running
    assert call.still_blocked()
    remote.set(release)
    result: ToolResult[Any] = call.join()
    assert result.code == ABORTED and result.dispatched
    seen = {"cancelled": True, "reason": "user pressed stop", "timeout": False}
    assert result.contexts == (seen,)


def test_an_uncooperative_remote_body_is_joined(remote: Remote) -> None:
    remote.tool(bodies.ignore_token)
    started, release = remote.event("started"), remote.event("release")
    caller = CancelSource()
    args = {"started": started, "release": release}
    call = Caller(lambda: remote.registry.execute("ignore_token", args, token=caller.token))
    remote.wait(started)
    caller.cancel("stop")
    assert call.still_blocked(0.2)
    remote.set(release)
    result: ToolResult[Any] = call.join()
    assert result.code == ABORTED and result.dispatched  # its late success is overtaken


def test_a_timeout_policy_deadline_reaches_the_remote_body_as_tool_timeout(
    remote: Remote,
) -> None:
    remote.registry.add_around(TimeoutPolicy())
    remote.tool(bodies.wait_for_cancel, timeout=5.0)
    started = remote.event("started")
    with manual_clock() as clock:  # the deadline fires when the test says, once the body runs
        call = Caller(lambda: remote.registry.execute("wait_for_cancel", {"started": started}))
        remote.wait(started)
        clock.advance(5.0)
        result: ToolResult[Any] = call.join()
    assert result.code == ErrorCode.TOOL_TIMEOUT and result.dispatched
    assert result.contexts == (
        {"cancelled": True, "reason": "TOOL_TIMEOUT: timed out after 5s", "timeout": True},
    )


def test_a_pre_aborted_direct_call_runs_the_body_with_a_cancelled_token(remote: Remote) -> None:
    remote.tool(bodies.token_state)
    caller = CancelSource()
    caller.cancel("cancelled before the call")
    result = remote.registry.execute("token_state", token=caller.token)
    assert result.ok and result.dispatched  # the body's own outcome stands
    assert result.value == [True, "cancelled before the call"]
    model = remote.registry.execute("token_state", token=caller.token, start_if_cancelled=False)
    assert model.code == BEFORE and not model.dispatched


def test_each_retry_attempt_is_a_task_with_a_fresh_key(remote: Remote) -> None:
    remote.registry.add_around(RetryPolicy(attempts=3, backoff=0))
    attempts: list[ToolResult[Any]] = []

    def record(dispatch: Any, proceed: Callable[[], ToolResult[Any]]) -> ToolResult[Any]:
        result = proceed()
        attempts.append(result)
        return result

    remote.registry.add_around(record)  # inside the retry: sees every attempt
    remote.tool(bodies.flaky)
    prefix = remote.event("flaky")
    for attempt in range(2):
        remote._events.append(f"{prefix}-{attempt}")
    result = remote.registry.execute("flaky", {"failures": 2, "prefix": prefix})
    assert result.ok
    last_key = cast(str, result.value)  # flaky returns its task's key
    keys = [str(a.error.exception) for a in attempts[:2] if a.error is not None] + [last_key]
    assert len(attempts) == 3 and len(set(keys)) == 3
    assert all(key.startswith("toolreg-flaky-") for key in keys)


def test_ctrl_c_cancels_the_remote_call_joins_it_and_re_raises(threads_remote: Remote) -> None:
    remote = threads_remote
    remote.tool(bodies.wait_for_cancel)
    started = remote.event("started")
    in_body = threading.Event()

    def watch() -> None:
        remote.wait(started)
        in_body.set()

    watcher = Caller(watch)
    press = send_ctrl_c_when(in_body)
    with default_sigint(), pytest.raises(KeyboardInterrupt):
        remote.registry.execute("wait_for_cancel", {"started": started})
    press.join()
    watcher.join()
    [result] = remote.observed.results
    assert result.code == ABORTED and result.dispatched  # joined before the re-raise
    assert result.contexts[0]["reason"] == "KeyboardInterrupt"


def test_an_awaited_remote_call_returns_and_its_task_cancel_reaches_the_body(
    remote: Remote,
) -> None:
    remote.tool(bodies.add)
    remote.tool(bodies.wait_for_cancel)
    started = remote.event("started")

    async def scenario() -> ToolResult[Any]:
        areg = AsyncToolRegistry(remote.registry)
        added = await areg.execute("add", {"a": 1, "b": 1})
        assert added.value == 2
        task = asyncio.ensure_future(
            areg.execute("wait_for_cancel", {"started": started}, cancel_reason="task gone")
        )
        await asyncio.to_thread(remote.wait, started)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return remote.observed.results[-1]

    result = asyncio.run(scenario())
    assert result.code == ABORTED and result.dispatched  # settled before the task ended
    assert result.contexts[0]["reason"] == "task gone"


def test_a_batch_runs_concurrency_safe_remote_bodies_side_by_side(remote: Remote) -> None:
    remote.tool(bodies.hold, concurrency_safe=True)
    remote.tool(bodies.add, concurrency_safe=True)
    release = remote.event("release")
    holds = [{"started": remote.event(f"hold{n}"), "release": release} for n in range(2)]
    calls = [ToolCall("hold", args) for args in holds] + [ToolCall("add", {"a": 1, "b": 2})]
    batch = Caller(lambda: remote.registry.execute_batch(calls, max_parallel=2))
    for args in holds:
        remote.wait(args["started"])  # both bodies run at once on the worker's two threads
    remote.set(release)
    results: list[ToolResult[Any]] = batch.join()
    assert [result.value for result in results] == ["released", "released", 3]


def test_closing_the_registry_cancels_and_joins_a_remote_call(threads_remote: Remote) -> None:
    remote = threads_remote
    remote.tool(bodies.wait_for_cancel)
    started = remote.event("started")
    call = Caller(lambda: remote.registry.execute("wait_for_cancel", {"started": started}))
    remote.wait(started)
    remote.registry.close()
    result: ToolResult[Any] = call.join()
    assert result.code == ABORTED and result.dispatched
    assert result.contexts[0]["reason"] == "registry closed"


# -- worker loss ----------------------------------------------------------------------------------


def test_a_worker_killed_mid_body_is_lost_once_and_never_run_again(
    processes_remote: Remote,
) -> None:
    remote = processes_remote
    remote.tool(bodies.die_once_started)
    once, twice, release = remote.event("once"), remote.event("twice"), remote.event("release")
    args = {"once": once, "twice": twice, "release": release}
    call = Caller(lambda: remote.registry.execute("die_once_started", args))
    remote.wait(once)
    remote.client.run(bodies.die, wait=False)
    result: ToolResult[Any] = call.join(timeout=30)
    assert result.code == ErrorCode.TOOL_ERROR and result.dispatched
    assert result.error is not None and "remote worker lost" in result.error.message
    assert isinstance(result.error.exception, RemoteWorkerLost)
    assert remote.observed.results == [result]
    remote.client.wait_for_workers(1, timeout=30)
    assert not remote.is_set(twice)


def test_closing_the_client_during_a_call_is_a_tool_error_saying_so(
    threads_client: Client,
) -> None:
    """14.10: the calls in flight end as `TOOL_ERROR`, their bodies' fate unknown.

    Closing a client releases its keys, so the call's future ends as cancelled: that must read
    as the closed client, not as a Dask task that failed. A client of its own, on the same
    threads cluster, so the module's client stays open.
    """
    assert threads_client.scheduler is not None
    own = Client(threads_client.scheduler.address)
    backend = DaskBackend(own)
    registry = ToolRegistry(max_workers=2)
    observed = Observed()
    registry.on_result(observed)
    registry.tool(name="hold")(backend.remote(bodies.hold))
    args = {"started": f"started-{uuid.uuid4().hex}", "release": f"release-{uuid.uuid4().hex}"}
    try:
        call = Caller(lambda: registry.execute("hold", args))
        assert Event(args["started"], client=threads_client).wait(WAIT)
        own.close()
        result: ToolResult[Any] = call.join()
        assert result.code == ErrorCode.TOOL_ERROR
        assert result.error is not None and isinstance(result.error.exception, RemoteToolError)
        assert "the Dask client was closed during the call" in result.error.message
        assert observed.results == [result]
    finally:
        Event(args["release"], client=threads_client).set()  # the body runs on regardless
        registry.close()
        backend.close()
        own.close()
        with DaskBackend(threads_client) as watcher:
            wait_until(lambda: settled(threads_client, watcher), "the body to end and go")
        for name in args.values():
            Event(name, client=threads_client).clear()


# -- refusals at the boundary ---------------------------------------------------------------------


def test_tokens_sources_and_contexts_refuse_to_pickle_naming_what_they_are() -> None:
    source = CancelSource()
    with pytest.raises(TypeError, match="CancelToken cannot be pickled"):
        pickle.dumps(source.token)
    with pytest.raises(TypeError, match="CancelSource cannot be pickled"):
        pickle.dumps(source)
    with pytest.raises(TypeError, match="ToolContext cannot be pickled"):
        pickle.dumps(_a_tool_context())
    context = RemoteContext.__new__(RemoteContext)
    with pytest.raises(TypeError, match="RemoteContext cannot be pickled"):
        pickle.dumps(context)


def _a_tool_context() -> ToolContext:
    contexts: list[ToolContext] = []

    def body(args: Any, ctx: ToolContext) -> None:
        contexts.append(ctx)

    with ToolRegistry(max_workers=1) as registry:
        registry.tool(name="grab")(body)
        registry.execute("grab")
    return contexts[0]


def test_a_dask_executor_is_refused_pointing_to_toolreg_distributed(
    threads_client: Client,
) -> None:
    with pytest.raises(TypeError, match=r"toolreg\.distributed"):
        ToolRegistry(executor=threads_client.get_executor())


def test_the_backend_refuses_bad_arguments(threads_client: Client) -> None:
    with pytest.raises(TypeError, match=r"distributed\.Client"):
        DaskBackend(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="RetryPolicy"):
        DaskBackend(threads_client, retries=2)
    with pytest.raises(TypeError, match="fresh key"):
        DaskBackend(threads_client, key="mine")
    with pytest.raises(TypeError, match="unknown submit option"):
        DaskBackend(threads_client, n=1)
    with DaskBackend(threads_client, priority=1) as backend:
        with pytest.raises(TypeError, match="async def"):
            backend.remote(_async_body)
        with pytest.raises(TypeError, match="function"):
            backend.remote(42)  # type: ignore[type-var]  # the refusal of a non-function


async def _async_body(args: Any, ctx: Any) -> None:
    return None


def test_closing_the_backend_lets_calls_in_flight_finish_and_fails_new_ones(
    threads_remote: Remote, caplog: pytest.LogCaptureFixture
) -> None:
    remote = threads_remote
    remote.tool(bodies.hold)
    args = {"started": remote.event("started"), "release": remote.event("release")}
    call = Caller(lambda: remote.registry.execute("hold", args))
    remote.wait(args["started"])
    remote.backend.close()
    remote.set(args["release"])
    assert call.join().value == "released"
    later = remote.registry.execute("hold", args)
    assert later.code == ErrorCode.TOOL_ERROR and "closed" in later.content
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_the_remote_function_runs_the_body_when_called_directly(threads_client: Client) -> None:
    with DaskBackend(threads_client) as backend:
        marked = backend.remote(bodies.add)
        assert marked.__name__ == "add" and marked.__wrapped__ is bodies.add  # type: ignore[attr-defined]
        assert marked({"a": 1, "b": 1}, None) == 2


def test_the_board_lets_go_of_an_idle_workers_watch(threads_remote: Remote) -> None:
    threads_remote.tool(bodies.add)
    assert threads_remote.registry.execute("add", {"a": 1, "b": 1}).ok
    wait_until(
        lambda: threads_remote.backend.board_state() == {"records": 0, "watches": 0},
        "the board to empty",
    )


def test_importing_toolreg_never_imports_dask() -> None:
    code = (
        "import sys, toolreg, toolreg.aio, toolreg.log, toolreg.process\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('dask', 'distributed', 'cloudpickle') or m.startswith('toolreg.distributed')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT, check=True
    )
    assert out.stdout.strip() == "[]"


def test_the_public_names_of_toolreg_distributed_are_pinned() -> None:
    import toolreg.distributed

    assert toolreg.distributed.__all__ == [
        "DaskBackend",
        "RemoteContext",
        "RemoteToolError",
        "RemoteTraceback",
        "RemoteWorkerLost",
    ]
    for name in toolreg.distributed.__all__:
        assert getattr(toolreg.distributed, name).__module__ == "toolreg.distributed"
