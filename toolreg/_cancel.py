"""Cancellation sources, tokens, registrations and deadlines.

A `CancelSource` owns cancellation; its `CancelToken` only observes it. Sources link to parent
tokens, so tokens form a tree: cancelling a parent cancels every linked descendant.

Design rules (each one answers a known trap, see docs/contract.md):

* Links are lazy until someone listens. A new source only *remembers* its parents and its due
  time; reading `.cancelled` (or `.reason`) resolves it against them, iteratively, and records
  the first cause (a parent's cancellation or its own due time, whichever came first, with that
  moment as `_cancelled_at`). Registering a callback, waiting, or linking a child makes the
  token eager first: linked into its parents and its timer armed. So a call that nobody listens
  to costs no link and no timer entry, and what every reader sees is the same as with eager
  links.
* Propagation over eager links is push-based. `cancel()` marks the whole linked subtree as
  cancelled first, walking it with an explicit worklist (never the Python stack), and only then
  runs user callbacks, in the cancelling thread, with no lock held.
* A parent holds its children *weakly*. A child that is closed or cancelled removes its link from
  every parent at once; the link of a child dropped without `close()` is swept when the parent's
  set of children doubles. So a long-lived parent holds no state for children that came and went,
  and correctness never depends on the garbage collector.
* `token.cancelled` is a plain attribute read once eager or cancelled (the read that resolves a
  lazy token's cause marks it under its lock). Critical sections never call user code; our
  finalizers (`TimerEntry._died`) never take a lock.
* A token's lock is reentrant, because a *user's* finalizer can run on the thread that holds it
  and call back into the token (remove a registration, link a child): a cyclic collection runs
  finalizers on whichever thread triggers it, at an allocation (3.10, 3.11) or, from 3.12 on, at
  the next call or loop back-edge after one, so no critical section can keep collections out.
  Each section leaves the token consistent at every call it makes, and takes the thread id and
  the clock before locking, so such a nested operation always sees (and leaves) a whole state.
* One shared daemon timer thread serves every deadline in the process (`_timer`). It fires a
  deadline by marking its subtree cancelled (so `.cancelled`, `.reason` and `.wait()` see the
  deadline on time) and hands the callbacks to the `toolreg-callbacks` threads (`_jobs`): a slow
  callback never delays another deadline, and a blocked one never holds up the callbacks of
  other deadlines. A lazy deadline nobody listens to never reaches the timer at all.
* Time comes from `_now` (`time.monotonic`), which `manual_clock()` replaces in tests.
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import itertools
import threading
import time
from _weakref import ref as _weak_ref  # `weakref.ref`, without loading `weakref`
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    import weakref

    from typing_extensions import Self

from . import _validate
from ._interrupts import INTERRUPTS
from ._jobs import JobThreads
from ._logger import logger
from ._record import record
from ._timer import ManualClock, Timer, TimerEntry

__all__ = [
    "CancelSource",
    "CancelToken",
    "Cancelled",
    "Registration",
    "TimeoutReason",
    "deadline",
    "timeout_of",
]


_next_key = itertools.count().__next__  # dict keys for listeners; next() is atomic under the GIL

_now = time.monotonic  # the clock of every due time and cancellation moment; see manual_clock()

# Listener states.
_PENDING, _RUNNING, _DONE, _REMOVED = range(4)


@record(frozen=True, slots=True)
class TimeoutReason:
    """The cancellation reason of a deadline: which `code` it carried, after how many seconds."""

    code: str
    seconds: float

    def __init__(self, code: str, seconds: float) -> None:
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "seconds", seconds)

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
        me = threading.get_ident()  # before locking: a call in the section could run a finalizer
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
        claimed = False
        # The try starts before the state is set: an asynchronous exception (a Ctrl-C) that
        # lands after it, before or in the callback, still marks the listener done, so a
        # `remove()` on another thread never waits for a callback that will not run. `claimed`
        # is set right after the state, with no call in between; an early return (a listener
        # that is not ours to run) leaves the state alone.
        try:
            with token._lock:
                if self._state != _PENDING:
                    return
                self._thread = me
                self._state = _RUNNING
                claimed = True
            fn = self._fn
            try:
                if fn is not None:
                    fn()
            except INTERRUPTS:  # Ctrl-C and SystemExit propagate, after the other callbacks
                raise
            except BaseException:  # asyncio.CancelledError, GeneratorExit, ...: a callback's bug
                logger.exception("toolreg: cancel callback %r raised", fn)
        finally:
            if claimed:
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

    Tokens are made by a `CancelSource` (or `CancelToken.never()`). All methods are thread-safe.
    `.cancelled` and `.reason` of an eager token, or of one already cancelled, are plain reads
    that take no lock; on a lazy token the read that first finds a cause marks it cancelled,
    under its lock (see `cancelled`). Once cancelled, a token stays cancelled and its reason
    never changes (the first reason wins, inherited from the parent that cancelled it).

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
        "_due",
        "_due_reason",
        "_event",
        "_linking",
        "_links",
        "_listeners",
        "_lock",
        "_parent",
        "_pending",
        "_reason",
        "_sweep_at",
        "_timed_out",
        "_timer",
    )

    # Guards every field below except the lock-free reads of _cancelled/_reason/_timed_out (which
    # are still only written under it), and the state of this token's listeners.
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
    # Lazy state, cleared once eager (or cancelled, or closed): parents not linked yet, and the
    # due time (monotonic) and (code, seconds) of a timer not armed yet. Readers resolve
    # through them without a lock; `_linking` is set while one thread makes the token eager,
    # which keeps `_pending`/`_due` readable until the links and the timer are in place.
    _pending: tuple[CancelToken, ...] | None
    # `_pending`'s one parent while it has exactly one and no thread is making this token eager
    # (cleared, under the lock, when one starts to): the fast path of `cancelled` reads it.
    _parent: CancelToken | None
    _due: float | None
    _due_reason: tuple[str, float] | None
    _linking: bool

    def __init__(self) -> None:
        raise TypeError("CancelToken cannot be created directly: use CancelSource().token")

    @staticmethod
    def never() -> CancelToken:
        """A token that is never cancelled and stores nothing (a shared singleton)."""
        return _NEVER

    @property
    def cancelled(self) -> bool:
        """True once cancelled.

        No lock on an eager or already-cancelled token. On a lazy one it walks the ancestry
        without a lock; the read that finds a cause marks the token (and lazy ancestors found
        cancelled) with the ordinary cancellation, under each one's lock, and one that finds a
        lazy ancestry deeper than 32 makes it eager (links, timer) so later reads are plain.
        """
        if self._cancelled:
            return True
        parent = self._parent
        due = self._due
        if parent is not None:
            # The usual shapes, read without a walk: a call's token under an eager caller, and a
            # deadline under a call's token (itself under nothing, or under an eager caller).
            # Live if every token up to the eager one is live with no due time of its own, and
            # this token's own due time (if any) is still ahead. Each token's lazy fields are
            # read before its flag (`_lazy_then_live`).
            if parent._due is None:
                if parent._pending is None:
                    if not parent._cancelled and (due is None or _now() < due):
                        return False
                elif not parent._cancelled:
                    grand = parent._parent  # one level more: a deadline under a call's token
                    if (
                        grand is not None
                        and grand._pending is None
                        and grand._due is None
                        and not grand._cancelled
                        and (due is None or _now() < due)
                    ):
                        return False
        elif self._pending is None and (due is None or _now() < due):
            # Eager (pushes reach it), a root, or a root deadline not due yet: what its flag
            # says now (it may have been marked since the first read).
            return self._cancelled
        return _resolve(self)

    @property
    def reason(self) -> object:
        """The reason passed to `cancel()` (or a `TimeoutReason`); None while live."""
        if not self._cancelled and (self._pending is not None or self._due is not None):
            _resolve(self)
        return self._reason

    def raise_if_cancelled(self) -> None:
        """Raise `Cancelled(reason)` if the token is cancelled."""
        if self.cancelled:
            raise Cancelled(self._reason)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or until `timeout` seconds pass; True if cancelled.

        An `Event` is created on the first wait only, so tokens nobody waits on stay small.
        """
        if self.cancelled:
            return True
        _materialize(self)
        event = self._event
        if event is None:
            new_event = threading.Event()  # allocated before taking the lock
            with self._lock:
                cancelled: bool = self._cancelled  # re-read under the lock, with no call
                if cancelled:  # (eager now: a push sets the event)
                    return True
                event = self._event
                if event is None:
                    event = self._event = new_event
        return event.wait(timeout)

    def on_cancel(self, callback: Callable[[], object]) -> Registration:
        """Run `callback()` once when the token is cancelled; return its `Registration`.

        If the token is already cancelled, the callback runs now, in this thread, before
        `on_cancel` returns. Otherwise it runs in the thread that calls `cancel()`, after the
        token (and every token linked below it) reads as cancelled, in registration order, with
        no toolreg lock held. A deadline's timer thread never runs callbacks: when a deadline
        fires, its tokens read as cancelled at once and their callbacks run soon after on a
        ``toolreg-callbacks`` daemon thread (a callback that blocks there lets the callbacks of
        other deadlines run on another one). A callback that raises is logged on the `toolreg`
        logger and the others still run; only `KeyboardInterrupt` and `SystemExit` propagate
        (out of `cancel()` or this call), after the other callbacks ran.

        A deadline with a callback registered is held by the timer until it fires or is closed,
        so the callback runs when it comes due even if nobody holds the source any more.
        """
        if not callable(callback):
            raise TypeError(f"on_cancel() needs a callable, got {type(callback).__name__}")
        if self._pending is not None or self._due is not None:  # lazy: link it first
            _materialize(self)
        listener = _Listener(self, callback)
        # Allocated before locking, if there was no dict when we looked (if another thread made
        # one meanwhile, `spare` goes unused).
        spare: dict[int, _Listener] | None = {} if self._listeners is None else None
        with self._lock:
            if not self._cancelled:
                listeners = self._listeners
                if listeners is None:
                    # Then there was none when we looked either, so `spare` is a dict: a dict,
                    # once made, is dropped only by `_mark`, which sets `_cancelled` first.
                    assert spare is not None
                    listeners = self._listeners = spare
                listeners[listener._key] = listener
                timer = self._timer
                if timer is not None:
                    timer.keep = self  # a dropped deadline still runs what waits for it
                return listener
        listener._run()
        return listener

    # -- internal -----------------------------------------------------------------------------

    def _attach(self, ref: weakref.ref[CancelToken]) -> bool:
        """Hold a child weakly; False (nothing held) if this token is already cancelled."""
        if self.cancelled:
            return False
        _materialize(self)  # an eager child needs an eager parent to push to it
        spare: set[weakref.ref[CancelToken]] | None = set() if self._children is None else None
        with self._lock:
            if self._cancelled:
                return False
            children = self._children
            if children is None:
                # `spare` is a set, as in `on_cancel`: only `_mark` drops it, after `_cancelled`.
                assert spare is not None
                children = self._children = spare
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

    def _mark(
        self, reason: object, from_timer: bool, from_parent: bool, at: float | None = None
    ) -> _Marked | None:
        """Set the cancelled state; return what to notify, or None if it was not live.

        `at` is when the cancellation happened, for one resolved lazily (default: now).
        """
        when = _now() if at is None else at
        with self._lock:
            if self._cancelled or (self._closed and (from_parent or from_timer)):
                return None
            self._reason = reason
            self._timed_out = from_timer
            self._cancelled_at = when
            # After the reason (a lock-free reader that sees `_cancelled` sees the reason too),
            # and before the lazy fields go: a lazy child reading this token while they are
            # gone would take it for an eager, live parent and read itself live.
            self._cancelled = True
            self._pending = self._due = self._parent = None
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
        ref = _weak_ref(self)
        if len(parents) == 1:
            links = [] if parents[0] is _NEVER else [(parents[0], ref)]
        else:
            links = [(parent, ref) for parent in parents if parent is not _NEVER]
        # Recorded before attaching, so a parent that cancels us meanwhile detaches us from all.
        self._links = links
        for parent, _ in links:
            if not parent._attach(ref):
                _cancel(self, parent._reason, at=parent._cancelled_at)
                return
            if self._cancelled or self._closed:
                # A parent cancelled us (or our owner closed us) while we attached; its cleanup
                # may have run first.
                parent._detach(ref)
                return

    def _arm(self, due: float, reason: TimeoutReason) -> None:
        entry = _TIMER.schedule(self, due, reason)  # the timer's clock is `_now`
        with self._lock:
            if not (self._cancelled or self._closed):
                self._timer = entry
                if self._listeners:
                    entry.keep = self  # see on_cancel
                return
        entry.disarm()

    def _make_eager(self) -> None:
        """Link this token into its parents and arm its timer; its parents are eager already."""
        with self._lock:
            if self._cancelled or self._closed or self._linking:
                return  # nothing to do, or another thread is doing it (and readers still resolve)
            pending, due, why = self._pending, self._due, self._due_reason
            if pending is None and due is None:
                return
            self._linking = True
            self._parent = None  # readers take the slow path while the links are made
        try:
            if pending is not None:
                self._link_to(pending)
            if due is not None and why is not None and not self._cancelled:
                reason = TimeoutReason(*why)
                if due <= _now():
                    _cancel(self, reason, from_timer=True, at=due)
                else:
                    self._arm(due, reason)
        finally:
            with self._lock:
                self._pending = self._due = None  # eager now: pushes reach it, the timer fires
                self._linking = False

    def _close(self, resolve: bool = True) -> None:
        if self._pending is not None or self._due is not None:
            if resolve:
                self.cancelled  # noqa: B018  # a cause that came before close() counts (eagerly too)
        else:
            timer = self._timer
            if timer is not None and not self._cancelled and _now() >= timer.due:
                _fire_late(self, timer)  # due, and the timer thread has not got to it yet
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._pending = self._due = self._parent = None
            links, self._links = self._links, None
            timer, self._timer = self._timer, None
        if links:
            for parent, ref in links:
                parent._detach(ref)
        if timer is not None:
            timer.disarm()

    def _state_repr(self) -> str:
        if self.cancelled:
            return f"cancelled reason={self._reason!r}"
        return "live"

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "a CancelToken cannot be pickled: it observes a cancellation in this process "
            "(on a cluster, toolreg.distributed hands the remote body a token of its own)"
        )

    def __repr__(self) -> str:
        return f"<CancelToken {self._state_repr()}>"


