"""The report's charts as plotly.js JSON: the timeline's data and layout, the distributions.

Plain dicts, not `plotly.graph_objects`: validating 100,000-point traces in Python would cost
more than everything else, and the timeline's numbers go out as base64 typed arrays
(`{"dtype": "f8", "bdata": ...}`) that the page's script (`_js`) decodes. Nothing here
imports plotly; `_page` puts the JSON, plotly.js and the script into the page.
"""

from __future__ import annotations

import base64
import heapq
import html
import itertools
import math
import sys
from array import array
from collections.abc import Iterable
from typing import Any

from ._calls import EACH_CALL_LIMIT, Call, ReportData
from ._stats import ToolStats

__all__ = [
    "BINS",
    "code_colors",
    "histogram",
    "latency",
    "short",
    "span",
    "text",
    "timeline_data",
]

BINS = 400
"""Time bins of the heat strips and the in-flight chart, over the range in view."""

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
_MESSAGES_KEPT = 10_000  # distinct error messages kept for the hover texts
_HISTOGRAM_BINS = 40
_LOG_FLOOR = 1e-6  # a log axis has no zero: shorter durations are drawn at this floor
_HISTOGRAM_TOOLS = 12  # the tools with most calls get a histogram line
_TOOL_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
)


def timeline_data(drawn: list[Call], colors: dict[str, str], overdue: float) -> dict[str, Any]:
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
        "late": _typed("B", "u1", ((call.overrun or 0.0) > overdue for call in drawn)),
        "ids": [text(call.call_id) for call in drawn],
        "messages": [text(short(message, 80)) for message in messages],
        "codes": [text(code) for code in codes],  # a log may hold any string
        "colors": [colors[code] for code in codes],
        "lightColors": [_alpha(colors[code], 0.55) for code in codes],
        "darkColors": [_darker(colors[code]) for code in codes],
        "dark": _CANCEL_COLOR,
        "outline": _OVERDUE_OUTLINE,
        "tools": [text(name) for name in tools],
        "blocks": [[first, last] for _, first, last in blocks],
        "lanes": lanes,
        "lanePx": band / max(lanes, 1.0),
        "start": _ms(start - pad),
        "stop": _ms(stop + pad),
        "overdue": overdue,
        "limit": EACH_CALL_LIMIT,
        "bins": BINS,
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
            "ticktext": [text(short(name)) for name, _, _ in blocks],
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


def latency(tools: list[ToolStats]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A precomputed box per tool (p25-p75, whiskers min-max) and p95 markers, and the layout."""
    tools = [tool for tool in tools if tool.durations]
    spreads = [_spread(tool.durations) for tool in tools]
    names = [text(short(tool.name)) for tool in tools]
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


def histogram(tools: list[ToolStats]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Step lines of each busy tool's durations over log-spaced bins, and the layout.

    Each line steps along the bins' edges (a bin is drawn from its lower edge to its upper one)
    and the x range spans every edge, so the first and last bins are drawn whole.
    """
    busiest = sorted(tools, key=lambda tool: -len(tool.durations))[:_HISTOGRAM_TOOLS]
    values = [max(_LOG_FLOOR, v) for tool in busiest for v in tool.durations]
    traces: list[dict[str, Any]] = []
    xaxis: dict[str, Any] = {"type": "log", "title": {"text": "seconds from entry to result (log)"}}
    if values:
        low, high = math.log10(min(values)), math.log10(max(values))
        width = max((high - low) / _HISTOGRAM_BINS, 1e-3)
        edges = [10 ** (low + index * width) for index in range(_HISTOGRAM_BINS + 1)]
        ranges = [f"{span(a)} to {span(b)}" for a, b in itertools.pairwise(edges)]
        for number, tool in enumerate(sorted(busiest, key=lambda tool: tool.name)):
            counts = [0] * _HISTOGRAM_BINS
            for value in tool.durations:
                where = (math.log10(max(_LOG_FLOOR, value)) - low) / width
                counts[min(_HISTOGRAM_BINS - 1, max(0, int(where)))] += 1
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": text(short(tool.name)),
                    "x": edges,
                    "y": [*counts, counts[-1]],  # the last bin's level runs to its upper edge
                    "customdata": [*ranges, ranges[-1]],
                    "line": {"shape": "hv", "color": _TOOL_COLORS[number % len(_TOOL_COLORS)]},
                    "hovertemplate": "%{y} calls, %{customdata}<extra>%{fullData.name}</extra>",
                }
            )
        # In log10 units, as plotly takes a log axis's range: every edge, and a bin to spare.
        xaxis["range"] = [low - width, low + (_HISTOGRAM_BINS + 1) * width]
    layout = {
        "height": 360,
        "margin": {"l": 60, "r": 20, "t": 10, "b": 50},
        "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"},
        "xaxis": xaxis,
        "yaxis": {"title": {"text": "calls"}, "rangemode": "tozero"},
    }
    return traces, layout


def span(seconds: float) -> str:
    """A duration in the unit that suits it (microseconds, milliseconds or seconds)."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f}ms"
    return f"{seconds:.3f}s"


# -- helpers ---------------------------------------------------------------------------------------


def code_colors(data: ReportData) -> dict[str, str]:
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


def text(text: str) -> str:
    """`text` for plotly's pseudo-HTML labels (it decodes &amp; &lt; &gt; only)."""
    return html.escape(text, quote=False)


def short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
