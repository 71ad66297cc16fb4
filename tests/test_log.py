"""ResultLog: one JSON line per final result, shared by threads, never failing a call.

Threads are ordered with `Event`s only; a gate inside the handler's `emit` holds the writing
thread where a test needs lines to pile up. Grouping, flush, crashes and failure bursts:
`test_log_writer.py`; the encoder: `test_log_encoding.py`; processes and fork:
`test_log_processes.py`.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _log_helpers import WAIT, EmitGate, lines_of
from concurrent_log_handler import ConcurrentRotatingFileHandler

from toolreg import ToolCall, ToolRegistry, ToolResult
from toolreg.log import REDACTION_FAILED, ResultLog

# -- the lines ---------------------------------------------------------------------------------


def test_each_final_result_is_one_line_with_the_contract_fields(
    tmp_path: Path, echo_registry: ToolRegistry
) -> None:
    path = tmp_path / "calls.jsonl"
    with ResultLog(path) as log:
        echo_registry.on_result(log)
        ok = echo_registry.execute("echo", {"q": "x"})
        failed = echo_registry.execute("boom", {})
        unknown = echo_registry.execute("nope", None)
    assert not unknown.ok
    first, second, third = lines_of(path)
    assert first["call_id"] == ok.call.call_id
    assert first["name"] == "echo" and first["ok"] is True and first["code"] is None
    assert first["message"] is None and first["dispatched"] is True
    assert first["arguments"] == {"q": "x"}
    assert first["duration"] == pytest.approx(ok.duration, abs=1e-6)
    assert first["pid"] == os.getpid()
    assert second["call_id"] == failed.call.call_id
    assert (second["ok"], second["code"]) == (False, "TOOL_ERROR")
    assert "boom" in second["message"]
    assert (third["code"], third["dispatched"], third["arguments"]) == ("UNKNOWN_TOOL", False, {})
    stamp = datetime.datetime.fromisoformat(first["time"].replace("Z", "+00:00"))
    assert stamp.utcoffset() == datetime.timedelta(0)
    now = datetime.datetime.now(datetime.timezone.utc)
    assert abs((now - stamp).total_seconds()) < 60


@pytest.mark.parametrize("per_line", [True, False], ids=["per-line", "grouped"])
def test_per_line_writes_on_the_joining_thread_and_grouped_on_the_drain(
    tmp_path: Path, echo_registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, per_line: bool
) -> None:
    gate = EmitGate(monkeypatch)
    gate.release()
    with ResultLog(tmp_path / "calls.jsonl", per_line=per_line) as log:
        echo_registry.on_result(log)
        echo_registry.execute("echo", {})
        if per_line:  # already written when execute returned
            assert gate.threads == [threading.current_thread().name]
    writer = threading.current_thread().name if per_line else "toolreg-log-drain"
    assert gate.threads == [writer]
    assert len(lines_of(tmp_path / "calls.jsonl")) == 1


def test_redact_replaces_what_is_logged_as_arguments(
    tmp_path: Path, echo_registry: ToolRegistry
) -> None:
    def redact(arguments: Any) -> Any:
        return {key: "***" if key == "password" else value for key, value in arguments.items()}

    path = tmp_path / "calls.jsonl"
    with ResultLog(path, redact=redact) as log:
        echo_registry.on_result(log)
        result = echo_registry.execute("echo", {"user": "ann", "password": "hunter2"})
    assert result.value == {"user": "ann", "password": "hunter2"}  # the call itself is untouched
    [line] = lines_of(path)
    assert line["arguments"] == {"user": "ann", "password": "***"}
    assert "hunter2" not in path.read_text()


def test_a_raising_redact_writes_a_marker_and_is_reported_once_without_the_secret(
    tmp_path: Path, echo_registry: ToolRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    def redact(arguments: Any) -> Any:
        raise KeyError(arguments["password"])

    path = tmp_path / "calls.jsonl"
    with caplog.at_level(logging.ERROR, logger="toolreg"), ResultLog(path, redact=redact) as log:
        echo_registry.on_result(log)
        results = [echo_registry.execute("echo", {"password": "hunter2"}) for _ in range(3)]
    assert all(result.ok for result in results)
    assert [line["arguments"] for line in lines_of(path)] == [REDACTION_FAILED] * 3
    reports = [r for r in caplog.records if r.name == "toolreg" and "redact" in r.getMessage()]
    assert len(reports) == 1
    assert "hunter2" not in caplog.text and "hunter2" not in path.read_text()


def test_values_that_are_not_json_are_written_with_a_fallback(tmp_path: Path) -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    deep: Any = "bottom"
    for _ in range(5000):
        deep = [deep]

    class Opaque:
        def __repr__(self) -> str:
            return "<Opaque 7>"

    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    odd = {
        "set": {1},
        "bytes": b"\xff",
        "object": Opaque(),
        "hostile": Hostile(),
        "nan": math.nan,
        "inf": -math.inf,
        "cycle": cycle,
        "deep": deep,
        ("tuple", "key"): 1,
        3: "int key",
        "text": "caf\u00e9 \ud800 \n end",
    }
    path = tmp_path / "calls.jsonl"
    with ResultLog(path, redact=lambda arguments: odd) as log:
        log(ToolResult.success(ToolCall("echo", {"a": 1}), "fine"))
        log(ToolResult.success(ToolCall(Opaque(), {"a": 1}), "odd name"))  # type: ignore[arg-type]
    raw = path.read_bytes()
    assert raw.isascii() and raw.count(b"\n") == 2  # one line each, whatever the strings held
    line, named = lines_of(path)
    logged = line["arguments"]
    assert logged["set"] == "{1}" and logged["bytes"] == "b'\\xff'"
    assert logged["object"] == "<Opaque 7>" and logged["hostile"] == "<unrepresentable Hostile>"
    assert logged["nan"] == "nan" and logged["inf"] == "-inf"
    assert logged["cycle"] == ["<circular reference>"]
    assert "<nested too deeply>" in json.dumps(logged["deep"])
    assert logged["('tuple', 'key')"] == 1 and logged["3"] == "int key"
    assert logged["text"] == "caf\u00e9 \ud800 \n end"
    assert named["name"] == "<Opaque 7>"


# -- failures ----------------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_never_fails_the_call_and_is_reported_once(
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
        results = [echo_registry.execute("echo", {"n": n}) for n in range(3)]
        log.close()
    assert [result.ok for result in results] == [True, True, True]
    assert log.write_errors == 3
    reports = [r for r in caplog.records if "could not write" in r.getMessage()]
    assert len(reports) == 1 and reports[0].name == "toolreg"
    assert reports[0].exc_info is not None and "No space left" in str(reports[0].exc_info[1])
    assert not any("observer" in r.getMessage() for r in caplog.records)


def test_each_kind_of_write_failure_is_reported_once_and_counted(
    tmp_path: Path,
    echo_registry: ToolRegistry,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failures = iter([PermissionError(13, "Permission denied")] * 3 + [OSError(28, "full")] * 3)

    def do_write(handler: ConcurrentRotatingFileHandler, msg: str) -> None:
        raise next(failures)

    monkeypatch.setattr(ConcurrentRotatingFileHandler, "do_write", do_write)
    path = tmp_path / "c"
    with caplog.at_level(logging.ERROR, logger="toolreg"), ResultLog(path, per_line=True) as log:
        echo_registry.on_result(log)
        results = [echo_registry.execute("echo", {}) for _ in range(6)]
    assert all(result.ok for result in results)
    assert log.write_errors == 6
    reports = [r for r in caplog.records if "could not write" in r.getMessage()]
    assert [type(r.exc_info[1]) for r in reports if r.exc_info] == [PermissionError, OSError]


def test_a_bad_directory_fails_at_construction_not_at_the_first_call(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ResultLog(tmp_path / "missing" / "calls.jsonl")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_bytes": 1000, "backup_count": 0}, ValueError),
        ({"max_bytes": -1}, ValueError),
        ({"backup_count": -1}, ValueError),
        ({"max_bytes": 1.5}, TypeError),
        ({"backup_count": True}, TypeError),
        ({"redact": "not callable"}, TypeError),
        ({"per_line": True, "background": True}, ValueError),
        ({"per_line": False, "background": False}, ValueError),
        ({"per_line": "yes"}, TypeError),
        ({"background": 1}, TypeError),
        ({"linger": -0.001}, ValueError),
        ({"linger": 2.0}, ValueError),
        ({"linger": math.nan}, ValueError),
        ({"linger": "2ms"}, TypeError),
    ],
)
def test_settings_that_would_lose_lines_or_make_no_sense_are_rejected(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        ResultLog(tmp_path / "calls.jsonl", **kwargs)


@pytest.mark.parametrize(
    ("options", "per_line"),
    [
        ({}, False),
        ({"per_line": True}, True),
        ({"per_line": False}, False),
        ({"background": True}, False),
        ({"background": False}, True),  # what background=False always meant: the caller writes
        ({"per_line": True, "background": False}, True),
        ({"per_line": False, "background": True}, False),
    ],
)
def test_grouped_is_the_default_and_background_keeps_its_meaning(
    tmp_path: Path, options: dict[str, Any], per_line: bool
) -> None:
    with ResultLog(tmp_path / "calls.jsonl", **options) as log:
        assert (log.per_line, log.background) == (per_line, not per_line)
        assert ("per-line" if per_line else "grouped") in repr(log)


def test_only_backup_count_retires_old_files(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    with ResultLog(path, max_bytes=600, backup_count=2) as log:
        for n in range(40):
            log(ToolResult.success(ToolCall("echo", {"n": n}), n))
    names = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".__"))
    assert names == ["calls.jsonl", "calls.jsonl.1", "calls.jsonl.2"]
    ns = [line["arguments"]["n"] for line in lines_of(path)]
    assert ns == list(range(ns[0], 40))  # the newest lines, in order, none missing


# -- lifecycle ---------------------------------------------------------------------------------


def test_using_a_closed_log_raises_and_close_is_idempotent(
    no_leaked_threads_or_fds: None, tmp_path: Path
) -> None:
    log = ResultLog(tmp_path / "calls.jsonl")
    log(ToolResult.success(ToolCall("echo"), 1))  # opens the log and its lock file
    log.close()  # ... and this releases both (the fixture counts descriptors)
    log.close()
    assert log.closed
    with pytest.raises(RuntimeError, match="closed"):
        log(ToolResult.success(ToolCall("echo"), 1))
    with pytest.raises(RuntimeError, match="closed"), log:
        pass


def test_a_call_finishing_after_the_log_closed_still_returns_its_result(
    tmp_path: Path, echo_registry: ToolRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    log = ResultLog(tmp_path / "calls.jsonl")
    echo_registry.on_result(log)
    log.close()
    with caplog.at_level(logging.ERROR, logger="toolreg"):
        result = echo_registry.execute("echo", {"a": 1})
    assert result.ok and result.value == {"a": 1}
    assert any("observer" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("options", [{}, {"background": True}], ids=["default", "background"])
def test_close_writes_every_queued_line_in_order(
    no_leaked_threads_or_fds: None,
    tmp_path: Path,
    echo_registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
    options: dict[str, Any],
) -> None:
    gate = EmitGate(monkeypatch)
    path = tmp_path / "calls.jsonl"
    log = ResultLog(path, **options)
    echo_registry.on_result(log)
    ids = [echo_registry.execute("echo", {"n": n}).call.call_id for n in range(300)]
    assert gate.reached.wait(WAIT)  # the drain holds its first group: the rest is queued
    assert threading.current_thread().name not in gate.threads
    gate.release()
    log.close()
    assert [line["call_id"] for line in lines_of(path)] == ids


@pytest.mark.parametrize("per_line", [True, False], ids=["per-line", "grouped"])
def test_concurrent_threads_each_get_whole_lines(
    tmp_path: Path, echo_registry: ToolRegistry, per_line: bool
) -> None:
    path = tmp_path / "calls.jsonl"
    start = threading.Barrier(8)
    with ResultLog(path, max_bytes=20_000, backup_count=50, per_line=per_line) as log:
        echo_registry.on_result(log)

        def caller(k: int) -> None:
            start.wait(WAIT)
            for n in range(100):
                echo_registry.execute("echo", {"k": k, "n": n, "pad": "x" * (k * 10)})

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
    pairs = Counter((line["arguments"]["k"], line["arguments"]["n"]) for line in lines_of(path))
    assert len(pairs) == 800 and set(pairs.values()) == {1}


def test_the_library_leaves_logging_configuration_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root_handlers = list(logging.getLogger().handlers)
    with caplog.at_level(logging.DEBUG), ResultLog(tmp_path / "calls.jsonl") as log:
        log(ToolResult.success(ToolCall("echo"), 1))
    assert logging.getLogger("toolreg").handlers == []
    assert logging.getLogger().handlers == root_handlers
    assert caplog.records == []  # the line went to the file only, not through logging
