"""ResultLog's encoder: the hand-built line is, byte for byte, what the JSON encoder writes.

The expected line is built here the way `ResultLog` always built it (a dict through the strict
`json.JSONEncoder` with its fallback), independently of the module's fast path; for values that
JSON holds natively it is also exactly `json.dumps` with compact separators.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from _log_helpers import lines_of, strict_json
from hypothesis import given, settings
from hypothesis import strategies as st

import toolreg.log as log_module
from toolreg import ErrorCode, ToolCall, ToolResult
from toolreg.log import REDACTION_FAILED, ResultLog
from toolreg.report._stats import read_logs

LOGGED_AT = 1735787045.25  # 2025-01-02T03:04:05.250000Z


@dataclasses.dataclass(frozen=True)
class Timeline:
    """A stand-in for the core's CallTimeline."""

    entered: Any
    dispatched: Any
    cancelled: Any
    settled: Any
    finished: Any


def _rounded(value: Any) -> Any:
    return None if value is None else round(value, 6)


def expected_line(result: Any, logged_at: float, redact: Any = None) -> str:
    """The line as ResultLog has always encoded it: a dict through the strict encoder."""
    call = result.call
    error = result.error
    record: dict[str, Any] = {
        "time": log_module._utc_timestamp(logged_at),
        "call_id": call.call_id,
        "name": call.name,
        "ok": result.ok,
        "code": None if error is None else str(error.code),
        "message": None if error is None else error.message,
        "dispatched": result.dispatched,
        "duration": round(result.duration, 6),
    }
    timeline = getattr(result, "timeline", None)
    if timeline is not None:
        record["timeline"] = {
            "entered": log_module._utc_timestamp(timeline.entered),
            "dispatched": _rounded(timeline.dispatched),
            "cancelled": _rounded(timeline.cancelled),
            "settled": _rounded(timeline.settled),
            "finished": round(timeline.finished, 6),
        }
    arguments = call.arguments
    if redact is not None and arguments is not None:
        try:
            arguments = redact(arguments)
        except Exception:
            arguments = REDACTION_FAILED
    record["arguments"] = arguments
    record["pid"] = os.getpid()
    return log_module._encode(record)


