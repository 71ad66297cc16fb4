"""`python -m toolreg stats`: known logs give known numbers; bad lines are counted, not fatal."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from _log_helpers import write_hostile_log

from toolreg import CancelSource, ToolCall, ToolRegistry
from toolreg.__main__ import main
from toolreg.log import ResultLog
from toolreg.report._stats import log_files, read_logs


def line(name: Any, code: str | None, duration: float, **extra: Any) -> str:
    record = {"call_id": extra.pop("call_id", "c"), "name": name, "ok": code is None}
    record.update(code=code, duration=duration, **extra)
    return json.dumps(record) + "\n"


@pytest.fixture
def known_log(tmp_path: Path) -> Path:
    """search: 20 calls (durations 1..20 s; 16 ok, 2 ABORTED, 1 before dispatch, 1 timeout),
    fetch: 3 calls in the gzipped backup; and 5 bad lines of different kinds."""
    base = tmp_path / "calls.jsonl"
    codes = {17: "ABORTED", 18: "ABORTED", 19: "ABORTED_BEFORE_DISPATCH", 20: "TOOL_TIMEOUT"}
    newest = [line("search", codes.get(n), float(n)) for n in range(1, 11)]
    oldest = [line("search", codes.get(n), float(n)) for n in range(11, 21)]
    base.write_text(
        "".join(newest[:5])
        + "this is not json\n"
        + "\n"  # blank: carries nothing, not counted
        + "[1, 2]\n"
        + '{"name": "search"}\n'
        + "".join(newest[5:])
        + '{"name": "search", "ok": tr'  # cut short by a crash: no newline
    )
    bad_code = '{"name": "search", "ok": true, "code": 5}\n'
    (tmp_path / "calls.jsonl.1").write_text("".join(oldest) + bad_code)
    with gzip.open(tmp_path / "calls.jsonl.2.gz", "wt") as stream:
        stream.write(line("fetch", None, 0.5) + line("fetch", "TOOL_ERROR", 0.25))
        stream.write(line("fetch", "ABORTED_BEFORE_DISPATCH", 0.0))
    (tmp_path / ".__calls.jsonl.lock").write_text("")  # the handler's lock file is no log
    (tmp_path / "calls.jsonl.rotate.123").write_text("junk\n")  # nor is a rotation temp file
    return base


def test_known_log_gives_known_numbers(known_log: Path) -> None:
    stats = read_logs([str(known_log)])
    assert [Path(f).name for f in stats.files] == [
        "calls.jsonl.2.gz",
        "calls.jsonl.1",
        "calls.jsonl",
    ]
    assert stats.records == 23
    assert stats.bad_lines == 5
    search = stats.tools["search"].to_json()
    assert search == {
        "calls": 20,
        "ok": 16,
        "failed": 1,  # the timeout: a cancelled call is no failure
        "codes": {"ABORTED": 2, "ABORTED_BEFORE_DISPATCH": 1, "TOOL_TIMEOUT": 1},
        "aborted_after_dispatch": 2,
        "aborted_before_dispatch": 1,
        "duration": {"p50": 10.0, "p95": 19.0, "max": 20.0},  # nearest rank
    }
    fetch = stats.tools["fetch"].to_json()
    assert (fetch["calls"], fetch["ok"], fetch["codes"]) == (
        3,
        1,
        {"ABORTED_BEFORE_DISPATCH": 1, "TOOL_ERROR": 1},
    )
    assert fetch["duration"] == {"p50": 0.25, "p95": 0.5, "max": 0.5}
    total = stats.total()
    assert (total.calls, total.ok, total.aborted_before_dispatch) == (23, 17, 2)
    parts = (total.ok, total.failed, total.aborted_after_dispatch, total.aborted_before_dispatch)
    assert parts == (17, 2, 2, 2) and sum(parts) == total.calls


def test_bad_lines_are_listed_with_their_place_and_reason(known_log: Path) -> None:
    stats = read_logs([str(known_log)])
    where = {(Path(bad.path).name, bad.line): bad.reason for bad in stats.bad}
    assert where.keys() == {
        ("calls.jsonl", 6),
        ("calls.jsonl", 8),
        ("calls.jsonl", 9),
        ("calls.jsonl", 15),
        ("calls.jsonl.1", 11),
    }
    assert "not JSON" in where[("calls.jsonl", 6)]
    assert "partial line" in where[("calls.jsonl", 15)]
    assert "'code'" in where[("calls.jsonl.1", 11)]


def test_json_output_and_exit_status(known_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "--json", str(known_log)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["records"] == 23 and document["bad_lines"] == 5
    assert document["tools"]["search"]["aborted_after_dispatch"] == 2
    assert document["total"]["calls"] == 23


def test_text_output_names_every_tool_and_code(
    known_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stats", str(known_log)]) == 0
    out = capsys.readouterr().out
    assert "3 file(s), 23 record(s), 5 bad line(s)" in out
    for word in ("search", "fetch", "ABORTED_BEFORE_DISPATCH", "TOOL_TIMEOUT", "p95", "20.00s"):
        assert word in out


def test_no_rotated_reads_only_the_named_file(known_log: Path) -> None:
    stats = read_logs([str(known_log)], include_rotated=False)
    assert stats.files == [str(known_log)] and stats.records == 10


def test_a_file_named_twice_is_read_once(known_log: Path) -> None:
    backup = str(known_log) + ".1"
    files = log_files([backup, str(known_log), str(known_log)])
    assert len(files) == len(set(files)) == 3
    assert read_logs([backup, str(known_log)]).records == 23


def test_missing_files_and_cut_gzip_are_reported_not_fatal(
    known_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = gzip.compress(line("fetch", None, 1.0).encode() * 200)
    (known_log.parent / "cut.gz").write_bytes(whole[: len(whole) // 2])
    missing = known_log.parent / "missing.jsonl"
    status = main(["stats", "--no-rotated", str(missing), str(known_log.parent / "cut.gz")])
    out = capsys.readouterr().out
    assert status == 1
    assert f"cannot read {missing}" in out
    assert "file ends unexpectedly" in out


def test_stats_of_a_real_result_log(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    gone = CancelSource()
    gone.cancel()
    with ResultLog(path, max_bytes=1000, backup_count=100, gzip=True) as log, ToolRegistry() as reg:
        reg.tool(lambda args, ctx: args["n"], name="work")
        reg.on_result(log)
        for n in range(30):
            reg.execute(ToolCall("work", {"n": n}))
        for _ in range(4):
            reg.execute("work", {"n": 0}, token=gone.token, start_if_cancelled=False)
        reg.execute("nope")
    stats = read_logs([str(path)])
    assert len(stats.files) > 2 and stats.bad_lines == 0
    work = stats.tools["work"]
    assert (work.calls, work.ok, work.aborted_before_dispatch) == (34, 30, 4)
    assert stats.tools["nope"].codes == {"UNKNOWN_TOOL": 1}


def test_hostile_lines_are_counted_never_fatal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A number too large for a float, a lone surrogate in any string, JSON nested too deep or
    holding an int beyond Python's digit limit: the tables come out, and exit 0."""
    path = tmp_path / "calls.jsonl"
    write_hostile_log(path)
    stats = read_logs([str(path)])
    assert (stats.records, stats.bad_lines) == (4, 2)
    assert sorted(stats.tools) == ["caf\\udce9", "t"]  # the surrogate as its escape's text
    assert stats.tools["t"].codes == {"X\\udce9": 1}
    assert stats.tools["t"].durations == [0.5, 0.2]  # the 400-digit duration is not used
    assert main(["stats", str(path)]) == 0
    out = capsys.readouterr().out
    assert "caf\\udce9" in out and "2 bad line(s)" in out
    assert main(["stats", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 4
