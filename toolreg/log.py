"""`ResultLog`: one JSON line per final result, in a file that several processes share.

Use it as an `on_result` observer::

    from toolreg.log import ResultLog

    with ResultLog("calls.jsonl", max_bytes=10_000_000, backup_count=5) as log:
        registry.on_result(log)
        ...

Each line is one JSON object (ASCII only, no embedded newline) with at least these fields:

========== ==========================================================================
`time`       when the result was logged: ISO 8601, UTC, microseconds (`...T12:00:00.000001Z`)
`call_id`    the call's id (unique across the processes that share the file)
`name`       the tool name
`ok`         true or false
`code`       the `ErrorCode` name, null on success
`message`    the error message, null on success
`dispatched` whether a body of this call started
`duration`   seconds from entry to result
`arguments`  the frozen arguments (or `redact(arguments)`; null if they were not a mapping)
`pid`        the process that wrote the line
========== ==========================================================================

Writing goes through `concurrent_log_handler.ConcurrentRotatingFileHandler`: every line is
written and the file rotated while holding an exclusive lock on a lock file next to the log
(`.__<name>.lock`), so processes that each open a `ResultLog` on the same path, with the same
`max_bytes`, `backup_count` and `gzip`, append and rotate without losing, duplicating or tearing
a line. Rotated files are `<path>.1` (newest) to `<path>.<backup_count>`, with `.gz` appended
when `gzip=True`; `python -m toolreg stats <path>` reads them all.

No logging configuration is touched: records go straight to a private handler (no `Logger`, no
propagation), and nothing is added to the `toolreg` logger. That logger only receives reports of
this module's own trouble (a failed write, a failing `redact`).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from logging.handlers import QueueHandler, QueueListener
from typing import Any

from concurrent_log_handler import ConcurrentRotatingFileHandler

from ._results import ToolResult

__all__ = ["DEFAULT_BACKUP_COUNT", "DEFAULT_MAX_BYTES", "REDACTION_FAILED", "Redactor", "ResultLog"]

logger = logging.getLogger("toolreg")

Redactor = Callable[[Mapping[str, Any]], Any]
"""`redact(arguments) -> mapping`: what to log instead of a call's (read-only) arguments."""

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
"""Rotate the file once it has reached 10 MiB (0 would mean: never rotate)."""
DEFAULT_BACKUP_COUNT = 5
"""Keep 5 rotated files; the oldest is deleted when a sixth would appear."""

REDACTION_FAILED = "<redaction failed>"
_MAX_DEPTH = 64  # nesting kept by the fallback encoder; deeper values are written as a marker