def plain_json(line_record: dict[str, Any]) -> str:
    return json.dumps(line_record, ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def result_of(
    name: Any = "search",
    arguments: Any = None,
    *,
    call_id: Any = "call-1",
    failure: tuple[ErrorCode, Any] | None = None,
    dispatched: Any = True,
    duration: Any = 0.123456789,
    timeline: Any = None,
) -> ToolResult[Any]:
    call = ToolCall.__new__(ToolCall)  # any name and id, as a hook might build one
    call.__dict__.update(name=name, arguments=arguments, call_id=call_id)
    if failure is None:
        base: ToolResult[Any] = ToolResult.success(call, "value")
    else:
        base = ToolResult.failure(call, failure[0], "placeholder")
        assert base.error is not None  # a failure carries its error
        base = dataclasses.replace(base, error=dataclasses.replace(base.error, message=failure[1]))
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    fields.update(dispatched=dispatched, duration=duration, timeline=timeline)
    return ToolResult(**fields)


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque \u00e9>"


class Text(str):
    """A str subclass: the encoder writes its content, not its repr."""


FULL = Timeline(LOGGED_AT - 0.5, 0.000123456789, None, 0.25, 0.5)
ODD_TEXT = 'caf\u00e9 \u2603 \U0001f600 \ud800 \x00\x01\x1f\x7f "quoted" back\\slash\n\t end'

CASES: dict[str, ToolResult[Any]] = {
    "plain": result_of(arguments={"q": "x", "limit": 10, "ratio": 0.5, "on": True, "no": None}),
    "no arguments": result_of(arguments=None),
    "empty arguments": result_of(arguments={}),
    "failure": result_of(failure=(ErrorCode.TOOL_ERROR, "ValueError: boom"), dispatched=False),
    "non-ascii and control characters": result_of(
        ODD_TEXT,
        {ODD_TEXT: ODD_TEXT, "nested": [ODD_TEXT, {"k": ODD_TEXT}]},
        call_id=ODD_TEXT,
        failure=(ErrorCode.HOOK_ERROR, ODD_TEXT),
    ),
    "name is not a str": result_of(Opaque()),
    "name is an int": result_of(7),
    "name is a str subclass": result_of(Text("sub")),
    "call id is not a str": result_of(call_id=12345),
    "message is not a str": result_of(failure=(ErrorCode.DENIED, Opaque())),
    "huge int argument": result_of(arguments={"n": 10**5000, "m": 2}),
    "huge int key": result_of(arguments={10**5000: "v"}),
    "huge int within limits": result_of(arguments={"n": 10**4000}),
    "nan and inf arguments": result_of(arguments={"a": math.nan, "b": -math.inf}),
    "duration nan": result_of(duration=math.nan),
    "duration inf": result_of(duration=math.inf),
    "duration int": result_of(duration=3),
    "duration negative zero": result_of(duration=-0.0),
    "duration tiny": result_of(duration=1e-9),
    "duration huge": result_of(duration=1e300),
    "ok is not a bool": result_of(dispatched=1),
    "timeline": result_of(arguments={"q": 1}, timeline=FULL),
    "timeline all moments": result_of(timeline=Timeline(LOGGED_AT, 0.1, 0.2, 0.3, 0.4)),
    "timeline no moments": result_of(timeline=Timeline(LOGGED_AT, None, None, None, 0.0)),
    "timeline int moments": result_of(timeline=Timeline(LOGGED_AT, 1, None, 2, 3)),
    "timeline nan moment": result_of(timeline=Timeline(LOGGED_AT, math.nan, None, None, 1.0)),
    "timeline with odd values elsewhere": result_of(Opaque(), {"n": math.inf}, timeline=FULL),
}


@pytest.mark.parametrize("result", CASES.values(), ids=CASES.keys())
def test_the_hand_built_line_is_identical_to_the_json_encoder_line(
    tmp_path: Path, result: ToolResult[Any]
) -> None:
    with ResultLog(tmp_path / "calls.jsonl") as log:
        line = log._line(result, LOGGED_AT)
    assert line == expected_line(result, LOGGED_AT)
    assert line.isascii() and "\n" not in line
    strict_json(line)


@pytest.mark.parametrize(
    "redact",
    [
        lambda arguments: {**arguments, "password": "***"},
        lambda arguments: "summary: " + ODD_TEXT,
        lambda arguments: [1, 2.5, None, ODD_TEXT],
        lambda arguments: {"set": {1}, "bytes": b"\xff", "object": Opaque()},
        lambda arguments: 1 / 0,
    ],
    ids=["mapping", "str", "list", "not-json", "raises"],
)
def test_redact_results_are_encoded_identically(tmp_path: Path, redact: Any) -> None:
    result = result_of(arguments={"user": "ann", "password": "hunter2"}, timeline=FULL)
    with ResultLog(tmp_path / "calls.jsonl", redact=redact) as log:
        assert log._line(result, LOGGED_AT) == expected_line(result, LOGGED_AT, redact)


def test_values_json_holds_are_plain_json_dumps(tmp_path: Path) -> None:
    result = CASES["timeline"]
    record = {
        "time": "2025-01-02T03:04:05.250000Z",
        "call_id": "call-1",
        "name": "search",
        "ok": True,
        "code": None,
        "message": None,
        "dispatched": True,
        "duration": 0.123457,
        "timeline": {
            "entered": "2025-01-02T03:04:04.750000Z",
            "dispatched": 0.000123,
            "cancelled": None,
            "settled": 0.25,
            "finished": 0.5,
        },
        "arguments": {"q": 1},
        "pid": os.getpid(),
    }
    with ResultLog(tmp_path / "calls.jsonl") as log:
        assert log._line(result, LOGGED_AT) == plain_json(record)


def test_the_fast_path_writes_ordinary_lines_without_the_generic_encoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ordinary = [CASES[name] for name in ("plain", "failure", "timeline", "timeline no moments")]
    expected = [expected_line(result, LOGGED_AT) for result in ordinary]

    def refuse(record: Any) -> str:
        raise AssertionError("the generic encoder ran for an ordinary line")

    monkeypatch.setattr(log_module, "_encode", refuse)
    with ResultLog(tmp_path / "calls.jsonl") as log:
        assert [log._line(result, LOGGED_AT) for result in ordinary] == expected


def test_the_timeline_is_a_nested_object_between_duration_and_arguments(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    result = result_of(arguments={"q": 1}, duration=0.5, timeline=FULL)
    with ResultLog(path) as log:
        log(result)
        log(result_of(arguments={"q": 2}))  # no timeline (a result from before it existed)
    with_timeline, without = path.read_text().splitlines()
    assert (
        '"duration":0.5,"timeline":{"entered":"2025-01-02T03:04:04.750000Z",'
        '"dispatched":0.000123,"cancelled":null,"settled":0.25,"finished":0.5},'
        '"arguments":{"q":1}'
    ) in with_timeline
    assert list(strict_json(with_timeline)) == [
        "time",
        "call_id",
        "name",
        "ok",
        "code",
        "message",
        "dispatched",
        "duration",
        "timeline",
        "arguments",
        "pid",
    ]
    assert "timeline" not in strict_json(without)


def test_a_timeline_that_cannot_be_read_is_written_as_a_marker(tmp_path: Path) -> None:
    class Broken:
        entered = 0.0
        dispatched = cancelled = settled = None

        @property
        def finished(self) -> float:
            raise RuntimeError("not finished")

    overflow = Timeline(1e300, None, None, None, 1.0)  # no such date
    with ResultLog(tmp_path / "calls.jsonl") as log:
        broken = strict_json(log._line(result_of(timeline=Broken()), LOGGED_AT))
        overflowed = strict_json(log._line(result_of(timeline=overflow), LOGGED_AT))
    assert broken["timeline"] == "<unrepresentable Broken>"
    assert overflowed["timeline"] == "<unrepresentable Timeline>"


def test_ints_too_long_to_convert_are_written_as_markers(tmp_path: Path) -> None:
    with ResultLog(tmp_path / "calls.jsonl") as log:
        line = strict_json(log._line(CASES["huge int argument"], LOGGED_AT))
        keyed = strict_json(log._line(CASES["huge int key"], LOGGED_AT))
    bits = (10**5000).bit_length()
    assert line["arguments"] == {"n": f"<int too long to write: {bits} bits>", "m": 2}
    assert keyed["arguments"] == {f"<int too long to write: {bits} bits>": "v"}


def test_a_mapping_that_fails_while_being_read_is_written_as_a_marker(tmp_path: Path) -> None:
    class Exploding(Mapping[str, Any]):
        def __getitem__(self, key: str) -> Any:
            raise KeyError(key)

        def __iter__(self) -> Iterator[str]:
            raise RuntimeError("dictionary changed size during iteration")

        def __len__(self) -> int:
            return 1

    path = tmp_path / "calls.jsonl"
    with ResultLog(path, redact=lambda arguments: Exploding()) as log:
        log(result_of(arguments={"a": 1}))
    [line] = lines_of(path)
    assert line["arguments"] == "<unencodable Exploding: RuntimeError>"


def test_stats_reads_lines_with_and_without_a_timeline(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    with ResultLog(path) as log:
        for n in range(6):
            log(result_of(arguments={"n": n}, duration=0.25, timeline=FULL if n % 2 else None))
        log(result_of(failure=(ErrorCode.ABORTED, "cancelled"), timeline=FULL))
    assert len(lines_of(path)) == 7
    stats = read_logs([str(path)])
    assert stats.bad_lines == 0
    search = stats.tools["search"]
    assert (search.calls, search.ok, search.aborted_after_dispatch) == (7, 6, 1)


_text = st.text(
    st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()), max_size=12
)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
_special = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-7, 1e300])
_seconds = st.floats(allow_nan=True, allow_infinity=True) | _special
_moment = st.none() | _seconds | st.integers(-(10**6), 10**6)


