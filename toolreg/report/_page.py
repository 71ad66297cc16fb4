"""The HTML page of `python -m toolreg report`: charts, tables and notes, plotly.js inlined.

Importing this module imports plotly (the `report` extra), for the plotly.js it ships; `_cli`
imports it only to write a report. The charts' JSON comes from `_charts`, the timeline's
drawing script from `_js`.
"""

from __future__ import annotations

import heapq
import html
import json
import math
import time
from collections.abc import Sequence
from typing import Any

from plotly.offline import get_plotlyjs, get_plotlyjs_version

from ._calls import EACH_CALL_LIMIT, Call, ReportData, choose_drawn
from ._charts import BINS, code_colors, histogram, latency, span, timeline_data
from ._js import SCRIPT
from ._stats import ToolStats, code_table_cells, table_cells

__all__ = ["render"]

_SHOWN_OVERDUE = 20
_SHOWN_SLOWEST = 10
_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["lasso2d"]}


def render(data: ReportData, *, overdue: float, max_bars: int) -> str:
    """The whole page for `data`: timeline, distributions, tables and notes."""
    drawn, sample_note = choose_drawn(data.calls, max_bars, overdue)
    colors = code_colors(data)
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
        sections.append("<h2>Latency by tool</h2>\n" + _figure("latency", *latency(rows[:-1])))
        sections.append(
            "<h2>Latency histogram</h2>\n" + _figure("histogram", *histogram(rows[:-1]))
        )
    sections.append(_overdue_table(data.calls, overdue))
    sections.append(_slowest_table(data.calls))
    sections.append(_stats_tables(rows))
    sections.append(_bad_lines(data))
    return _page("\n".join(section for section in sections if section))


# -- the timeline ----------------------------------------------------------------------------------


def _timeline(drawn: list[Call], colors: dict[str, str], overdue: float) -> str:
    """The timeline's div and the call of `toolregTimeline` that draws it (see `_js`)."""
    payload = timeline_data(drawn, colors, overdue)
    return (
        '<div id="timeline" class="figure"></div>\n'
        f'<script>toolregTimeline("timeline", {_json(payload)}, {_json(_CONFIG)});</script>'
    )


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
            f"in each of {BINS} time intervals, with the overdue calls and the failures in view "
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
        f"{BINS} intervals over the range in view, by code. "
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
            f"+{span(call.cancelled or 0.0)}",
            f"+{span(call.settled or 0.0)}",
            span(call.overrun or 0.0),
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
            body = f"+{span(call.dispatched)} to +{span(settled)}"
        cancel = "-" if call.cancelled is None else f"+{span(call.cancelled)}"
        entered = _iso(call.entered)
        cells.append(
            [call.name, call.call_id, call.code, entered, span(call.finished), body, cancel]
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


def _iso(epoch: float) -> str:
    seconds = math.floor(epoch)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{int((epoch - seconds) * 1e6):06d}Z"
