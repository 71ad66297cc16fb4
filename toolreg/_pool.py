"""`WorkerPool`: the thread pool tool bodies run on; a hand-off costs at most two thread wake-ups.

A `concurrent.futures.ThreadPoolExecutor` hands work over through one shared queue: every
hand-off may wake a second idle worker, and the caller's wait goes through a `Future`, a
`Condition` and an idle semaphore (about four wake-ups and a dozen Python-level lock operations
per round trip). Here each idle worker sleeps on a wake-up of its own, idle workers are taken last
in, first out (the most recently active one is the likeliest to be warm), and the registry hands
over its own per-call object as the work item, so a round trip is at most two wake-ups: the
caller wakes one worker, the worker wakes the caller. What a worker sleeps on, and why a
hand-off wakes it without holding the GIL where it can, is `_wake`.

A burst of hand-offs wakes one worker, not one each: an item handed over while the last worker
woken has not yet woken up waits in the backlog, and that worker, once awake, passes the first
queued item on to another idle worker before it runs its own (which may block), which does the
same in turn; so does a thread just started for a queued item. A worker that finishes an item
and takes the next from the backlog passes nothing on: items are queued while a worker is to
spare only behind a worker waking (or starting), which will look at the backlog, and a worker
only goes idle with the backlog empty. So no item waits behind a body while a worker is to
spare, only behind wake-ups, and the workers that run are few: with eight callers, eight woken
workers would each fight the callers for the GIL and mostly go back to sleep, and a pass-on from
every worker that takes a queued item would wake more workers than there is work for, worst
with the callers on another CPU.

Work items are objects with two methods: `_run()`, called once on a worker (it must not raise;
the pool logs it if it does), and `_drop()`, called instead if the pool discards the item
(`shutdown(cancel_futures=True)`), so that whoever waits for it learns at once that it will
never run. `submit()` wraps a plain callable in such an item with a `Future`, so the pool is a
real `Executor` for anyone.

Lifecycle: threads are started on demand, up to `max_workers`, and are daemons: an idle pool
never keeps the interpreter alive (the registry cancels and joins calls still in flight at
exit). `shutdown()` stops them; after `fork()` the child's pool forgets the parent's threads and
starts fresh ones on demand. A hand-off that a signal handler interrupted halfway wakes the
workers it may have left out of the idle list without a wake-up (`_rescue`); a worker sleeping
on a lock also wakes on its own every `IDLE_CHECK` seconds to re-check its slot.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, Protocol, TypeVar

from . import _validate
from ._helper import HELPER
from ._logger import logger
from ._wake import Wake, new_wake

__all__ = ["WorkerPool"]


T = TypeVar("T")

_pool_numbers = itertools.count(1)  # thread names of pools without a prefix; next() is atomic


class WorkItem(Protocol):
    """What the pool runs: `_run()` once on a worker, or `_drop()` if it never will."""

    def _run(self) -> None: ...

    def _drop(self) -> None: ...


class _Worker:
    """One worker thread's slot: the item handed to it, and the wake-up it sleeps on."""

    __slots__ = ("item", "thread", "wake")

    def __init__(self, item: WorkItem | None) -> None:
        self.item = item  # written under the pool lock by whoever hands it work
        self.wake: Wake = new_wake()  # what it sleeps on, and how it is woken
        self.thread: threading.Thread | None = None


