"""ResultLog against the stdlib JSON-lines observer a user would write, and the raw handler.

* lines/s: a `ResultLog` fed results (grouped, the default: the observer queues, a drain thread
  encodes and writes many lines per file lock) against the same handler class, with the same
  rotation settings, writing the very same lines already encoded, the usual way (a private
  `logging.Logger`, one lock per line: the baseline; target: ResultLog >= 3x its rate). Every
  run writes N lines into a new file and closes it (the close is the drain, so it counts). The
  per-line mode and the bare `handler.handle(record)` floor are shown for reference. Files go
  to tmpfs when there is one, so the figures measure code rather than a disk others share.
* encoding: the hand-built line against the generic one (a dict through the JSON encoder),
  same output.
* per call, against what a user would write without toolreg.log: `registry.execute` of a
  trivial tool observed by a stdlib JSON-lines observer (the baseline: a private
  `logging.Logger` with a `logging.FileHandler` whose `Formatter` writes the result's fields
  as one JSON object per line) and by the same formatter on a raw
  `ConcurrentRotatingFileHandler` (one lock per line, safe across processes, as ResultLog is);
  and the same calls observed by a grouped `ResultLog` (target <= 1.00x of the stdlib
  observer). Paired (ABBA on one registry). A timed run ends with `flush()`, so the drain's
  work for those calls is inside it. A trivial tool is the worst case.
* CPU per line on the calling thread: `time.thread_time()` over many direct calls of each
  observer, so what the grouped ResultLog leaves to its drain thread is not counted (that is
  its point); the per-line ResultLog, which writes on the calling thread, for reference.
* per call against a no-op observer (no log at all): the factor and the microseconds a log
  adds, grouped and per line (no target: a log line costs what it costs, whoever writes it).

Regimes (`_regime`): in `cross` the registries' workers and ResultLog's drain thread are started
on the workers' CPU (they are created inside `_regime.worker_side()`); the call target holds in
the `same` regime only (on an idle machine, cross, the log costs a smaller share).

All variants run interleaved, in a rotated order, and each figure is the median over the
repeats (`_harness.interleaved`). The comparisons that carry targets are paired: their
variants time both sides back to back (ABBA) and the median of those ratios is reported,
which cancels most of the drift of a busy, shared machine.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from concurrent_log_handler import ConcurrentRotatingFileHandler

import toolreg.log as log_module
from toolreg import ToolCall, ToolRegistry, ToolResult
from toolreg.log import ResultLog

from . import _regime
from ._harness import Rounds, Row, format_time, gc_off, interleaved, timed_once, verdict

MAX_BYTES = 4 * 1024 * 1024  # the same rotation settings for every variant
BACKUP_COUNT = 3
LINES_TARGET = 3.0  # grouped ResultLog lines/s over the raw handler's
CALL_TARGET = 1.00  # execute + grouped ResultLog over execute + a stdlib JSON-lines observer
_serial = itertools.count()  # a new file for every run
ARGUMENTS: dict[str, Any] = {"q": "quiescent cancellation", "limit": 10, "lang": "en"}


def search(args: Any, ctx: Any) -> str:
    """The trivial tool every `execute` variant calls."""
    return "ok"


def _noop(result: ToolResult[Any]) -> None:
    """The baseline observer."""


def _result() -> ToolResult[Any]:
    return ToolResult.success(ToolCall("search", ARGUMENTS), {"hits": []})


def _new_file(directory: str, stem: str) -> str:
    return os.path.join(directory, f"{stem}-{next(_serial)}.jsonl")


def _handler(directory: str, stem: str) -> ConcurrentRotatingFileHandler:
    return ConcurrentRotatingFileHandler(
        _new_file(directory, stem),
        maxBytes=MAX_BYTES,
        backupCount=BACKUP_COUNT,
        encoding="utf-8",
    )


def _raw_logger(directory: str, lines: list[str]) -> float:
    """Seconds per line: the handler behind a private, non-propagating Logger."""
    handler = _handler(directory, "raw")
    sink = logging.Logger("bench_log.raw")  # outside the logging hierarchy, like ResultLog
    sink.propagate = False
    sink.addHandler(handler)

    def write(n: int) -> None:
        for line in lines:
            sink.info(line)
        handler.close()

    return timed_once(write, len(lines)) / len(lines)


def _raw_handle(directory: str, lines: list[str]) -> float:
    """Seconds per line: `handler.handle` with records built beforehand."""
    handler = _handler(directory, "floor")
    records = [logging.LogRecord("bench", logging.INFO, "", 0, line, None, None) for line in lines]

    def write(n: int) -> None:
        for record in records:
            handler.handle(record)
        handler.close()

    return timed_once(write, len(records)) / len(records)


def _result_log(directory: str, count: int, per_line: bool) -> float:
    """Seconds per line: ResultLog, encoding included (and the drain, in `close()`)."""
    result = _result()
    path = _new_file(directory, "per-line" if per_line else "grouped")
    with _regime.worker_side():  # the drain thread is a worker
        log = ResultLog(path, max_bytes=MAX_BYTES, backup_count=BACKUP_COUNT, per_line=per_line)

    def write(n: int) -> None:
        for _ in range(n):
            log(result)
        log.close()

    return timed_once(write, count) / count


def _paired_lines(directory: str, lines: list[str]) -> float:
    """Grouped ResultLog's time per line over the raw handler's, runs side by side (ABBA)."""
    raw = _raw_logger(directory, lines)
    ours = _result_log(directory, len(lines), False)
    ours += _result_log(directory, len(lines), False)
    raw += _raw_logger(directory, lines)
    return ours / raw


def _encoding(directory: str, count: int, hand_built: bool) -> float:
    """Seconds per line encoded: the hand-built encoder, or the generic dict path."""
    log = ResultLog(_new_file(directory, "encoding"))
    result = _result()
    now = time.time()

    def hand(n: int) -> None:
        for _ in range(n):
            log._line(result, now)

    def generic(n: int) -> None:
        # What ResultLog did before: build the dict, then the JSON encoder.
        for _ in range(n):
            call = result.call
            error = result.error
            log_module._encode(
                {
                    "time": log_module._utc_timestamp(now),
                    "call_id": call.call_id,
                    "name": call.name,
                    "ok": result.ok,
                    "code": None if error is None else str(error.code),
                    "message": None if error is None else error.message,
                    "dispatched": result.dispatched,
                    "duration": round(result.duration, 6),
                    "arguments": call.arguments,
                    "pid": os.getpid(),
                }
            )

    try:
        return timed_once(hand if hand_built else generic, count) / count
    finally:
        log.close()


def _per_call(count: int, directory: str | None = None) -> float:
    """Seconds per `execute` of a trivial tool, with a no-op observer (or, given a directory,
    the stdlib JSON-lines observer writing a file there)."""
    observer: Any = _noop if directory is None else _observer(directory, "stdlib")
    with _regime.worker_side():
        registry = ToolRegistry(max_workers=2)
        registry.tool(search)
        registry.on_result(observer)
        _calls(registry, 100)  # start the pool's threads
    with registry:
        try:
            return timed_once(partial(_calls, registry), count) / count
        finally:
            if directory is not None:
                observer.close()


def _paired_calls(directory: str, count: int, per_line: bool) -> float:
    """`execute` with a ResultLog over `execute` with a no-op observer, one registry (ABBA)."""
    name = "execute-per-line.jsonl" if per_line else "execute.jsonl"
    with _regime.worker_side():
        registry = ToolRegistry(max_workers=2)
        registry.tool(search)
        _calls(registry, 100)  # start the pool's threads
        log = ResultLog(os.path.join(directory, name), per_line=per_line)
    with registry, log:

        def logged_calls(n: int) -> None:
            _calls(registry, n)
            log.flush()  # the drain's work for these calls belongs to them

        observing = registry.on_result(_noop)
        bare = timed_once(partial(_calls, registry), count)
        observing.remove()
        observing = registry.on_result(log)
        logged = timed_once(logged_calls, count)
        logged += timed_once(logged_calls, count)
        observing.remove()
        observing = registry.on_result(_noop)
        bare += timed_once(partial(_calls, registry), count)
        observing.remove()
    return logged / bare


class JsonLines(logging.Formatter):
    """The stdlib way to log results as JSON lines: a formatter over the record's result."""

    def format(self, record: logging.LogRecord) -> str:
        result: ToolResult[Any] = record.__dict__["result"]
        call, error = result.call, result.error
        return json.dumps(
            {
                "time": self.formatTime(record),
                "call_id": call.call_id,
                "name": call.name,
                "ok": result.ok,
                "code": None if error is None else str(error.code),
                "message": None if error is None else error.message,
                "dispatched": result.dispatched,
                "duration": round(result.duration, 6),
                "arguments": None if call.arguments is None else dict(call.arguments),
                "pid": record.process,
            }
        )


