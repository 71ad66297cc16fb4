"""ResultLog's grouped writing: lines share locks, flush and close wait for them, and nothing is
lost when writes fail or the drain thread crashes.

The drain thread is held with gates (`RedactGate` while it encodes, `EmitGate` while it writes),
never with sleeps; every wait is bounded by `WAIT`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from _log_helpers import WAIT, EmitGate, RedactGate, lines_of, log_files, read_text
from _registry_helpers import Caller, wait_until
from concurrent_log_handler import ConcurrentRotatingFileHandler

import toolreg._logwriter as logwriter
from toolreg import ToolCall, ToolRegistry, ToolResult
from toolreg._logwriter import LineWriter, group_bytes
from toolreg.log import ResultLog


def result(n: int, pad: int = 0) -> ToolResult[Any]:
    return ToolResult.success(ToolCall("echo", {"n": n, "pad": "x" * pad}, call_id=f"c-{n}"), n)


class WriteRecorder:
    """Records each locked write (`do_write`): how many lines, from which thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes: list[tuple[int, str]] = []
        original = ConcurrentRotatingFileHandler.do_write

        def do_write(handler: ConcurrentRotatingFileHandler, msg: str) -> None:
            self.writes.append((msg.count("\n") + 1, threading.current_thread().name))
            original(handler, msg)

        monkeypatch.setattr(ConcurrentRotatingFileHandler, "do_write", do_write)


# -- grouping --------------------------------------------------------------------------------------


def test_lines_queued_while_the_drain_is_busy_share_one_locked_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = WriteRecorder(monkeypatch)
    gate = RedactGate()
    path = tmp_path / "calls.jsonl"
    with ResultLog(path, redact=gate) as log:
        log(result(0))
        gate.wait_reached()  # the drain holds line 0; everything below stays queued
        for n in range(1, 200):
            log(result(n))
        gate.release()
        assert log.flush(WAIT)
        assert sum(count for count, _ in writes.writes) == 200
        assert len(writes.writes) <= 3  # line 0's group, then the 199 queued lines together
    assert {thread for _, thread in writes.writes} == {"toolreg-log-drain"}
    assert [line["call_id"] for line in lines_of(path)] == [f"c-{n}" for n in range(200)]


def test_groups_are_capped_so_a_file_exceeds_max_bytes_by_at_most_one_group(
    tmp_path: Path,
) -> None:
    gate = RedactGate()
    path = tmp_path / "calls.jsonl"
    max_bytes = 4096
    with ResultLog(path, max_bytes=max_bytes, backup_count=500, redact=gate) as log:
        log(result(0))
        gate.wait_reached()
        for n in range(1, 600):
            log(result(n, pad=n % 90))
        longest = max(len(log.encode(result(n, pad=89))) + 1 for n in range(600))
        gate.release()
    files = log_files(path)
    assert len(files) > 20
    cap = group_bytes(max_bytes)
    assert cap == 512
    sizes = [len(read_text(file)) for file in files]
    assert max(sizes) <= max_bytes - 1 + cap + longest
    assert [line["call_id"] for line in lines_of(path)] == [f"c-{n}" for n in range(600)]


def test_group_caps() -> None:
    assert group_bytes(0) == 64 * 1024  # never rotating: the cap is only about memory
    assert group_bytes(10 * 1024 * 1024) == 64 * 1024
    assert group_bytes(16_384) == 2048
    assert group_bytes(5) == 1