class WorkerPool(Executor):
    """A thread pool whose idle workers each sleep on their own lock, taken LIFO.

    The default executor of `ToolRegistry`, and a real `concurrent.futures.Executor`:
    `submit(fn, *args, **kwargs)` returns a `Future`, `map` and `with` work, and
    `shutdown(wait=True, cancel_futures=False)` stops the workers (work already queued still
    runs unless `cancel_futures=True`). Thread-safe. Workers are daemon threads named
    `<thread_name_prefix>-<n>`, started on demand up to `max_workers` (an int, `TypeError`
    otherwise, a `bool` included; below 1 is a `ValueError`).

    Example::

        with WorkerPool(max_workers=4) as pool:
            pool.submit(pow, 2, 10).result()      # 1024
    """

    def __init__(self, max_workers: int | None = None, thread_name_prefix: str = "") -> None:
        if max_workers is None:
            max_workers = min(32, (os.cpu_count() or 1) + 4)
        max_workers = _validate.count(max_workers, "max_workers")
        if not isinstance(thread_name_prefix, str):
            raise TypeError("thread_name_prefix must be a str")
        self._max = max_workers
        self._prefix = thread_name_prefix or f"toolreg-pool-{next(_pool_numbers)}"
        self._names = itertools.count(1)
        # Guards _idle, _backlog, _ready, _count and _shutdown. Held only for list and deque
        # operations and for waking a worker: never while work runs.
        self._lock = threading.Lock()
        self._exited = threading.Condition(self._lock)  # notified when a worker leaves _count
        self._idle: list[_Worker] = []  # sleeping workers; the last one is taken first
        # Items waiting for a worker: every worker busy, or queued behind `_ready`. Cleared in
        # place, never replaced: the workers hold it, to look at it without the lock.
        self._backlog: collections.deque[WorkItem] = collections.deque()
        # The worker most recently woken with an item: while its wake-up says `waking()`, it
        # has not started that item, and the first thing it does once it has is to look at the
        # backlog (`_serve`). Items handed over meanwhile wait there, so a burst of hand-offs
        # wakes one worker, not one each (many woken workers fight over the GIL).
        self._ready: _Worker | None = None
        self._count = 0  # workers started (or being started), alive or not yet exited
        self._shutdown = False
        # Thread ident -> its slot, written by each worker for itself: the dispatcher reads it to
        # run a call made on a worker inline, and shutdown() to find the threads to join.
        self._threads: dict[int, _Worker] = {}
        self._ref = weakref.ref(self, functools.partial(_wake_all, self._idle))
        _POOLS.add(self)

    @property
    def max_workers(self) -> int:
        """The most threads this pool runs at once."""
        return self._max

    # -- handing work over -------------------------------------------------------------------

    def _hand_over(self, item: WorkItem, *, may_block: bool = True, goes_on: bool = False) -> bool:
        """Give `item` to a worker; True if one took it at once, False if it waits its turn.

        `may_block=False` (an event loop thread): a new thread, if one is needed, is started
        by toolreg's helper thread, because `Thread.start()` blocks until the thread runs.
        `goes_on`: the caller has more to do before it waits (see `EventWake.release_deferred`).
        Raises `RuntimeError` after `shutdown()`.
        """
        try:
            worker, wake = self._place(item)
            if wake is not None and wake.deferred:
                wake.release_deferred(goes_on)  # after the pool's lock: see `_wake`
        except RuntimeError:  # shut down: nothing was taken out of the idle list
            raise
        except BaseException:  # a signal handler's exception may have cut the wake-up off
            self._rescue()
            raise
        if worker is None:
            return wake is not None
        self._start(worker, may_block)
        return True

    def _place(self, item: WorkItem) -> tuple[_Worker | None, Wake | None]:
        """`_hand_over`'s part under the pool's lock. `(worker, None)`: a new worker to start
        with `item`; `(None, wake)`: an idle worker took it (its wake-up is made already, or
        is to be made after the lock if it is `deferred`); `(None, None)`: it is queued."""
        lock = self._lock
        lock.acquire()  # not `with`: its lookups cost more than the rest of this hot path
        try:
            if self._shutdown:
                raise RuntimeError("cannot hand work to a WorkerPool after shutdown()")
            ready = self._ready
            if ready is not None and self._behind(ready, item):
                return None, None
            if self._idle:
                worker = self._idle.pop()
                worker.item = item
                self._ready = worker
                wake = worker.wake
                if wake.deferred:
                    wake.mark()
                else:
                    wake.release()  # under the lock: the slot and the wake-up go together
                return None, wake
            if self._count >= self._max:
                self._backlog.append(item)
                return None, None
            self._count += 1
            return _Worker(item), None
        finally:
            lock.release()

    def _rescue(self) -> None:
        """A hand-off was interrupted: wake every started worker not in the idle list, so one
        it took out of the list without waking it learns (spurious wake-ups of busy workers
        only make them look at their slot once more)."""
        with self._lock:
            idle = set(map(id, self._idle))
            for worker in list(self._threads.values()):
                if id(worker) not in idle:
                    with contextlib.suppress(RuntimeError):  # a lock released already
                        worker.wake.release()

    def _behind(self, ready: _Worker, item: WorkItem) -> bool:
        """With the lock held: queue `item` behind `ready` if it has not woken yet.

        Queued first, checked after: a worker wakes (`waking()` turns False), then looks at the
        backlog (without the lock), so either that look sees the item, or this check sees it
        woken and takes the item back (still last: the backlog is popped only under the lock).
        """
        if ready.wake.waking():
            self._backlog.append(item)
            if ready.wake.waking():
                return True
            self._backlog.pop()
        self._ready = None  # it has started: what it runs may block
        return False

    def _pass_on(self) -> None:
        """Items are queued and this worker is about to run one (which may block): the first of
        them goes to another worker, which does the same before it runs it (`_serve`)."""
        with self._lock:
            spare = self._pass_first() if self._backlog and not self._shutdown else None
        if spare is not None:
            self._start_spare(spare)

    def _pass_first(self) -> _Worker | None:
        """With the lock held and items queued: hand the first to an idle worker, or to a new
        worker, or leave it (all busy). What is returned is for `_start_spare` after the lock:
        a new worker to start, or an idle one whose deferred wake-up is still to be made."""
        if self._idle:
            worker = self._idle.pop()
            worker.item = self._backlog.popleft()
            self._ready = worker
            wake = worker.wake
            if wake.deferred:
                wake.mark()
                return worker
            wake.release()
            return None
        if self._count >= self._max:
            return None  # every worker is busy: the first to free up takes it
        self._count += 1
        return _Worker(self._backlog.popleft())

    def _start_spare(self, worker: _Worker) -> None:
        """After the lock, what `_pass_first` returned: wake it, or start its thread."""
        if worker.thread is not None:  # an idle worker, handed the item
            worker.wake.release_deferred()
            return
        # From a worker, which must live on: `_lost` has logged the failure and requeued the item.
        with contextlib.suppress(Exception):
            self._start(worker, True)

    def _start(self, worker: _Worker, may_block: bool) -> None:
        name = f"{self._prefix}-{next(self._names)}"
        args = (self._ref, self._threads, self._backlog, worker)
        thread = threading.Thread(target=_serve, args=args, name=name, daemon=True)
        worker.thread = thread
        if may_block:
            try:
                thread.start()
            except BaseException:
                self._lost(worker)
                raise
        else:
            try:
                HELPER.call_soon(lambda: self._start_later(worker, thread))
            except BaseException:
                self._lost(worker)  # never started: shutdown() must not wait for it
                raise

    def _start_later(self, worker: _Worker, thread: threading.Thread) -> None:
        try:
            thread.start()
        except BaseException:
            self._lost(worker)
            raise

    def _lost(self, worker: _Worker) -> None:
        """A worker whose thread could not start: its item waits for the others."""
        with self._lock:
            self._left(worker)
            item = worker.item
            worker.item = None
            if item is not None:
                self._backlog.appendleft(item)
        logger.error("toolreg: %s could not start a worker thread", self._prefix)

    # -- the workers -------------------------------------------------------------------------
    #
    # A worker holds its pool only while it runs an item or looks for the next one, never while
    # it sleeps: a pool nobody references any more is collected, and its sleeping workers are
    # woken to exit (`_wake_all`), as ThreadPoolExecutor's are.

    def _next(self, worker: _Worker) -> WorkItem | _Sleep | None:
        """The worker's next item: from the backlog, or None to exit, or `SLEEP` (it is idle)."""
        lock = self._lock
        lock.acquire()  # not `with`, as in `_hand_over`: once per item
        try:
            if self._backlog:
                # Nothing passed on from here: a backlog with a worker to spare has a worker
                # waking (or starting) that will look at it, see the module docstring.
                return self._backlog.popleft()
            if self._shutdown:
                self._left(worker)
                return None
            self._idle.append(worker)
            return SLEEP
        finally:
            lock.release()

    def _woken(self, worker: _Worker, timed_out: bool) -> WorkItem | _Sleep | None:
        """After a sleep: the item handed over, None to exit, or `SLEEP` again."""
        with self._lock:
            item = worker.item
            if item is not None:
                worker.item = None
                if timed_out:
                    # Handed over as a lock's wait timed out: the hand-off released the lock
                    # (under this lock, so it has). Take that release back, or the next
                    # hand-off would release an unlocked lock.
                    worker.wake.take_back()
                return item
            if self._shutdown:
                if worker in self._idle:
                    self._idle.remove(worker)
                self._left(worker)
                return None
            if self._backlog:
                # Woken without an item (a spurious wake-up, or a timeout) while items wait,
                # maybe queued behind this very worker (`_behind`): it is free, so it takes the
                # first, as a worker that finishes one does (`_next`).
                if worker in self._idle:
                    self._idle.remove(worker)
                if self._ready is worker:
                    self._ready = None
                return self._backlog.popleft()
            if worker not in self._idle:  # popped without an item: put back (see module doc)
                self._idle.append(worker)
            return SLEEP

    def _abandoned(self, worker: _Worker) -> None:
        """A worker stopped on an error of the pool's own: count it out, requeue its item."""
        with self._lock:
            if worker in self._idle:
                self._idle.remove(worker)
            if self._ready is worker:
                self._ready = None
            item, worker.item = worker.item, None
            if item is not None:
                self._backlog.appendleft(item)
            self._left(worker)
            spare = self._pass_first() if self._backlog and not self._shutdown else None
        if spare is not None:
            self._start_spare(spare)

    def _left(self, worker: _Worker) -> None:
        """With the lock held: one worker less (it exits, or its thread never started). Its
        wake-up is freed here, before `shutdown(wait=True)` can see the count drop (it joins
        only the threads still listed; see `EventWake.close`)."""
        worker.wake.close()
        self._count -= 1
        self._exited.notify_all()

    # -- Executor --------------------------------------------------------------------------------

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run `fn(*args, **kwargs)` on a worker; its `Future`."""
        future: Future[T] = Future()
        self._hand_over(_FutureItem(future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop accepting work; stop the workers once the queued work ran (or was dropped).

        `cancel_futures=True` drops the queued items (their waiters learn at once that they
        will never run). `wait=True` returns once every worker has finished its work and left,
        counting the workers whose threads are still being started (a hand-off with
        `may_block=False`); from one of the pool's own workers, all but that one. Idempotent.
        """
        with self._lock:
            self._shutdown = True
            dropped = list(self._backlog) if cancel_futures else []
            if cancel_futures:
                self._backlog.clear()
            idle = list(self._idle)
            self._idle.clear()
            self._ready = None  # nothing refers to a worker once it has left (see `_wake`)
            for worker in idle:
                worker.wake.release()
        self._drop_all(dropped)
        if not wait:
            return
        me = threading.get_ident()
        mine = 1 if me in self._threads else 0
        with self._lock:
            while self._count > mine:
                self._exited.wait()
            threads = [w.thread for i, w in list(self._threads.items()) if i != me]  # one copy
            # Workers whose threads could not start leave their items here: none will run them.
            stranded = [] if self._count else list(self._backlog)
            if stranded:
                self._backlog.clear()
        self._drop_all(stranded)
        for thread in threads:
            if thread is not None:
                thread.join()  # it has left its loop: only its last bytecodes remain

    def _drop_all(self, items: list[WorkItem]) -> None:
        for item in items:
            try:
                item._drop()
            except BaseException:
                logger.exception("toolreg: dropping a work item raised")

    def _after_fork_in_child(self) -> None:
        # The parent's workers did not survive the fork (except this thread, if it is one: it
        # finishes its item and carries on as a worker). Queued items belong to the parent.
        me = threading.get_ident()
        mine = self._threads.get(me)
        self._lock = threading.Lock()
        self._exited = threading.Condition(self._lock)
        self._idle.clear()
        self._backlog.clear()  # in place: the workers hold this very deque
        self._ready = None
        self._threads.clear()  # in place: the dispatcher holds this very dict
        if mine is not None:
            self._threads[me] = mine
        self._count = 1 if mine is not None else 0

    def __repr__(self) -> str:
        state = "shut down" if self._shutdown else "open"
        return (
            f"<WorkerPool {state} max_workers={self._max} threads={self._count} "
            f"idle={len(self._idle)} queued={len(self._backlog)}>"
        )


