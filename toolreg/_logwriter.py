"""The writing half of `ResultLog`: lines grouped per file lock by a drain thread, or one by one.

Why groups: `ConcurrentRotatingFileHandler` pays per lock, not per line (an exclusive lock on a
lock file, a size check, the write, a flush, the unlock: about six system calls). One emit of
128 lines joined by newlines costs little more than one emit of one line, and it is still one
locked, flushed write, so processes sharing the file still never tear or interleave a line.

The grouped path, step by step:

* The observer (`submit`, on the thread that joined the call) appends `(result, time)` to a
  deque and, only when the drain thread is idle, puts a token in its wake queue. That is a
  C-level append plus two attribute reads when the drain is busy.
* The drain wakes, lingers a few milliseconds while few lines are pending (so that a trickle of
  calls still shares locks), then takes entries in chunks, encodes them (calling `redact`:
  user code, run with no lock held) and emits groups of at most `group_bytes`.
* Lost wake-ups cannot happen: the drain sets `idle` and then looks at the deque again before
  it waits, and a submitter appends before it reads `idle`. Either the submitter sees `idle`
  (and wakes the drain) or the drain sees the entry. A stale token only costs a spin.

Every entry is written exactly once, whoever writes it. Entries leave the deque only under
`_lock`; the last writer (the drain's exit, `close()`, the fallback after a crash) turns
`queueing` off first and then empties the deque. A submitter reads `queueing` again after its
append: if it is off, its entry may have been appended after that final sweep, so it looks for
its own entry (by identity, under `_lock`) and, when the entry is still there, takes it back and
handles it itself (writes it, or raises because the log is closed).

fork(): every open writer's `_write_lock` is held across `fork()` (an `os.register_at_fork`
`before` hook), so no write is in progress in the parent at that instant. Otherwise the child
could inherit the file's buffered stream with a half-written group in its buffer (written again
by the child's next flush) and the stream's internal lock held by a thread that does not exist
in the child. The child then gets an empty queue (the parent writes the entries it had queued)
and starts its own drain at its first line.

Exit: the drain is a daemon thread, so it never keeps the interpreter alive, and an `atexit`
hook closes every open writer, which drains the queue. `atexit` rather than
`threading._register_atexit`: the latter runs *before* the non-daemon threads are joined, so a
call finishing on one of them afterwards would find the log closed; `atexit` runs after they
have all ended, while daemon threads (this drain) are still running. A `multiprocessing` child
started with fork ends in `os._exit()`, skipping `atexit`; it does run multiprocessing's exit
finalizers, and one is registered in each such child to close the inherited logs there.

If the drain thread crashes (a bug, `MemoryError`), the crash is logged, lines are written one
by one from then on by the calling threads, and the lines it had not yet handed to the file are
written by the dying thread, one by one: none is lost, none written twice.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from concurrent_log_handler import ConcurrentRotatingFileHandler

logger = logging.getLogger("toolreg")

Encode = Callable[[Any, float], str]
"""`encode(result, logged_at) -> line`: the JSON line (no newline) for one result."""

GROUP_BYTES = 64 * 1024  # a group's size cap when rotation allows it
LINGER_BELOW = 32  # the drain lingers only while fewer entries than this are pending
_CHUNK = 1024  # entries taken out of the deque per lock

Entry = tuple[Any, float]  # (result, when it was logged); a flush marker is a threading.Event


def group_bytes(max_bytes: int) -> int:
    """The cap on one group: well below `max_bytes` (an eighth), at most 64 KiB."""
    if max_bytes <= 0:
        return GROUP_BYTES
    return max(1, min(GROUP_BYTES, max_bytes // 8))


class LineWriter:
    """Writes the lines of one `ResultLog` through its `ConcurrentRotatingFileHandler`.

    `grouped=True`: a drain thread writes queued entries in groups (see the module docstring).
    `grouped=False`: each `submit` encodes and writes its line before it returns.
    """

    def __init__(
        self,
        path: str,
        *,
        max_bytes: int,
        backup_count: int,
        use_gzip: bool,
        encode: Encode,
        grouped: bool,
        linger: float,
        closed_error: Callable[[], RuntimeError],
    ) -> None:
        self.path = path
        self.grouped = grouped
        self.linger = linger
        self.group_bytes = group_bytes(max_bytes)
        self._encode = encode
        self._closed_error = closed_error
        self._handler = _Handler(
            path,
            maxBytes=max_bytes,
            backupCount=backup_count,
            encoding="utf-8",
            use_gzip=use_gzip,
        )
        self._handler.setFormatter(_LINE)
        # Guards the handler (every write, its close) and `_handler_closed`. Held across fork()
        # by the at-fork hook, so that a child never inherits a write in progress. Nothing else
        # is taken while it is held, and no logging happens under it.
        self._write_lock = threading.Lock()
        self._handler_closed = False
        # Guards taking entries out of `pending` (appends need no lock), `_closed`, `_drain`,
        # `_in_flight` and `_handed`, and the failure counters. Never held around I/O or user
        # code (`redact` runs in `encode`, outside it).
        self._lock = threading.Lock()
        self._closed = False
        self._close_done = threading.Event()  # set when the first close() has finished
        self._write_errors = 0
        self._burst_kinds: set[tuple[str, int | None]] = set()
        self._burst_lost = 0
        self._fresh_queue()
        _open_writers.add(self)
        if grouped:
            self._start_drain()

    def _fresh_queue(self) -> None:
        self.pending: deque[Entry | threading.Event] = deque()
        #: True while the drain waits for a token (or before it first runs): a submitter that
        #: sees it wakes the drain. Set by the drain; cleared by whoever wakes it.
        self.idle = True
        #: Whether `submit` queues entries: grouped, open, and the drain has not crashed.
        self.queueing = self.grouped
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._stopping = False
        self._drain: threading.Thread | None = None
        self._in_flight: list[Entry | threading.Event] = []  # the chunk being written
        self._handed = 0  # how many of `_in_flight` were handed to the handler
        # Set once nothing is queued any more and everything that was has been written (after
        # close, after a crash's fallback, and from the start in per-line mode).
        self._drained = threading.Event()
        if not self.grouped:
            self._drained.set()

    # -- the observer's side -------------------------------------------------------------------

    def submit(self, result: Any) -> None:
        """Queue `result` (grouped) or write it now; `RuntimeError` once closed."""
        if not self.queueing:
            return self._write_now(result, time.time())
        entry = (result, time.time())
        self.pending.append(entry)
        # Closed or crashed while we appended (mypy cannot know another thread changes it):
        # the entry may have come after the last sweep.
        if not self.queueing:
            return self._settle_late(entry)  # type: ignore[unreachable]
        if self.idle:
            self._wake_drain()
        return None

    def _wake_drain(self) -> None:
        self.idle = False
        if self._drain is None:  # a forked child: its own drain, at its first line
            self._start_drain()
        self._wake.put(None)

    def _settle_late(self, entry: Entry) -> None:
        with self._lock:
            mine = _take_back(self.pending, entry)
        if mine:  # nobody will write it: write it here (or refuse, if closed)
            self._write_now(*entry)

    def _write_now(self, result: Any, logged_at: float) -> None:
        """Per-line mode (and after a crash): encode and write on the calling thread."""
        if self._closed:
            raise self._closed_error()
        line = self._encode_entry(result, logged_at)
        if line is None:
            return
        with self._write_lock:
            if self._handler_closed:
                raise self._closed_error()
            failure = self._handler.write(line)
        self._account(failure, 1)

    def flush(self, timeout: float | None) -> bool:
        """Wait until every line submitted before this call is written; False on timeout."""
        if self._drain is not None and threading.current_thread() is self._drain:
            raise RuntimeError(
                "ResultLog.flush() called on its own drain thread (from redact?): it would "
                "wait for itself; call it from another thread"
            )
        if self.queueing:
            marker = threading.Event()
            self.pending.append(marker)
            if self.queueing:
                self._wake_drain()
                return marker.wait(timeout)
            with self._lock:  # type: ignore[unreachable]  # (another thread cleared it)
                mine = _take_back(self.pending, marker)
            if not mine:  # taken by the last sweep: set once the lines before it are written
                return marker.wait(timeout)
        return self._drained.wait(timeout)

    # -- the drain -------------------------------------------------------------------------------

    def _start_drain(self) -> None:
        with self._lock:
            if self._drain is not None or self._closed:
                return
            drain = threading.Thread(target=self._run, name="toolreg-log-drain", daemon=True)
            self._drain = drain
        try:
            drain.start()
        except RuntimeError:  # no new threads at interpreter shutdown: write lines one by one
            logger.warning(
                "toolreg: ResultLog could not start its drain thread for %s; lines are written "
                "by the calling thread",
                self.path,
                exc_info=True,
            )
            with self._lock:
                self._drain = None
                self.queueing = False
            self._write_pending(grouped=False)
            self._drained.set()

    def _run(self) -> None:
        try:
            self._drain_until_stopped()
        except BaseException:
            try:
                logger.exception(
                    "toolreg: the ResultLog drain thread for %s crashed; its pending lines "
                    "are written now and every later line is written by the calling thread",
                    self.path,
                )
            finally:
                self._fall_back()

    def _drain_until_stopped(self) -> None:
        pending = self.pending
        wake = self._wake
        while True:
            if not pending:
                if self._stopping:
                    return
                self.idle = True
                if not pending:  # an append before `idle` was set did not wake us: look again
                    wake.get()
                self.idle = False
                continue
            if self.linger and len(pending) < LINGER_BELOW and not self._stopping:
                # Let a trickle of calls share one lock; a flush or close cuts it short.
                with suppress(queue.Empty):
                    wake.get(timeout=self.linger)
            self._write_pending(grouped=True)

    def _write_pending(self, *, grouped: bool) -> None:
        pending = self.pending
        while True:
            with self._lock:
                chunk = [pending.popleft() for _ in range(min(len(pending), _CHUNK))]
                self._in_flight = chunk
                self._handed = 0
            if not chunk:
                return
            if grouped:
                self._write_chunk(chunk)
            else:
                self._write_one_by_one(chunk)

    def _write_chunk(self, chunk: list[Entry | threading.Event]) -> None:
        lines: list[str] = []
        size = 0
        for index, entry in enumerate(chunk):
            if isinstance(entry, threading.Event):  # a flush marker: the lines before it first
                self._emit(lines, index + 1)
                lines, size = [], 0
                entry.set()
                continue
            line = self._encode_entry(*entry)
            if line is None:
                continue
            lines.append(line)
            size += len(line) + 1
            if size >= self.group_bytes:
                self._emit(lines, index + 1)
                lines, size = [], 0
        self._emit(lines, len(chunk))

    def _write_one_by_one(self, entries: list[Entry | threading.Event]) -> None:
        for index, entry in enumerate(entries):
            if isinstance(entry, threading.Event):
                self._handed = index + 1
                entry.set()
            else:
                line = self._encode_entry(*entry)
                self._emit([] if line is None else [line], index + 1)

    def _encode_entry(self, result: Any, logged_at: float) -> str | None:
        """The line, or None (counted and reported like a failed write) if encoding failed."""
        try:
            return self._encode(result, logged_at)
        except Exception as exc:  # a result with broken attributes: lose its line, not the log
            self._account(exc, 1)
            return None

    def _emit(self, lines: list[str], handed: int) -> None:
        # Handed over before the write: a crash from here on must not write these again.
        self._handed = handed
        if not lines:
            return
        text = "\n".join(lines)  # the handler adds the last newline
        with self._write_lock:
            if self._handler_closed:  # cannot happen: close() joins the drain first
                failure: BaseException | None = RuntimeError("the handler is closed")
            else:
                failure = self._handler.write(text)
        self._account(failure, len(lines))

    def _fall_back(self) -> None:
        """After a crash: no more queueing; write what the drain had not handed over."""
        with self._lock:
            self.queueing = False
            left = self._in_flight[self._handed :]
            self._in_flight = []
        try:
            self._write_one_by_one(left)
            self._write_pending(grouped=False)
        except BaseException:
            logger.exception(
                "toolreg: ResultLog could not write its pending lines to %s", self.path
            )
        else:
            self._drained.set()

    # -- failures --------------------------------------------------------------------------------

    def _account(self, failure: BaseException | None, lines: int) -> None:
        if failure is None:
            if self._burst_kinds:  # unlocked peek; the burst ends under the lock
                self._end_burst()
            return
        kind = (type(failure).__name__, getattr(failure, "errno", None))
        with self._lock:
            self._write_errors += lines
            self._burst_lost += lines
            first = kind not in self._burst_kinds
            self._burst_kinds.add(kind)
        if first:
            logger.error(
                "toolreg: ResultLog could not write to %s (%d line(s) lost); the calls' results "
                "are unaffected. Further %s failures are counted in write_errors, not logged, "
                "until a write succeeds again",
                self.path,
                lines,
                kind[0],
                exc_info=failure,
            )

    def _end_burst(self) -> None:
        with self._lock:
            if not self._burst_kinds:
                return
            lost = self._burst_lost
            self._burst_kinds.clear()
            self._burst_lost = 0
        logger.warning(
            "toolreg: ResultLog writes to %s succeed again; %d line(s) were lost before",
            self.path,
            lost,
        )

    @property
    def write_errors(self) -> int:
        """Lines lost to failed writes so far (in this process)."""
        return self._write_errors

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop queueing, write everything queued, close the file; idempotent.

        A second caller (another thread) returns once the first caller's close has finished.
        """
        if self._drain is not None and threading.current_thread() is self._drain:
            raise RuntimeError(
                "ResultLog.close() called on its own drain thread (from redact?): it would "
                "wait for itself; close the log from another thread"
            )
        with self._lock:
            closing = not self._closed
            self._closed = True
            self.queueing = False
            drain = self._drain
        if not closing:  # another thread is closing it: done when that close is
            self._close_done.wait()
            return
        try:
            self._finish_close(drain)
        finally:
            self._close_done.set()

    def _finish_close(self, drain: threading.Thread | None) -> None:
        if drain is not None:
            self._stopping = True
            self._wake.put(None)
            drain.join()
        # Entries the drain did not see: appended as it exited, or left behind by a crash.
        try:
            self._write_pending(grouped=True)
        except Exception:
            logger.exception("toolreg: ResultLog could not write its last lines to %s", self.path)
        with self._write_lock:
            self._handler_closed = True
            try:
                self._handler.close()
            except Exception:
                logger.exception("toolreg: ResultLog could not close %s", self.path)
        # Only now: until the file is closed, a fork must still wait for its writes.
        _open_writers.discard(self)
        self._drained.set()

    def _reset_in_child(self) -> None:
        # Another thread may have held `_lock` at fork, and the drain does not exist here. The
        # entries queued belong to the parent, which writes them.
        self._lock = threading.Lock()
        self._write_errors = 0
        self._burst_kinds = set()
        self._burst_lost = 0
        if not self._closed:
            self._fresh_queue()
        else:  # a close that was under way belongs to the parent
            self._close_done.set()