_FIRST_SWEEP = 64
_DESCENT_LIMIT = 16  # tokens walked to tell whether one descends from another
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
    self._pending = self._due = self._due_reason = self._parent = None
    self._linking = False
    self._sweep_at = _FIRST_SWEEP
    return self


_NEVER = _new_token(_NeverToken)


def _cancel(
    token: CancelToken, reason: object, from_timer: bool = False, at: float | None = None
) -> bool:
    """Cancel `token` and its linked subtree; run their callbacks here. True if it was live.

    `from_timer`: its own due time passed (a lazy deadline read late); `at`: when that was.
    """
    marked = _mark_tree(token, reason, from_timer, at)
    if marked is None:
        return False
    callbacks, interrupted = marked
    try:
        if callbacks:
            _run_callbacks(callbacks)
    finally:
        if interrupted is not None:
            raise interrupted
    return True


def _fire(token: CancelToken, reason: TimeoutReason) -> None:
    """The timer's action: mark the subtree cancelled now, run its callbacks elsewhere."""
    marked = _mark_tree(token, reason, True, None)
    if marked is not None and marked[0]:
        _CALLBACKS.call_soon(functools.partial(_run_callbacks, marked[0]))


def _fire_late(token: CancelToken, entry: TimerEntry) -> None:
    """`_fire` for a token closed after its due time, before the timer got to it.

    It reads as timed out at its due time, as a lazy deadline would; its callbacks still run
    where the timer's would (a Ctrl-C that landed while marking is re-raised here).
    """
    marked = _mark_tree(token, entry.reason, True, entry.due)
    if marked is None:
        return
    callbacks, interrupted = marked
    if callbacks:
        _CALLBACKS.call_soon(functools.partial(_run_callbacks, callbacks))
    if interrupted is not None:
        raise interrupted


