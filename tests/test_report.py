"""`python -m toolreg report`: known logs give a page holding the known calls, ticks and codes.

What the page draws is checked through the data it embeds (the typed arrays the timeline script
reads) and, where node is installed, by running that script against a stand-in `Plotly`.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import re
import shutil
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest
from _log_helpers import write_hostile_log

import toolreg.report
from toolreg import CancelSource, ToolCall, ToolRegistry
from toolreg.__main__ import main
from toolreg.log import ResultLog
from toolreg.report._calls import Call, ReportData, choose_drawn, collect, parse_time
from toolreg.report._cli import DEFAULT_OVERDUE, MISSING_EXTRA

T0 = parse_time("2026-12-01T05:00:00Z") or 0.0


def iso(offset: float) -> str:
    """T0 + offset seconds, as ResultLog writes times."""
    moment = T0 + offset
    whole = int(moment)
    fraction = round((moment - whole) * 1e6)
    return (
        f"2026-12-01T05:{(whole - int(T0)) // 60:02d}:{(whole - int(T0)) % 60:02d}.{fraction:06d}Z"
    )


def line(
    call_id: str,
    name: Any,
    code: str | None,
    entered: float,
    finished: float,
    *,
    dispatched: float | None = None,
    cancelled: float | None = None,
    settled: float | None = None,
    timeline: Any = True,
    message: str | None = None,
) -> str:
    record: dict[str, Any] = {
        "time": iso(entered + finished + 0.0001),
        "call_id": call_id,
        "name": name,
        "ok": code is None,
        "code": code,
        "message": message if message is not None else (None if code is None else "failed"),
        "dispatched": dispatched is not None,
        "duration": finished,
        "arguments": {},
        "pid": 1,
    }
    if timeline is True:
        record["timeline"] = {
            "entered": iso(entered),
            "dispatched": dispatched,
            "cancelled": cancelled,
            "settled": settled,
            "finished": finished,
        }
    elif timeline is not False:
        record["timeline"] = timeline
    return json.dumps(record) + "\n"


KNOWN = [
    line("c-ok", "search", None, 0.0, 0.101, dispatched=0.001, settled=0.1),
    line("c-coop", "crawl", "ABORTED", 0.05, 0.506, dispatched=0.002, cancelled=0.5, settled=0.505),
    line(
        "c-late",
        "render_video",
        "ABORTED",
        0.06,
        1.801,
        dispatched=0.001,
        cancelled=0.3,
        settled=1.8,
    ),
    line("c-before", "crawl", "ABORTED_BEFORE_DISPATCH", 1.0, 0.0002, cancelled=0.0001),
    line(
        "c-timeout",
        "slow_search",
        "TOOL_TIMEOUT",
        2.0,
        1.011,
        dispatched=0.001,
        cancelled=1.0,
        settled=1.01,
    ),
    line("c-unknown", "nope", "UNKNOWN_TOOL", 3.0, 0.00005),
]


@pytest.fixture
def known_log(tmp_path: Path) -> Path:
    path = tmp_path / "calls.jsonl"
    path.write_text("".join(KNOWN))
    return path


def report(*args: str) -> int:
    return main(["report", *args])


def payload(page: str) -> dict[str, Any]:
    """The data the timeline script draws from, as the page embeds it."""
    start = page.index('toolregTimeline("timeline", ') + len('toolregTimeline("timeline", ')
    data, _ = json.JSONDecoder().raw_decode(page, start)
    assert isinstance(data, dict)
    return data


def typed(spec: dict[str, str]) -> list[float]:
    codes = {"f8": "d", "f4": "f", "u1": "B", "u2": "H", "i4": "i"}
    values = array(codes[spec["dtype"]])
    values.frombytes(base64.b64decode(spec["bdata"]))
    if sys.byteorder == "big":
        values.byteswap()
    return list(values)


def columns(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per call id: its code, tool and timeline as the page holds them (NaN -> None)."""
    fields = ("entered", "finished", "dispatched", "cancelled", "settled", "y")
    arrays = {key: typed(data[key]) for key in (*fields, "code", "tool", "estimated")}
    out = {}
    for index, call_id in enumerate(data["ids"]):
        row: dict[str, Any] = {
            key: (None if arrays[key][index] != arrays[key][index] else arrays[key][index])
            for key in fields
        }
        row["code"] = data["codes"][int(arrays["code"][index])]
        row["tool"] = data["tools"][int(arrays["tool"][index])]
        row["estimated"] = bool(arrays["estimated"][index])
        out[call_id] = row
    return out


