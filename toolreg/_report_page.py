"""The HTML page of `python -m toolreg report`: plotly figures (the library inlined) and tables.

Importing this module imports plotly (the `report` extra); `_report` imports it only to write a
report. Figures are plain plotly.js JSON written here, not `plotly.graph_objects`: validating
100,000-point traces in Python would cost more than everything else, and the numeric arrays go
out as base64 typed arrays (`{"dtype": "f8", "bdata": ...}`), which plotly.js reads directly.
"""

from __future__ import annotations

import base64
import heapq
import html
import json
import math
import sys
import time
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from plotly.offline import get_plotlyjs, get_plotlyjs_version

from ._report import EACH_CALL_LIMIT, Call, ReportData, choose_drawn
from ._report_js import SCRIPT
from ._stats import ToolStats, code_table_cells, table_cells

__all__ = ["render"]

_CODE_COLORS = {
    "ok": "#59a14f",
    "ABORTED": "#f28e2b",
    "ABORTED_BEFORE_DISPATCH": "#edc948",
    "TOOL_TIMEOUT": "#b07aa1",
    "TOOL_ERROR": "#e15759",
    "DENIED": "#9c755f",
    "INVALID_ARGS": "#ff9da7",
    "UNKNOWN_TOOL": "#bab0ac",
    "HOOK_ERROR": "#76b7b2",
}
_OTHER_COLORS = ("#4e79a7", "#8cd17d", "#d37295", "#a0cbe8", "#86bcb6", "#79706e")
_OVERDUE_OUTLINE = "#d62728"
_CANCEL_COLOR = "#111111"
_GAP = 0.6  # blank lanes between two tools
_BINS = 400  # time bins of the heat strips and the in-flight chart, over the range in view
_MESSAGES_KEPT = 10_000  # distinct error messages kept for the hover texts
_HISTOGRAM_BINS = 40
_HISTOGRAM_TOOLS = 12  # the tools with most calls get a histogram line
_SHOWN_OVERDUE = 20
_SHOWN_SLOWEST = 10
_LOG_FLOOR = 1e-6  # durations below 1 us are drawn at 1 us on log axes
_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["lasso2d"]}


def render(data: ReportData, *, overdue: float, max_bars: int) -> str:
    """The whole page for `data`: timeline, distributions, tables and notes."""
    drawn, sample_note = choose_drawn(data.calls, max_bars, overdue)
    colors = _colors(data)
    notes = _notes(data, drawn, sample_note, overdue)
    sections = [f"<h1>toolreg report</h1>\n{_summary(data)}", _list("Notes", notes)]
    if drawn:
        sections.append(
            "<h2>Timeline</h2>\n<p class=legend-help>One bar per call, entry to result, grouped "
            "by tool; inside it the body (dispatched to settled). A black tick: the call's token "
            f"was first seen cancelled. Outlined in red, dark inside: the body ran more than "
            f"{overdue:g} s after that (overdue). Drag to zoom (the chart redraws for the range "
            "in view), double-click to see everything again; click a code in the legend to hide "
            "it.</p>\n" + _timeline(drawn, colors, overdue)
        )
    rows = data.table.table_rows()
    if rows:
        sections.append("<h2>Latency by tool</h2>\n" + _figure("latency", *_latency(rows[:-1])))
        sections.append(
            "<h2>Latency histogram</h2>\n" + _figure("histogram", *_histogram(rows[:-1], colors))
        )
    sections.append(_overdue_table(data.calls, overdue))
    sections.append(_slowest_table(data.calls))
    sections.append(_stats_tables(rows))
    sections.append(_bad_lines(data))
    return _page("\n".join(section for section in sections if section))


# -- the timeline ----------------------------------------------------------------------------------


def _timeline(drawn: list[Call], colors: dict[str, str], overdue: float) -> str:
    """The timeline's div and the call of `toolregTimeline` that draws it (see `_report_js`)."""
    payload = _timeline_data(drawn, colors, overdue)
    return (
        '<div id="timeline" class="figure"></div>\n'
        f'<script>toolregTimeline("timeline", {_json(payload)}, {_json(_CONFIG)});</script>'
    )