def test_a_line_queued_just_before_the_drain_goes_idle_is_not_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The drain finds the queue empty, then marks itself idle, then waits. A line appended
    # between the first two steps sees `idle` still false and wakes nobody: the drain must look
    # at the queue again after marking itself idle. Hold it exactly there.
    armed = threading.Event()
    checked = threading.Event()
    resume = threading.Event()

    class HoldingDeque(deque):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return self._held(super().__len__())

        def __bool__(self) -> bool:  # 3.10 tests a deque's truth without calling __len__
            return self._held(super().__len__()) > 0

        def _held(self, length: int) -> int:
            at_top = sys._getframe(2).f_code.co_name == "_drain_until_stopped"
            if length == 0 and at_top and armed.is_set() and not checked.is_set():
                checked.set()
                assert resume.wait(WAIT)
            return length

    monkeypatch.setattr(logwriter, "deque", HoldingDeque)
    path = tmp_path / "calls.jsonl"
    with ResultLog(path, linger=0) as log:
        armed.set()
        log(result(0))  # wakes the drain; once it has written it, it finds the queue empty
        assert checked.wait(WAIT)
        assert not log._writer.idle
        log(result(1))  # sees the drain busy: no wake-up
        resume.set()
        wait_until(lambda: path.read_text().count("\n") == 2, "line 1 written without a flush")


@pytest.mark.stress
@pytest.mark.parametrize("linger", [0.0, 0.002])
def test_every_line_reaches_the_file_without_flush_however_threads_interleave(
    fast_thread_switching: None, tmp_path: Path, linger: float
) -> None:
    # A lost wake-up would leave the last lines queued until some later call: nothing here
    # flushes or closes before the lines are counted.
    path = tmp_path / "calls.jsonl"
    start = threading.Barrier(8)
    log = ResultLog(path, linger=linger)

    def caller(k: int) -> None:
        start.wait(WAIT)
        for n in range(150):
            log(result(k * 1000 + n))

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    try:
        wait_until(lambda: path.read_text().count("\n") == 1200, "every line in the file")
    finally:
        log.close()
    assert len(set(line["call_id"] for line in lines_of(path))) == 1200


# -- flush and close -------------------------------------------------------------------------------


def test_flush_waits_until_every_line_logged_before_it_is_written(tmp_path: Path) -> None:
    gate = RedactGate()
    path = tmp_path / "calls.jsonl"
    with ResultLog(path, redact=gate, linger=1.0) as log:
        log(result(0))
        gate.wait_reached()
        for n in range(1, 10):
            log(result(n))
        assert not log.flush(timeout=0.05)  # held: those lines cannot be written yet
        flushed = threading.Event()

        def flush_then_mark() -> None:
            if log.flush(WAIT):
                flushed.set()

        flusher = threading.Thread(target=flush_then_mark)
        flusher.start()
        gate.release()
        flusher.join(WAIT)
        assert flushed.is_set()
        assert len(lines_of(path)) == 10  # all of them, before close
        log(result(10))  # lingers up to 1 s for company; flush cuts that short
        assert log.flush(WAIT)
        assert len(lines_of(path)) == 11


def test_flush_has_nothing_to_wait_for_per_line_or_once_closed(tmp_path: Path) -> None:
    per_line = ResultLog(tmp_path / "a.jsonl", per_line=True)
    per_line(result(0))
    assert per_line.flush(0)
    per_line.close()
    grouped = ResultLog(tmp_path / "b.jsonl")
    grouped(result(0))
    grouped.close()
    assert grouped.flush(0)
    assert len(lines_of(tmp_path / "b.jsonl")) == 1


