"""`ResultLog`: one JSON line per final result, in a file that several processes share.

Use it as an `on_result` observer::

    from toolreg.log import ResultLog

    with ResultLog("calls.jsonl", max_bytes=10_000_000, backup_count=5) as log:
        registry.on_result(log)
        ...

Each line is one JSON object (ASCII only, no embedded newline) with these fields, in this order:

============ ========================================================================
`time`       when the result was logged: ISO 8601, UTC, microseconds (`...T12:00:00.000001Z`)
`call_id`    the call's id (unique across the processes that share the file)
`name`       the tool name
`ok`         true or false
`code`       the `ErrorCode` name, null on success
`message`    the error message, null on success
`dispatched` whether a body of this call started
`duration`   seconds from entry to result
`timeline`   when the result has one: `entered` (a timestamp like `time`), then `dispatched`,
             `cancelled`, `settled` (seconds after entry, null when it did not happen) and
             `finished` (seconds after entry)
`arguments`  the frozen arguments (or `redact(arguments)`; null if they were not a mapping)
`pid`        the process that wrote the line
============ ========================================================================

Writing goes through `concurrent_log_handler.ConcurrentRotatingFileHandler`: every write happens,
and the file is rotated, while holding an exclusive lock on a lock file next to the log
(`.__<name>.lock`), so processes that each open a `ResultLog` on the same path, with the same
`max_bytes`, `backup_count` and `gzip`, append and rotate without losing, duplicating or tearing
a line. Rotated files are `<path>.1` (newest) to `<path>.<backup_count>`, with `.gz` appended
when `gzip=True`; `python -m toolreg stats <path>` reads them all.

Grouped or per line
-------------------
That handler's cost is per lock, not per line: about six system calls (lock, size check, write,
flush, unlock) whether it writes one line or a hundred. So by default a `ResultLog` *groups*:
the observer only queues the result (a deque append: well under a microsecond) and a drain
thread encodes the queued results and writes them, many lines per lock. The trade-offs, all
bounded:

* A line reaches the file shortly after `execute` returns (typically within a few
  milliseconds: the drain lingers at most `linger` seconds to let lines share a lock), not
  before. `flush()` waits until every line logged so far is written; `close()` writes every
  queued line first.
* A crash of the whole process (SIGKILL, `os._exit`) loses the lines still queued. Interpreter
  exit does not (an `atexit` hook drains every open log once the non-daemon threads have
  ended), nor does the end of a `multiprocessing` child started with fork (a multiprocessing
  finalizer does). Close or flush the log yourself before calling `os._exit`.
* `fork()` waits for a write in progress (at most one group), so that the child never inherits
  a half-written buffer. The child starts its own drain thread at its first line.
* `max_bytes` becomes softer: rotation is checked before each write, and a write is a group,
  so a file may exceed `max_bytes` by up to one group. Groups are capped at an eighth of
  `max_bytes` (at most 64 KiB) plus the line that crosses the cap.

`per_line=True` keeps the other behaviour: each line is encoded and written (flushed to the
operating system) by the thread that calls the observer, before `execute` returns, at the
cost of one lock per line. Choose it when each line must be in the file before the call's
result is acted on. Both modes write the same bytes, and both may share one file.

No logging configuration is touched: lines go straight to a private handler (no `Logger`, no
propagation), and nothing is added to the `toolreg` logger. That logger only receives reports of
this module's own trouble (failed writes, a failing `redact`, a crashed drain thread).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

from . import _validate
from ._logwriter import LineWriter
from ._results import ToolResult

__all__ = [
    "DEFAULT_BACKUP_COUNT",
    "DEFAULT_LINGER",
    "DEFAULT_MAX_BYTES",
    "REDACTION_FAILED",
    "Redactor",
    "ResultLog",
]

logger = logging.getLogger("toolreg")

Redactor = Callable[[Mapping[str, Any]], Any]
"""`redact(arguments) -> mapping`: what to log instead of a call's (read-only) arguments."""

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
"""Rotate the file once it has reached 10 MiB (0 would mean: never rotate)."""
DEFAULT_BACKUP_COUNT = 5
"""Keep 5 rotated files; the oldest is deleted when a sixth would appear."""
DEFAULT_LINGER = 0.002
"""Seconds the drain waits for more lines before writing a small group (grouped mode)."""
MAX_LINGER = 1.0