@settings(max_examples=150, deadline=None)
@given(
    name=_text,
    call_id=_text,
    message=st.none() | _text,
    arguments=st.none() | st.dictionaries(_text, _json_values, max_size=5),
    duration=_seconds,
    moments=st.none() | st.tuples(_moment, _moment, _moment, _seconds),
    entered=st.floats(min_value=0, max_value=4e9),
)
def test_any_line_is_identical_to_the_json_encoder_line(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    call_id: str,
    message: str | None,
    arguments: dict[str, Any] | None,
    duration: float,
    moments: tuple[Any, Any, Any, float] | None,
    entered: float,
) -> None:
    timeline = None if moments is None else Timeline(entered, *moments)
    failure = None if message is None else (ErrorCode.TOOL_ERROR, message)
    result = result_of(
        name, arguments, call_id=call_id, failure=failure, duration=duration, timeline=timeline
    )
    log = _shared_log(tmp_path_factory)
    assert log._line(result, LOGGED_AT) == expected_line(result, LOGGED_AT)


_logs: list[ResultLog] = []


def _shared_log(factory: pytest.TempPathFactory) -> ResultLog:
    """One log for every hypothesis example (only its encoder is used)."""
    if not _logs:
        _logs.append(ResultLog(factory.mktemp("encoding") / "calls.jsonl"))
    return _logs[0]


@pytest.fixture(autouse=True, scope="module")
def _close_shared_log() -> Any:
    yield
    for log in _logs:
        log.close()
