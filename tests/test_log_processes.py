"""ResultLog across processes: spawned and forked writers, each with threads, share one rotating
file; every line lands exactly once and whole, and fork() neither loses nor repeats a line.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import select
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _log_helpers import WAIT, EmitGate, RedactGate, lines_of, log_files, read_text

from toolreg import CancelSource, ErrorCode, ToolCall, ToolRegistry, ToolResult
from toolreg._logwriter import group_bytes
from toolreg.log import ResultLog

pytestmark = pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")

THREADS = 3
PER_THREAD = 500
MAX_BYTES = 4096


def _write_results(log: ResultLog | str, tag: str, options: dict[str, Any], close: bool) -> None:
    """A child process: THREADS threads x PER_THREAD calls, some failing, some cancelled."""
    if isinstance(log, str):
        log = ResultLog(log, **options)
    gone = CancelSource()
    gone.cancel()
    start = threading.Barrier(THREADS)
    with ToolRegistry(max_workers=2) as registry:
        registry.tool(lambda args, ctx: args["n"], name="work")
        registry.on_result(log)

        def calls(thread: int) -> None:
            start.wait(WAIT)
            for n in range(PER_THREAD):
                call_id = f"{tag}-{thread}-{n}"
                call = ToolCall("work" if n % 7 else "missing", {"n": n}, call_id=call_id)
                token = gone.token if n % 11 == 0 else None
                registry.execute(call, token=token, start_if_cancelled=False)

        threads = [threading.Thread(target=calls, args=(k,)) for k in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT * 3)
    if close:
        log.close()
    # else: a spawned child's atexit hook, or a forked child's multiprocessing finalizer,
    # writes what is still queued


@pytest.mark.parametrize("use_gzip", [False, True], ids=["plain", "gzip"])
def test_processes_and_threads_share_and_rotate_one_file_without_losing_or_repeating_a_line(
    tmp_path: Path, use_gzip: bool
) -> None:
    path = tmp_path / "calls.jsonl"
    options: dict[str, Any] = {"max_bytes": MAX_BYTES, "backup_count": 1000, "gzip": use_gzip}
    # Forked children inherit this instance after it opened the file, with a line queued.
    inherited = ResultLog(path, **options)
    inherited(ToolResult.success(ToolCall("parent", call_id="parent-0"), 0))
    spawn = multiprocessing.get_context("spawn")
    fork = multiprocessing.get_context("fork")
    children = [
        spawn.Process(  # per line
            target=_write_results, args=(str(path), "spawn-a", {**options, "per_line": True}, True)
        ),
        spawn.Process(  # never closed: its atexit hook writes what is queued
            target=_write_results, args=(str(path), "spawn-b", options, False)
        ),
        fork.Process(target=_write_results, args=(inherited, "fork-a", options, True)),
        fork.Process(target=_write_results, args=(inherited, "fork-b", options, False)),
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(WAIT * 3)
    inherited.close()
    assert [child.exitcode for child in children] == [0, 0, 0, 0]

    records = lines_of(path)  # every line strict JSON, every file ending in a newline
    ids = Counter(record["call_id"] for record in records)
    tags = ("spawn-a", "spawn-b", "fork-a", "fork-b")
    expected = {"parent-0"} | {
        f"{tag}-{k}-{n}" for tag in tags for k in range(THREADS) for n in range(PER_THREAD)
    }
    assert set(ids) == expected
    assert [call_id for call_id, count in ids.items() if count != 1] == []
    codes = Counter(record["code"] for record in records)
    before = sum(1 for n in range(PER_THREAD) if n % 11 == 0 and n % 7)  # unknown tools first
    assert codes[ErrorCode.ABORTED_BEFORE_DISPATCH.value] == 4 * THREADS * before
    assert len({record["pid"] for record in records}) == 5
    files = log_files(path)
    assert len(files) > 200, "the file should have rotated hundreds of times"
    assert all(p.name.endswith(".gz") == use_gzip for p in files[:-1])
    longest = max(len(line) for file in files for line in read_text(file).splitlines()) + 1
    assert max(len(read_text(p)) for p in files) <= MAX_BYTES - 1 + group_bytes(MAX_BYTES) + longest


def test_a_forked_child_never_writes_the_lines_its_parent_had_queued(tmp_path: Path) -> None:
    gate = RedactGate()  # holds the parent's drain only
    path = tmp_path / "calls.jsonl"
    log = ResultLog(path, redact=gate)
    log(ToolResult.success(ToolCall("parent", call_id="parent-0"), 0))
    gate.wait_reached()  # the drain encodes line 0: the next 49 wait in the queue across the fork
    for n in range(1, 50):
        log(ToolResult.success(ToolCall("parent", call_id=f"parent-{n}"), n))
    assert len(log._writer.pending) == 49
    child = multiprocessing.get_context("fork").Process(
        target=_write_results,
        args=(log, "child", {}, False),  # closed by the exit finalizer
    )
    child.start()
    child.join(WAIT * 3)
    gate.release()
    log.close()
    assert child.exitcode == 0
    ids = Counter(line["call_id"] for line in lines_of(path))
    assert set(ids.values()) == {1}
    assert len(ids) == 50 + THREADS * PER_THREAD


class SpyLock:
    """A lock that tells when a given thread starts waiting for it."""

    def __init__(self, thread_name: str) -> None:
        self._lock = threading.Lock()
        self.thread_name = thread_name
        self.waiting = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if threading.current_thread().name == self.thread_name:
            self.waiting.set()
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _log_one_line(log: ResultLog) -> None:
    log(ToolResult.success(ToolCall("child", call_id="child-0"), 0))
    log.close()


def test_fork_waits_for_a_write_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A child forked in the middle of a write would inherit the half-written group in the
    # stream's buffer, and the stream's lock held by a thread it does not have.
    gate = EmitGate(monkeypatch)
    path = tmp_path / "calls.jsonl"
    log = ResultLog(path)
    spy = SpyLock("forker")
    log._writer._write_lock = spy  # type: ignore[assignment]
    log(ToolResult.success(ToolCall("parent", call_id="parent-0"), 0))
    assert gate.reached.wait(WAIT)  # the drain is writing, holding the write lock
    child = multiprocessing.get_context("fork").Process(target=_log_one_line, args=(log,))
    forked = threading.Event()

    def fork() -> None:
        child.start()
        forked.set()

    forker = threading.Thread(target=fork, name="forker")
    forker.start()
    assert spy.waiting.wait(WAIT)  # the fork hook waits for the write lock...
    assert not forked.is_set()  # ...so the fork has not happened
    gate.release()
    forker.join(WAIT)
    assert forked.is_set()
    child.join(WAIT * 3)
    log.close()
    assert child.exitcode == 0
    assert sorted(line["call_id"] for line in lines_of(path)) == ["child-0", "parent-0"]


def test_per_line_children_need_no_drain(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    log = ResultLog(path, per_line=True)
    child = multiprocessing.get_context("fork").Process(target=_log_one_line, args=(log,))
    child.start()
    child.join(WAIT * 3)
    log(ToolResult.success(ToolCall("parent", call_id="parent-0"), 0))
    log.close()
    assert child.exitcode == 0
    assert sorted(line["call_id"] for line in lines_of(path)) == ["child-0", "parent-0"]
    assert os.getpid() in {line["pid"] for line in lines_of(path)}


_TORN_WRITER = """
import os, sys, threading
from toolreg import ToolCall, ToolRegistry, _logwriter
from toolreg.log import ResultLog

