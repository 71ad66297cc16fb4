"""The caller side of `toolreg.distributed`: `DaskBackend`, and the runner of a remote body.

The registry calls a remote body's runner on the stage thread (see `_body.Runner`). One run is
one attempt (`_Attempt`), a Dask task with a key of its own:

1. Submit `_dask_worker.run_remote` under a fresh key. On the main thread a Ctrl-C is held back
   for the few lines of the hand-over (`deferred_sigint`), so it lands once the task exists.
2. Listen on the body's token: its cancellation sends `toolreg_cancel` to the board, from the
   client's event loop (the cancelling thread only schedules it). The board's answer `refused`
   means the body never started and never will: the join ends at once, even while every worker
   thread is busy, and the registry reports `ABORTED_BEFORE_DISPATCH`. Otherwise the worker's
   watcher cancels the body's own token, with the reason.
3. Join: the stage thread waits for the attempt's messages (progress, then its end), on the
   main thread in slices so a Ctrl-C is noticed; an exception landing there goes to
   `ctx._interrupt` (which cancels the call) and the join goes on until the body settled.
4. Release the Dask future only once no cancel is on its way to the board: the board deletes
   the record when the scheduler forgets the task, and a cancel arriving after that would leave
   a refusal behind for a task that is gone.

The loop-side state of an attempt (`_decided`, `_cancelling`, `_settled`) is only touched on
the client's event loop, so it needs no lock; the stage thread and the loop talk through the
attempt's `SimpleQueue` and `loop.add_callback`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import queue
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar, cast

import cloudpickle
from distributed import Client
from distributed.scheduler import KilledWorker

from ._body import NotStarted, ToolContext
from ._cancel import CancelToken, Registration
from ._catalog import RUNNER_ATTRIBUTE
from ._dask_board import BOARD_NAME, KEY_PREFIX, REFUSED, ClaimBoard
from ._dask_outcome import (
    ERROR,
    LOST,
    VALUE,
    Outcome,
    RemoteToolError,
    RemoteWorkerLost,
    dump_reason,
    load_contexts,
    load_error,
    load_value,
)
from ._dask_worker import run_remote
from ._interrupts import INTERRUPTS, MAIN_THREAD_SLICE, deferred_sigint

__all__ = ["DaskBackend"]

logger = logging.getLogger("toolreg")

F = TypeVar("F", bound=Callable[..., Any])

# The options of `Client.submit` a backend passes on; the others are set by toolreg or refused.
_SUBMIT_OPTIONS = frozenset(
    {"workers", "resources", "priority", "fifo_timeout", "allow_other_workers"}
)
_REFUSED_OPTIONS = {
    "key": "toolreg gives every attempt a fresh key",
    "pure": "every attempt must run: toolreg submits with pure=False",
    "retries": "Dask would run a failed body again; use toolreg.RetryPolicy instead",
    "actor": "remote bodies are plain functions",
    "actors": "remote bodies are plain functions",
}
_CHECK_SECONDS = 1.0  # how often a joiner off the main thread checks that the client lives


class DaskBackend:
    """Runs marked tool bodies on a Dask cluster, under toolreg's cancellation contract.

    `DaskBackend(client, **submit_kwargs)` takes a synchronous `distributed.Client` it does not
    own (closing the backend leaves the client open) and registers toolreg's claim board on
    the scheduler (once per scheduler; toolreg must be installed on the scheduler and the
    workers). `submit_kwargs` are passed to every `client.submit`: `workers`, `resources`,
    `priority`, `fifo_timeout`, `allow_other_workers`.

    `@backend.remote`, under `@registry.tool(...)`, marks a body: the whole pipeline (hooks,
    approval, wrappers, policies, observers) stays on the caller and only the body runs on a
    worker, where it gets a `RemoteContext`. A call cancelled before its body started never
    starts on any worker, and returns at once; a started body is told through its own token,
    with the reason, and joined; a body whose worker died is `TOOL_ERROR` ("remote worker
    lost") and never starts twice. See the `toolreg.distributed` module for what holds when
    a worker or the scheduler dies.

    Thread-safe: any number of threads may run remote calls through one backend.

    Example::

        backend = DaskBackend(client)

        @registry.tool(description="Crunch numbers", timeout=60)
        @backend.remote
        def crunch(args, ctx):
            return sum(range(args["n"]))
    """

    def __init__(self, client: Client, **submit_kwargs: Any) -> None:
        if not isinstance(client, Client):
            raise TypeError(f"DaskBackend needs a distributed.Client, got {type(client).__name__}")
        if client.asynchronous:
            raise TypeError(
                "DaskBackend needs a synchronous Client (Client(..., asynchronous=False)); it "
                "runs its own event loop thread, so asyncio applications can use it too"
            )
        for name in submit_kwargs:
            if name in _REFUSED_OPTIONS:
                raise TypeError(f"DaskBackend does not take {name}=: {_REFUSED_OPTIONS[name]}")
            if name not in _SUBMIT_OPTIONS:
                raise TypeError(
                    f"DaskBackend got an unknown submit option {name!r}; it takes "
                    f"{', '.join(sorted(_SUBMIT_OPTIONS))}"
                )
        self._client: Any = cast(Any, client)  # distributed is only partly typed
        self._options = dict(submit_kwargs)
        self._topic = f"toolreg-progress-{uuid.uuid4().hex}"
        # The attempts in flight, by key, for progress routing. Single dict operations are
        # atomic: the stage threads insert and pop, the client's event loop reads.
        self._attempts: dict[str, _Attempt] = {}
        self._closed = False
        self._client.register_plugin(ClaimBoard(), name=BOARD_NAME)  # idempotent
        self._client.subscribe_topic(self._topic, self._on_progress)

    @property
    def client(self) -> Client:
        """The client this backend submits to (it does not own it)."""
        client: Client = self._client
        return client

    def remote(self, fn: F) -> F:
        """Mark `fn(args, ctx)` to run on a Dask worker; use under `@registry.tool(...)`.

        Returns a new function of the same name and docstring; `fn` itself is unchanged (so
        calling the result directly runs `fn` here). The body is pickled with cloudpickle on
        its first call: define it where the workers can import it, or where it pickles by value
        (what it refers to must pickle too). `async def` bodies are refused (`TypeError`).
        """
        if not callable(fn):
            raise TypeError(f"backend.remote needs a function, got {type(fn).__name__}")
        if inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"{getattr(fn, '__name__', fn)!r} is an async def body: remote bodies must be "
                "plain functions (run the coroutine with asyncio.run inside one)"
            )
        if getattr(fn, RUNNER_ATTRIBUTE, None) is not None:
            raise ValueError(f"{getattr(fn, '__name__', fn)!r} already runs elsewhere")

        @functools.wraps(fn)
        def body(args: Any, ctx: Any) -> Any:
            return fn(args, ctx)

        setattr(body, RUNNER_ATTRIBUTE, RemoteRunner(self, fn))
        return body  # type: ignore[return-value]

    def board_state(self) -> dict[str, int]:
        """What the scheduler's claim board holds: `records` and `watches` (0 and 0 when idle).

        A record lives from a task's submission until the scheduler forgets the task, shortly
        after its call returned. For monitoring and tests.
        """
        state: dict[str, int] = self._client.sync(self._client.scheduler.toolreg_board)
        return state

    def close(self) -> None:
        """Stop relaying progress; later remote calls fail. Leaves the client open. Idempotent.

        Calls in flight are still joined (their progress is no longer relayed).
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._client.unsubscribe_topic(self._topic)
        except Exception:  # the client is closed already: nothing is subscribed any more
            logger.debug("toolreg: could not unsubscribe %s", self._topic, exc_info=True)

    def __enter__(self) -> DaskBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<DaskBackend {state} in_flight={len(self._attempts)} client={self._client!r}>"

    # -- one attempt -------------------------------------------------------------------------

    def _run(self, runner: RemoteRunner, ctx: ToolContext) -> Any:
        if self._closed:
            raise RemoteToolError("this DaskBackend is closed: create a new one")
        token = ctx.token
        reason: bytes | None = None
        if token.cancelled:
            if ctx._live:  # cancelled since the registry's last recheck: it never starts
                raise NotStarted
            reason = dump_reason(token.reason)  # pre-aborted: it starts cancelled, as locally
        body = runner.pickled()
        key = f"{KEY_PREFIX}{ctx.call.name}-{uuid.uuid4().hex}"
        attempt = _Attempt(self._client, key, token)
        self._attempts[key] = attempt
        try:
            listener = attempt.start(ctx, self._options, body, self._topic, reason)
            outcome = attempt.join(ctx, listener)
        finally:
            self._attempts.pop(key, None)
            attempt.settle()
        return _deliver(outcome, ctx)

    def _on_progress(self, event: Any) -> None:
        """On the client's event loop: a body's progress, for the attempt's joiner."""
        try:
            key, progress, total, message = event
        except (TypeError, ValueError):
            return
        attempt = self._attempts.get(key)
        if attempt is not None:
            attempt.post(("progress", progress, total, message))


class RemoteRunner:
    """The `Runner` of one remote body (`_body.Runner`): each call is one remote attempt."""

    __slots__ = ("_backend", "_fn", "_pickled")

    def __init__(self, backend: DaskBackend, fn: Callable[..., Any]) -> None:
        self._backend = backend
        self._fn = fn
        self._pickled: bytes | None = None

    def pickled(self) -> bytes:
        """The body, pickled once (two threads may both pickle it the first time: harmless)."""
        pickled = self._pickled
        if pickled is None:
            try:
                pickled = cloudpickle.dumps(self._fn)
            except Exception as exc:
                raise RemoteToolError(
                    f"the tool body {getattr(self._fn, '__qualname__', self._fn)!r} cannot be "
                    f"pickled for the workers ({type(exc).__name__}: {exc}); define it in a "
                    "module the workers can import, or keep what it refers to picklable"
                ) from exc
            self._pickled = pickled
        return pickled

    def __call__(self, ctx: ToolContext, /) -> Any:
        return self._backend._run(self, ctx)

    def __repr__(self) -> str:
        return f"<RemoteRunner {getattr(self._fn, '__qualname__', self._fn)!r}>"


Message = tuple[Any, ...]  # ("progress", p, total, msg) | ("outcome", Outcome) | ("refused",)
# | ("failed", exception)


class _Attempt:
    """One Dask task of a remote body: its submission, cancellation, join and release."""

    def __init__(self, client: Client, key: str, token: CancelToken) -> None:
        self._client: Any = cast(Any, client)  # distributed is only partly typed
        self._key = key
        self._token = token
        self._inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._future: Any = None  # the attempt's distributed.Future, until released
        # Touched on the client's event loop only:
        self._decided = False  # the end of the attempt was posted
        self._cancelling = False  # a cancel is on its way to the board
        self._settled = False  # the joiner is done with the attempt
        self._cancel_task: asyncio.Future[None] | None = None

    # -- the stage thread --------------------------------------------------------------------

    def start(
        self,
        ctx: ToolContext,
        options: Mapping[str, Any],
        body: bytes,
        topic: str,
        reason: bytes | None,
    ) -> Registration | None:
        """Hand the attempt to Dask, follow it, and listen on the body's token (unless
        pre-aborted); the listener to remove after the join. Raises only if nothing reached
        Dask: `RemoteToolError`, or `NotStarted` after an interrupt.

        On the main thread a Ctrl-C is held back until all three are done (then it cancels the
        call like any interrupt), so no press can leave a task that nobody follows.
        """
        client = self._client
        listener: Registration | None = None
        following = False
        try:
            with deferred_sigint():
                self._future = client.submit(
                    run_remote,
                    body,
                    ctx.call,
                    self._key,
                    topic,
                    reason,
                    key=self._key,
                    pure=False,
                    **options,
                )
                client.loop.add_callback(self._follow)
                following = True
                if reason is None:
                    listener = self._token.on_cancel(self.cancel)
        except BaseException as exc:
            if self._future is None:
                self._not_submitted(ctx, exc)
            _interrupt(ctx, exc)  # the press held back: the call's token is cancelled now
            # Raised by an application's own handler mid-way: finish what it cut short (the
            # call's token is cancelled now, so the listener runs at once). Following twice,
            # or listening twice, is harmless: the first end and the first cancel count.
            if not following:
                client.loop.add_callback(self._follow)
            if reason is None and listener is None:
                listener = self._token.on_cancel(self.cancel)
        return listener

    def _not_submitted(self, ctx: ToolContext, exc: BaseException) -> NoReturn:
        if isinstance(exc, INTERRUPTS):
            # Raised by an application's own signal handler inside submit: whether the task
            # reached Dask is unknown, so make sure its claim is refused if it did.
            _interrupt(ctx, exc)
            self._client.loop.add_callback(self._cancel_now, dump_reason(type(exc).__name__))
            raise NotStarted from exc
        raise RemoteToolError(f"could not submit the remote body to Dask: {exc!r}") from exc

    def join(self, ctx: ToolContext, listener: Registration | None) -> Message:
        """Wait for the attempt's end, relaying progress; interrupts cancel, never cut it short."""
        try:
            return self._wait(ctx)
        finally:
            if listener is not None:
                listener.remove()  # waits for a callback running now: it scheduled its cancel

    def _wait(self, ctx: ToolContext) -> Message:
        main = threading.current_thread() is threading.main_thread()
        slice_ = MAIN_THREAD_SLICE if main else _CHECK_SECONDS
        inbox = self._inbox
        while True:
            try:
                message = inbox.get(timeout=slice_)
            except queue.Empty:
                if self._client.status in ("closing", "closed"):
                    return ("failed", RemoteToolError("the Dask client was closed during the call"))
                continue
            except BaseException as exc:  # asynchronous: nothing else runs on this line
                _interrupt(ctx, exc)
                continue
            if message[0] != "progress":
                return message
            try:
                ctx.report_progress(*message[1:])
            except INTERRUPTS as exc:  # raised by the progress callback (on this thread)
                _interrupt(ctx, exc)
            except Exception:
                logger.exception("toolreg: relaying the progress of %s failed", self._key)

    def cancel(self) -> None:
        """The body's token was cancelled (any thread): tell the board, from the client's loop."""
        self._client.loop.add_callback(self._cancel_now, dump_reason(self._token.reason))

    def settle(self) -> None:
        """The joiner is done: release the future once no cancel is on its way."""
        self._client.loop.add_callback(self._settle_now)

    def post(self, message: Message) -> None:
        self._inbox.put(message)

    # -- the client's event loop -------------------------------------------------------------

    async def _follow(self) -> None:
        future = self._future
        try:
            outcome = await self._client.gather(future, asynchronous=True)
        except BaseException as exc:  # erred or cancelled: KilledWorker, a lost scheduler, ...
            self._decide(("failed", exc))
        else:
            self._decide(("outcome", outcome))

    def _decide(self, message: Message) -> None:
        if not self._decided:
            self._decided = True
            self._inbox.put(message)

    def _cancel_now(self, reason: bytes) -> None:
        if self._settled:
            return
        self._cancelling = True
        # Kept: the loop holds tasks only weakly.
        self._cancel_task = asyncio.ensure_future(self._send_cancel(reason))

    async def _send_cancel(self, reason: bytes) -> None:
        phase = None
        try:
            phase = await self._client.scheduler.toolreg_cancel(
                key=self._key, reason=reason, client=self._client.id
            )
        except Exception:  # the scheduler is unreachable: the join learns the rest from Dask
            logger.warning("toolreg: could not cancel %s", self._key, exc_info=True)
        finally:
            self._cancelling = False
        if phase == REFUSED:
            self._decide(("refused",))
        if self._settled:
            self._release()

    def _settle_now(self) -> None:
        self._settled = True
        if not self._cancelling:
            self._release()

    def _release(self) -> None:
        future, self._future = self._future, None
        if future is not None:
            future.release()


def _interrupt(ctx: ToolContext, exc: BaseException) -> None:
    """An exception landed in the join: cancel the call (re-raised once it is complete)."""
    interrupt = ctx._interrupt
    if interrupt is None:  # pragma: no cover - a runner always has one while it runs
        raise exc
    interrupt(exc)


def _deliver(message: Message, ctx: ToolContext) -> Any:
    """The attempt's end as the runner's return value or exception."""
    kind = message[0]
    if kind == "refused":
        raise NotStarted
    if kind == "failed":
        raise _failure(message[1], ctx)
    outcome: Outcome = message[1]
    if outcome.kind == VALUE or outcome.kind == ERROR:
        for item in load_contexts(outcome):
            ctx.defer_context(item)
        if outcome.kind == ERROR:
            raise load_error(outcome)
        return load_value(outcome)
    if outcome.kind == LOST:
        raise _lost(ctx)
    if ctx.token.cancelled:  # REFUSED: the caller's cancel reached the board first
        raise NotStarted
    raise RemoteToolError(
        "the scheduler's claim board did not know the call, so it never started (was the "
        "scheduler restarted?)"
    )


def _failure(exc: BaseException, ctx: ToolContext) -> Exception:
    if isinstance(exc, KilledWorker):  # Dask gave up after losing workers: never rerun
        return _lost(ctx)
    if isinstance(exc, RemoteToolError):
        return exc
    error = RemoteToolError(f"the Dask task of the call failed: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def _lost(ctx: ToolContext) -> RemoteWorkerLost:
    return RemoteWorkerLost(
        f"remote worker lost while running {ctx.call.name!r} (call {ctx.call.call_id}); "
        "its outcome is unknown, and it is not run again"
    )
