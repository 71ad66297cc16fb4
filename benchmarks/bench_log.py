"""ResultLog: lines per second against the raw handler, and the cost it adds to `execute`.

* lines/s: a `ResultLog` fed results (it encodes each one, then writes it through its
  `ConcurrentRotatingFileHandler`) against the same handler class, with the same rotation
  settings, writing the very same lines already encoded, the usual way (a private
  `logging.Logger`: the baseline; target: ResultLog >= 0.85x its rate), and against the bare
  `handler.handle(record)` floor with prebuilt records. Every run writes N lines into a new file
  and closes it (for `background=True` the close is the drain, so it counts). Files go to tmpfs
  when there is one, so the figures measure code rather than a disk other processes share.
* per call: `registry.execute` of a trivial tool, and the same registry with a `ResultLog`
  (foreground, then `background=True`) observing: the factor and the microseconds added. A
  trivial tool is the worst case: a real tool's own work dwarfs the write.

All variants run interleaved, in a rotated order, and each figure is the median over the
repeats (`_harness.interleaved`). The two comparisons that matter are paired: their variants
time both sides back to back (ABBA) and the median of those ratios is reported, which cancels
most of the drift of a busy, shared machine.
"""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
from collections.abc import Callable
from functools import partial
from typing import Any

from concurrent_log_handler import ConcurrentRotatingFileHandler

from toolreg import ToolCall, ToolRegistry, ToolResult
from toolreg.log import ResultLog

from ._harness import Row, format_time, interleaved, ratio, timed_once, verdict

MAX_BYTES = 4 * 1024 * 1024  # the same rotation settings for every variant
BACKUP_COUNT = 3
TARGET = 0.85  # ResultLog lines/s over the raw handler's
_serial = itertools.count()  # a new file for every run
ARGUMENTS: dict[str, Any] = {"q": "quiescent cancellation", "limit": 10, "lang": "en"}


def search(args: Any, ctx: Any) -> str:
    """The trivial tool every `execute` variant calls."""
    return "ok"


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


def _result_log(directory: str, count: int, background: bool) -> float:
    """Seconds per line: ResultLog, encoding included (and the drain, in background)."""
    result = _result()
    path = _new_file(directory, "background" if background else "resultlog")
    log = ResultLog(path, max_bytes=MAX_BYTES, backup_count=BACKUP_COUNT, background=background)

    def write(n: int) -> None:
        for _ in range(n):
            log(result)
        log.close()

    return timed_once(write, count) / count


def _paired(directory: str, lines: list[str]) -> float:
    """ResultLog's lines/s over the raw handler's, from runs side by side (ABBA order).

    A ratio of two medians taken seconds apart carries the drift of a shared machine; a ratio
    of runs taken side by side mostly cancels it. The median of these ratios is the target.
    """
    raw = _raw_logger(directory, lines)
    ours = _result_log(directory, len(lines), False)
    ours += _result_log(directory, len(lines), False)
    raw += _raw_logger(directory, lines)
    return raw / ours


def _per_call(count: int) -> float:
    """Seconds per `execute` of a trivial tool, no observer."""
    with ToolRegistry(max_workers=2) as registry:
        registry.tool(search)
        _calls(registry, 100)  # start the pool's threads
        return timed_once(partial(_calls, registry), count) / count


def _paired_calls(directory: str, count: int, background: bool) -> float:
    """`execute` with a ResultLog over `execute` without, in one registry (ABBA order)."""
    name = "execute-background.jsonl" if background else "execute.jsonl"
    with (
        ToolRegistry(max_workers=2) as registry,
        ResultLog(os.path.join(directory, name), background=background) as log,
    ):
        registry.tool(search)
        _calls(registry, 100)
        bare = timed_once(partial(_calls, registry), count)
        observing = registry.on_result(log)
        logged = timed_once(partial(_calls, registry), count)
        logged += timed_once(partial(_calls, registry), count)
        observing.remove()
        bare += timed_once(partial(_calls, registry), count)
    return logged / bare


def _calls(registry: ToolRegistry, n: int) -> None:
    for _ in range(n):
        registry.execute("search", ARGUMENTS)


def _variants(directory: str, lines: list[str], calls: int) -> dict[str, Callable[[], float]]:
    return {
        "raw logger": partial(_raw_logger, directory, lines),
        "raw handle": partial(_raw_handle, directory, lines),
        "ResultLog": partial(_result_log, directory, len(lines), False),
        "ResultLog background": partial(_result_log, directory, len(lines), True),
        "ResultLog / raw": partial(_paired, directory, lines[: len(lines) // 2]),
        "execute": partial(_per_call, calls),
        "execute foreground / bare": partial(_paired_calls, directory, calls // 2, False),
        "execute background / bare": partial(_paired_calls, directory, calls // 2, True),
    }


def measure(quick: bool) -> dict[str, float]:
    """Medians: seconds per line or per call, and the paired ratios (`a / b` keys)."""
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
    """Measure and return the table's rows."""
    m = measure(quick)

    def rate(name: str) -> str:
        return f"{1 / m[name]:,.0f} lines/s"

    raw = m["raw logger"]
    throughput = 1 / m["ResultLog / raw"]
    rows = [
        Row("raw handler via logging.Logger (baseline)", rate("raw logger"), "1.00x"),
        Row(
            "raw handler.handle(record): the floor", rate("raw handle"), ratio(raw, m["raw handle"])
        ),
        Row(
            "ResultLog (encodes, then writes); ratio: paired",
            rate("ResultLog"),
            f"{throughput:.2f}x",
            f">= {TARGET}x",
            verdict(TARGET, throughput),
        ),
        Row(
            "ResultLog background=True (with the drain)",
            rate("ResultLog background"),
            ratio(raw, m["ResultLog background"]),
        ),
    ]
    bare = m["execute"]
    rows.append(Row("execute, no observer", f"{format_time(bare)}/call", "1.00x"))
    for mode in ("foreground", "background"):
        factor = m[f"execute {mode} / bare"]
        rows.append(
            Row(
                f"execute + ResultLog {mode}; paired",
                f"+{format_time(bare * (factor - 1))}/call",
                f"{factor:.2f}x",
            )
        )
    return rows