def _timeline_data(drawn: list[Call], colors: dict[str, str], overdue: float) -> dict[str, Any]:
    """The calls as typed arrays (by entry), with what the script needs to lay them out."""
    ys, blocks = _lanes(drawn)
    lanes = blocks[-1][2] + 1 if blocks else 1.0
    band = min(720.0, max(160.0, 22.0 * lanes))  # pixels of the timeline band
    codes = sorted({call.code for call in drawn}, key=_code_order)
    code_index = {code: number for number, code in enumerate(codes)}
    tools = [name for name, _, _ in blocks]
    tool_index = {name: number for number, name in enumerate(tools)}
    messages: dict[str, int] = {}
    message_of = []
    for call in drawn:
        if call.message is None:
            message_of.append(-1)
            continue
        number = messages.get(call.message)
        if number is None:
            number = len(messages) if len(messages) < _MESSAGES_KEPT else -1
            if number >= 0:
                messages[call.message] = number
        message_of.append(number)
    start = min(call.entered for call in drawn)
    stop = max(call.end for call in drawn)
    pad = max((stop - start) * 0.01, 0.001)
    counts = [0] * len(codes)
    for call in drawn:
        counts[code_index[call.code]] += 1
    return {
        "entered": _typed("d", "f8", (_ms(call.entered) for call in drawn)),
        "finished": _typed("f", "f4", (call.finished for call in drawn)),
        "dispatched": _typed("f", "f4", (_nan(call.dispatched) for call in drawn)),
        "cancelled": _typed("f", "f4", (_nan(call.cancelled) for call in drawn)),
        "settled": _typed("f", "f4", (_nan(call.settled) for call in drawn)),
        "y": _typed("f", "f4", ys),
        "code": _typed("H", "u2", (code_index[call.code] for call in drawn)),
        "tool": _typed("i", "i4", (tool_index[call.name] for call in drawn)),
        "message": _typed("i", "i4", message_of),
        "estimated": _typed("B", "u1", (call.estimated for call in drawn)),
        "ids": [_text(call.call_id) for call in drawn],
        "messages": [_text(_short(message, 80)) for message in messages],
        "codes": codes,
        "counts": counts,
        "colors": [colors[code] for code in codes],
        "lightColors": [_alpha(colors[code], 0.55) for code in codes],
        "darkColors": [_darker(colors[code]) for code in codes],
        "dark": _CANCEL_COLOR,
        "outline": _OVERDUE_OUTLINE,
        "tools": [_text(name) for name in tools],
        "blocks": [[first, last] for _, first, last in blocks],
        "lanes": lanes,
        "lanePx": band / max(lanes, 1.0),
        "start": _ms(start - pad),
        "stop": _ms(stop + pad),
        "overdue": overdue,
        "lateCount": sum((call.overrun or 0.0) > overdue for call in drawn),
        "limit": EACH_CALL_LIMIT,
        "bins": _BINS,
        "layout": _timeline_layout(blocks, band),
    }


def _timeline_layout(blocks: list[tuple[str, float, float]], band: float) -> dict[str, Any]:
    separators = [
        {
            "type": "line",
            "xref": "paper",
            "yref": "y",
            "x0": 0,
            "x1": 1,
            "y0": last + 0.5 + _GAP / 2,
            "y1": last + 0.5 + _GAP / 2,
            "line": {"color": "#dddddd", "width": 1},
        }
        for _, _, last in blocks[:-1][:200]
    ]
    plot = band / 0.76  # the band is the top 76% of the plot area, the in-flight chart below
    return {
        "height": round(plot + 40 + 120),
        "margin": {"l": 150, "r": 20, "t": 40, "b": 120},
        "barmode": "overlay",
        "hovermode": "closest",
        "showlegend": True,
        # Under the axis title: 62 px below the plot area, whatever its height.
        "legend": {"orientation": "h", "x": 0, "y": -62 / plot, "yanchor": "top"},
        "xaxis": {"type": "date", "anchor": "y2", "title": {"text": "time (UTC)"}},
        "yaxis": {
            "domain": [0.24, 1.0],
            "tickvals": [(first + last) / 2 for _, first, last in blocks],
            "ticktext": [_text(_short(name)) for name, _, _ in blocks],
            "showgrid": False,
            "zeroline": False,
        },
        "yaxis2": {
            "domain": [0.0, 0.17],
            "title": {"text": "in flight"},
            "rangemode": "tozero",
            "fixedrange": True,
        },
        "shapes": separators,
    }