# -- reading and filtering (no plotting library needed) --------------------------------------------


def test_known_log_gives_calls_placed_in_time(known_log: Path) -> None:
    data = collect([str(known_log)])
    assert [call.call_id for call in data.calls] == [
        "c-ok",
        "c-coop",
        "c-late",
        "c-before",
        "c-timeout",
        "c-unknown",
    ]
    late = data.calls[2]
    assert late.entered == pytest.approx(T0 + 0.06, abs=1e-6)
    assert (late.dispatched, late.cancelled, late.settled, late.finished) == (
        0.001,
        0.3,
        1.8,
        1.801,
    )
    assert late.overrun == pytest.approx(1.5)
    assert data.calls[1].overrun == pytest.approx(0.005)
    assert data.calls[3].overrun is None  # cancelled before dispatch: no body to overrun
    assert [call.code for call in data.calls] == [
        "ok",
        "ABORTED",
        "ABORTED",
        "ABORTED_BEFORE_DISPATCH",
        "TOOL_TIMEOUT",
        "UNKNOWN_TOOL",
    ]
    assert (data.read, data.estimated, data.unplaced, data.bad_timelines) == (6, 0, 0, 0)
    assert data.table.tools["crawl"].codes == {"ABORTED": 1, "ABORTED_BEFORE_DISPATCH": 1}


