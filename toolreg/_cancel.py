"""Cancellation sources, tokens, registrations and deadlines.

A `CancelSource` owns cancellation; its `CancelToken` only observes it. Sources link to parent
tokens, so tokens form a tree: cancelling a parent cancels every linked descendant.

Design rules (each one answers a known trap, see PITFALLS.md):

* Propagation is push-based and eager. `cancel()` marks the whole linked subtree as cancelled
  first, walking it with an explicit worklist (never the Python stack), and only then runs user
  callbacks, in the cancelling thread, with no lock held.
* A parent holds its children *weakly*. A child that is closed or cancelled removes its link from
  every parent at once; the link of a child dropped without `close()` is swept when the parent's
  set of children doubles. So a long-lived parent holds no state for children that came and went,
  and correctness never depends on the garbage collector.
* `token.cancelled` is a plain attribute read. Critical sections never call user code; our
  finalizers (`TimerEntry._died`) never take a lock.
* A token's lock is reentrant, because a *user's* finalizer can run on the thread that holds it
  and call back into the token (remove a registration, link a child): a cyclic collection runs
  finalizers on whichever thread triggers it, at an allocation (3.10, 3.11) or, from 3.12 on, at
  the next call or loop back-edge after one, so no critical section can keep collections out.
  Each section leaves the token consistent at every call it makes, and takes the thread id and
  the clock before locking, so such a nested operation always sees (and leaves) a whole state.
* One shared daemon timer thread serves every deadline in the process (`_timer`).
"""

from __future__ import annotations

import _thread
import itertools
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from typing_extensions import Self

from ._timer import Timer, TimerEntry

__all__ = [
    "CancelSource",
    "CancelToken",
    "Cancelled",
    "Registration",
    "TimeoutReason",
    "deadline",
    "timeout_of",
]

logger = logging.getLogger("toolreg")

_next_key = itertools.count().__next__  # dict keys for listeners; next() is atomic under the GIL

# Listener states.
_PENDING, _RUNNING, _DONE, _REMOVED = range(4)


@dataclass(frozen=True, slots=True)
class TimeoutReason:
    """The cancellation reason of a deadline: which `code` it carried, after how many seconds."""

    code: str
    seconds: float

    def __str__(self) -> str:
        return f"{self.code}: timed out after {format(self.seconds, 'g')}s"


class Cancelled(BaseException):
    """Raised by `CancelToken.raise_if_cancelled()`; carries the cancellation `reason`.

    It derives from `BaseException`, like `asyncio.CancelledError`, so a tool's
    `except Exception:` cannot swallow it by accident.
    """

    def __init__(self, reason: object = None) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"cancelled: {self.reason!s}"