class _Sleep:
    """What `_next` returns to a worker that has just gone idle."""


SLEEP = _Sleep()


def _serve(
    pool_ref: weakref.ref[WorkerPool],
    threads: dict[int, _Worker],
    backlog: collections.deque[WorkItem],
    worker: _Worker,
) -> None:
    """A worker thread: run items; sleep on its own wake-up (`_wake`) between them."""
    ident = threading.get_ident()
    threads[ident] = worker
    try:
        _work(pool_ref, backlog, worker)
    except BaseException:
        # Outside `_run` (guarded) only the pool's own code runs here; should it fail all the
        # same, shutdown() must not wait forever for a worker that is gone.
        logger.exception("toolreg: %s stopped on an error", threading.current_thread().name)
        pool = pool_ref()
        if pool is not None:
            pool._abandoned(worker)
    finally:
        threads.pop(ident, None)  # (a collected pool's workers leave their wake-ups to finalizers)


def _work(
    pool_ref: weakref.ref[WorkerPool], backlog: collections.deque[WorkItem], worker: _Worker
) -> None:
    """The worker's loop (its owner, `_serve`, counts it out should it fail)."""
    item: WorkItem | _Sleep | None = worker.item
    worker.item = None
    if backlog:  # started by a pass-on with more queued: pass the next on, as a woken one
        _pass_on(pool_ref)
    while True:
        if isinstance(item, _Sleep):
            woken = worker.wake.sleep()
            if woken:
                # Woken by a hand-off: its item was written before the release that woke
                # us, and nobody else writes the slot of a worker out of the idle list.
                # (Shutdown and a collected pool wake it without one: the slow path.)
                item = worker.item
                if item is not None:
                    worker.item = None  # type: ignore[unreachable]  # mypy: set None above
                    if backlog:  # queued behind this worker while it woke (`_behind`)
                        _pass_on(pool_ref)
                    continue
            pool = pool_ref()
            if pool is None:
                return  # the pool was collected while this worker slept
            item = pool._woken(worker, timed_out=not woken)
            if backlog and not isinstance(item, _Sleep) and item is not None:
                pool._pass_on()
            del pool
            continue
        if item is None:
            return
        try:
            item._run()
        except BaseException:  # a work item must not raise; the worker lives on
            logger.exception("toolreg: a work item raised on %s", threading.current_thread())
        item = None  # dropped before sleeping: it may hold a whole call's state
        pool = pool_ref()
        if pool is None:
            return
        item = pool._next(worker)
        del pool  # never held while sleeping


def _pass_on(pool_ref: weakref.ref[WorkerPool]) -> None:
    pool = pool_ref()
    if pool is not None:
        pool._pass_on()


def _wake_all(idle: list[_Worker], _ref: object) -> None:
    """The pool was collected: wake its sleeping workers, which then see it gone and exit.

    A weakref callback, so it may run inside any allocation: it takes no lock (waking a worker
    never blocks), and nobody else can touch a dead pool's idle list. A worker that leaves a dead
    pool does not close its eventfd (that takes the pool's lock): its finalizer does.
    """
    for worker in list(idle):
        with contextlib.suppress(RuntimeError):  # woken already
            worker.wake.release()


class _FutureItem:
    """A plain callable as a work item, completing a `Future`."""

    __slots__ = ("args", "fn", "future", "kwargs")

    def __init__(self, future: Future[Any], fn: Callable[..., Any], args: Any, kwargs: Any) -> None:
        self.future = future
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def _run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)

    def _drop(self) -> None:
        self.future.cancel()


_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


def _reset_pools_in_child() -> None:
    for pool in list(_POOLS):
        pool._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_pools_in_child)