class StdlibObserver:
    """An `on_result` observer a user would write: `logger.info(..., extra={"result": r})` on a
    private logger whose handler formats JSON lines; `handler` is a `logging.FileHandler`, or
    a `ConcurrentRotatingFileHandler` for a file several processes share."""

    def __init__(self, handler: logging.Handler) -> None:
        handler.setFormatter(JsonLines())
        self.handler = handler
        self.logger = logging.Logger(f"bench_log.{type(handler).__name__}")
        self.logger.propagate = False
        self.logger.addHandler(handler)

    def __call__(self, result: ToolResult[Any]) -> None:
        self.logger.info("tool result", extra={"result": result})

    def flush(self) -> None:
        self.handler.flush()

    def close(self) -> None:
        self.handler.close()


def _observer(directory: str, name: str) -> Any:
    """A new observer writing a file (flushable and closable): `stdlib`, `raw handler`,
    `ResultLog` or `ResultLog per line`."""
    if name == "stdlib":
        return StdlibObserver(logging.FileHandler(_new_file(directory, "stdlib"), encoding="utf-8"))
    if name == "raw handler":
        return StdlibObserver(_handler(directory, "raw-observer"))
    with _regime.worker_side():  # ResultLog's drain thread is a worker
        return ResultLog(_new_file(directory, "observer"), per_line=name == "ResultLog per line")