_NOTHING_TO_RUN: tuple[list[_Listener], None] = ([], None)


def _mark_tree(
    token: CancelToken, reason: object, from_timer: bool, at: float | None
) -> tuple[list[_Listener], BaseException | None] | None:
    """Mark `token` and its linked subtree cancelled; None if it was not live.

    Returns the callbacks to run, in registration order, and a Ctrl-C that landed meanwhile.
    """
    marked = token._mark(reason, from_timer, False, at)
    if marked is None:
        return None
    if marked == (None, None):
        return _NOTHING_TO_RUN  # nothing linked below it, nothing registered: the lazy case
    pending = [marked]
    callbacks: dict[int, _Listener] = {}
    interrupted: BaseException | None = None
    while True:
        try:
            _mark_subtree(pending, callbacks, reason)
            break
        except BaseException as exc:  # a Ctrl-C mid-walk: the walk is idempotent, finish it
            interrupted = interrupted or exc
    return list(callbacks.values()), interrupted


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
        self._token = _new_source_token(parents, timeout, "TIMEOUT", "timeout")

    @property
    def token(self) -> CancelToken:
        """The token observing this source."""
        return self._token

    @property
    def timed_out(self) -> bool:
        """True if this source's own timer cancelled it (not a parent, not `cancel()`)."""
        token = self._token
        return token.cancelled and token._timed_out

    def cancel(self, reason: object = None) -> bool:
        """Cancel the token and its linked descendants; True only for the call that cancelled.

        The first reason wins. Callbacks run in this thread, after every linked token reads as
        cancelled; one that raises is logged and does not make `cancel()` raise, except for a
        `KeyboardInterrupt` or `SystemExit`, re-raised once the other callbacks ran.
        """
        return cancel_token(self._token, reason)

    def close(self) -> None:
        """Detach from the parents and stop the timer, without cancelling. Idempotent."""
        self._token._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._token._close()

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "a CancelSource cannot be pickled: it owns a cancellation in this process "
            "(on a cluster, toolreg.distributed relays the cancellation and its reason)"
        )

    def __repr__(self) -> str:
        token = self._token
        timed = " timed_out" if self.timed_out else ""
        closed = " closed" if token._closed else ""
        return f"<CancelSource {token._state_repr()}{timed}{closed}>"