def _lanes(calls: list[Call]) -> tuple[list[float], list[tuple[str, float, float]]]:
    """A y for each call (overlapping calls of a tool get their own lane) and each tool's span."""
    by_tool: dict[str, list[int]] = {}
    for index, call in enumerate(calls):
        by_tool.setdefault(call.name, []).append(index)
    ys = [0.0] * len(calls)
    blocks: list[tuple[str, float, float]] = []
    base = 0.0
    for name in sorted(by_tool):
        free: list[int] = []  # lanes that are free again
        busy: list[tuple[float, int]] = []  # (end, lane)
        used = 0
        for index in by_tool[name]:  # by entry: `calls` is sorted
            call = calls[index]
            while busy and busy[0][0] <= call.entered:
                heapq.heappush(free, heapq.heappop(busy)[1])
            if free:
                lane = heapq.heappop(free)
            else:
                lane, used = used, used + 1
            heapq.heappush(busy, (call.end, lane))
            ys[index] = base + lane
        blocks.append((name, base, base + used - 1))
        base += used + _GAP
    return ys, blocks


# -- distributions ---------------------------------------------------------------------------------


def _latency(tools: list[ToolStats]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    tools = [tool for tool in tools if tool.durations]
    spreads = [_spread(tool.durations) for tool in tools]
    names = [_text(_short(tool.name)) for tool in tools]
    box = {
        "type": "box",
        "orientation": "h",
        "name": "p25-p75, whiskers min-max",
        "y": names,
        **{key: [spread[key] for spread in spreads] for key in ("q1", "median", "q3")},
        "lowerfence": [spread["min"] for spread in spreads],
        "upperfence": [spread["max"] for spread in spreads],
        "marker": {"color": "#4e79a7"},
        "hoverinfo": "x",
    }
    p95 = {
        "type": "scatter",
        "mode": "markers",
        "name": "p95",
        "y": names,
        "x": [spread["p95"] for spread in spreads],
        "marker": {"symbol": "diamond", "size": 9, "color": "#e15759"},
        "hovertemplate": "p95 %{x:.4s}s<extra></extra>",
    }
    layout = {
        "height": 120 + 34 * len(tools),
        "margin": {"l": 150, "r": 20, "t": 10, "b": 50},
        "xaxis": {"type": "log", "title": {"text": "seconds from entry to result (log)"}},
        "yaxis": {"autorange": "reversed"},
        "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"},
    }
    return [box, p95], layout


def _spread(durations: list[float]) -> dict[str, float]:
    ordered = sorted(max(_LOG_FLOOR, value) for value in durations)
    rank = len(ordered) - 1
    return {
        "min": ordered[0],
        "q1": ordered[round(0.25 * rank)],
        "median": ordered[round(0.5 * rank)],
        "q3": ordered[round(0.75 * rank)],
        "p95": ordered[round(0.95 * rank)],
        "max": ordered[-1],
    }


def _histogram(
    tools: list[ToolStats], colors: dict[str, str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    busiest = sorted(tools, key=lambda tool: -len(tool.durations))[:_HISTOGRAM_TOOLS]
    values = [max(_LOG_FLOOR, v) for tool in busiest for v in tool.durations]
    traces: list[dict[str, Any]] = []
    if values:
        low, high = math.log10(min(values)), math.log10(max(values))
        width = max((high - low) / _HISTOGRAM_BINS, 1e-3)
        centers = [10 ** (low + (index + 0.5) * width) for index in range(_HISTOGRAM_BINS)]
        palette = [*_OTHER_COLORS, *colors.values()]
        for number, tool in enumerate(sorted(busiest, key=lambda tool: tool.name)):
            counts = [0] * _HISTOGRAM_BINS
            for value in tool.durations:
                where = (math.log10(max(_LOG_FLOOR, value)) - low) / width
                counts[min(_HISTOGRAM_BINS - 1, max(0, int(where)))] += 1
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": _text(_short(tool.name)),
                    "x": centers,
                    "y": counts,
                    "line": {"shape": "hvh", "color": palette[number % len(palette)]},
                    "hovertemplate": "%{y} calls near %{x:.3s}s<extra>%{fullData.name}</extra>",
                }
            )
    layout = {
        "height": 340,
        "margin": {"l": 60, "r": 20, "t": 10, "b": 50},
        "xaxis": {"type": "log", "title": {"text": "seconds from entry to result (log)"}},
        "yaxis": {"title": {"text": "calls"}, "rangemode": "tozero"},
    }
    return traces, layout


# -- tables and text -------------------------------------------------------------------------------