def _paired_observers(directory: str, count: int, ours: str, theirs: str) -> float:
    """`execute` observed by `ours` over `execute` observed by `theirs`, one registry (ABBA)."""
    with _regime.worker_side():
        registry = ToolRegistry(max_workers=2)
        registry.tool(search)
        _calls(registry, 100)  # start the pool's threads
    observers = {name: _observer(directory, name) for name in (ours, theirs)}
    try:
        with registry:

            def observed(name: str, n: int) -> None:
                observing = registry.on_result(observers[name])
                _calls(registry, n)
                observers[name].flush()  # a line's whole cost belongs to its call
                observing.remove()

            observed(ours, 50)
            observed(theirs, 50)
            base = timed_once(partial(observed, theirs), count)
            mine = timed_once(partial(observed, ours), count)
            mine += timed_once(partial(observed, ours), count)
            base += timed_once(partial(observed, theirs), count)
    finally:
        for observer in observers.values():
            observer.close()
    return mine / base


def _caller_cpu(directory: str, count: int, name: str) -> float:
    """CPU seconds of the calling thread per line, calling the observer `name` directly."""
    result = _result()
    observer = _observer(directory, name)
    try:
        for _ in range(50):
            observer(result)
        observer.flush()
        with _cpu_clock() as clock:
            for _ in range(count):
                observer(result)
        return clock[0] / count
    finally:
        observer.close()


@contextlib.contextmanager
def _cpu_clock() -> Iterator[list[float]]:
    """`clock[0]`: the calling thread's CPU seconds in the block (the cyclic GC off)."""
    clock = [0.0]
    with gc_off():
        started = time.thread_time()
        yield clock
        clock[0] = time.thread_time() - started


def _calls(registry: ToolRegistry, n: int) -> None:
    for _ in range(n):
        registry.execute("search", ARGUMENTS)