def _take_back(pending: deque[Any], item: object) -> bool:
    """Remove `item` (by identity) from `pending` if it is still there; caller holds `_lock`.

    Only appends can happen meanwhile (every removal holds `_lock`), so an index found in a
    snapshot still points at the same entry.
    """
    while True:
        try:
            snapshot = list(pending)
            break
        except RuntimeError:  # appended to while copied (free-threaded builds)
            continue
    for index, candidate in enumerate(snapshot):
        if candidate is item:
            del pending[index]
            return True
    return False


class _Handler(ConcurrentRotatingFileHandler):
    """The real handler; a failed write is returned to the writer instead of printed.

    A writer that died mid-line (SIGKILL, a full disk) leaves a line without its newline; the
    next line appended, by any process, would be glued to it and lost with it. So each write,
    under the file lock, first makes sure the file ends a line, and starts a fresh one if not:
    the dead writer loses only its own line.
    """

    _failure: BaseException | None = None
    #: (inode, size) of the file right after this handler's last write, which ended a line; a
    #: file still in that state needs no look at its last byte.
    _clean_end: tuple[int, int] | None = None

    def write(self, text: str) -> BaseException | None:
        """Emit `text` (lines joined by newlines) under the file lock: the failure, or None."""
        self._failure = None
        self.emit(_record(text))
        failure, self._failure = self._failure, None
        return failure

    def do_write(self, msg: str) -> None:
        """Write `msg` and the newline (under the file lock), on a line of its own."""
        if self.stream is None or self.stream.closed:
            self.stream = self.do_open()
        self._clean_end = None  # unknown until this write has succeeded
        if not self._ends_a_line(os.fstat(self.stream.fileno())):
            msg = f"\n{msg}"
        super().do_write(msg)
        if self.stream is not None and not self.stream.closed:
            written = os.fstat(self.stream.fileno())
            self._clean_end = (written.st_ino, written.st_size)

    def _ends_a_line(self, file: os.stat_result) -> bool:
        if file.st_size == 0 or (file.st_ino, file.st_size) == self._clean_end:
            return True
        with open(self.baseFilename, "rb") as reader:  # the stream is write-only
            reader.seek(file.st_size - 1)
            return reader.read(1) in (b"\n", b"")

    def handleError(self, record: logging.LogRecord) -> None:
        # Runs inside the handler's `except Exception:`; the lines are lost, the caller unharmed.
        self._failure = sys.exc_info()[1]

    def close(self) -> None:
        try:
            super().close()
        finally:
            # The base close() stops at a stream that fails its last flush (disk full) and
            # would leave the lock file open: release it whatever happened.
            lock_file = self.stream_lock
            self.stream_lock = None
            if lock_file is not None and not lock_file.closed:
                lock_file.close()