def _summary(data: ReportData) -> str:
    reading = data.reading
    files = ", ".join(f"<code>{html.escape(path)}</code>" for path in reading.files)
    parts = [
        f"{data.read:,} record(s) read from {len(reading.files)} file(s) ({files}); "
        f"{reading.bad_lines:,} bad line(s).",
        f"{data.table.records:,} call(s) kept{_filters(data)}; written {_iso(time.time())}.",
    ]
    for path, why in reading.unreadable.items():
        parts.append(f"Could not read <code>{html.escape(path)}</code>: {html.escape(why)}.")
    return "<p>" + "<br>\n".join(parts) + "</p>"


def _filters(data: ReportData) -> str:
    parts = []
    if data.tools:
        parts.append("tool " + " or ".join(f"<code>{html.escape(n)}</code>" for n in data.tools))
    if data.since is not None:
        parts.append(f"since {_iso(data.since)}")
    if data.until is not None:
        parts.append(f"until {_iso(data.until)}")
    return f" (filters: {'; '.join(parts)})" if parts else " (no filter)"


def _notes(data: ReportData, drawn: list[Call], sample_note: str, overdue: float) -> list[str]:
    notes = [
        f"Overdue: a body still running more than {overdue:g} s after the call's token was "
        "first seen cancelled (<code>settled - cancelled</code>; set with --overdue)."
    ]
    if sample_note:
        notes.append(html.escape(sample_note))
    if len(drawn) > EACH_CALL_LIMIT:
        notes.append(
            f"The timeline draws each call when at most {EACH_CALL_LIMIT:,} are in view. With "
            "more, it aggregates: per tool, a heat strip of the mean number of calls in flight "
            f"in each of {_BINS} time intervals, with the overdue calls and the failures in view "
            f"still drawn one by one (at most {EACH_CALL_LIMIT:,} of each, an even sample "
            "beyond). Zoom in to see each call."
        )
    if data.estimated:
        notes.append(
            f"{data.estimated:,} call(s) come from lines without a timeline (written before "
            "toolreg recorded one): their entry is estimated as <code>time - duration</code> "
            "(a little late: <code>time</code> is when the line was logged), with no body span "
            "and no cancellation tick."
        )
    if data.bad_timelines:
        notes.append(
            f"{data.bad_timelines:,} record(s) had an unusable <code>timeline</code> field and "
            "were placed like lines without one."
        )
    if data.unplaced:
        notes.append(
            f"{data.unplaced:,} call(s) have no usable time (no <code>time</code>, "
            "<code>duration</code> or timeline): counted in the tables, not drawn."
        )
    notes.append(
        "The in-flight chart shows the mean number of calls in flight in each of its "
        f"{_BINS} intervals over the range in view, by code. "
        "Latency is seconds from entry to result; the box spans p25-p75 with whiskers at the "
        "minimum and maximum."
    )
    return notes


def _overdue_table(calls: list[Call], overdue: float) -> str:
    late = [call for call in calls if (call.overrun or 0.0) > overdue]
    if not late:
        none = f"None: no body ran more than {overdue:g} s after cancellation."
        return f"<h2>Overdue calls</h2>\n<p>{none}</p>"
    shown = heapq.nlargest(_SHOWN_OVERDUE, late, key=lambda call: call.overrun or 0.0)
    cells = [["tool", "call", "code", "entered (UTC)", "cancelled", "settled", "ran after"]]
    cells.extend(
        [
            call.name,
            call.call_id,
            call.code,
            _iso(call.entered),
            f"+{_span(call.cancelled or 0.0)}",
            f"+{_span(call.settled or 0.0)}",
            _span(call.overrun or 0.0),
        ]
        for call in shown
    )
    title = f"<h2>Overdue calls ({len(late):,}; the {len(shown)} that ran longest after it)</h2>"
    return f"{title}\n{_table(cells, 'overdue')}"


def _slowest_table(calls: list[Call]) -> str:
    if not calls:
        return ""
    shown = heapq.nlargest(_SHOWN_SLOWEST, calls, key=lambda call: call.finished)
    cells = [["tool", "call", "code", "entered (UTC)", "total", "body", "cancelled"]]
    for call in shown:
        body = "-"
        if call.dispatched is not None:
            settled = call.settled if call.settled is not None else call.finished
            body = f"+{_span(call.dispatched)} to +{_span(settled)}"
        cancel = "-" if call.cancelled is None else f"+{_span(call.cancelled)}"
        entered = _iso(call.entered)
        cells.append(
            [call.name, call.call_id, call.code, entered, _span(call.finished), body, cancel]
        )
    return f"<h2>Slowest calls</h2>\n{_table(cells, 'slowest')}"