def _variants(directory: str, lines: list[str], calls: int) -> dict[str, Callable[[], float]]:
    count = len(lines)
    return {
        "raw logger": partial(_raw_logger, directory, lines),
        "raw handle": partial(_raw_handle, directory, lines),
        "ResultLog": partial(_result_log, directory, count, False),
        "ResultLog per line": partial(_result_log, directory, count, True),
        "ResultLog / raw": partial(_paired_lines, directory, lines[: count // 2]),
        "encode hand-built": partial(_encoding, directory, count, True),
        "encode generic": partial(_encoding, directory, count, False),
        "execute": partial(_per_call, calls),
        "execute stdlib": partial(_per_call, calls, directory),
        "ResultLog / stdlib": partial(
            _paired_observers, directory, calls // 2, "ResultLog", "stdlib"
        ),
        "ResultLog / raw handler": partial(
            _paired_observers, directory, calls // 2, "ResultLog", "raw handler"
        ),
        "raw handler / stdlib": partial(
            _paired_observers, directory, calls // 2, "raw handler", "stdlib"
        ),
        "cpu stdlib": partial(_caller_cpu, directory, count, "stdlib"),
        "cpu raw handler": partial(_caller_cpu, directory, count, "raw handler"),
        "cpu ResultLog": partial(_caller_cpu, directory, count, "ResultLog"),
        "cpu ResultLog per line": partial(_caller_cpu, directory, count, "ResultLog per line"),
        "execute grouped / noop": partial(_paired_calls, directory, calls // 2, False),
        "execute per-line / noop": partial(_paired_calls, directory, calls // 2, True),
    }


def measure(quick: bool) -> Rounds:
    """Seconds per line or per call, and the paired ratios (`a / b` keys), per round."""
    repeats = 5 if quick else 11
    count = 2_000 if quick else 10_000
    calls = 400 if quick else 2_000
    # tmpfs when there is one: the figures then measure the code, not a disk that other
    # processes share (and a slower disk would only dilute ResultLog's own overhead).
    memory = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="bench-log-", dir=memory) as directory:
        sample = ResultLog(os.path.join(directory, "sample.jsonl"))
        lines = [sample.encode(_result()) for _ in range(count)]  # what ResultLog would write
        sample.close()
        return interleaved(_variants(directory, lines, calls), repeats)


def run(quick: bool) -> list[Row]:
    """Measure in the current regime and return the table's rows."""
    return _rows(measure(quick))


def _rows(m: Rounds) -> list[Row]:
    def rate(key: str) -> str:
        return f"{1 / m[key]:,.0f} lines/s"

    def speed(key: str) -> str:  # lines/s over the raw logger's, per round
        return f"{m.ratio('raw logger', key):.2f}x"

    throughput = 1 / m["ResultLog / raw"]
    rows = [
        Row("raw handler via logging.Logger (baseline)", rate("raw logger"), "1.00x"),
        Row("raw handler.handle(record): floor", rate("raw handle"), speed("raw handle")),
        Row(
            "ResultLog grouped (encode + drain); paired",
            rate("ResultLog"),
            f"{throughput:.2f}x",
            f">= {LINES_TARGET}x",
            "PASS" if throughput >= LINES_TARGET else "MISS",
        ),
        Row("ResultLog per_line=True", rate("ResultLog per line"), speed("ResultLog per line")),
        Row(
            "encode a line: hand-built / generic",
            f"{format_time(m['encode hand-built'])}/line",
            f"{m.ratio('encode hand-built', 'encode generic'):.2f}x",
            baseline="the generic encoder",
        ),
    ]
    stdlib = "execute + stdlib logging JSON-lines observer (FileHandler)"
    ours = m["ResultLog / stdlib"]
    base = m["execute stdlib"]
    rows.append(Row(f"{stdlib} (baseline)", f"{format_time(base)}/call", "1.00x"))
    rows.append(
        Row(
            "execute + ResultLog grouped; paired",
            f"{format_time(base * ours)}/call",
            f"{ours:.2f}x",
            f"<= {CALL_TARGET:.2f}x",
            verdict(ours, CALL_TARGET),
        )
    )
    raw = "execute + the same observer on a raw ConcurrentRotatingFileHandler"
    factor = m["raw handler / stdlib"]
    rows.append(Row(f"{raw}; paired", f"{format_time(base * factor)}/call", f"{factor:.2f}x"))
    rows.append(
        Row(
            "execute + ResultLog grouped, against the raw handler's observer; paired",
            "",
            f"{m['ResultLog / raw handler']:.2f}x",
            baseline=raw,
        )
    )
    cpu = m["cpu stdlib"]
    rows.append(Row("calling thread's CPU per line: stdlib observer (baseline)", _us(cpu), "1.00x"))
    for key, label in (
        ("cpu raw handler", "raw ConcurrentRotatingFileHandler observer"),
        ("cpu ResultLog", "ResultLog grouped (the drain's share not counted)"),
        ("cpu ResultLog per line", "ResultLog per_line=True"),
    ):
        rows.append(
            Row(
                f"calling thread's CPU per line: {label}",
                _us(m[key]),
                f"{m.ratio(key, 'cpu stdlib'):.2f}x",
            )
        )
    bare = m["execute"]
    rows.append(Row("execute + no-op observer (baseline)", f"{format_time(bare)}/call", "1.00x"))
    for mode in ("grouped", "per-line"):
        factor = m[f"execute {mode} / noop"]
        rows.append(
            Row(
                f"execute + ResultLog {mode}; paired",
                f"{'+' if factor >= 1 else '-'}{format_time(abs(bare * (factor - 1)))}/call",
                f"{factor:.2f}x",
            )
        )
    return rows


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} us/line"