def _new_source_token(
    parents: tuple[object, ...], seconds: object, code: str, what: str
) -> CancelToken:
    for parent in parents:
        if not isinstance(parent, CancelToken):
            checked_token(parent, "a parent")  # raises the TypeError that says why
    timeout = (
        None
        if seconds is None
        else _validate.seconds(seconds, what, unlimited="pass None for no timer")
    )
    token = _new_token()
    # Lazy: remember the parents and the due time; linking and arming wait for a listener.
    if parents:
        if len(parents) == 1:
            if parents[0] is not _NEVER:
                token._pending = parents  # type: ignore[assignment]
                token._parent = parents[0]  # type: ignore[assignment]
        else:
            linked = tuple(parent for parent in parents if parent is not _NEVER)
            if linked:
                token._pending = linked  # type: ignore[assignment]
                if len(linked) == 1:
                    token._parent = linked[0]  # type: ignore[assignment]
    if timeout is not None:
        token._due_reason = (code, timeout)
        token._due = _now() + timeout
    return token


def cancel_token(token: CancelToken, reason: object) -> bool:
    """`CancelSource.cancel` for any token (a source's, or a call's from `child_token`).

    A lazy token that a parent's cancellation or a due time has cancelled already is resolved
    first, so that cause stays the first, with its moment and reason, and this returns False:
    what an eager token (whose parent pushed the cancellation down) would have done.
    """
    lazy = token._pending is not None or token._due is not None
    if lazy and not token._cancelled and _resolve(token):
        return False
    return _cancel(token, reason)