class ResultLog:
    """An `on_result` observer appending one JSON object per final result to `path`.

    `registry.on_result(ResultLog("calls.jsonl"))` logs every result of that registry. The
    file is created (and proven appendable) by the constructor, so a bad path raises `OSError`
    there and not at the first call. Options:

    * `max_bytes`: rotate once the file reaches this size (0: never rotate). Rotation happens
      before a write, so a file may exceed it by about one line per writing process.
    * `backup_count`: rotated files kept; only this count ever retires old lines. Must be at
      least 1 when `max_bytes > 0` (the underlying handler would otherwise truncate the log).
    * `redact(arguments) -> mapping`: what is logged instead of the arguments; it gets the
      frozen arguments and must not mutate anything. If it raises, `arguments` is written as
      `"<redaction failed>"` (reported once on the `toolreg` logger, without the traceback,
      which could quote a secret).
    * `gzip`: compress rotated files (`<path>.1.gz`, ...).
    * `background`: hand lines to a `QueueListener` thread that does the locking and writing,
      so the joining thread only encodes the line. `close()` still writes every queued line.
      It helps when writes block (a lock held by another process, a slow disk); it saves no
      CPU, and under the GIL a tight loop of trivial calls runs slower with it.

    Values that are not JSON (from `redact`, or a tool name that is not a string) are written
    through a fallback, never dropped: mappings as objects, other objects as their `repr`,
    non-finite floats as strings, cycles and very deep nesting as markers.

    Thread- and process-safe: any number of threads may call the observer at once, and any
    number of processes may each open their own `ResultLog` on the same path (after `fork`, an
    inherited instance keeps working in the child, with its own background thread).

    Failures: a write that fails (disk full, permission denied, ...) never raises into the
    call and never changes its result; it is logged on the `toolreg` logger the first time each
    kind of failure happens (later ones are only counted in `write_errors`). The line is lost,
    or written late if the handler's buffered stream gets it out at a later write; a disk that
    fills in the middle of a line can leave a partial line, which `stats` counts as bad.

    Calling the observer after `close()` raises `RuntimeError`; the registry logs observer
    exceptions, so a call that finishes after the log was closed still returns its result.

    `close()` (or leaving the `with` block) waits for writes in progress, drains the background
    queue, then closes the file. It is idempotent. Logs still open at interpreter exit are
    closed then; a forked `multiprocessing` child exits without running `atexit`, so close a
    `background=True` log there yourself.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backup_count: int = DEFAULT_BACKUP_COUNT,
        redact: Redactor | None = None,
        gzip: bool = False,
        background: bool = False,
    ) -> None:
        _check_count(max_bytes, "max_bytes")
        _check_count(backup_count, "backup_count")
        if max_bytes > 0 and backup_count < 1:
            raise ValueError(
                "backup_count=0 with max_bytes > 0 would truncate the log at every rotation: "
                "keep at least one backup, or pass max_bytes=0 to never rotate"
            )
        if redact is not None and not callable(redact):
            raise TypeError(f"redact must be callable, got {type(redact).__name__}")
        self.path = os.path.abspath(os.fspath(path))
        with open(self.path, "a", encoding="utf-8"):
            pass  # fail fast on a bad directory or a read-only file
        self.max_bytes = max_bytes
        self.backup_count = backup_count
        self.gzip = bool(gzip)
        self.background = bool(background)
        self._redact = redact
        self._handler = _Handler(
            self._report_write_error,
            self.path,
            maxBytes=max_bytes,
            backupCount=backup_count,
            encoding="utf-8",
            use_gzip=self.gzip,
        )
        self._handler.setFormatter(_LINE)
        # Guards _closed, _writers, _failure_kinds, _write_errors and the queue fields. Held only
        # for bookkeeping: the handler (file lock, disk I/O, error reports) runs outside it.
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when _writers drops to 0
        self._closed = False
        self._writers = 0
        self._failure_kinds: set[tuple[str, int | None]] = set()
        self._write_errors = 0
        self._redaction_reported = False
        self._listener: QueueListener | None = None
        self._sink: logging.Handler = self._handler
        if self.background:
            self._new_queue()
            self._start_listener()
        _open_logs.add(self)

    # -- writing ---------------------------------------------------------------------------------

    def __call__(self, result: ToolResult[Any], /) -> None:
        """Append `result` as one JSON line; `RuntimeError` if the log is closed.

        The line is encoded here, on the calling thread (in a registry: the thread that joined
        the call, after its result was frozen). A failed write is reported, never raised.
        """
        if self._closed:  # fail before encoding; the check that counts is the one below
            raise self._closed_error()
        line = self.encode(result)
        with self._lock:
            if self._closed:
                raise self._closed_error()
            self._writers += 1
            sink = self._sink
            listener_missing = self.background and self._listener is None
        try:
            if listener_missing:  # first write in a forked child: its own thread, lazily
                self._start_listener()
            sink.handle(_record(line))
        finally:
            with self._lock:
                self._writers -= 1
                if not self._writers:
                    self._idle.notify_all()

    def _closed_error(self) -> RuntimeError:
        return RuntimeError(
            f"ResultLog({self.path!r}) is closed: remove the observer (with the Registration "
            "that on_result() returned) before closing the log"
        )

    def encode(self, result: ToolResult[Any]) -> str:
        """The JSON line (without newline) that `result` is logged as; never raises for values."""
        call = result.call
        error = result.error
        record = {
            "time": _utc_timestamp(time.time()),
            "call_id": call.call_id,
            "name": call.name,
            "ok": result.ok,
            "code": None if error is None else str(error.code),
            "message": None if error is None else error.message,
            "dispatched": result.dispatched,
            "duration": round(result.duration, 6),
            "arguments": self._arguments(call.arguments),
            "pid": os.getpid(),
        }
        return _encode(record)

    def _arguments(self, arguments: Mapping[str, Any] | None) -> Any:
        if arguments is None or self._redact is None:
            return arguments
        try:
            return self._redact(arguments)
        except Exception as exc:
            report = False
            with self._lock:
                if not self._redaction_reported:
                    self._redaction_reported = report = True
            if report:
                logger.error(
                    "toolreg: ResultLog redact %r raised %s; arguments are logged as %r "
                    "(reported once per log)",
                    self._redact,
                    type(exc).__name__,
                    REDACTION_FAILED,
                )
            return REDACTION_FAILED

    def _report_write_error(self, exc: BaseException | None) -> None:
        """Called by the handler (on the writing thread) instead of printing to stderr."""
        kind = (type(exc).__name__, getattr(exc, "errno", None))
        with self._lock:
            self._write_errors += 1
            first = kind not in self._failure_kinds
            self._failure_kinds.add(kind)
        if first:
            logger.error(
                "toolreg: ResultLog could not write to %s; the line is lost, the call's result "
                "is unaffected (further %s failures are counted in write_errors, not logged)",
                self.path,
                kind[0],
                exc_info=exc,
            )

    @property
    def write_errors(self) -> int:
        """How many writes have failed so far (each reported or counted, never raised)."""
        return self._write_errors

    # -- background queue ------------------------------------------------------------------------

    def _new_queue(self) -> None:
        lines: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        handler = QueueHandler(lines)
        handler.setFormatter(_LINE)
        self._sink = handler
        self._listener = None
        self._lines = lines

    def _start_listener(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            listener = QueueListener(self._lines, self._handler, respect_handler_level=False)
            self._listener = listener
        listener.start()

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for writes in progress, write every queued line, close the file; idempotent.

        A failure to flush or close is logged on the `toolreg` logger, not raised.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._writers:
                self._idle.wait()
            listener = self._listener
        _open_logs.discard(self)
        if listener is not None:
            listener.stop()  # processes everything enqueued before its sentinel
        try:
            self._handler.close()
        except Exception:
            logger.exception("toolreg: ResultLog could not close %s", self.path)

    @property
    def closed(self) -> bool:
        """True once `close()` has been called."""
        return self._closed

    def __enter__(self) -> ResultLog:
        if self._closed:
            raise RuntimeError(f"ResultLog({self.path!r}) is closed: create a new one")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        mode = " background" if self.background else ""
        return (
            f"<ResultLog {state}{mode} path={self.path!r} max_bytes={self.max_bytes} "
            f"backup_count={self.backup_count} write_errors={self._write_errors}>"
        )

    def _after_fork_in_child(self) -> None:
        # A parent thread may have held the lock or been mid-write at fork: neither exists
        # here. Queued lines belong to the parent (which writes them); the child gets an empty
        # queue and starts its own listener at its first write.
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._writers = 0
        if self.background and not self._closed:
            self._new_queue()


class _Handler(ConcurrentRotatingFileHandler):
    """The real handler, reporting write failures to the `ResultLog` instead of stderr."""

    def __init__(self, report: Callable[[BaseException | None], None], *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self._report = report

    def handleError(self, record: logging.LogRecord) -> None:
        # Runs inside the handler's `except Exception:`; the line is lost, the caller unharmed.
        self._report(sys.exc_info()[1])

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
    """The record's message is the finished JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        return str(record.msg)


