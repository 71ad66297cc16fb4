"""Helpers shared by the ResultLog tests: reading logs back, and gates that hold its threads.

Threads are ordered with `Event`s only. `EmitGate` holds the first thread that reaches the
handler's `emit` (the drain, or a caller in per-line mode) while it holds the write lock;
`RedactGate` holds the drain earlier, while it encodes (before it takes any lock), which is
where a test needs lines to pile up across a `fork()`.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from concurrent_log_handler import ConcurrentRotatingFileHandler

WAIT = 10.0  # bound on every handshake: a hang becomes a failure


def strict_json(line: str) -> Any:
    def reject(constant: str) -> Any:
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(line, parse_constant=reject)


def log_files(path: Path) -> list[Path]:
    """`path` and its rotated siblings (`.N`, `.N.gz`), oldest file first."""
    siblings = []
    for candidate in path.parent.iterdir():
        match = re.fullmatch(re.escape(path.name) + r"\.(\d+)(\.gz)?", candidate.name)
        if match:
            siblings.append((-int(match.group(1)), candidate))
    return [*(p for _, p in sorted(siblings)), path]


def read_text(file: Path) -> str:
    opener: Any = gzip.open if file.name.endswith(".gz") else open
    with opener(file, "rt", encoding="ascii") as stream:
        text: str = stream.read()
    return text


def lines_of(path: Path) -> list[Any]:
    """Every record in `path` and its rotated siblings, oldest file first; none may be torn."""
    records: list[Any] = []
    for file in log_files(path):
        text = read_text(file)
        assert text == "" or text.endswith("\n"), f"{file.name} ends with a partial line"
        records.extend(strict_json(line) for line in text.splitlines())
    return records


class EmitGate:
    """Patches the handler's `emit` so the first writing thread in this process waits."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached = threading.Event()
        self.released = threading.Event()
        self.threads: list[str] = []
        self.pid = os.getpid()
        original = ConcurrentRotatingFileHandler.emit

        def emit(handler: ConcurrentRotatingFileHandler, record: logging.LogRecord) -> None:
            self.threads.append(threading.current_thread().name)
            if os.getpid() == self.pid and not self.reached.is_set():
                self.reached.set()
                assert self.released.wait(WAIT), "the emit gate was never released"
            original(handler, record)

        monkeypatch.setattr(ConcurrentRotatingFileHandler, "emit", emit)

    def release(self) -> None:
        self.released.set()


class RedactGate:
    """A `redact` that holds the first thread calling it in this process until `release()`.

    In grouped mode `redact` runs on the drain thread while it encodes, before it takes any
    lock: the held drain keeps everything logged afterwards queued.
    """

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.released = threading.Event()
        self.threads: list[str] = []
        self.pid = os.getpid()

    def __call__(self, arguments: Mapping[str, Any]) -> Any:
        self.threads.append(threading.current_thread().name)
        if os.getpid() == self.pid and not self.reached.is_set():
            self.reached.set()
            assert self.released.wait(WAIT), "the redact gate was never released"
        return dict(arguments)

    def wait_reached(self) -> None:
        assert self.reached.wait(WAIT), "no thread reached the redact gate"

    def release(self) -> None:
        self.released.set()


HOSTILE_RECORDS = [  # records `stats` and `report` must count, whatever their fields hold
    '{"name": "t", "ok": true, "duration": ' + "9" * 400 + ', "time": "2026-12-01T05:00:01Z"}',
    '{"name": "t", "ok": true, "duration": 0.5, "timeline": {"entered": "2026-12-01T05:00:01Z", '
    '"finished": ' + "9" * 400 + "}}",
    '{"name": "caf\\udce9", "ok": false, "code": "UNKNOWN_TOOL", "duration": 0.1, '
    '"message": "unknown tool \\ud800", "call_id": "\\udfff", "time": "2026-12-01T05:00:02Z"}',
    '{"name": "t", "ok": false, "code": "X\\udce9", "duration": 0.2, '
    '"time": "2026-12-01T05:00:03Z"}',
]
HOSTILE_BAD_LINES = [  # lines they must count as bad
    '{"name": "t", "ok": true, "duration": ' + "9" * 5000 + "}",  # beyond Python's int limit
    '{"name": "t", "ok": true, "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",
]


def write_hostile_log(path: Path) -> None:
    """A log of `HOSTILE_RECORDS` and `HOSTILE_BAD_LINES`, one per line."""
    path.write_text("".join(f"{line}\n" for line in HOSTILE_RECORDS + HOSTILE_BAD_LINES))