def caller_token(value: object) -> CancelToken:
    """A call's ``token=`` argument: None means never cancelled; anything else must be a
    `CancelToken` (`TypeError` otherwise). The sync registry and the asyncio facade check it the
    same way."""
    if value is None:
        return _NEVER
    if isinstance(value, CancelToken):
        return value
    return checked_token(value, "token")  # raises the TypeError that says why


def checked_token(value: object, what: str) -> CancelToken:
    """`value` if it is a `CancelToken`, else a `TypeError` naming `what` it should have been,
    with a hint when a `CancelSource` was passed instead of its token. The one check of a token
    argument (here, beside the class: `_validate`, which this module uses, cannot import it)."""
    if isinstance(value, CancelToken):
        return value
    hint = " (pass source.token)" if isinstance(value, CancelSource) else ""
    raise TypeError(f"{what} must be a CancelToken, got {type(value).__name__}{hint}")


def child_token(parent: CancelToken) -> CancelToken:
    """A lazy child of `parent` without a source (the registry's own, checked tokens).

    Cancel it with `cancel_token(token, reason)`; like a source's token it follows `parent`.
    """
    token = _new_token()
    if parent is not _NEVER:
        token._pending = (parent,)
        token._parent = parent
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
    source._token = _new_source_token(parents, seconds, code, "seconds")
    return source


