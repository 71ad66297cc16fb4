"""The caller side of `toolreg.distributed`: `DaskBackend` and the runner of a remote body.

`backend.remote(fn)` marks a body with a `RemoteRunner` (`_catalog.RUNNER_ATTRIBUTE`); the
registry calls it on the stage thread, and each call runs one `_attempt.Attempt`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar, cast

import cloudpickle
from distributed import Client

from .._body import NotStarted, ToolContext, rechecked
from .._catalog import RUNNER_ATTRIBUTE
from ._attempt import Attempt, deliver
from ._board import BOARD_NAME, KEY_PREFIX, ClaimBoard
from ._groups import Groups
from ._outcome import RemoteToolError, dump_reason

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
        self._groups = Groups(client, submit_kwargs)
        self._topic = f"toolreg-progress-{uuid.uuid4().hex}"
        # The attempts in flight, by key, for progress routing. Single dict operations are
        # atomic: the stage threads insert (under _lock) and pop, the client's loop reads.
        self._attempts: dict[str, Attempt] = {}
        self._lock = threading.Lock()  # guards _closed, _subscribed and adding to _attempts
        self._closed = False
        self._client.register_plugin(ClaimBoard(), name=BOARD_NAME)  # idempotent
        self._client.subscribe_topic(self._topic, self._on_progress)
        self._subscribed = True

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
        """Refuse new remote calls (`TOOL_ERROR`); leave the client open. Idempotent.

        Calls in flight go on as before (progress included); the backend's subscription for
        progress ends with the last of them.
        """
        with self._lock:
            self._closed = True
        self._unsubscribe_when_idle()

    def _unsubscribe_when_idle(self) -> None:
        with self._lock:
            if not self._closed or not self._subscribed or self._attempts:
                return
            self._subscribed = False
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
        token = ctx.token
        reason: bytes | None = None
        if token.cancelled:
            if rechecked(ctx):  # cancelled since the registry's last recheck: it never starts
                raise NotStarted
            reason = dump_reason(token.reason)  # pre-aborted: it starts cancelled, as locally
        body = runner.pickled()
        key = f"{KEY_PREFIX}{ctx.call.name}-{uuid.uuid4().hex}"
        attempt = Attempt(self._client, self._groups, key, token)
        with self._lock:
            if self._closed:
                raise RemoteToolError("this DaskBackend is closed: create a new one")
            self._attempts[key] = attempt
        try:
            arguments = (body, ctx.call, key, self._topic, reason)
            listener = attempt.start(ctx, arguments, listen=reason is None)
            outcome = attempt.join(ctx, listener)
        finally:
            self._attempts.pop(key, None)
            attempt.settle()
            self._unsubscribe_when_idle()  # if closed meanwhile and this was the last call
        return deliver(outcome, ctx)

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
    """The `Runner` of one remote body (`_catalog.Runner`): each call is one remote attempt."""

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