class Registration:
    """Handle for something registered (a cancel callback, a hook); `remove()` unregisters it.

    Registrations are context managers: leaving the `with` block calls `remove()`.
    """

    __slots__ = ()

    def remove(self) -> bool:
        """Unregister; return True if this call removed it before it ran."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


class _NoopRegistration(Registration):
    """Returned where nothing was stored (the never-cancelled token)."""

    __slots__ = ()

    def remove(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "<Registration on a never-cancelled token>"


class _Listener(Registration):
    """A callback registered with `CancelToken.on_cancel`."""

    __slots__ = ("_done", "_fn", "_key", "_state", "_thread", "_token")

    def __init__(self, token: CancelToken, fn: Callable[[], object]) -> None:
        self._token = token
        self._key = _next_key()
        self._fn: Callable[[], object] | None = fn
        self._state = _PENDING  # guarded by self._token._lock
        self._thread = 0  # the thread running the callback; guarded by the token lock
        self._done: threading.Event | None = None  # created only when remove() must wait

    def remove(self) -> bool:
        token = self._token
        done: threading.Event | None = None
        me = threading.get_ident()
        while True:
            with token._lock:
                state = self._state
                if state == _PENDING:
                    self._state = _REMOVED
                    listeners = token._listeners
                    if listeners is not None:
                        del listeners[self._key]
                    break
                if state != _RUNNING or self._thread == me:
                    return False
                if self._done is None and done is not None:
                    self._done = done
                waiter = self._done
            if waiter is not None:
                waiter.wait()
                return False
            done = threading.Event()  # allocated outside the lock, then retry
        self._fn = None  # dropped outside the lock: it may run a finalizer
        return True

    def _run(self) -> None:
        token = self._token
        me = threading.get_ident()  # before locking: a call in the section could run a finalizer
        with token._lock:
            if self._state != _PENDING:
                return
            self._state = _RUNNING
            self._thread = me
        fn = self._fn
        try:
            if fn is not None:
                fn()
        except (Exception, Cancelled):  # Ctrl-C and SystemExit propagate, after the others
            logger.exception("toolreg: cancel callback %r raised", fn)
        finally:
            with token._lock:
                self._state = _DONE
                done = self._done
            self._fn = None
            if done is not None:
                done.set()

    def __repr__(self) -> str:
        state = ("pending", "running", "done", "removed")[self._state]
        return f"<Registration {state} fn={self._fn!r}>"


class CancelToken:
    """Observes one cancellation: `.cancelled`, `.reason`, `.wait()`, `.on_cancel()`.

    Tokens are made by a `CancelSource` (or `CancelToken.never()`). All methods are thread-safe;
    `.cancelled` and `.reason` are lock-free reads. Once cancelled, a token stays cancelled and its
    reason never changes (the first reason wins, inherited from the parent that cancelled it).

    Example::

        src = CancelSource()
        src.token.on_cancel(lambda: print("stopping"))
        src.cancel("user pressed stop")          # prints "stopping"
        src.token.reason                         # 'user pressed stop'
    """

    __slots__ = (
        "__weakref__",
        "_cancelled",
        "_cancelled_at",
        "_children",
        "_closed",
        "_event",
        "_links",
        "_listeners",
        "_lock",
        "_reason",
        "_sweep_at",
        "_timed_out",
        "_timer",
    )

    # Guards every field below except the lock-free reads of _cancelled/_reason/_timed_out (which
    # are still only written under it), and the state of this token's listeners. Reentrant: a
    # finalizer may run on the holding thread and use the token (see the module docstring).
    _lock: _thread.RLock
    _cancelled: bool
    _reason: object
    _cancelled_at: float  # time.monotonic() when cancelled; unset while live
    _timed_out: bool
    _closed: bool
    _listeners: dict[int, _Listener] | None  # on_cancel callbacks; None until the first one
    _children: set[weakref.ref[CancelToken]] | None  # linked children, held weakly
    _sweep_at: int  # size of _children that triggers a sweep of collected children
    _links: list[tuple[CancelToken, weakref.ref[CancelToken]]] | None  # our place in parents
    _event: threading.Event | None  # created for the first waiter only
    _timer: TimerEntry | None

    def __init__(self) -> None:
        raise TypeError("CancelToken cannot be created directly: use CancelSource().token")

    @staticmethod
    def never() -> CancelToken:
        """A token that is never cancelled and stores nothing (a shared singleton)."""
        return _NEVER

    @property
    def cancelled(self) -> bool:
        """True once cancelled (lock-free)."""
        return self._cancelled

    @property
    def reason(self) -> object:
        """The reason passed to `cancel()` (or a `TimeoutReason`); None while live."""
        return self._reason

    def raise_if_cancelled(self) -> None:
        """Raise `Cancelled(reason)` if the token is cancelled."""
        if self._cancelled:
            raise Cancelled(self._reason)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or until `timeout` seconds pass; True if cancelled.

        An `Event` is created on the first wait only, so tokens nobody waits on stay small.
        """
        if self._cancelled:
            return True
        event = self._event
        if event is None:
            new_event = threading.Event()  # allocated before taking the lock
            with self._lock:
                cancelled: bool = self._cancelled  # re-read under the lock, with no call
                if cancelled:
                    return True
                event = self._event
                if event is None:
                    event = self._event = new_event
        return event.wait(timeout)

    def on_cancel(self, callback: Callable[[], object]) -> Registration:
        """Run `callback()` once when the token is cancelled; return its `Registration`.

        If the token is already cancelled, the callback runs now, in this thread, before
        `on_cancel` returns. Otherwise it runs in the thread that cancels (or the timer thread),
        after the token (and every token linked below it) reads as cancelled, in registration
        order, with no toolreg lock held. A callback that raises is logged on the `toolreg`
        logger; the others still run.
        """
        if not callable(callback):
            raise TypeError(f"on_cancel() needs a callable, got {type(callback).__name__}")
        listener = _Listener(self, callback)
        spare: dict[int, _Listener] | None = {} if self._listeners is None else None
        with self._lock:
            if not self._cancelled:
                listeners = self._listeners
                if listeners is None:
                    # `spare` is None only if another thread created the dict since we looked.
                    listeners = self._listeners = spare if spare is not None else {}
                listeners[listener._key] = listener
                return listener
        listener._run()
        return listener

    # -- internal -----------------------------------------------------------------------------

    def _attach(self, ref: weakref.ref[CancelToken]) -> bool:
        """Hold a child weakly; False (nothing held) if this token is already cancelled."""
        spare: set[weakref.ref[CancelToken]] | None = set() if self._children is None else None
        with self._lock:
            if self._cancelled:
                return False
            children = self._children
            if children is None:
                children = self._children = spare if spare is not None else set()
            children.add(ref)
            if len(children) < self._sweep_at:
                return True
        self._sweep_children()
        return True

    def _detach(self, ref: weakref.ref[CancelToken]) -> None:
        with self._lock:
            children = self._children
            if children is not None:
                children.discard(ref)

    def _sweep_children(self) -> None:
        # Children dropped without close() leave dead weak references behind. Sweeping when the
        # set has doubled since the last sweep keeps it within twice its live size, amortized
        # O(1) per attach, with no finalizer of our own.
        with self._lock:
            children = self._children
            # copy() allocates the new set before it reads the old one in one C call, so a
            # finalizer that links a child meanwhile cannot break the copy (an iterator would
            # raise "set changed size").
            snapshot = children.copy() if children else set()
        dead = {ref for ref in snapshot if ref() is None}
        with self._lock:  # set-from-set difference: no iterator
            children = self._children
            if children is None:
                return
            children.difference_update(dead)
            self._sweep_at = max(_FIRST_SWEEP, 2 * len(children))

    def _mark(self, reason: object, from_timer: bool, from_parent: bool) -> _Marked | None:
        """Set the cancelled state; return what to notify, or None if it was not live."""
        now = time.monotonic()  # before locking: no call, so no finalizer, inside the section
        with self._lock:
            if self._cancelled or (self._closed and (from_parent or from_timer)):
                return None
            self._reason = reason
            self._timed_out = from_timer
            self._cancelled_at = now
            self._cancelled = True  # written last: a lock-free reader then also sees the reason
            listeners, self._listeners = self._listeners, None
            children, self._children = self._children, None
            links, self._links = self._links, None
            timer, self._timer = self._timer, None
            event = self._event
        # The swapped-out containers are private now: nobody mutates them any more.
        if links:
            for parent, ref in links:
                parent._detach(ref)
        if timer is not None:
            timer.disarm()
        if event is not None:
            event.set()
        return children, listeners

    def _link_to(self, parents: tuple[CancelToken, ...]) -> None:
        ref = weakref.ref(self)
        if len(parents) == 1:
            links = [] if parents[0] is _NEVER else [(parents[0], ref)]
        else:
            links = [(parent, ref) for parent in parents if parent is not _NEVER]
        # Recorded before attaching, so a parent that cancels us meanwhile detaches us from all.
        self._links = links
        for parent, _ in links:
            if not parent._attach(ref):
                _cancel(self, parent._reason)
                return
            if self.cancelled:
                # A parent cancelled us while we attached; its cleanup may have run first.
                parent._detach(ref)
                return

    def _arm(self, seconds: float, reason: TimeoutReason) -> None:
        entry = _TIMER.schedule(self, seconds, reason)
        with self._lock:
            if not self._cancelled:
                self._timer = entry
                return
        entry.disarm()

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            links, self._links = self._links, None
            timer, self._timer = self._timer, None
        if links:
            for parent, ref in links:
                parent._detach(ref)
        if timer is not None:
            timer.disarm()

    def _state_repr(self) -> str:
        if self._cancelled:
            return f"cancelled reason={self._reason!r}"
        return "live"

    def __repr__(self) -> str:
        return f"<CancelToken {self._state_repr()}>"


