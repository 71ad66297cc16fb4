"""The dispatcher: the one inward-facing seam through which every call runs.

It owns the executor bodies run on, the table of what is in flight, admission (a closed or
closing registry refuses new calls), nesting, `close()` and `wait_idle()`, and the process-level
events a registry must survive (`fork()`, interpreter exit). `ToolRegistry` is a façade over the
catalog, the hook table and one dispatcher; the batch scheduler and the asyncio facade talk to
the dispatcher only, through the methods below.

* **In flight.** `_calls` maps a key to something `close()` can cancel (a call's state, a batch,
  an awaited job). Single `dict` inserts and pops are atomic, so the hot path takes no lock;
  `close()` sets `_closing` before it lists the table, and every entry re-checks `_closing`
  after inserting itself, so either `close()` sees a call or the call sees `_closing`.
* **Nesting** is known from the thread: a thread that is one of the executor's workers (or the
  registry's event loop thread for `async def` bodies, or a foreign executor's thread while it
  runs one of our bodies) is running a body right now, so a call it makes runs its body inline
  rather than waiting for another worker, which a full pool could never provide.
* **fork().** A forked child starts with a fresh pool (the registry's own) and forgets the
  parent's calls; with an executor the caller passed in, which cannot be repaired, every call
  raises `RuntimeError` at once.
* **Interpreter exit.** Before Python joins non-daemon threads, every registry cancels its calls
  in flight and waits for them, so cooperative bodies stop and the process exits; pool threads
  are daemons and never hold it up by themselves.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from threading import get_ident
from typing import TYPE_CHECKING, Any, Protocol

from ._body import Submit
from ._call import CallMode, CallState, DebugCallState, Stage
from ._cancel import CancelToken, release_token
from ._catalog import CatalogEntry, ToolTable
from ._coro import CoroutineRunner
from ._errors import ExecutorRefusedError, InsideCallError, RegistryClosedError
from ._interrupts import INTERRUPTS, MAIN_THREAD_SLICE, wait_until
from ._logger import DEBUG, logger
from ._pipeline import execute as execute_call
from ._pipeline import never_started
from ._progress import ProgressSink
from ._results import ToolCall, ToolResult
from ._traces import start_traces

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future

    from ._hooks import HookSet
    from ._pool import WorkItem

__all__ = ["Cancellable", "Dispatcher", "dispatcher_of"]


class Cancellable(Protocol):
    """An entry of the in-flight table: `close()` cancels it."""

    def cancel(self, reason: object) -> None: ...


class Hooks(Protocol):
    @property
    def current(self) -> HookSet: ...


class Dispatcher:
    """Runs calls: admission, the in-flight table, the executor, nesting, close, wait_idle."""

    def __init__(
        self,
        tools: ToolTable,
        hooks: Hooks,
        executor: Executor,
        owns_executor: bool,
        overdue_after: float | None,
        name: str,
        owner: object = None,
    ) -> None:
        """`owner`: the façade this dispatcher serves (`dispatcher_of(owner)` finds it again)."""
        # `tools` and `submit` are plain attributes, not properties: each call reads both, and a
        # property is a Python frame per read. Neither changes after this.
        self.tools = tools
        self._hooks = hooks
        self._executor = executor
        self._owns_executor = owns_executor
        from ._pool import WorkerPool  # loaded with the first registry, not by `import toolreg`

        pool = self._pool = executor if isinstance(executor, WorkerPool) else None
        # The pool's own ident -> worker table (only its workers write it): a thread found here
        # is running a body right now, so a call it makes runs inline.
        # private reach: the registry's own pool, whose one client this is; read once.
        self._pool_threads: dict[int, Any] = {} if pool is None else pool._threads
        self.overdue_after = overdue_after
        # Guards _closing/_closed transitions and the idle condition; never held while a call
        # runs, and the calls table is read and written without it (see the module docstring).
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when _calls empties
        self._idle_waiters = 0  # wait_idle()/close() callers; untrack notifies only if any
        self._idle_callbacks: dict[int, Callable[[], object]] = {}  # the facade's own wake-ups
        self._calls: dict[int, Cancellable] = {}
        self._closing = False
        self._closed = False
        self._foreign_inherited = False  # forked with a caller's executor: unusable
        self._foreign_threads: dict[int, int] = {}  # thread ident -> bodies it runs right now
        self._coroutines = CoroutineRunner(name)
        # How bodies are handed to a worker: the pool's own hand-off, bound once (a body's
        # hand-over is one call, no wrapper), or a Future on someone else's executor.
        # private reach: the registry's own pool's hand-off (no Future); bound once, here.
        self._hand_over = None if pool is None else pool._hand_over
        self.submit: Submit = self._submit_foreign if self._hand_over is None else self._hand_over
        _register(self)
        if owner is not None:
            _OWNED[owner] = weakref.ref(self)

    # -- running calls -----------------------------------------------------------------------

    def run(
        self,
        call: ToolCall,
        caller: CancelToken,
        mode: CallMode,
        progress: ProgressSink | None = None,
        admitted: CatalogEntry | None = None,
        watcher: Callable[[CallState], object] | None = None,
        owns_call: bool = False,
    ) -> tuple[ToolResult[Any], BaseException | None]:
        """Run one call; its final result and the interrupt (if any) to re-raise or hand on.

        `admitted`: the batch already ran the entry checks (`call` is frozen, this is its
        entry). `watcher(state)` is told the call's state as soon as it exists (the
        asyncio facade cancels it through that). `owns_call`: the registry made `call` from a
        name and nothing else has seen it.
        """
        entered = time.monotonic()
        wall = time.time()
        ident = get_ident()
        # Already on a thread running one of our bodies: run this call's body right here.
        inline = (
            mode.inline
            or ident in self._pool_threads
            or ident in self._foreign_threads
            or ident == self._coroutines.loop_ident
        )
        hooks = self._hooks.current
        # Each stage logged at DEBUG: the state's own doing (`DebugCallState`), never a check.
        new_state = DebugCallState if logger.isEnabledFor(DEBUG) else CallState
        state = new_state(call, hooks, caller, mode, entered, inline, progress, wall, ident)
        if owns_call:
            state.owns_call = True
        # Admission, inline: this runs for every call.
        if self._closed or (self._closing and not mode.admit_while_closing):
            raise RegistryClosedError("this ToolRegistry is closed: create a new one to run calls")
        if self._foreign_inherited:
            self._check_usable()
        key = id(state)
        calls = self._calls
        calls[key] = state
        if self._closing:  # close() may have listed the table before this call
            state.cancel("registry closed")
        try:
            if hooks.call_hooks:
                _start_traces(state, hooks)
            if watcher is not None:
                watcher(state)
            result = execute_call(self, state, admitted)
        finally:
            release_token(state.token)
            calls.pop(key, None)  # `untrack(key)`, inline
            if not calls and (self._idle_waiters or self._idle_callbacks):
                self._notify_idle()
        return result, state.interrupted

    def run_nested(
        self, call: ToolCall, token: CancelToken, watcher: Callable[[CallState], object]
    ) -> ToolResult[Any]:
        """A nested call under `token`, run inline; `watcher` (the parent body's) is told its
        state, so the parent's overdue watch can cover it (`ToolContext._watch_nested`)."""
        result, interrupted = self.run(call, token, _NESTED, None, None, watcher)
        if interrupted is not None:
            raise interrupted
        return result

    def run_coroutine(
        self, make: Callable[[], Coroutine[Any, Any, Any]], token: CancelToken
    ) -> Any:
        return self._coroutines.run(make, token)

    def unstarted(
        self, call: ToolCall, reason: object
    ) -> tuple[ToolResult[Any], BaseException | None]:
        """The result of a batch or awaited call that never started: observed like any other.

        It never started because its turn was cancelled (for `reason`): its call's token reads
        cancelled from the start, as a model-driven call's does when refused at entry, so its
        call hooks see what happened to it.
        """
        never = CancelToken.never()
        mode = CallMode.batch_item()
        hooks = self._hooks.current
        new_state = DebugCallState if logger.isEnabledFor(DEBUG) else CallState
        state = new_state(call, hooks, never, mode, time.monotonic(), True, None)
        state.cancel(reason)
        if hooks.call_hooks:  # traced like any call: its entry, then its end
            _start_traces(state, hooks)
        return never_started(state), state.interrupted

    def has_own_pool(self) -> bool:
        """Whether bodies run on a `WorkerPool` (which never blocks a caller on a loop)."""
        return self._pool is not None

    # -- handing bodies over ---------------------------------------------------------------------

    def hand_over(self, item: WorkItem, may_block: bool = True, goes_on: bool = False) -> None:
        """Run `item._run()` on a worker (batch runners, awaited calls); `_drop()` if never.

        `goes_on`: the caller has more to do before it waits (`WorkerPool._hand_over`)."""
        if self._hand_over is not None:
            self._hand_over(item, may_block=may_block, goes_on=goes_on)
            return
        self._submit_foreign(item)

    def _submit_foreign(self, item: WorkItem) -> bool:
        # The slower path for a caller's ThreadPoolExecutor: a Future per body (or batch runner,
        # or awaited job), watched so that an item the executor drops
        # (shutdown(cancel_futures=True)) ends its call at once.
        self._check_usable()
        future = self._executor.submit(self._run_foreign, item)
        future.add_done_callback(functools.partial(_drop_if_cancelled, item))
        return False

    def _run_foreign(self, item: WorkItem) -> None:
        ident = threading.get_ident()
        threads = self._foreign_threads
        threads[ident] = threads.get(ident, 0) + 1  # only this thread writes its own key
        try:
            item._run()  # private reach: the pool's work-item protocol (`_pool.WorkItem`)
        finally:
            left = threads[ident] - 1
            if left:
                threads[ident] = left
            else:
                del threads[ident]

    def _check_usable(self) -> None:
        if self._foreign_inherited:
            raise ExecutorRefusedError(
                "this ToolRegistry was created before fork() with an executor passed in, whose "
                "threads did not survive the fork: create the registry (and its executor) in "
                "the child, or let the registry own its WorkerPool"
            )

    # -- where we are ------------------------------------------------------------------------

    def on_body_thread(self, ident: int) -> bool:
        """Whether thread `ident` is running one of our bodies (so a call there runs inline)."""
        return (
            ident in self._pool_threads
            or ident in self._foreign_threads
            or ident == self._coroutines.loop_ident
        )

    def inside(self, ident: int | None = None) -> bool:
        """Whether thread `ident` (default: this one) is inside one of our calls."""
        if ident is None:
            ident = threading.get_ident()
        if self.on_body_thread(ident):
            return True
        return any(getattr(entry, "thread", None) == ident for entry in list(self._calls.values()))

    # -- admission and the in-flight table ---------------------------------------------------

    def admit(self, entry: Cancellable, nested: bool) -> int:
        """Count `entry` in (a batch, an awaited job); `RuntimeError` if closed."""
        if self._closed or (self._closing and not nested):
            raise RegistryClosedError("this ToolRegistry is closed: create a new one to run calls")
        self._check_usable()
        return self.track(entry)

    def track(self, entry: Cancellable) -> int:
        """Count `entry` in; its key is `id(entry)`. It may be cancelled before this returns."""
        key = id(entry)
        self._calls[key] = entry
        if self._closing:  # close() may have listed the table before this entry
            entry.cancel("registry closed")
        return key

    def untrack(self, key: int) -> None:
        """Count the entry under `key` out; wake the idle waiters if it was the last one."""
        calls = self._calls
        calls.pop(key, None)
        if not calls and (self._idle_waiters or self._idle_callbacks):
            self._notify_idle()

    def _notify_idle(self) -> None:
        with self._lock:
            if self._calls:
                return
            self._idle.notify_all()
            callbacks, self._idle_callbacks = self._idle_callbacks, {}
        for callback in callbacks.values():
            callback()  # the facade's own (a call_soon_threadsafe): never user code

    def in_flight(self) -> list[CallState]:
        """The calls past their entry checks, oldest first (a snapshot)."""
        states = [
            entry
            for entry in list(self._calls.values())  # one C-level copy: atomic
            if isinstance(entry, CallState) and entry.stage is not Stage.ENTRY
        ]
        return sorted(states, key=lambda state: state.entered)

    def active(self) -> int:
        return len(self._calls)

    # -- quiescence ------------------------------------------------------------------------------

    def wait_idle(self, timeout: float | None) -> bool:
        """Block until nothing is in flight (True), or `timeout` seconds passed (False)."""
        if self.inside():
            raise InsideCallError("wait_idle() from inside one of this registry's calls would wait")
        limit = None if timeout is None else time.monotonic() + timeout
        main = threading.current_thread() is threading.main_thread()
        with self._lock:
            self._idle_waiters += 1
            try:
                while self._calls:
                    left = None if limit is None else limit - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    if main:  # in slices: a Ctrl-C is noticed within one
                        left = MAIN_THREAD_SLICE if left is None else min(left, MAIN_THREAD_SLICE)
                    self._idle.wait(left)
                return True
            finally:
                self._idle_waiters -= 1

    def call_when_idle(self, callback: Callable[[], object]) -> Callable[[], None] | None:
        """Run `callback()` (never user code) once nothing is in flight.

        None if nothing is in flight now (the callback is not kept), else a function that
        forgets the callback (for a waiter that gave up).
        """
        key = next(_callback_keys)
        with self._lock:
            # Kept before the table is read, as wait_idle counts itself in first: a last call
            # that leaves after this read finds the callback (its check takes no lock).
            self._idle_callbacks[key] = callback
            if not self._calls:
                del self._idle_callbacks[key]
                return None

        def forget() -> None:
            with self._lock:
                self._idle_callbacks.pop(key, None)

        return forget

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Cancel every call in flight, wait for all of them, shut down an owned executor.

        An exception that lands while waiting (Ctrl-C) does not cut the wait short: the calls
        are cancelled already, so cooperative ones end; it is re-raised once all have.
        """
        if self.inside():
            raise InsideCallError(
                "close() from inside one of this registry's calls would wait forever"
            )
        with self._lock:
            self._closing = True
        interrupted: list[BaseException] = []
        self._cancel_all("registry closed", interrupted)
        self._drain(interrupted)
        try:
            if self._owns_executor:
                self._executor.shutdown(wait=True)  # idempotent
            self._coroutines.close()  # idempotent
        finally:
            with self._lock:
                self._closed = True
        if interrupted:
            raise interrupted[0]

    def _cancel_all(self, reason: str, interrupted: list[BaseException]) -> None:
        # A snapshot taken after _closing is set: later entries cancel themselves. Cancelling
        # twice is harmless (the first reason wins), and it finishes a close() that was cut
        # short and is called again.
        for entry in list(self._calls.values()):
            try:
                entry.cancel(reason)
            except BaseException as exc:  # a Ctrl-C mid-way: cancel the others first
                interrupted.append(exc)

    def _drain(self, interrupted: list[BaseException]) -> None:
        def wait(timeout: float) -> None:
            with self._lock:
                if self._calls:
                    self._idle.wait(None if timeout < 0 else timeout)

        def drained() -> bool:
            return not self._calls

        with self._lock:
            self._idle_waiters += 1
        try:
            wait_until(drained, wait, interrupted.append)
        finally:
            with self._lock:
                self._idle_waiters -= 1

    def _at_exit(self) -> None:
        """Interpreter exit: cancel what is in flight and wait for it (cooperative bodies end)."""
        if not self._calls:
            return
        interrupted: list[BaseException] = []
        self._cancel_all("interpreter exiting", interrupted)
        self._drain(interrupted)

    def _after_fork_in_child(self) -> None:
        # The parent's calls and threads are the parent's. Locks held across the fork by other
        # threads would never be released here: make new ones.
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._idle_waiters = 0
        self._idle_callbacks = {}
        self._calls = {}
        self._foreign_threads = {}
        self._coroutines = self._coroutines.after_fork()
        if self._pool is None and not self._closed:
            self._foreign_inherited = True

    def __repr__(self) -> str:
        state = "closed" if self._closed else "closing" if self._closing else "open"
        return f"<Dispatcher {state} in_flight={len(self._calls)} executor={self._executor!r}>"


def _start_traces(state: CallState, hooks: HookSet) -> None:
    """The call's traces from its call hooks. An interrupt a hook raised (or a Ctrl-C that
    landed) is the call's: it still runs its course, cancelled and observed, then re-raises."""
    try:
        state.traces = start_traces(hooks.call_hooks, state.call, state.token)
    except INTERRUPTS as exc:
        state.interrupt(exc)