class _LineFormatter(logging.Formatter):
    """The record's message is the finished text."""

    def format(self, record: logging.LogRecord) -> str:
        return str(record.msg)


_LINE = _LineFormatter()


def _record(text: str) -> logging.LogRecord:
    # A bare record: the handler only reads `msg` (through the formatter); a full LogRecord()
    # costs more than encoding a line (frames, thread and process names).
    record = logging.LogRecord.__new__(logging.LogRecord)
    record.msg = text
    record.args = None
    record.exc_info = None
    record.exc_text = None
    record.stack_info = None
    record.levelno = logging.INFO
    record.name = "toolreg.log"
    return record


# -- process lifecycle -----------------------------------------------------------------------------

# Open writers, for the exit and fork hooks. Only set.add / set.discard / list(set) touch it:
# single C-level operations under the GIL, so no lock (which a fork could leave held) is needed.
_open_writers: set[LineWriter] = set()
# Write locks held across a fork, per forking thread (two threads may fork at once).
_held_at_fork: dict[int, list[LineWriter]] = {}
_finalizer_registered = False  # in this process (inherited, with the registration, by children)


def close_open_writers() -> None:
    """Close (drain) every open writer: at exit, and at a forked multiprocessing child's end."""
    for writer in list(_open_writers):
        try:
            writer.close()
        except Exception:
            logger.exception("toolreg: ResultLog could not close %s at exit", writer.path)