_FIRST_SWEEP = 64
_Marked = tuple["set[weakref.ref[CancelToken]] | None", "dict[int, _Listener] | None"]


class _NeverToken(CancelToken):
    """The never-cancelled token: registrations and links to it store nothing."""

    __slots__ = ()

    def on_cancel(self, callback: Callable[[], object]) -> Registration:
        if not callable(callback):
            raise TypeError(f"on_cancel() needs a callable, got {type(callback).__name__}")
        return _NoopRegistration()

    def wait(self, timeout: float | None = None) -> bool:
        threading.Event().wait(timeout)  # without a timeout: blocks forever, as asked
        return False

    def __repr__(self) -> str:
        return "<CancelToken never>"


def _new_token(cls: type[CancelToken] = CancelToken) -> CancelToken:
    self = object.__new__(cls)
    self._lock = _thread.RLock()  # threading.RLock() is the same type behind a Python call
    self._cancelled = self._timed_out = self._closed = False
    self._reason = self._listeners = self._children = self._links = None
    self._event = self._timer = None
    self._sweep_at = _FIRST_SWEEP
    return self


_NEVER = _new_token(_NeverToken)


def _cancel(token: CancelToken, reason: object, from_timer: bool = False) -> bool:
    """Cancel `token` and its linked subtree; run their callbacks. True if it was live."""
    marked = token._mark(reason, from_timer, False)
    if marked is None:
        return False
    pending = [marked]
    callbacks: dict[int, _Listener] = {}
    interrupted: BaseException | None = None
    while True:
        try:
            _mark_subtree(pending, callbacks, reason)
            break
        except BaseException as exc:  # a Ctrl-C mid-walk: the walk is idempotent, finish it
            interrupted = interrupted or exc
    try:
        _run_callbacks(list(callbacks.values()))
    finally:
        if interrupted is not None:
            raise interrupted
    return True