def _drop_if_cancelled(item: WorkItem, future: Future[Any]) -> None:
    if future.cancelled():
        item._drop()  # private reach: the pool's work-item protocol (`_pool.WorkItem`)


_NESTED = CallMode.nested()
_callback_keys = itertools.count()  # keys for idle callbacks; next() is atomic

# The façade (a `ToolRegistry`) -> its dispatcher, both held weakly: the asyncio facade finds a
# registry's dispatcher here rather than through the registry's privates. The dispatcher refers
# back to its façade (through the catalog's change callback), so a strong value would keep
# every registry alive.
_OWNED: weakref.WeakKeyDictionary[object, weakref.ref[Dispatcher]] = weakref.WeakKeyDictionary()


def dispatcher_of(owner: object) -> Dispatcher | None:
    """The dispatcher serving `owner` (a `ToolRegistry`), or None if it is not one."""
    try:
        ref = _OWNED.get(owner)
    except TypeError:  # not weakly referenceable (or not hashable): not a registry
        return None
    return None if ref is None else ref()


# -- process-level events: fork and interpreter exit ----------------------------------------

_DISPATCHERS: weakref.WeakSet[Dispatcher] = weakref.WeakSet()
_exit_hook_lock = threading.Lock()  # guards _exit_hook_registered
_exit_hook_registered = False


def _register(dispatcher: Dispatcher) -> None:
    _DISPATCHERS.add(dispatcher)
    if not _exit_hook_registered:
        _register_exit_hook()


def _register_exit_hook() -> None:
    global _exit_hook_registered
    with _exit_hook_lock:
        if _exit_hook_registered:
            return
        # concurrent.futures.thread joins its workers from the same kind of hook; ours must run
        # first (hooks run in reverse), or a body waiting for its token would block that join.
        import concurrent.futures.thread  # noqa: F401

        register_atexit = getattr(threading, "_register_atexit", None)
        if register_atexit is not None:
            with contextlib.suppress(RuntimeError):  # already shutting down: nothing to protect
                register_atexit(_at_exit)
        _exit_hook_registered = True


def _at_exit() -> None:
    for dispatcher in list(_DISPATCHERS):
        try:
            dispatcher._at_exit()
        except BaseException:
            logger.exception("toolreg: cancelling calls at interpreter exit failed")


def _reset_in_child() -> None:
    global _exit_hook_lock
    _exit_hook_lock = threading.Lock()
    for dispatcher in list(_DISPATCHERS):
        dispatcher._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_in_child)