def deadline_token(parent: CancelToken, seconds: float, code: str) -> CancelToken:
    """`deadline(parent, seconds, code).token` for a duration checked already, without a source.

    `TimeoutPolicy`'s per-call deadline: the tool's timeout was validated when the tool was
    made. Close it with `close_token`; `timed_out(token)` says whether its own due time fired.
    """
    token = _new_token()
    if parent is not _NEVER:
        token._pending = (parent,)
        token._parent = parent
    token._due_reason = (code, seconds)
    token._due = _now() + seconds
    return token


def close_token(token: CancelToken) -> None:
    """`CancelSource.close()` for a token made without a source (`deadline_token`), except that
    a lazy token is not read once more first: a cause nobody has read yet is dropped with it.

    `TimeoutPolicy` closes its deadline after the body was joined, and the body's reads (before
    it starts, on its return, and the registry's after the join) saw whatever counts.
    """
    with token._lock:
        if token._links is None and token._timer is None and not token._linking:
            # Never made eager (the usual case): nothing of it is registered anywhere, and a
            # closed token is never linked or armed later (`_make_eager` checks `_closed`).
            token._closed = True
            token._pending = token._due = token._parent = None
            return
    token._close(False)


def timed_out(token: CancelToken) -> bool:
    """`CancelSource.timed_out` for a token made without a source (`deadline_token`)."""
    return token.cancelled and token._timed_out


# -- what the engine reads of a token (its internal interface) ------------------------------------


def descends_from(token: CancelToken, ancestor: CancelToken) -> bool:
    """Whether `ancestor`'s cancellation reaches `token` (a bounded upward walk)."""
    pending = token._pending
    if pending is not None and pending[0] is ancestor:
        return True  # a lazy child of it (a deadline under the call's token): the usual case
    seen = 0
    frontier: list[CancelToken] = [token]
    while frontier and seen < _DESCENT_LIMIT:
        node = frontier.pop()
        if node is ancestor:
            return True
        seen += 1
        pending = node._pending
        if pending is not None:
            frontier.extend(pending)
        links = node._links
        if links:
            frontier.extend(parent for parent, _ in links)
    return False


def lazy_due_above(token: CancelToken, ancestor: CancelToken) -> float | bool | None:
    """The earliest lazy due time on the path from `token` up to `ancestor`, if it is all lazy.

    The path must be single-parent lazy links ending at `ancestor`: then None (no due time
    on it) or the earliest due time. Anything else (an eager token on the way, a fused
    one, another root): False. Always False under `manual_clock()`: its due times are not
    monotonic times a joiner could wait for, so it listens and the manual timer pushes.
    """
    if _now is not time.monotonic:
        return False
    node: CancelToken = token
    due: float | None = None
    for _ in range(_DESCENT_LIMIT):
        if node is ancestor:
            return due
        pending = node._pending
        if pending is None or len(pending) != 1 or node._linking:
            return False
        node_due = node._due
        if node_due is not None and (due is None or node_due < due):
            due = node_due
        node = pending[0]
    return False