def _mark_subtree(pending: list[_Marked], callbacks: dict[int, _Listener], reason: object) -> None:
    """Mark every token linked below `pending` breadth-first (any depth, no recursion).

    Every linked token reads as cancelled before any user callback runs. Re-running it after an
    interruption is harmless: marked tokens return None and callbacks are keyed by listener.
    """
    index = 0
    while index < len(pending):
        children, listeners = pending[index]
        if listeners:
            callbacks.update(listeners)  # keys are global registration numbers: order kept
        if children:
            for ref in children:
                child = ref()
                if child is not None:
                    child_marked = child._mark(reason, False, True)
                    if child_marked is not None and child_marked != (None, None):
                        pending.append(child_marked)
        index += 1


def _run_callbacks(callbacks: list[_Listener]) -> None:
    first_error: BaseException | None = None
    for listener in callbacks:
        try:
            listener._run()
        except BaseException as exc:  # KeyboardInterrupt & co: finish the others, then re-raise
            if first_error is None:
                first_error = exc
    if first_error is not None:
        raise first_error


def _check_seconds(seconds: object, what: str) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {type(seconds).__name__}")
    try:
        value = float(seconds)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive, finite number of seconds, got {seconds!r}")
    return value


class CancelSource:
    """Owns a cancellation: `cancel(reason)` cancels `.token` and every token linked below it.

    `CancelSource(*parents, timeout=None)` links to each parent token: the source is cancelled
    when *any* parent is (with that parent's reason) or, with `timeout`, after that many seconds
    (reason `TimeoutReason("TIMEOUT", timeout)`). `close()` detaches it from its parents and stops
    its timer without cancelling it; `cancel()` still works after `close()`. Use it as a context
    manager to close it on exit. A link lives while the source *or its token* is reachable.

    Example::

        with CancelSource(caller_token, timeout=2.5) as scope:
            do_work(scope.token)
            scope.timed_out          # True only if its own timer fired
    """

    __slots__ = ("__weakref__", "_token")

    def __init__(self, *parents: CancelToken, timeout: float | None = None) -> None:
        self._token = _new_source_token(parents, timeout, "TIMEOUT")

    @property
    def token(self) -> CancelToken:
        """The token observing this source."""
        return self._token

    @property
    def timed_out(self) -> bool:
        """True if this source's own timer cancelled it (not a parent, not `cancel()`)."""
        return self._token._timed_out

    def cancel(self, reason: object = None) -> bool:
        """Cancel the token and its linked descendants; True only for the call that cancelled.

        The first reason wins. Callbacks run in this thread, after every linked token reads as
        cancelled; one that raises is logged and never makes `cancel()` raise.
        """
        return _cancel(self._token, reason)

    def close(self) -> None:
        """Detach from the parents and stop the timer, without cancelling. Idempotent."""
        self._token._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._token._close()

    def __repr__(self) -> str:
        token = self._token
        timed = " timed_out" if token._timed_out else ""
        closed = " closed" if token._closed else ""
        return f"<CancelSource {token._state_repr()}{timed}{closed}>"