def test_close_writes_lines_still_lingering(no_leaked_threads_or_fds: None, tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    log = ResultLog(path, linger=1.0)
    for n in range(5):
        log(result(n))
    log.close()  # cuts the linger short and writes them
    assert [line["call_id"] for line in lines_of(path)] == [f"c-{n}" for n in range(5)]


def test_a_second_close_returns_only_once_the_first_has_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = EmitGate(monkeypatch)
    path = tmp_path / "calls.jsonl"
    log = ResultLog(path)
    for n in range(20):
        log(result(n))
    assert gate.reached.wait(WAIT)  # the drain is writing; lines wait behind it
    first = Caller(log.close, name="first-close")
    wait_until(lambda: log.closed, "the first close under way")

    def second_close() -> int:
        log.close()
        return len(path.read_text().splitlines())

    second = Caller(second_close, name="second-close")
    gate.release()
    first.join()
    assert second.join() == 20  # every line was in the file when the second close returned


def test_the_drain_is_a_daemon_thread_joined_by_close(
    no_leaked_threads_or_fds: None, tmp_path: Path
) -> None:
    log = ResultLog(tmp_path / "calls.jsonl")
    [drain] = [t for t in threading.enumerate() if t.name == "toolreg-log-drain"]
    assert drain.daemon
    log.close()
    assert not drain.is_alive()


def test_closing_or_flushing_from_redact_raises_instead_of_waiting_for_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[str] = []
    log: ResultLog

    def redact(arguments: Any) -> Any:
        for action in (log.flush, log.close):
            try:
                action()
            except RuntimeError as exc:
                errors.append(str(exc))
        return arguments

    path = tmp_path / "calls.jsonl"
    log = ResultLog(path, redact=redact)
    log(result(0))
    assert log.flush(WAIT)
    log.close()
    assert len(errors) == 2 and all("drain thread" in error for error in errors)
    assert len(lines_of(path)) == 1


def test_a_late_line_is_written_once_or_refused_never_stranded(tmp_path: Path) -> None:
    # The window a caller can fall into: it saw the log open and queued its line, but close()
    # (or a crash) turned queueing off meanwhile and may already have swept the queue.
    path = tmp_path / "calls.jsonl"
    log = ResultLog(path)
    writer: LineWriter = log._writer
    log(result(0))
    log.close()
    late = (result(1), 0.0)
    writer.pending.append(late)  # appended after the final sweep, like a preempted caller
    with pytest.raises(RuntimeError, match="closed"):
        writer._settle_late(late)
    assert not writer.pending  # taken back: neither stranded nor written
    assert [line["call_id"] for line in lines_of(path)] == ["c-0"]


# -- failures --------------------------------------------------------------------------------------


class FailingWrites:
    """`do_write` raises `error` while `failing` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, error: OSError) -> None:
        self.failing = threading.Event()
        original = ConcurrentRotatingFileHandler.do_write

        def do_write(handler: ConcurrentRotatingFileHandler, msg: str) -> None:
            if self.failing.is_set():
                raise error
            original(handler, msg)

        monkeypatch.setattr(ConcurrentRotatingFileHandler, "do_write", do_write)


def test_write_failures_count_every_lost_line_and_are_logged_once_per_burst(
    tmp_path: Path,
    echo_registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    writes = FailingWrites(monkeypatch, OSError(28, "No space left on device"))
    path = tmp_path / "calls.jsonl"
    with caplog.at_level(logging.WARNING, logger="toolreg"), ResultLog(path) as log:
        echo_registry.on_result(log)
        writes.failing.set()
        results = [echo_registry.execute("echo", {"n": n}) for n in range(20)]
        assert log.flush(WAIT)
        for n in range(5):  # one group each: still one report for the burst
            echo_registry.execute("echo", {"n": n})
            assert log.flush(WAIT)
        assert log.write_errors == 25
        writes.failing.clear()
        echo_registry.execute("echo", {"n": "back"})
        assert log.flush(WAIT)
        writes.failing.set()
        echo_registry.execute("echo", {"n": "again"})
        assert log.flush(WAIT)
        writes.failing.clear()
    assert all(result.ok for result in results)
    assert log.write_errors == 26
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "toolreg"]
    assert [level for level, _ in messages] == ["ERROR", "WARNING", "ERROR"]
    assert "succeed again; 25 line(s) were lost" in messages[1][1]
    assert not any("observer" in message for _, message in messages)
    assert [line["arguments"]["n"] for line in lines_of(path)] == ["back"]


@pytest.mark.parametrize("per_line", [True, False], ids=["per-line", "grouped"])
def test_a_result_that_cannot_be_encoded_loses_its_line_not_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, per_line: bool
) -> None:
    broken = ToolResult(None, True, "no call")  # type: ignore[arg-type]
    path = tmp_path / "calls.jsonl"
    with (
        caplog.at_level(logging.ERROR, logger="toolreg"),
        ResultLog(path, per_line=per_line) as log,
    ):
        log(result(0))
        log(broken)
        log(result(1))
        assert log.flush(WAIT)
        assert log._writer.queueing is not per_line  # the drain did not crash
        with pytest.raises(TypeError, match="ToolResult"):
            log("not a result")  # type: ignore[arg-type]
    assert log.write_errors == 1
    assert [line["call_id"] for line in lines_of(path)] == ["c-0", "c-1"]
    [report] = [r for r in caplog.records if r.name == "toolreg"]
    assert report.exc_info is not None and isinstance(report.exc_info[1], AttributeError)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_loses_the_lines_but_never_a_call(
    no_leaked_threads_or_fds: None,
    tmp_path: Path,
    echo_registry: ToolRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "calls.jsonl"
    path.symlink_to("/dev/full")  # every write: ENOSPC, a real disk-full error
    log = ResultLog(path, max_bytes=0)
    echo_registry.on_result(log)
    with caplog.at_level(logging.ERROR, logger="toolreg"):
        results = [echo_registry.execute("echo", {"n": n}) for n in range(50)]
        log.close()
    assert all(result.ok for result in results)
    assert log.write_errors == 50
    reports = [r for r in caplog.records if "could not write" in r.getMessage()]
    assert len(reports) == 1
    assert reports[0].exc_info is not None and "No space left" in str(reports[0].exc_info[1])


def test_a_crashed_drain_is_logged_and_the_log_carries_on_per_line_without_loss(
    tmp_path: Path,
    echo_registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = RedactGate()
    original = LineWriter._write_chunk
    crashed = threading.Event()

    def write_chunk(writer: LineWriter, chunk: list[Any]) -> None:
        if crashed.is_set():
            return original(writer, chunk)
        crashed.set()
        original(writer, chunk[:1])  # a bug after the first line was handed over
        raise RuntimeError("a bug in the drain")

    monkeypatch.setattr(LineWriter, "_write_chunk", write_chunk)
    path = tmp_path / "calls.jsonl"
    with (
        caplog.at_level(logging.ERROR, logger="toolreg"),
        ResultLog(path, redact=gate, linger=1.0) as log,
    ):
        echo_registry.on_result(log)
        ids = [echo_registry.execute("echo", {"n": n}).call.call_id for n in range(5)]  # lingering
        flusher = threading.Thread(target=log.flush, args=(WAIT,))
        flusher.start()  # cuts the linger short: the drain takes lines 0-4 as one chunk
        gate.wait_reached()  # ... and encodes line 0, held; the next 5 wait in the queue
        ids += [echo_registry.execute("echo", {"n": n}).call.call_id for n in range(5, 10)]
        gate.release()  # the drain writes line 0 and crashes with lines 1-4 in hand
        flusher.join(WAIT)
        assert log.flush(WAIT)  # the fallback wrote lines 1-9
        assert not log._writer.queueing
        writes = WriteRecorder(monkeypatch)
        ids += [echo_registry.execute("echo", {"n": n}).call.call_id for n in range(10, 20)]
        assert writes.writes == [(1, threading.current_thread().name)] * 10  # per line, here
    assert [line["call_id"] for line in lines_of(path)] == ids  # each once, even in order
    [report] = [r for r in caplog.records if "crashed" in r.getMessage()]
    assert report.exc_info is not None and "a bug in the drain" in str(report.exc_info[1])


# -- interpreter exit ------------------------------------------------------------------------------

EXIT_SCRIPT = """
import sys
from toolreg import ToolCall, ToolResult
from toolreg.log import ResultLog

log = ResultLog(sys.argv[1], linger=1.0)  # the drain lingers: lines stay queued at exit
for n in range(20):
    log(ToolResult.success(ToolCall("echo", {"n": n}, call_id=f"c-{n}"), n))
# no close(): the main thread ends with 20 lines queued and a daemon drain thread alive
"""


def test_interpreter_exit_writes_every_queued_line(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        timeout=WAIT * 3,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert [line["call_id"] for line in lines_of(path)] == [f"c-{n}" for n in range(20)]