def _stats_tables(rows: list[ToolStats]) -> str:
    if not rows:
        return "<h2>Per tool</h2>\n<p>No call matches.</p>"
    parts = ["<h2>Per tool (as <code>python -m toolreg stats</code> prints it)</h2>"]
    parts.append(_table(table_cells(rows), "stats", header_rows=2))
    codes = code_table_cells(rows)
    if codes:
        parts.append(_table(codes, "codes"))
    return "\n".join(parts)


def _bad_lines(data: ReportData) -> str:
    reading = data.reading
    if not reading.bad_lines:
        return ""
    items = [
        f"<code>{html.escape(bad.path)}:{bad.line}</code>: {html.escape(bad.reason)}"
        for bad in reading.bad
    ]
    return _list(f"Bad lines (first {len(reading.bad)} of {reading.bad_lines:,})", items)


def _table(cells: list[list[str]], kind: str, header_rows: int = 1) -> str:
    out = [f'<table class="{kind}">']
    for number, row in enumerate(cells):
        tag = "th" if number < header_rows else "td"
        out.append("<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in row) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _list(title: str, items: Sequence[str]) -> str:
    body = "\n".join(f"<li>{item}</li>" for item in items)
    return f"<h2>{html.escape(title)}</h2>\n<ul>\n{body}\n</ul>"


# -- helpers ---------------------------------------------------------------------------------------


def _figure(name: str, traces: list[dict[str, Any]], layout: dict[str, Any]) -> str:
    figure = _json({"data": traces, "layout": layout, "config": _CONFIG})
    return (
        f'<div id="{name}" class="figure"></div>\n<script>(function () {{ var f = {figure}; '
        f'Plotly.newPlot("{name}", f.data, f.layout, f.config); }})();</script>'
    )


def _json(value: object) -> str:
    # Inside <script>: no "</script>", "<!--" or "&" from a tool name can end or alter it.
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _page(body: str) -> str:
    library = get_plotlyjs().replace("</script", "<\\/script")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="toolreg report, plotly.js {get_plotlyjs_version()}">
<title>toolreg report</title>
<style>{_STYLE}</style>
<script>{library}</script>
<script>{SCRIPT}</script>
</head>
<body>
{body}
</body>
</html>
"""


_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em 2em; color: #222; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
code { font: 0.92em ui-monospace, monospace; background: #f3f3f3; padding: 0 0.2em; }
table { border-collapse: collapse; margin: 0.6em 0; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 0.2em 0.8em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr:last-child td { border-bottom: none; }
table.stats tr:last-child td { font-weight: 600; border-top: 1px solid #bbb; }
.legend-help { color: #555; max-width: 70em; }
.figure { width: 100%; }
"""


def _colors(data: ReportData) -> dict[str, str]:
    codes = {call.code for call in data.calls}
    for tool in data.table.tools.values():
        codes.update(tool.codes)
        if tool.ok:
            codes.add("ok")
    colors = {}
    others = iter(_OTHER_COLORS * (1 + len(codes) // len(_OTHER_COLORS)))
    for code in sorted(codes, key=_code_order):
        colors[code] = _CODE_COLORS.get(code) or next(others)
    return colors


def _code_order(code: str) -> tuple[int, str]:
    order = list(_CODE_COLORS)
    return (order.index(code), "") if code in _CODE_COLORS else (len(order), code)


def _darker(color: str) -> str:
    red, green, blue = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({red * 6 // 10},{green * 6 // 10},{blue * 6 // 10})"


def _alpha(color: str, alpha: float) -> str:
    red, green, blue = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},{alpha})"


def _ms(epoch: float) -> float:
    return epoch * 1000.0


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _typed(typecode: str, dtype: str, values: Iterable[float]) -> dict[str, str]:
    """A plotly.js typed array: little-endian bytes in base64, the way plotly.js reads them."""
    numbers = array(typecode, values)
    if sys.byteorder == "big":
        numbers.byteswap()
    return {"dtype": dtype, "bdata": base64.b64encode(numbers.tobytes()).decode("ascii")}


def _iso(epoch: float) -> str:
    seconds = math.floor(epoch)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{int((epoch - seconds) * 1e6):06d}Z"


def _span(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f}ms"
    return f"{seconds:.3f}s"


def _text(text: str) -> str:
    """`text` for plotly's pseudo-HTML labels (it decodes &amp; &lt; &gt; only)."""
    return html.escape(text, quote=False)


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