def _new_source_token(parents: tuple[object, ...], seconds: object, code: str) -> CancelToken:
    for parent in parents:
        if not isinstance(parent, CancelToken):
            hint = " (pass source.token)" if isinstance(parent, CancelSource) else ""
            raise TypeError(f"parents must be CancelTokens, got {type(parent).__name__}{hint}")
    timeout = None if seconds is None else _check_seconds(seconds, "timeout")
    token = _new_token()
    if parents and not (len(parents) == 1 and parents[0] is _NEVER):
        token._link_to(parents)  # type: ignore[arg-type]
    if timeout is not None and not token._cancelled:
        token._arm(timeout, TimeoutReason(code, timeout))
    return token


def deadline(
    parent: CancelToken | None, seconds: float | None, code: str = "TIMEOUT"
) -> CancelSource:
    """A source cancelled by `parent` or, after `seconds`, with `TimeoutReason(code, seconds)`.

    `seconds=None` means no timer. Close it (or use `with`) when done, so that a long-lived
    parent keeps nothing registered for it.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    source = CancelSource.__new__(CancelSource)
    parents: tuple[object, ...] = () if parent is None else (parent,)
    source._token = _new_source_token(parents, seconds, code)
    return source


def timeout_of(token_or_reason: object, code: str | None = None) -> TimeoutReason | None:
    """The `TimeoutReason` that cancelled a token (or that a reason is), else None.

    With `code`, only a reason carrying that code counts, so an outer deadline with another code
    reads as ordinary cancellation.
    """
    reason = token_or_reason
    if isinstance(token_or_reason, CancelToken):
        reason = token_or_reason._reason
    if isinstance(reason, TimeoutReason) and (code is None or reason.code == code):
        return reason
    return None


def _fire(token: CancelToken, reason: TimeoutReason) -> None:
    _cancel(token, reason, from_timer=True)


_TIMER = Timer(_fire)