def cancelled_at(token: CancelToken, resolve: bool = True) -> float | None:
    """When `token` was cancelled (`time.monotonic()` seconds), or None while it is live.

    `resolve=False` reads only a cancellation already marked: a lazy cause nobody has read yet
    does not count (nor is it resolved).
    """
    if not resolve:
        return token._cancelled_at if token._cancelled else None
    if not token._cancelled and token._pending is None and token._due is None:
        return None  # live, and nothing it could resolve against
    return token._cancelled_at if token.cancelled else None


def release_token(token: CancelToken) -> None:
    """A call's token at the call's end: if someone listened on it (which made it eager), it
    is closed, so nothing of it stays linked to the caller's token."""
    if token._links:
        token._close()


def timeout_of(token_or_reason: object, code: str | None = None) -> TimeoutReason | None:
    """The `TimeoutReason` that cancelled a token (or that a reason is), else None.

    With `code`, only a reason carrying that code counts, so an outer deadline with another code
    reads as ordinary cancellation.
    """
    reason = token_or_reason
    if isinstance(token_or_reason, CancelToken):
        reason = token_or_reason.reason
    if isinstance(reason, TimeoutReason) and (code is None or reason.code == code):
        return reason
    return None


# -- lazy links ------------------------------------------------------------------------------------

_EAGER_AFTER = 32  # a lazy ancestry this deep is made eager on read, so reads stay O(1) after

# `_lazy_then_live`: how a lock-free reader reads a token it did not lock. Marking a token
# cancelled sets `_cancelled` before it clears `_pending`/`_due`, and making one eager clears
# them only once its links are in place (so a parent's cancellation reaches it). So a reader
# reads a token's lazy fields first and its flag after: lazy fields gone and the flag unset means
# eager (or a root) and live at that moment. The other order can see the fields gone by a
# marking that began just after the flag was read, and take a cancelled token for a live one.


def _resolve(token: CancelToken) -> bool:
    """Is a lazy `token` cancelled by now? If so, mark it and say True.

    The first cause wins, by when it happened: an ancestor's cancellation (at its
    `_cancelled_at`) or a due time on the way up (its own, or a lazy ancestor's). Marking is the
    ordinary `_cancel`, so two threads resolving at once agree (the first mark wins) and a
    callback registered meanwhile still runs exactly once. A chain of single-parent links (a
    call's token under its caller's, a deadline under that) is walked in a plain loop; anything
    else goes to `_resolve_graph`.
    """
    now: float | None = None
    first_at: float | None = None
    first: CancelToken | None = None  # whose cancellation or due time came first
    node = token
    for _ in range(_EAGER_AFTER):
        pending, due = node._pending, node._due  # before the flag (`_lazy_then_live`)
        if node._cancelled:  # an ancestor cancelled (or this one, concurrently): a moment
            at = node._cancelled_at
            if first_at is None or at < first_at:
                first_at, first = at, node
            break
        if due is not None:
            if now is None:
                now = _now()
            if due <= now and (first_at is None or due < first_at):
                first_at, first = due, node
        if pending is None:
            break  # eager and live (pushes reach it), or a root: nothing further up
        if len(pending) != 1 or node._linking:
            return _resolve_graph(token)
        node = pending[0]
    else:
        return _resolve_graph(token)  # a long chain: the graph walk also makes it eager
    if first is None or first_at is None:
        return False
    if first._cancelled:
        _cancel(token, first._reason, from_timer=first is token and first._timed_out, at=first_at)
        return True
    if first is token:
        return _time_out(token, first_at)
    why = first._due_reason
    if why is None:  # that ancestor became eager meanwhile: ask again, the slow way
        return _resolve_graph(token)
    _cancel(token, TimeoutReason(*why), at=first_at)  # an ancestor's deadline: inherited
    return True