_LINE = _LineFormatter()


def _record(line: str) -> logging.LogRecord:
    # A bare record: the handlers here only read `msg` (formatter) and the QueueHandler copies
    # it; a full LogRecord() costs more than encoding the line (frames, thread, process names).
    record = logging.LogRecord.__new__(logging.LogRecord)
    record.msg = line
    record.args = None
    record.exc_info = None
    record.exc_text = None
    record.stack_info = None
    record.levelno = logging.INFO
    record.name = "toolreg.log"
    return record


def _check_count(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")


# -- encoding --------------------------------------------------------------------------------------

_seconds_cache: tuple[int, str] = (-1, "")


def _utc_timestamp(now: float) -> str:
    """`now` (epoch seconds) as ISO 8601 UTC with microseconds: `2025-01-02T03:04:05.000006Z`."""
    global _seconds_cache
    seconds = int(now)
    cached = _seconds_cache  # one tuple, read and replaced atomically: no lock needed
    if cached[0] != seconds:
        cached = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
        _seconds_cache = cached
    return f"{cached[1]}.{int((now - seconds) * 1e6):06d}Z"


def _fallback(value: object) -> object:
    """`default=` for the encoder: mappings become objects, anything else its repr."""
    if isinstance(value, Mapping):
        return dict(value)
    try:
        return repr(value)
    except Exception:
        return f"<unrepresentable {type(value).__name__}>"


# ASCII-only output keeps every line valid UTF-8 whatever the strings hold (lone surrogates
# included), and allow_nan=False keeps it strict JSON: such values take the sanitizing path.
_ENCODER = json.JSONEncoder(
    ensure_ascii=True, allow_nan=False, separators=(",", ":"), default=_fallback
)


def _encode(record: Mapping[str, Any]) -> str:
    try:
        return _ENCODER.encode(record)
    except (TypeError, ValueError, RecursionError):
        # Non-finite floats, cycles, keys JSON cannot have, or very deep nesting.
        return _ENCODER.encode(_sanitize(record, 0, set()))


def _sanitize(value: object, depth: int, seen: set[int]) -> object:
    """A JSON-safe copy of `value`; what JSON cannot hold becomes a string."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if not isinstance(value, (Mapping, list, tuple)):
        return _fallback(value)
    if depth >= _MAX_DEPTH:
        return "<nested too deeply>"
    if id(value) in seen:
        return "<circular reference>"
    seen.add(id(value))
    try:
        if isinstance(value, Mapping):
            return {_key(key): _sanitize(item, depth + 1, seen) for key, item in value.items()}
        return [_sanitize(item, depth + 1, seen) for item in value]
    except Exception as exc:  # a hostile Mapping; keep what can be said about it
        return f"<unencodable {type(value).__name__}: {type(exc).__name__}>"
    finally:
        seen.discard(id(value))


def _key(key: object) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int)):
        return json.dumps(key)  # what the encoder itself does with such keys
    if isinstance(key, float):
        return json.dumps(key) if math.isfinite(key) else repr(key)
    text = _fallback(key)
    return text if isinstance(text, str) else repr(text)


# -- process lifecycle -----------------------------------------------------------------------------

# Open logs, so that exit closes them (draining background queues) and fork resets their locks.
# Only set.add / set.discard / list(set) touch it: single C-level operations under the GIL, so
# no lock that a fork could leave held is needed.
_open_logs: set[ResultLog] = set()


def _close_open_logs() -> None:
    for log in list(_open_logs):
        log.close()


def _reset_after_fork() -> None:
    for log in list(_open_logs):
        log._after_fork_in_child()


atexit.register(_close_open_logs)  # registered after logging's own: runs before it
os.register_at_fork(after_in_child=_reset_after_fork)