def test_old_lines_without_timeline_are_placed_from_time_minus_duration(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    path.write_text(
        line("old-1", "search", None, 10.0, 0.5, dispatched=0.01, timeline=False)
        + line("new-1", "search", None, 11.0, 0.2, dispatched=0.01, settled=0.19)
        + '{"call_id": "no-time", "name": "search", "ok": true, "duration": 0.1}\n'
    )
    data = collect([str(path)])
    old, new = data.calls
    assert old.call_id == "old-1" and old.estimated
    assert old.entered == pytest.approx(T0 + 10.0001, abs=1e-6)  # `time` is when it was logged
    assert (old.finished, old.dispatched, old.cancelled, old.settled) == (0.5, None, None, None)
    assert not new.estimated and new.settled == 0.19
    assert (data.estimated, data.unplaced, data.table.records) == (1, 1, 3)


def test_an_unusable_timeline_is_counted_and_the_line_placed_like_an_old_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_text(
        line("a", "search", None, 0.0, 0.1, timeline="soon")
        + line("b", "search", None, 1.0, 0.1, timeline={"entered": "yesterday", "finished": 0.1})
        + line("c", "search", None, 2.0, 0.1, timeline={"entered": iso(2.0), "settled": -1})
        + line("d", "search", None, 3.0, 0.1, timeline={"entered": iso(3.0), "finished": 0.1})
    )
    data = collect([str(path)])
    assert data.bad_timelines == 3 and data.estimated == 3
    assert [call.call_id for call in data.calls] == ["a", "b", "c", "d"]
    assert not data.calls[3].estimated  # a timeline with only `finished` is a timeline


def test_rotated_and_gzipped_siblings_are_read_and_bad_lines_counted(tmp_path: Path) -> None:
    base = tmp_path / "calls.jsonl"
    base.write_text(KNOWN[0] + "not json\n" + KNOWN[1] + '{"name": "x", "ok": tr')
    (tmp_path / "calls.jsonl.1").write_text(KNOWN[2] + "[1]\n")
    with gzip.open(tmp_path / "calls.jsonl.2.gz", "wt") as stream:
        stream.write(KNOWN[3] + KNOWN[4])
    data = collect([str(base)])
    assert [Path(name).name for name in data.reading.files] == [
        "calls.jsonl.2.gz",
        "calls.jsonl.1",
        "calls.jsonl",
    ]
    assert {call.call_id for call in data.calls} == {
        "c-ok",
        "c-coop",
        "c-late",
        "c-before",
        "c-timeout",
    }
    assert data.reading.bad_lines == 3
    assert collect([str(base)], include_rotated=False).read == 2


def test_tool_filter_and_time_window_keep_overlapping_calls(known_log: Path) -> None:
    def ids(data: ReportData) -> list[str]:
        return [call.call_id for call in data.calls]

    assert ids(collect([str(known_log)], tools=["crawl", "nope"])) == [
        "c-coop",
        "c-before",
        "c-unknown",
    ]
    # [0.55, 1.5] overlaps render_video (0.06 to 1.861) and the call entered at 1.0, not
    # the cooperative crawl that finished at 0.556.
    window = collect([str(known_log)], since=T0 + 0.56, until=T0 + 1.5)
    assert ids(window) == ["c-late", "c-before"]
    assert window.table.records == 2
    assert ids(collect([str(known_log)], since=T0 + 2.5)) == ["c-timeout", "c-unknown"]
    assert ids(collect([str(known_log)], until=T0 + 0.055)) == ["c-ok", "c-coop"]


def test_a_time_window_leaves_out_calls_without_a_time(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_text(KNOWN[0] + '{"name": "search", "ok": true}\n')
    assert collect([str(path)]).table.records == 2
    windowed = collect([str(path)], since=T0 - 1)
    assert windowed.table.records == 1 and windowed.unplaced == 0


def test_parse_time_reads_iso_8601_and_takes_utc_when_no_offset_is_given() -> None:
    assert parse_time("2026-12-01T05:00:00Z") == T0
    assert parse_time("2026-12-01T05:00:00") == T0
    assert parse_time("2026-12-01 06:00:00+01:00") == T0
    assert parse_time("2026-12-01T05:00:00.250000Z") == T0 + 0.25
    assert parse_time("2026-12-01") == T0 - 5 * 3600
    for bad in ("", "soon", "2026-13-01", None, 5):
        assert parse_time(bad) is None


def _call(
    number: int, code: str = "ok", finished: float = 0.0, overrun: float | None = None
) -> Call:
    finished = finished or 0.1 + number * 1e-5  # later calls are slower: no ties
    cancelled = None if overrun is None else 0.01
    settled = None if overrun is None else 0.01 + overrun
    return Call(
        name="t",
        call_id=f"c{number}",
        code=code,
        message=None,
        entered=T0 + number,
        finished=max(finished, settled or 0.0),
        dispatched=0.0,
        cancelled=cancelled,
        settled=settled,
    )


def test_a_sample_keeps_every_overdue_call_the_slowest_and_failures_first() -> None:
    calls = [_call(n) for n in range(1000)]
    calls[10] = _call(10, "ABORTED", overrun=5.0)
    calls[20] = _call(20, finished=100.0)
    calls[30] = _call(30, "TOOL_ERROR", finished=0.01)
    drawn, note = choose_drawn(calls, 200, overdue=1.0)
    ids = {call.call_id for call in drawn}
    assert len(drawn) == 200 and {"c10", "c20", "c30"} <= ids
    assert [call.entered for call in drawn] == sorted(call.entered for call in drawn)
    assert note.startswith("The timeline and its in-flight chart show 200 of 1,000 calls: ")
    assert "1 overdue, the 99 slowest others, all 1 failed, 99 of 899 successful" in note
    assert choose_drawn(calls, 1000, overdue=1.0) == (calls, "")


# -- the page --------------------------------------------------------------------------------------


@pytest.fixture
def plotly() -> Any:
    return pytest.importorskip("plotly")


def test_the_page_holds_the_known_calls_ticks_and_codes(
    plotly: Any, known_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.html"
    assert report(str(known_log), "-o", str(out)) == 0
    assert f"wrote {out}: 6 call(s)" in capsys.readouterr().out
    page = out.read_text(encoding="utf-8")
    data = payload(page)
    calls = columns(data)
    assert set(calls) == {"c-ok", "c-coop", "c-late", "c-before", "c-timeout", "c-unknown"}
    late = calls["c-late"]
    assert (late["code"], late["tool"]) == ("ABORTED", "render_video")
    assert late["entered"] == pytest.approx((T0 + 0.06) * 1000, abs=0.01)  # ms, as plotly dates
    assert late["cancelled"] == pytest.approx(0.3) and late["settled"] == pytest.approx(1.8)
    assert calls["c-before"]["dispatched"] is None and calls["c-before"]["cancelled"] is not None
    assert calls["c-ok"]["cancelled"] is None
    assert calls["c-coop"]["y"] == calls["c-before"]["y"]  # one after the other: one lane
    assert set(data["codes"]) == {
        "ok",
        "ABORTED",
        "ABORTED_BEFORE_DISPATCH",
        "TOOL_TIMEOUT",
        "UNKNOWN_TOOL",
    }
    assert data["overdue"] == DEFAULT_OVERDUE and sum(typed(data["late"])) == 1
    # The tables: the overdue call (and only it), the slowest call, the stats rows.
    overdue = page[page.index("<h2>Overdue calls") : page.index("<h2>Slowest calls")]
    assert "c-late" in overdue and "1.500s" in overdue and "c-coop" not in overdue
    assert "<td>TOOL_TIMEOUT</td>" in page and "<td>(all)</td>" in page


def test_the_page_needs_no_network(plotly: Any, known_log: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert report(str(known_log), "-o", str(out)) == 0
    page = out.read_text(encoding="utf-8")
    tags = re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", page, flags=re.IGNORECASE)
    assert tags and all(tag.lower() == "<script>" for tag in tags), tags
    assert not re.search(r"@import|url\(\s*['\"]?https?:", page, flags=re.IGNORECASE)
    assert "Plotly.newPlot" in page and "function toolregTimeline" in page
    assert len(page) > 1_000_000  # plotly.js itself is in the page


def test_overdue_threshold_is_an_option(plotly: Any, known_log: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert report(str(known_log), "-o", str(out), "--overdue", "2") == 0
    page = out.read_text(encoding="utf-8")
    assert sum(typed(payload(page)["late"])) == 0
    assert "None: no body ran more than 2 s after cancellation" in page


def test_old_log_page_says_entries_are_estimated(plotly: Any, tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    path.write_text(line("old-1", "search", "ABORTED", 1.0, 0.5, timeline=False))
    out = tmp_path / "report.html"
    assert report(str(path), "-o", str(out)) == 0
    page = out.read_text(encoding="utf-8")
    assert "1 call(s) come from lines without a timeline" in page
    assert columns(payload(page))["old-1"]["estimated"] is True


def test_bad_lines_are_listed_in_the_page_not_fatal(
    plotly: Any, known_log: Path, tmp_path: Path
) -> None:
    with known_log.open("a") as stream:
        stream.write("garbage\n[1, 2]\n" + '{"name": "x", "ok": tr')
    out = tmp_path / "report.html"
    assert report(str(known_log), "-o", str(out)) == 0
    page = out.read_text(encoding="utf-8")
    assert "3 bad line(s)" in page and "Bad lines (first 3 of 3)" in page
    assert "partial line" in page and len(payload(page)["ids"]) == 6


def test_a_log_without_calls_still_makes_a_page(plotly: Any, tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_text('{"name": "search", "ok": true}\n')  # no time: counted, not drawn
    out = tmp_path / "report.html"
    assert report(str(path), "-o", str(out)) == 0
    page = out.read_text(encoding="utf-8")
    assert 'id="timeline"' not in page
    assert "1 call(s) have no usable time" in page and "<td>search</td>" in page
    assert "No call matches." not in page  # one call, without a time


def test_filters_that_match_nothing_say_so_and_write_nothing(
    plotly: Any, known_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.html"
    assert report(str(known_log), "-o", str(out), "--tool", "nosuch") == 1
    assert capsys.readouterr().err == (
        "toolreg report: no call matches --tool nosuch (of 6 read); nothing written\n"
    )
    window = ["--tool", "crawl", "--since", "2027-01-01"]
    assert report(str(known_log), "-o", str(out), *window) == 1
    assert "no call matches --tool crawl --since 2027-01-01T00:00:00Z" in capsys.readouterr().err
    assert not out.exists()


def test_non_finite_numbers_in_a_log_are_not_fatal(plotly: Any, tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_text(
        KNOWN[0]
        + '{"name": "search", "ok": true, "duration": NaN, "time": "2026-12-01T05:00:01Z"}\n'
        + '{"name": "search", "ok": false, "code": "ABORTED", "duration": Infinity}\n'
        + '{"name": "search", "ok": true, "duration": 1e300, "time": "2026-12-01T05:00:01Z"}\n'
        + line("x", "search", None, 2.0, 0.1, timeline={"entered": iso(2.0), "finished": -1e400})
    )
    out = tmp_path / "report.html"
    assert report(str(path), "-o", str(out)) == 0
    page = out.read_text(encoding="utf-8")
    assert payload(page)["ids"] == ["c-ok", "x"]  # x: an unusable `finished`, its duration used
    assert "<td>5</td>" in page  # all five counted in the table


def test_hostile_lines_are_counted_never_fatal(plotly: Any, tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    write_hostile_log(path)
    out = tmp_path / "report.html"
    assert report(str(path), "-o", str(out)) == 0
    page = out.read_text(encoding="utf-8")
    assert "<td>4</td>" in page  # every record counted in the table
    data = payload(page)
    assert sorted(data["tools"]) == ["caf\\udce9", "t"]
    assert "X\\udce9" in data["codes"]


def test_a_tool_name_cannot_break_out_of_the_page(plotly: Any, tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    name = "</script><script>alert(1)</script>"
    path.write_text(line("<b>id</b>", name, "<i>X</i>", 0.0, 0.1, message="<img src=x>"))
    out = tmp_path / "report.html"
    assert report(str(path), "-o", str(out)) == 0
    page = out.read_text(encoding="utf-8")
    for raw in (name, "<img src=x>", "<b>id</b>", "<i>X</i>"):
        assert raw not in page
    data = payload(page)
    assert data["codes"] == ["&lt;i&gt;X&lt;/i&gt;"]
    assert data["tools"] == ["&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;"]
    assert data["ids"] == ["&lt;b&gt;id&lt;/b&gt;"]


def test_filters_on_the_command_line(plotly: Any, known_log: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    status = report(
        str(known_log),
        "-o",
        str(out),
        "--tool",
        "crawl",
        "--tool",
        "render_video",
        "--since",
        "2026-12-01T05:00:00.560Z",
        "--until",
        "2026-12-01T05:00:01.500",
    )
    assert status == 0
    page = out.read_text(encoding="utf-8")
    assert payload(page)["ids"] == ["c-late", "c-before"]
    assert "tool <code>crawl</code> or <code>render_video</code>; since 2026-12-01" in page


def test_a_real_result_log_of_today_makes_a_report(plotly: Any, tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    gone = CancelSource()
    gone.cancel()
    with ResultLog(path, max_bytes=800, backup_count=50, gzip=True) as log, ToolRegistry() as reg:
        reg.tool(lambda args, ctx: args["n"], name="work")
        reg.on_result(log)
        for n in range(20):
            reg.execute(ToolCall("work", {"n": n}))
        reg.execute("work", {"n": 0}, token=gone.token, start_if_cancelled=False)
        reg.execute("nope")
    out = tmp_path / "report.html"
    assert report(str(path), "-o", str(out)) == 0
    data = payload(out.read_text(encoding="utf-8"))
    assert len(data["ids"]) == 22
    assert set(data["codes"]) == {"ok", "ABORTED_BEFORE_DISPATCH", "UNKNOWN_TOOL"}


def test_many_calls_are_sampled_and_the_page_says_so(plotly: Any, tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_text(
        "".join(line(f"c{n}", "search", None, n * 0.01, 0.005, dispatched=0.0) for n in range(300))
    )
    out = tmp_path / "report.html"
    assert report(str(path), "-o", str(out), "--max-bars", "100") == 0
    page = out.read_text(encoding="utf-8")
    assert len(payload(page)["ids"]) == 100
    assert "show 100 of 300 calls" in page


def figure(page: str, name: str) -> dict[str, Any]:
    """The plotly figure (data, layout, config) the page draws into the element `name`."""
    start = page.index("var f = ", page.index(f'<div id="{name}"')) + len("var f = ")
    data, _ = json.JSONDecoder().raw_decode(page, start)
    assert isinstance(data, dict)
    return data


def test_distributions_and_table_count_every_call_when_the_timeline_is_sampled(
    plotly: Any, tmp_path: Path
) -> None:
    # 16.3 and 16.5: per-tool latency distributions (a box per tool, a histogram line per tool),
    # and "distributions and tables always count every call", even when --max-bars keeps only
    # 100 of 300 calls on the timeline (the 100 slowest are all `crawl` calls here, so a page
    # built from the drawn calls alone would lose `search` entirely).
    path = tmp_path / "calls.jsonl"
    searches = [0.001 * (n + 1) for n in range(200)]  # 1 ms .. 200 ms
    crawls = [0.3 + 0.001 * n for n in range(100)]  # 300 ms .. 399 ms
    path.write_text(
        "".join(
            line(f"s{n}", "search", None, n * 0.01, took, dispatched=0.0)
            for n, took in enumerate(searches)
        )
        + "".join(
            line(f"c{n}", "crawl", None, 3.0 + n * 0.01, took, dispatched=0.0)
            for n, took in enumerate(crawls)
        )
    )
    out = tmp_path / "report.html"
    assert report(str(path), "-o", str(out), "--max-bars", "100") == 0
    page = out.read_text(encoding="utf-8")
    assert len(payload(page)["ids"]) == 100  # the timeline is sampled ...

    # ... the box plot is not: one box per tool, whiskers at that tool's min and max.
    box, p95 = figure(page, "latency")["data"]
    assert box["type"] == "box" and box["y"] == ["crawl", "search"]
    assert box["lowerfence"] == pytest.approx([0.3, 0.001])
    assert box["upperfence"] == pytest.approx([0.399, 0.2])
    assert box["median"] == pytest.approx([0.35, 0.1], abs=0.002)
    for index in range(2):
        low, high = box["lowerfence"][index], box["upperfence"][index]
        assert low <= box["q1"][index] <= box["median"][index] <= box["q3"][index] <= high
    assert p95["y"] == ["crawl", "search"]
    assert p95["x"] == pytest.approx([0.395, 0.19], abs=0.002)

    # ... nor is the histogram: one line per tool, its bins adding up to that tool's calls.
    histogram = figure(page, "histogram")
    lines = {trace["name"]: trace for trace in histogram["data"]}
    assert {name: sum(trace["y"][:-1]) for name, trace in lines.items()} == {
        "crawl": 100,
        "search": 200,
    }
    # Each line steps along the bins' edges (its last level repeated to the last edge), and the
    # axis shows every edge: the first and the last bin are drawn whole.
    edges = lines["search"]["x"]
    assert edges[0] == pytest.approx(0.001) and edges[-1] == pytest.approx(0.399)
    assert all(trace["y"][-1] == trace["y"][-2] for trace in lines.values())
    assert lines["crawl"]["line"]["shape"] == "hv"
    low, high = histogram["layout"]["xaxis"]["range"]  # log10 units on a log axis
    assert low < math.log10(edges[0]) and high > math.log10(edges[-1])

    # ... nor the table `stats` prints.
    table = page[page.index('<table class="stats">') :]
    table = table[: table.index("</table>")]
    assert "<tr><td>crawl</td><td>100</td><td>100</td>" in table
    assert "<tr><td>search</td><td>200</td><td>200</td>" in table
    assert "<tr><td>(all)</td><td>300</td><td>300</td>" in table


# -- command-line errors ---------------------------------------------------------------------------


def test_a_missing_file_is_reported_and_nothing_written(
    known_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("plotly")
    out = tmp_path / "report.html"
    missing = tmp_path / "missing.jsonl"
    assert report(str(missing), "-o", str(out)) == 1
    err = capsys.readouterr().err
    assert f"cannot read {missing}" in err and "nothing written" in err
    assert not out.exists()
    # With one readable file the report is written, and the status still says what went wrong.
    assert report(str(missing), str(known_log), "-o", str(out)) == 1
    assert out.exists() and f"cannot read {missing}" in capsys.readouterr().err
    assert "Could not read" in out.read_text(encoding="utf-8")


def test_an_unwritable_output_is_an_error(
    plotly: Any, known_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "no-such-dir" / "report.html"
    assert report(str(known_log), "-o", str(out)) == 1
    assert f"cannot write {out}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [known_log]  # no temporary file left behind


def test_a_missing_plotting_library_names_the_extra(
    known_log: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in [name for name in sys.modules if name.partition(".")[0] == "plotly"]:
        monkeypatch.setitem(sys.modules, name, None)  # makes `import plotly...` fail
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.delitem(sys.modules, "toolreg.report._page", raising=False)
    monkeypatch.delattr(toolreg.report, "_page", raising=False)  # or `from . import` finds it
    out = tmp_path / "report.html"
    assert report(str(known_log), "-o", str(out)) == 1
    err = capsys.readouterr().err
    assert MISSING_EXTRA in err and "pip install 'toolreg-quiescent[report]'" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--since", "soon"],
        ["--until", "2026-13-01"],
        ["--overdue", "-1"],
        ["--overdue", "nan"],
        ["--max-bars", "0"],
    ],
)
def test_bad_arguments_are_usage_errors(
    known_log: Path, tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        report(str(known_log), "-o", str(tmp_path / "r.html"), *args)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_since_after_until_is_a_usage_error(
    known_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--since", "2026-12-02", "--until", "2026-12-01"]
    assert report(str(known_log), "-o", str(tmp_path / "r.html"), *args) == 2
    assert "--since is after --until" in capsys.readouterr().err


def test_importing_toolreg_does_not_import_the_plotting_library() -> None:
    code = "import sys, toolreg, toolreg.__main__; print('plotly' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


# -- the timeline script, run by node against a stand-in Plotly ------------------------------------

_HARNESS = """
const gd = {data: [], on(name, fn) { this.handler = fn; }};
const draws = [];
globalThis.document = {getElementById: () => gd};
globalThis.Plotly = {react(div, traces, layout) {
  div.data = traces; div.layout = layout; draws.push({traces, layout});
  return Promise.resolve();
}};
%(script)s
toolregTimeline("timeline", %(data)s, {});
function summary(draw) {
  return {
    note: draw.layout.annotations[0].text,
    range: draw.layout.xaxis.range,
    traces: draw.traces.map(t => ({type: t.type, name: t.name, uid: t.uid, n: (t.x || []).length,
      hover: t.hovertext || t.text || null, base: t.base || null, x: t.x || null,
      color: t.marker ? t.marker.color : null,
      visible: t.visible === undefined ? true : t.visible})),
  };
}
(async () => {
  for (const event of %(events)s) {
    await Promise.resolve();
    if (event.hide) {  // what a click on a legend entry does
      gd.data.forEach(t => { if (t.legendgroup === event.hide) t.visible = "legendonly"; });
    } else {
      gd.handler(event);
    }
  }
  await Promise.resolve();
  console.log(JSON.stringify(draws.map(summary)));
})();
"""


def run_script(data: dict[str, Any], *events: dict[str, Any]) -> list[dict[str, Any]]:
    """The draws of the timeline script: the first, then one per event that redraws."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    from toolreg.report._js import SCRIPT

    program = _HARNESS % {
        "script": SCRIPT,
        "data": json.dumps(data),
        "events": json.dumps(events),
    }
    done = subprocess.run(
        [node, "-"], input=program, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    draws: list[dict[str, Any]] = json.loads(done.stdout)
    return draws


def _page_data(log: Path, tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "report.html"
    assert report(str(log), "-o", str(out), *extra) == 0
    return payload(out.read_text(encoding="utf-8"))


def test_script_draws_each_call_with_its_body_cancel_tick_and_overdue_outline(
    plotly: Any, known_log: Path, tmp_path: Path
) -> None:
    data = _page_data(known_log, tmp_path)
    zoom = {"xaxis.range[0]": iso(1.5)[:-1], "xaxis.range[1]": iso(4)[:-1]}
    reset = {"xaxis.autorange": True, "yaxis.autorange": True}  # a double-click
    first, zoomed, again = run_script(data, zoom, {"hide": "TOOL_TIMEOUT"}, reset)
    traces = {trace["uid"]: trace for trace in first["traces"]}
    assert first["note"] == "6 calls in view"
    assert legend_counts(first) == {
        "ok": 1,
        "ABORTED": 2,
        "ABORTED_BEFORE_DISPATCH": 1,
        "TOOL_TIMEOUT": 1,
        "UNKNOWN_TOOL": 1,
        "overdue": 1,
    }
    aborted = data["codes"].index("ABORTED")
    bars = traces[f"bar-{aborted}"]
    assert bars["type"] == "bar" and bars["n"] == 2 and bars["name"] == "ABORTED (2)"
    late = next(text for text in bars["hover"] if "c-late" in text)
    assert "ABORTED after 1.801s" in late and "cancelled +300.0ms, body ran 1.500s after" in late
    assert "entered 2026-12-01 05:00:00.060000Z" in late
    assert traces[f"body-{aborted}"]["n"] == 2
    assert traces["cancels"]["n"] == 4  # coop, late, before dispatch, timeout
    assert traces["overdue"]["n"] == 1 and traces["overdue-dark"]["n"] == 1
    dark_start = traces["overdue-dark"]["base"][0]
    assert dark_start == pytest.approx((T0 + 0.06 + 0.3) * 1000, abs=0.01)  # from the cancel
    assert traces["overdue-dark"]["x"][0] == pytest.approx(1500, abs=0.01)  # to settled, in ms
    # Zoomed to 05:00:01.5-05:00:04: render_video (0.06 to 1.861), the timeout (2.0 to
    # 3.011) and the unknown tool (3.0).
    assert zoomed["note"] == "3 calls in view"
    # The legend counts what is in view too (it counted every call, whatever the zoom).
    assert legend_counts(zoomed) == {
        "ok": 0,
        "ABORTED": 1,
        "ABORTED_BEFORE_DISPATCH": 0,
        "TOOL_TIMEOUT": 1,
        "UNKNOWN_TOOL": 1,
        "overdue": 1,
    }
    assert zoomed["range"][0] == pytest.approx((T0 + 1.5) * 1000, abs=0.01)
    drawn = [
        text
        for trace in zoomed["traces"]
        if trace["uid"].startswith("bar-")
        for text in trace["hover"] or []
    ]
    assert sorted(text.split("</b> ")[1].split("<br>")[0] for text in drawn) == [
        "c-late",
        "c-timeout",
        "c-unknown",
    ]
    # A double-click shows everything again; a code hidden from the legend stays hidden.
    assert again["note"] == "6 calls in view" and again["range"] == first["range"]
    timeout = data["codes"].index("TOOL_TIMEOUT")
    hidden = {t["uid"] for t in again["traces"] if t["visible"] == "legendonly"}
    assert hidden == {f"bar-{timeout}", f"body-{timeout}", f"entry-{timeout}", f"flight-{timeout}"}


def legend_counts(draw: dict[str, Any]) -> dict[str, int]:
    """What the legend says of each code and of overdue calls: `NAME (COUNT)`."""
    counts = {}
    for trace in draw["traces"]:
        match = re.fullmatch(r"(\S+)(?: .*)? \(([\d,]+)\)", trace["name"] or "")
        if match and trace["visible"] is not False:
            counts[match.group(1).rstrip(":")] = int(match.group(2).replace(",", ""))
    return counts


def test_script_draws_calls_too_short_to_see_at_a_minimum_width_in_their_colour(
    plotly: Any, known_log: Path, tmp_path: Path
) -> None:
    data = _page_data(known_log, tmp_path)
    zoom = {"xaxis.range[0]": iso(2.9)[:-1], "xaxis.range[1]": iso(3.1)[:-1]}
    whole, zoomed = run_script(data, zoom)
    # The whole log spans about 3 s: 4 px of a plot 830 px wide (the harness's page is 1,000
    # px) are about 15 ms. The call denied before dispatch (0.2 ms) and the unknown tool (50 us)
    # would be hairlines; each gets a marker of that width in its code's own colour.
    traces = {trace["uid"]: trace for trace in whole["traces"]}
    width = (data["stop"] - data["start"]) * 4 / (1000 - 150 - 20)
    for code, call_id in (("ABORTED_BEFORE_DISPATCH", "c-before"), ("UNKNOWN_TOOL", "c-unknown")):
        index = data["codes"].index(code)
        short = traces[f"short-{index}"]
        assert short["type"] == "bar" and short["n"] == 1
        assert short["x"] == [pytest.approx(width, rel=1e-3)]  # epoch ms in float64
        assert short["color"] == data["colors"][index]  # full colour, not the pale bar's
        assert call_id in short["hover"][0]
    assert len([uid for uid in traces if uid.startswith("short-")]) == 2  # the rest are wide
    # Zoomed in to 200 ms around the unknown tool's call, it is still drawn 4 px wide: 1 ms.
    narrow = [t for t in zoomed["traces"] if t["uid"].startswith("short-")]
    assert [t["x"] for t in narrow] == [[pytest.approx(200 * 4 / 830, rel=1e-3)]]


def test_script_aggregates_when_too_many_calls_are_in_view(plotly: Any, tmp_path: Path) -> None:
    from toolreg.report._calls import EACH_CALL_LIMIT

    path = tmp_path / "calls.jsonl"
    count = EACH_CALL_LIMIT + 500
    lines = [line(f"c{n}", "search", None, n * 0.01, 0.02, dispatched=0.0) for n in range(count)]
    lines[7] = line("c7", "search", "TOOL_ERROR", 0.07, 0.02, dispatched=0.0)
    path.write_text("".join(lines))
    data = _page_data(path, tmp_path)
    zoom = {"xaxis.range[0]": iso(1.005)[:-1], "xaxis.range[1]": iso(2.005)[:-1]}
    first, zoomed = run_script(data, zoom)
    assert first["note"].startswith(f"{count:,} calls in view: calls in flight per tool")
    kinds = {trace["uid"]: trace for trace in first["traces"]}
    assert kinds["heat"]["type"] == "heatmap"
    error = data["codes"].index("TOOL_ERROR")
    assert kinds[f"bar-{error}"]["n"] == 1 and "c7" in kinds[f"bar-{error}"]["hover"][0]
    assert zoomed["note"] == "102 calls in view"  # entered from 0.99 (ends 1.01) to 2.0
    assert "heat" not in {trace["uid"] for trace in zoomed["traces"]}
