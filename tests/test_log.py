"""ResultLog: one JSON line per final result, shared by threads and processes, never failing a call.

Threads are ordered with `Event`s only; a gate inside the handler's `emit` holds the writing
thread where a test needs lines to pile up.
"""

from __future__ import annotations

import datetime
import gzip
import json
import logging
import math
import multiprocessing
import os
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from concurrent_log_handler import ConcurrentRotatingFileHandler

from toolreg import CancelSource, ErrorCode, ToolCall, ToolRegistry, ToolResult
from toolreg.log import REDACTION_FAILED, ResultLog

WAIT = 10.0  # bound on every handshake: a hang becomes a failure


def strict_json(line: str) -> Any:
    def reject(constant: str) -> Any:
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(line, parse_constant=reject)


def lines_of(path: Path) -> list[Any]:
    """Every record in `path` and its rotated siblings (`.N`, `.N.gz`), oldest file first."""
    siblings = []
    for candidate in path.parent.iterdir():
        match = re.fullmatch(re.escape(path.name) + r"\.(\d+)(\.gz)?", candidate.name)
        if match:
            siblings.append((-int(match.group(1)), candidate))
    records = []
    for file in [*(p for _, p in sorted(siblings)), path]:
        opener: Any = gzip.open if file.name.endswith(".gz") else open
        with opener(file, "rt", encoding="ascii") as stream:
            text = stream.read()
        assert text == "" or text.endswith("\n"), f"{file.name} ends with a partial line"
        records.extend(strict_json(line) for line in text.splitlines())
    return records


@pytest.fixture
def echo_boom_registry(registry: ToolRegistry) -> ToolRegistry:
    """The shared `registry` with two tools: `echo` returns its arguments, `boom` raises."""

    @registry.tool
    def echo(args: Any, ctx: Any) -> Any:
        return dict(args)

    @registry.tool
    def boom(args: Any, ctx: Any) -> Any:
        raise ValueError("boom")

    return registry


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


# -- the lines ---------------------------------------------------------------------------------


def test_each_final_result_is_one_line_with_the_contract_fields(
    tmp_path: Path, echo_boom_registry: ToolRegistry
) -> None:
    path = tmp_path / "calls.jsonl"
    with ResultLog(path) as log:
        echo_boom_registry.on_result(log)
        ok = echo_boom_registry.execute("echo", {"q": "x"})
        failed = echo_boom_registry.execute("boom", {})
        unknown = echo_boom_registry.execute("nope", None)
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