path, ready = sys.argv[1], int(sys.argv[2])


class DiesMidLine:
    # The file's stream, which writes half of the next line, says so, and waits to be killed.
    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        self.stream.write(text[: len(text) // 2])
        self.stream.flush()
        os.write(ready, b"x")
        threading.Event().wait()

    def __getattr__(self, name):
        return getattr(self.stream, name)


opened = _logwriter._Handler.do_open
_logwriter._Handler.do_open = lambda self, mode=None: DiesMidLine(opened(self, mode))
registry = ToolRegistry(max_workers=1)
registry.tool(lambda args, ctx: "done", name="doomed")
registry.on_result(ResultLog(path, per_line=True))
registry.execute(ToolCall("doomed", call_id="doomed-1"))
"""


def test_a_writer_killed_mid_line_loses_only_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    healthy = ResultLog(path, per_line=True)
    healthy(ToolResult.success(ToolCall("before", call_id="before-1"), 1))
    ready_read, ready_write = os.pipe()
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", _TORN_WRITER, str(path), str(ready_write)],
            pass_fds=[ready_write],
        )
        try:
            assert select.select([ready_read], [], [], WAIT)[0], "the writer never wrote"
            assert os.read(ready_read, 1) == b"x"
        finally:
            child.kill()  # SIGKILL, mid-line, holding the file lock (released by its death)
            child.wait(WAIT)
    finally:
        os.close(ready_read)
        os.close(ready_write)
    healthy(ToolResult.success(ToolCall("after", call_id="after-1"), 2))
    healthy.close()
    lines = read_text(path).split("\n")
    assert lines[-1] == ""  # the file ends a line
    parsed, torn = [], []
    for line in lines[:-1]:
        try:
            parsed.append(json.loads(line)["call_id"])
        except json.JSONDecodeError:
            torn.append(line)
    assert parsed == ["before-1", "after-1"]  # the healthy process lost nothing
    assert len(torn) == 1 and torn[0].startswith('{"time":')  # the half the dead writer wrote