def _time_out(token: CancelToken, due: float) -> bool:
    why = token._due_reason
    if why is None:  # made eager (or cancelled) meanwhile: what it reads now is the answer
        return token._cancelled
    _cancel(token, TimeoutReason(*why), from_timer=True, at=due)
    return True


def _resolve_graph(token: CancelToken) -> bool:
    """`_resolve` over any ancestry of lazy tokens, iteratively (any depth, any fan-in)."""
    now = _now()
    causes: dict[int, tuple[float, object, bool] | None] = {}  # id -> (when, reason, by timer)
    order: list[CancelToken] = []  # lazy tokens, parents before children
    stack = [token]
    while stack:
        node = stack[-1]
        if id(node) in causes:
            stack.pop()
            continue
        waiting = False
        for parent in node._pending or ():
            lazy = parent._pending is not None or parent._due is not None
            if lazy and not parent._cancelled and id(parent) not in causes:
                stack.append(parent)
                waiting = True
        if waiting:
            continue
        stack.pop()
        causes[id(node)] = _first_cause(node, now, causes)
        order.append(node)
    if len(order) > _EAGER_AFTER:
        _materialize(token)
    for node in order:
        cause = causes[id(node)]
        if cause is not None and not node._cancelled:
            when, reason, by_timer = cause
            _cancel(node, reason, from_timer=by_timer, at=when)
    return token._cancelled


def _first_cause(
    node: CancelToken, now: float, causes: dict[int, tuple[float, object, bool] | None]
) -> tuple[float, object, bool] | None:
    """The earliest of a lazy token's causes, given its parents' (already resolved) causes."""
    pending, due, why = node._pending, node._due, node._due_reason  # before the flag
    if node._cancelled:
        return (node._cancelled_at, node._reason, node._timed_out)
    first: tuple[float, object, bool] | None = None
    if due is not None and why is not None and now >= due:
        first = (due, TimeoutReason(*why), True)
    for parent in pending or ():
        if parent._cancelled:
            cause: tuple[float, object, bool] | None = (
                parent._cancelled_at,
                parent._reason,
                False,
            )
        else:
            inherited = causes.get(id(parent))
            cause = None if inherited is None else (inherited[0], inherited[1], False)
        if cause is not None and (first is None or cause[0] < first[0]):
            first = cause
    return first


def _materialize(token: CancelToken) -> None:
    """Make `token` eager: link it (and its lazy ancestors, roots first) and arm its timer."""
    if token._pending is None and token._due is None:
        return
    order: list[CancelToken] = []  # parents before children
    seen: set[int] = set()
    stack: list[tuple[CancelToken, bool]] = [(token, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for parent in node._pending or ():
            if parent._pending is not None or parent._due is not None:
                stack.append((parent, False))
    for node in order:
        node._make_eager()


# Runs the callbacks of fired deadlines; its threads start with the timer's, never on it.
_CALLBACKS = JobThreads("toolreg-callbacks")
_TIMER = Timer(_fire, on_start=_CALLBACKS.start)


@contextlib.contextmanager
def manual_clock() -> Iterator[ManualClock]:
    """For tests: time stands still until `advance()`; deadlines then fire exactly when due.

    Inside, every due time and cancellation moment is read from the clock, and deadlines made
    eager (a listener, a wait) are scheduled on a timer that `advance()` serves in the calling
    thread; lazy ones read as cancelled once the clock passes their due time. Callbacks of fired
    deadlines still run on the ``toolreg-callbacks`` threads, as in production. The block owns
    its deadlines: make them inside it and do not use them after it (a deadline made before it
    is read against the manual clock meanwhile, and one made inside against the real clock
    after it).
    """
    global _TIMER, _now
    clock = ManualClock()
    previous, _TIMER = _TIMER, Timer(_fire, clock=clock)
    previous_now, _now = _now, clock
    try:
        yield clock
    finally:
        _TIMER = previous
        _now = previous_now