def test_the_line_is_written_on_the_joining_thread(
    tmp_path: Path, echo_boom_registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = EmitGate(monkeypatch)
    gate.release()
    with ResultLog(tmp_path / "calls.jsonl") as log:
        echo_boom_registry.on_result(log)
        echo_boom_registry.execute("echo", {})
    assert gate.threads == [threading.current_thread().name]


def test_redact_replaces_what_is_logged_as_arguments(
    tmp_path: Path, echo_boom_registry: ToolRegistry
) -> None:
    def redact(arguments: Any) -> Any:
        return {key: "***" if key == "password" else value for key, value in arguments.items()}

    path = tmp_path / "calls.jsonl"
    with ResultLog(path, redact=redact) as log:
        echo_boom_registry.on_result(log)
        result = echo_boom_registry.execute("echo", {"user": "ann", "password": "hunter2"})
    assert result.value == {"user": "ann", "password": "hunter2"}  # the call itself is untouched
    [line] = lines_of(path)
    assert line["arguments"] == {"user": "ann", "password": "***"}
    assert "hunter2" not in path.read_text()


def test_a_raising_redact_writes_a_marker_and_is_reported_once_without_the_secret(
    tmp_path: Path, echo_boom_registry: ToolRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    def redact(arguments: Any) -> Any:
        raise KeyError(arguments["password"])

    path = tmp_path / "calls.jsonl"
    with caplog.at_level(logging.ERROR, logger="toolreg"), ResultLog(path, redact=redact) as log:
        echo_boom_registry.on_result(log)
        results = [echo_boom_registry.execute("echo", {"password": "hunter2"}) for _ in range(3)]
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
    echo_boom_registry: ToolRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "calls.jsonl"
    path.symlink_to("/dev/full")  # every write: ENOSPC, a real disk-full error
    log = ResultLog(path, max_bytes=0)
    echo_boom_registry.on_result(log)
    with caplog.at_level(logging.ERROR, logger="toolreg"):
        results = [echo_boom_registry.execute("echo", {"n": n}) for n in range(3)]
        log.close()
    assert [result.ok for result in results] == [True, True, True]
    assert log.write_errors == 3
    reports = [r for r in caplog.records if "could not write" in r.getMessage()]
    assert len(reports) == 1 and reports[0].name == "toolreg"
    assert reports[0].exc_info is not None and "No space left" in str(reports[0].exc_info[1])
    assert not any("observer" in r.getMessage() for r in caplog.records)


def test_each_kind_of_write_failure_is_reported_once_and_counted(
    tmp_path: Path,
    echo_boom_registry: ToolRegistry,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failures = iter([PermissionError(13, "Permission denied")] * 3 + [OSError(28, "full")] * 3)

    def do_write(handler: ConcurrentRotatingFileHandler, msg: str) -> None:
        raise next(failures)

    monkeypatch.setattr(ConcurrentRotatingFileHandler, "do_write", do_write)
    with caplog.at_level(logging.ERROR, logger="toolreg"), ResultLog(tmp_path / "c") as log:
        echo_boom_registry.on_result(log)
        results = [echo_boom_registry.execute("echo", {}) for _ in range(6)]
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
    ],
)
def test_settings_that_would_lose_lines_or_make_no_sense_are_rejected(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        ResultLog(tmp_path / "calls.jsonl", **kwargs)


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
    tmp_path: Path, echo_boom_registry: ToolRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    log = ResultLog(tmp_path / "calls.jsonl")
    echo_boom_registry.on_result(log)
    log.close()
    with caplog.at_level(logging.ERROR, logger="toolreg"):
        result = echo_boom_registry.execute("echo", {"a": 1})
    assert result.ok and result.value == {"a": 1}
    assert any("observer" in r.getMessage() for r in caplog.records)


def test_background_mode_loses_nothing_on_close(
    no_leaked_threads_or_fds: None,
    tmp_path: Path,
    echo_boom_registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = EmitGate(monkeypatch)
    path = tmp_path / "calls.jsonl"
    log = ResultLog(path, background=True)
    echo_boom_registry.on_result(log)
    ids = [echo_boom_registry.execute("echo", {"n": n}).call.call_id for n in range(300)]
    assert gate.reached.wait(WAIT)  # the writer thread holds the first line: 299 are queued
    assert threading.current_thread().name not in gate.threads
    gate.release()
    log.close()
    assert [line["call_id"] for line in lines_of(path)] == ids


def test_concurrent_threads_each_get_whole_lines(
    tmp_path: Path, echo_boom_registry: ToolRegistry
) -> None:
    path = tmp_path / "calls.jsonl"
    start = threading.Barrier(8)
    with ResultLog(path, max_bytes=20_000, backup_count=50) as log:
        echo_boom_registry.on_result(log)

        def caller(k: int) -> None:
            start.wait(WAIT)
            for n in range(100):
                echo_boom_registry.execute("echo", {"k": k, "n": n, "pad": "x" * (k * 10)})

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


# -- several processes -------------------------------------------------------------------------

PER_PROCESS = 500
ROTATING = {"max_bytes": 16_384, "backup_count": 500}


def _write_results(log: ResultLog | str, tag: str, options: dict[str, Any]) -> None:
    """A child process: 500 calls through a registry, some failing, some cancelled."""
    if isinstance(log, str):
        log = ResultLog(log, **options)
    with ToolRegistry(max_workers=2) as registry:
        registry.tool(lambda args, ctx: args["n"], name="work")
        registry.on_result(log)
        gone = CancelSource()
        gone.cancel()
        for n in range(PER_PROCESS):
            call = ToolCall("work" if n % 7 else "missing", {"n": n}, call_id=f"{tag}-{n}")
            token = gone.token if n % 11 == 0 else None
            registry.execute(call, token=token, start_if_cancelled=False)
    log.close()


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@pytest.mark.parametrize("use_gzip", [False, True], ids=["plain", "gzip"])
def test_processes_share_and_rotate_one_file_without_losing_or_duplicating_a_line(
    tmp_path: Path, use_gzip: bool
) -> None:
    path = tmp_path / "calls.jsonl"
    options = {**ROTATING, "gzip": use_gzip}
    # Forked children inherit this instance, after it already opened the file and wrote a line.
    inherited = ResultLog(path, **options)
    inherited(ToolResult.success(ToolCall("parent", call_id="parent-0"), 0))
    spawn = multiprocessing.get_context("spawn")
    fork = multiprocessing.get_context("fork")
    children = [
        spawn.Process(target=_write_results, args=(str(path), "spawn-a", options)),
        spawn.Process(
            target=_write_results, args=(str(path), "spawn-b", {**options, "background": True})
        ),
        fork.Process(target=_write_results, args=(inherited, "fork-a", options)),
        fork.Process(target=_write_results, args=(inherited, "fork-b", options)),
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    inherited.close()
    assert [child.exitcode for child in children] == [0, 0, 0, 0]

    records = lines_of(path)
    ids = Counter(record["call_id"] for record in records)
    expected = {"parent-0"} | {
        f"{tag}-{n}"
        for tag in ("spawn-a", "spawn-b", "fork-a", "fork-b")
        for n in range(PER_PROCESS)
    }
    assert set(ids) == expected
    assert [cid for cid, count in ids.items() if count != 1] == []
    codes = Counter(record["code"] for record in records)
    before = sum(1 for n in range(PER_PROCESS) if n % 11 == 0 and n % 7)  # unknown tools first
    assert codes[ErrorCode.ABORTED_BEFORE_DISPATCH.value] == 4 * before
    assert len({record["pid"] for record in records}) == 5
    backups = [p for p in tmp_path.iterdir() if p.name.startswith("calls.jsonl.")]
    assert len(backups) >= 10, "the file should have rotated many times"
    assert all(p.name.endswith(".gz") == use_gzip for p in backups)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_a_forked_child_does_not_write_the_lines_its_parent_had_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = EmitGate(monkeypatch)  # holds the parent's writer thread only
    path = tmp_path / "calls.jsonl"
    log = ResultLog(path, background=True)
    for n in range(50):
        log(ToolResult.success(ToolCall("parent", call_id=f"parent-{n}"), n))
    assert gate.reached.wait(WAIT)  # 49 lines wait in the parent's queue across the fork
    child = multiprocessing.get_context("fork").Process(
        target=_write_results, args=(log, "child", {})
    )
    child.start()
    child.join(60)
    gate.release()
    log.close()
    assert child.exitcode == 0
    ids = Counter(line["call_id"] for line in lines_of(path))
    assert set(ids.values()) == {1}
    assert len(ids) == 50 + PER_PROCESS