REDACTION_FAILED = "<redaction failed>"
_MAX_DEPTH = 64  # nesting kept by the fallback encoder; deeper values are written as a marker


class ResultLog:
    """An `on_result` observer appending one JSON object per final result to `path`.

    `registry.on_result(ResultLog("calls.jsonl"))` logs every result of that registry. The
    file is created (and proven appendable) by the constructor, so a bad path raises `OSError`
    there and not at the first call. Options:

    * `max_bytes`: rotate once the file reaches this size (0: never rotate). Rotation happens
      before a write, so a file may exceed it by one write: one group (see the module
      docstring), or one line in per-line mode, per writing process.
    * `backup_count`: rotated files kept; only this count ever retires old lines. Must be at
      least 1 when `max_bytes > 0` (the underlying handler would otherwise truncate the log).
    * `redact(arguments) -> mapping`: what is logged instead of the arguments; it gets the
      frozen arguments and must not mutate anything. It runs on the drain thread (grouped) or
      the calling thread (per line). If it raises, `arguments` is written as
      `"<redaction failed>"` (reported once on the `toolreg` logger, without the traceback,
      which could quote a secret).
    * `gzip`: compress rotated files (`<path>.1.gz`, ...).
    * `per_line`: write each line on the calling thread before the observer returns, instead
      of queueing it for the drain thread (the default, grouped). See the module docstring.
    * `linger`: grouped mode: how long the drain may wait for more lines before writing a small
      group (0 to 1 s; default 2 ms).
    * `background`: kept for code written before grouping existed. `background=True` (a thread
      writes the lines, `close()` writes every queued one) is the grouped default;
      `background=False` (the calling thread writes each line) is `per_line=True`. Contradicting
      `per_line` raises `ValueError`.

    A `max_bytes` or `backup_count` that is not an int, or a `linger` that is not a number (a
    `bool` is neither), raises `TypeError`; a negative count, or a `linger` outside 0 to 1 s,
    raises `ValueError`.

    Values that are not JSON (from `redact`, or a tool name that is not a string) are written
    through a fallback, never dropped: mappings as objects, other objects as their `repr`,
    non-finite floats as strings, integers too long for `int`'s string conversion, cycles and
    very deep nesting as markers.

    Thread- and process-safe: any number of threads may call the observer at once, and any
    number of processes may each open their own `ResultLog` on the same path. After `fork`, an
    inherited instance keeps working in the child, with its own drain thread (started at the
    child's first line); lines the parent had queued are written once, by the parent. The
    drain thread is a daemon: it never keeps the interpreter alive, and `close()` joins it.

    Failures: a write that fails (disk full, permission denied, ...) never raises into the call
    and never changes its result. The lines are lost and counted in `write_errors`; the first
    failure of each kind in a burst is logged on the `toolreg` logger (ERROR, with the
    exception), later ones are only counted, and the first successful write after a burst is
    logged (WARNING, with how many lines the burst lost). A disk that fills in the middle of a
    write can leave a partial line, which `stats` counts as bad. A result whose line cannot be
    built at all (broken attributes) is counted and reported the same way. If the drain thread
    crashes, that is logged and the log carries on per line, without losing the queued lines.

    Calling the observer after `close()` raises `RuntimeError`; the registry logs observer
    exceptions, so a call that finishes after the log was closed still returns its result.

    `close()` (or leaving the `with` block) writes every queued line, waits for writes in
    progress, then closes the file. It is idempotent (a concurrent second call returns when the
    first has finished). Logs still open at interpreter exit are closed then.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backup_count: int = DEFAULT_BACKUP_COUNT,
        redact: Redactor | None = None,
        gzip: bool = False,
        per_line: bool | None = None,
        linger: float = DEFAULT_LINGER,
        background: bool | None = None,
    ) -> None:
        _validate.count(max_bytes, "max_bytes", minimum=0)
        _validate.count(backup_count, "backup_count", minimum=0)
        if max_bytes > 0 and backup_count < 1:
            raise ValueError(
                "backup_count=0 with max_bytes > 0 would truncate the log at every rotation: "
                "keep at least one backup, or pass max_bytes=0 to never rotate"
            )
        if redact is not None and not callable(redact):
            raise TypeError(f"redact must be callable, got {type(redact).__name__}")
        self.per_line = _writing_mode(per_line, background)
        self.linger = _validate.seconds(linger, "linger", allow_zero=True, maximum=MAX_LINGER)
        self.path = os.path.abspath(os.fspath(path))
        with open(self.path, "a", encoding="utf-8"):
            pass  # fail fast on a bad directory or a read-only file
        self.max_bytes = max_bytes
        self.backup_count = backup_count
        self.gzip = bool(gzip)
        self._redact = redact
        # Guards `_redaction_reported` only.
        self._lock = threading.Lock()
        self._redaction_reported = False
        self._writer = LineWriter(
            self.path,
            max_bytes=max_bytes,
            backup_count=backup_count,
            use_gzip=self.gzip,
            encode=self._line,
            grouped=not self.per_line,
            linger=self.linger,
            closed_error=self._closed_error,
        )

    @property
    def background(self) -> bool:
        """True when a drain thread writes the lines (grouped mode): `not per_line`."""
        return not self.per_line

    # -- writing ---------------------------------------------------------------------------------

    def __call__(self, result: ToolResult[Any], /) -> None:
        """Log `result`: queue it (grouped) or write it now (per line); `RuntimeError` if closed.

        Grouped, the line is encoded and written later by the drain thread; its `time` is taken
        now. Per line, it is encoded and written here, on the calling thread (in a registry:
        the thread that joined the call, after its result was frozen). A failed write is
        reported, never raised; anything but a `ToolResult` raises `TypeError`.
        """
        if not isinstance(result, ToolResult):
            raise TypeError(f"ResultLog logs ToolResult objects, got {type(result).__name__}")
        self._writer.submit(result)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every line logged before this call is written; False if `timeout` ran out.

        "Written" means handed to the operating system (the handler flushes after each write),
        or counted in `write_errors` if that failed. Per line, and once closed, there is nothing
        to wait for: True at once. Thread-safe; `RuntimeError` if called from `redact` (on the
        drain thread, which would wait for itself).
        """
        return self._writer.flush(timeout)

    def _closed_error(self) -> RuntimeError:
        return RuntimeError(
            f"ResultLog({self.path!r}) is closed: remove the observer (with the Registration "
            "that on_result() returned) before closing the log"
        )

    def encode(self, result: ToolResult[Any]) -> str:
        """The JSON line (without newline) that `result` is logged as; never raises for values."""
        return self._line(result, time.time())

    def _line(self, result: ToolResult[Any], logged_at: float) -> str:
        call = result.call
        error = result.error
        call_id = call.call_id
        name = call.name
        ok = result.ok
        code = None if error is None else str(error.code)
        message = None if error is None else error.message
        dispatched = result.dispatched
        duration = _rounded(result.duration)
        timeline = getattr(result, "timeline", None)
        moments = None if timeline is None else _timeline_fields(timeline)
        arguments = self._arguments(call.arguments)
        stamp = _utc_timestamp(logged_at)
        line = _fast_line(
            stamp, call_id, name, ok, code, message, dispatched, duration, moments, arguments
        )
        if line is not None:
            return line
        return _encode(
            _record(
                stamp, call_id, name, ok, code, message, dispatched, duration, moments, arguments
            )
        )

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

    @property
    def write_errors(self) -> int:
        """How many lines failed to be written so far in this process (never raised)."""
        return self._writer.write_errors

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Write every queued line, wait for writes in progress, close the file; idempotent.

        A failure to flush or close is logged on the `toolreg` logger, not raised. Calling it
        from `redact` (on the drain thread) raises `RuntimeError`: it would wait for itself.
        """
        self._writer.close()

    @property
    def closed(self) -> bool:
        """True once `close()` has been called."""
        return self._writer.closed

    def __enter__(self) -> Self:
        if self.closed:
            raise RuntimeError(f"ResultLog({self.path!r}) is closed: create a new one")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        mode = "per-line" if self.per_line else "grouped"
        return (
            f"<ResultLog {state} {mode} path={self.path!r} max_bytes={self.max_bytes} "
            f"backup_count={self.backup_count} write_errors={self.write_errors}>"
        )


def _writing_mode(per_line: bool | None, background: bool | None) -> bool:
    """Whether to write per line, from `per_line` and the older `background`."""
    for value, name in ((per_line, "per_line"), (background, "background")):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    if background is None:
        return bool(per_line)
    if per_line is not None and per_line == background:
        raise ValueError(
            f"per_line={per_line} contradicts background={background} (background=True is the "
            "grouped mode, background=False is per_line=True): pass only per_line"
        )
    return not background


# -- encoding --------------------------------------------------------------------------------------
#
# Two encoders that write the same bytes. `_record` + `_encode` is the reference: a dict through
# a strict `json.JSONEncoder` (ASCII only, no NaN, compact separators, a fallback for what JSON
# cannot hold). `_fast_line` writes the fixed fields by hand when each has its usual exact type
# (the C encoder's own string escaping and `float.__repr__`, which is what the encoder calls),
# and only `arguments` through the encoder; it returns None otherwise, and the reference runs.

_seconds_cache: tuple[int, str] = (-1, "")


def _utc_timestamp(now: float) -> str:
    """`now` (epoch seconds) as ISO 8601 UTC, to the microsecond, with a `Z` suffix."""
    global _seconds_cache
    seconds = int(now)
    cached = _seconds_cache  # one tuple, read and replaced atomically: no lock needed
    if cached[0] != seconds:
        cached = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
        _seconds_cache = cached
    return f"{cached[1]}.{int((now - seconds) * 1e6):06d}Z"


def _rounded(value: object) -> object:
    """`round(value, 6)`, or `value` itself when it cannot be rounded (written by the fallback)."""
    if type(value) is float:
        return round(value, 6)
    try:
        return round(value, 6)  # type: ignore[call-overload]
    except Exception:
        return value


def _timeline_fields(timeline: Any) -> object:
    """The `timeline` value: a dict of the five moments, or a marker if they cannot be read."""
    try:
        dispatched = timeline.dispatched
        cancelled = timeline.cancelled
        settled = timeline.settled
        return {
            "entered": _utc_timestamp(timeline.entered),
            "dispatched": None if dispatched is None else _rounded(dispatched),
            "cancelled": None if cancelled is None else _rounded(cancelled),
            "settled": None if settled is None else _rounded(settled),
            "finished": _rounded(timeline.finished),
        }
    except Exception:
        return f"<unrepresentable {type(timeline).__name__}>"


def _record(
    stamp: str,
    call_id: object,
    name: object,
    ok: object,
    code: object,
    message: object,
    dispatched: object,
    duration: object,
    moments: object,
    arguments: object,
) -> dict[str, object]:
    """The line as a dict, fields in their documented order (`timeline` only when present)."""
    record: dict[str, object] = {
        "time": stamp,
        "call_id": call_id,
        "name": name,
        "ok": ok,
        "code": code,
        "message": message,
        "dispatched": dispatched,
        "duration": duration,
    }
    if moments is not None:
        record["timeline"] = moments
    record["arguments"] = arguments
    record["pid"] = _pid
    return record


_string = json.encoder.encode_basestring_ascii  # the C escaper the encoder itself uses
_float_text = float.__repr__


def _number(value: object) -> str | None:
    """`value` as the encoder writes it, if it is a finite float (or None); else None."""
    if value is None:
        return "null"
    if type(value) is float and value - value == 0.0:  # finite: NaN and inf give NaN here
        return _float_text(value)
    return None


def _fast_line(
    stamp: str,
    call_id: object,
    name: object,
    ok: object,
    code: object,
    message: object,
    dispatched: object,
    duration: object,
    moments: object,
    arguments: object,
) -> str | None:
    """The line written by hand, or None when a field needs the reference encoder."""
    if not (
        type(call_id) is str
        and type(name) is str
        and type(ok) is bool
        and type(dispatched) is bool
        and (code is None or type(code) is str)
        and (message is None or type(message) is str)
    ):
        return None
    duration_text = _number(duration)
    if duration_text is None or duration is None:
        return None
    if moments is None:
        timeline = ""
    else:
        if type(moments) is not dict:
            return None
        parts = [
            _number(moments["dispatched"]),
            _number(moments["cancelled"]),
            _number(moments["settled"]),
            _number(moments["finished"]),
        ]
        if None in parts or moments["finished"] is None:
            return None
        timeline = (
            f',"timeline":{{"entered":"{moments["entered"]}","dispatched":{parts[0]},'
            f'"cancelled":{parts[1]},"settled":{parts[2]},"finished":{parts[3]}}}'
        )
    try:
        arguments_text = _flat_object(arguments) if type(arguments) in _PLAIN_MAPPINGS else None
        if arguments_text is None:
            arguments_text = _ENCODER.encode(arguments)
    except Exception:  # what JSON cannot hold, or a mapping changed under us
        return None
    return (
        f'{{"time":"{stamp}","call_id":{_string(call_id)},"name":{_string(name)},'
        f'"ok":{"true" if ok else "false"},'
        f'"code":{"null" if code is None else _string(code)},'
        f'"message":{"null" if message is None else _string(message)},'
        f'"dispatched":{"true" if dispatched else "false"},"duration":{duration_text}'
        f'{timeline},"arguments":{arguments_text},"pid":{_pid}}}'
    )


_PLAIN_MAPPINGS = (dict, types.MappingProxyType)
_SAFE_INT = 10**15  # far below the int-to-str digit limit


def _flat_object(mapping: Any) -> str | None:
    """A mapping of str keys to scalars as the encoder writes it; None for anything else.

    Most tool arguments look like this, and it saves building an encoder per line.
    """
    parts = []
    for key, value in mapping.items():
        if type(key) is not str:
            return None
        kind = type(value)
        if kind is str:
            text = _string(value)
        elif kind is bool:
            text = "true" if value else "false"
        elif kind is int and -_SAFE_INT < value < _SAFE_INT:
            text = int.__repr__(value)
        elif kind is float and value - value == 0.0:
            text = _float_text(value)
        elif value is None:
            text = "null"
        else:
            return None
        parts.append(f"{_string(key)}:{text}")
    return "{" + ",".join(parts) + "}"


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
    except Exception:
        # Non-finite floats, cycles, keys JSON cannot have, very deep nesting, an int too long
        # for int's string conversion, or a hostile mapping.
        return _ENCODER.encode(_sanitize(record, 0, set()))


def _sanitize(value: object, depth: int, seen: set[int]) -> object:
    """A JSON-safe copy of `value`; what JSON cannot hold becomes a string."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return value if _int_writable(value) else _long_int(value)
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


def _int_writable(value: int) -> bool:
    try:
        int.__repr__(value)
    except ValueError:  # longer than sys.get_int_max_str_digits()
        return False
    return True


def _long_int(value: int) -> str:
    return f"<int too long to write: {value.bit_length()} bits>"


def _key(key: object) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, int) and not isinstance(key, bool) and not _int_writable(key):
        return _long_int(key)
    if key is None or isinstance(key, (bool, int)):
        return json.dumps(key)  # what the encoder itself does with such keys
    if isinstance(key, float):
        return json.dumps(key) if math.isfinite(key) else repr(key)
    text = _fallback(key)
    return text if isinstance(text, str) else repr(text)


# -- process identity ------------------------------------------------------------------------------

_pid = os.getpid()  # cached: getpid() is a system call, and lines are encoded by the thousand


def _new_pid() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_pid)