def _before_fork() -> None:
    writers = list(_open_writers)
    for writer in writers:
        writer._write_lock.acquire()
    _held_at_fork[threading.get_ident()] = writers


def _after_fork_in_parent() -> None:
    for writer in _held_at_fork.pop(threading.get_ident(), []):
        writer._write_lock.release()


def _after_fork_in_child() -> None:
    global _finalizer_registered
    _after_fork_in_parent()  # the same thread, now alone in the child
    _held_at_fork.clear()
    for writer in list(_open_writers):
        writer._reset_in_child()
    # multiprocessing's fork start method ends the child with os._exit() (no atexit); its own
    # bootstrap first clears inherited finalizers, then runs the after-fork callbacks, which
    # is where ours registers one.
    util = sys.modules.get("multiprocessing.util")
    if util is not None and not _finalizer_registered:
        _finalizer_registered = True
        util.register_after_fork(_AFTER_FORK_KEY, _register_exit_finalizer)


class _Key:
    """A weak-referenceable key for multiprocessing's after-fork registry."""


_AFTER_FORK_KEY = _Key()


def _register_exit_finalizer(key: object) -> None:
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        util.Finalize(None, close_open_writers, exitpriority=5)


atexit.register(close_open_writers)  # registered after logging's own, so it runs before it
if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
