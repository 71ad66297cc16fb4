"""The worker side of `toolreg.distributed`: claim, run the body, watch for its cancellation.

`run_remote` is the function of every remote Dask task. On the worker thread Dask gives it:

1. It loads the body (unpickled once per worker process and cached) and creates the body's
   local `CancelSource`, registered with this worker's `_WorkerSide` *before* the claim, so a
   cancellation notice that arrives right after the claim finds it.
2. It claims the call on the board (`_board`): one message, answered on the scheduler's loop,
   shared with the claims the worker's other threads made while the previous one was on its
   way (`_WorkerSide.claim`). Refused: the body never starts. `rerun`: Dask is running the task
   again after losing the worker that started it; the body does not start a second time
   (`LOST`).
3. It runs the body with a `RemoteContext`. A pre-aborted call (the caller's token was already
   cancelled at entry) starts with its local token cancelled, with the caller's reason.
4. It pickles the outcome itself (`_outcome`) and returns it.

Cancellation reaches a running body through one long poll per worker (`_WorkerSide._watch`, a
coroutine on the worker's event loop, never a thread per body): the board answers it with the
notices for this worker's bodies, and each `source.cancel(reason)` is handed to toolreg's
callback threads, so the body's `on_cancel` callbacks (user code) never run on the event loop,
and a slow one does not hold up the next notice. The poll ends once no body of this worker is
registered (at the latest `WATCH_SECONDS` after the last one settled).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, NoReturn

import cloudpickle
from distributed import get_worker

from .._cancel import CancelSource, CancelToken
from .._jobs import JobThreads
from .._progress import check_progress
from .._results import ToolCall, ToolResult
from ._board import REFUSED, STARTED
from ._outcome import (
    LOST,
    Outcome,
    RemoteToolError,
    encode_error,
    encode_value,
    load_reason,
)

__all__ = ["WATCH_SECONDS", "RemoteContext", "run_remote"]

logger = logging.getLogger("toolreg")

WATCH_SECONDS = 2.0  # how long one idle long poll waits on the scheduler
_RETRY_SECONDS = 0.5  # pause before polling again after the scheduler could not be reached
_PROGRESS_FLUSH_SECONDS = 5.0  # how long a settled body waits for its last progress to leave

_BODIES: dict[bytes, Callable[..., Any]] = {}  # digest of the pickled body -> the function
_BODIES_LIMIT = 512  # cleared when full: a worker serves few distinct bodies
_BODIES_LOCK = threading.Lock()  # guards _BODIES
_SIDES: dict[str, _WorkerSide] = {}  # worker address -> its side
_SIDES_LOCK = threading.Lock()  # guards _SIDES
# Where notices cancel the bodies' sources, so their on_cancel callbacks (user code) never run on
# the worker's event loop; a callback that blocks holds up only its own job.
_CANCELLERS = JobThreads("toolreg-remote-cancel")


def run_remote(
    body: bytes,
    call: ToolCall,
    key: str,
    topic: str,
    reason: bytes | None,
) -> Outcome:
    """The Dask task of one remote attempt; see the module docstring. Never raises."""
    try:
        fn = _load_body(body)
    except Exception as exc:
        return encode_error(
            RemoteToolError(f"the tool body could not be loaded on the worker: {exc!r}"), []
        )
    worker = get_worker()
    side = _WorkerSide.of(worker)
    source = CancelSource()
    side.register(key, source)
    try:
        try:
            verdict = side.claim(key)
        except Exception as exc:
            return encode_error(
                RemoteToolError(f"the worker could not claim the call on the scheduler: {exc!r}"),
                [],
            )
        if verdict != STARTED:
            return Outcome(REFUSED if verdict == REFUSED else LOST)
        if reason is not None:  # pre-aborted: it starts under a cancelled token, as locally
            source.cancel(load_reason(reason))
        ctx = RemoteContext(call, source.token, _ProgressRelay(worker, key, topic))
        try:
            value = fn(call.arguments, ctx)
        except BaseException as exc:  # shipped to the caller, which re-raises it there
            return encode_error(exc, ctx._settle())
        return encode_value(value, ctx._settle())
    finally:
        side.unregister(key)
        source.close()


def _load_body(blob: bytes) -> Callable[..., Any]:
    digest = hashlib.blake2b(blob, digest_size=16).digest()
    fn = _BODIES.get(digest)
    if fn is None:
        fn = cloudpickle.loads(blob)
        with _BODIES_LOCK:
            if len(_BODIES) >= _BODIES_LIMIT:
                _BODIES.clear()
            _BODIES[digest] = fn
    return fn


class RemoteContext:
    """What a body running on a Dask worker gets as `ctx`.

    * `call`: the call being executed (frozen arguments), as the caller's pipeline admitted it.
    * `token`: a token of this worker process, cancelled when the call's token on the caller is
      (with the same reason: `timeout_of(ctx.token)` tells a deadline). Its `on_cancel`
      callbacks run on toolreg's callback threads.
    * `defer_context(item)`: keep `item` for the result's `contexts`; it must pickle.
    * `report_progress(progress, total=None, message=None)`: relayed to the caller's
      `progress=` callback; updates may be coalesced to the latest.
    * `execute(...)` raises `RuntimeError`: nested calls need the caller's pipeline.

    Thread-safe. After the body has settled, `defer_context` and `report_progress` raise
    `RuntimeError`. A context cannot be pickled.
    """

    __slots__ = ("_closed", "_contexts", "_lock", "_relay", "call", "token")

    call: ToolCall
    token: CancelToken

    def __init__(self, call: ToolCall, token: CancelToken, relay: _ProgressRelay) -> None:
        self.call = call
        self.token = token
        self._relay = relay
        self._lock = threading.Lock()  # guards _contexts and _closed
        self._contexts: list[Any] = []
        self._closed = False

    def defer_context(self, item: object) -> None:
        """Keep `item` for the result's `contexts` (in call order); thread-safe."""
        with self._lock:
            if self._closed:
                raise RuntimeError("defer_context() after the tool body has returned")
            self._contexts.append(item)

    def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Report progress to the caller (`TypeError`/`ValueError` for bad values, like locally).

        Sent from the worker's event loop: an update made while the previous one is on its way
        replaces the one waiting, so the caller sees the latest. Raises `RuntimeError` after
        the body has settled.
        """
        check_progress(progress, total, message)
        if self._closed:
            raise RuntimeError("report_progress() after the tool body has returned")
        self._relay.report([progress, total, message])

    def execute(
        self, call_or_name: ToolCall | str, arguments: Mapping[str, Any] | None = None
    ) -> ToolResult[Any]:
        """Not available on a worker: raises `RuntimeError`."""
        raise RuntimeError(
            "ctx.execute() is not available in a remote tool body: nested calls run through "
            "the caller's pipeline (hooks, approval), which is not on the worker; make the "
            "nested call from the caller, or run this tool locally"
        )

    def _settle(self) -> list[Any]:
        """The body returned: no more deferring or reporting; the contexts, progress flushed."""
        with self._lock:
            self._closed = True
            contexts = self._contexts
        self._relay.flush()
        return contexts

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "a RemoteContext cannot be pickled: it belongs to one remote call on this worker "
            "(pass what the work needs, e.g. ctx.call.arguments)"
        )

    def __repr__(self) -> str:
        return f"<RemoteContext {self.call.name!r} call_id={self.call.call_id!r}>"


class _ProgressRelay:
    """Sends a body's progress to the board from the worker's loop, at most one RPC at a time."""

    __slots__ = ("_idle", "_key", "_latest", "_lock", "_sending", "_topic", "_worker")

    def __init__(self, worker: Any, key: str, topic: str) -> None:
        self._worker = worker
        self._key = key
        self._topic = topic
        self._lock = threading.Lock()  # guards _latest and _sending
        self._latest: list[Any] | None = None
        self._sending = False
        self._idle = threading.Event()  # set while nothing is on its way
        self._idle.set()

    def report(self, update: list[Any]) -> None:
        with self._lock:
            self._latest = update
            if self._sending:
                return
            self._sending = True
            self._idle.clear()
        self._worker.loop.add_callback(self._send)

    async def _send(self) -> None:
        try:
            while True:
                with self._lock:
                    update, self._latest = self._latest, None
                    if update is None:
                        self._sending = False
                        self._idle.set()
                        return
                await self._worker.scheduler.toolreg_progress(
                    key=self._key, topic=self._topic, update=update
                )
        except Exception:
            logger.warning("toolreg: could not relay progress of %s", self._key, exc_info=True)
            with self._lock:
                self._latest = None
                self._sending = False
            self._idle.set()

    def flush(self) -> None:
        """Wait (bounded) until the last update has reached the scheduler: it goes first."""
        if not self._idle.wait(_PROGRESS_FLUSH_SECONDS):
            logger.warning("toolreg: the last progress of %s may arrive late", self._key)


class _WorkerSide:
    """One worker's registered bodies and its long poll for their cancellation notices."""

    def __init__(self, worker: Any) -> None:
        self._worker = worker
        self._address: str = worker.address
        self._lock = threading.Lock()  # guards _sources, _watching, _claims and _claiming
        self._sources: dict[str, CancelSource] = {}
        self._watching = False
        self._claims: dict[str, Future[str]] = {}  # claims waiting for the next message
        self._claiming = False  # a claim message is on its way (or about to be sent)

    @staticmethod
    def of(worker: Any) -> _WorkerSide:
        address = worker.address
        side = _SIDES.get(address)
        if side is None or side._worker is not worker:  # a new worker at an old address
            with _SIDES_LOCK:
                side = _SIDES.get(address)
                if side is None or side._worker is not worker:
                    side = _SIDES[address] = _WorkerSide(worker)
        return side

    def register(self, key: str, source: CancelSource) -> None:
        with self._lock:
            self._sources[key] = source
            start = not self._watching
            self._watching = True
        if start:
            self._worker.loop.add_callback(self._watch)

    def unregister(self, key: str) -> None:
        with self._lock:
            self._sources.pop(key, None)

    def claim(self, key: str) -> str:
        """The board's verdict for `key` (this thread waits for it).

        The claims of this worker's threads travel in groups, one message on its way at a
        time: a claim made while one is on its way goes with the next, so a worker whose
        threads start bodies together sends one message for them, and a lone claim goes at
        once.
        """
        verdict: Future[str] = Future()
        with self._lock:
            self._claims[key] = verdict
            send = not self._claiming
            self._claiming = True
        if send:
            self._worker.loop.add_callback(self._send_claims)
        return verdict.result()

    async def _send_claims(self) -> None:
        """On the worker's loop: send the waiting claims, a group at a time, until none wait."""
        while True:
            with self._lock:
                group, self._claims = self._claims, {}
                if not group:
                    self._claiming = False
                    return
            try:
                verdicts = await self._worker.scheduler.toolreg_claim(
                    keys=list(group), worker=self._address
                )
            except Exception as exc:
                for waiter in group.values():
                    waiter.set_exception(exc)
                continue
            except BaseException:  # the worker's loop is going away: no claim may wait forever
                with self._lock:
                    group.update(self._claims)
                    self._claims = {}
                    self._claiming = False
                for waiter in group.values():
                    waiter.set_exception(RuntimeError("the worker stopped while claiming"))
                raise
            for waiter, verdict in zip(group.values(), verdicts, strict=True):
                waiter.set_result(verdict)

    async def _watch(self) -> None:
        worker = self._worker
        while True:
            with self._lock:
                if not self._sources:
                    self._watching = False
                    return
            try:
                notices = await worker.scheduler.toolreg_watch(
                    worker=self._address, timeout=WATCH_SECONDS
                )
            except Exception:
                if worker.status.name not in ("running", "paused"):
                    with self._lock:
                        self._watching = False
                    return
                logger.warning("toolreg: lost the cancellation watch; retrying", exc_info=True)
                await asyncio.sleep(_RETRY_SECONDS)
                continue
            for key, reason in notices:
                source = self._sources.get(key)
                if source is not None:
                    _CANCELLERS.call_soon(functools.partial(_cancel, source, reason))


def _cancel(source: CancelSource, reason: bytes | None) -> None:
    source.cancel(load_reason(reason))
