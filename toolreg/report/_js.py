"""The script that draws the report's timeline in the browser, for the x range in view.

Drawing 100,000 calls as plotly traces makes plotly.js process every point on each redraw
(seconds, even with WebGL), and at full zoom a bar is far less than a pixel anyway. So the page
holds the calls once, as typed arrays, and this script draws only what is in view: each call
(SVG bars, hover anywhere on a bar; a call too short to see, say one denied at once, is drawn
at a few pixels' width in its code's full colour) when at most `limit` calls are in view;
otherwise, per tool,
a heat strip of how many calls were in flight, with the overdue calls and the failures in view
still drawn one by one (up to `limit` of each, an even sample beyond). The in-flight chart under
the timeline is recomputed for the range in view, and so are the legend's counts (they count the
calls in view, as the note above the chart does). Zooming or panning redraws (`plotly_relayout`).

`toolregTimeline(id, data, config)`: `data` is what `_charts.timeline_data` makes.
"""

from __future__ import annotations

__all__ = ["SCRIPT"]

SCRIPT = r"""
function toolregTimeline(id, D, config) {
  "use strict";
  var gd = document.getElementById(id);
  function decode(spec) {
    var text = atob(spec.bdata), bytes = new Uint8Array(text.length);
    for (var k = 0; k < text.length; k++) bytes[k] = text.charCodeAt(k);
    var kind = {f8: Float64Array, f4: Float32Array, u1: Uint8Array, u2: Uint16Array,
                i4: Int32Array}[spec.dtype];
    return new kind(bytes.buffer);
  }
  var entered = decode(D.entered), finished = decode(D.finished);
  var dispatched = decode(D.dispatched), cancelled = decode(D.cancelled);
  var settled = decode(D.settled), lane = decode(D.y), code = decode(D.code);
  var tool = decode(D.tool), message = decode(D.message), estimated = decode(D.estimated);
  var late = decode(D.late);  // overdue, decided in Python on the unrounded times
  var n = entered.length, ends = new Float64Array(n);
  for (var i = 0; i < n; i++) ends[i] = entered[i] + finished[i] * 1000;
  var full = [D.start, D.stop], fullY = [D.lanes - 0.5 + 0.3, -0.8];
  var view = {x0: full[0], x1: full[1], y: fullY.slice()};

  function span(s) {
    if (s < 1e-3) return (s * 1e6).toFixed(0) + "\u00b5s";
    if (s < 1) return (s * 1e3).toFixed(1) + "ms";
    return s.toFixed(3) + "s";
  }
  function iso(ms) {
    var whole = Math.floor(ms), text = new Date(whole).toISOString();
    var micro = Math.min(999, Math.round((ms - whole) * 1000));
    return text.slice(0, 10) + " " + text.slice(11, 23) + String(micro).padStart(3, "0") + "Z";
  }
  // plotly reports date ranges as UTC text with a space, not a T, before the time
  function toMs(value) {
    if (typeof value === "number") return value;
    var m = /^(\d+)-(\d+)-(\d+)(?:[ T](\d+):(\d+)(?::(\d+)(\.\d+)?)?)?/.exec(String(value));
    if (!m) return NaN;
    return Date.UTC(+m[1], m[2] - 1, +m[3], +(m[4] || 0), +(m[5] || 0), +(m[6] || 0)) +
      (m[7] ? parseFloat(m[7]) * 1000 : 0);
  }
  function hover(i) {
    var lines = ["<b>" + D.tools[tool[i]] + "</b> " + D.ids[i]];
    var outcome = D.codes[code[i]] + " after " + span(finished[i]);
    if (message[i] >= 0) outcome += ": " + D.messages[message[i]];
    lines.push(outcome);
    lines.push("entered " + iso(entered[i]) + (estimated[i] ? " (estimated)" : ""));
    if (isFinite(dispatched[i])) {
      lines.push("body +" + span(dispatched[i]) + " to " +
        (isFinite(settled[i]) ? "+" + span(settled[i]) : "?"));
    } else if (!estimated[i]) {
      lines.push("no body started");
    }
    if (isFinite(cancelled[i])) {
      var cancel = "cancelled +" + span(cancelled[i]);
      if (isFinite(settled[i])) {
        cancel += ", body ran " + span(Math.max(0, settled[i] - cancelled[i])) + " after";
      }
      lines.push(cancel);
    }
    return lines.join("<br>");
  }
  function evenly(list, room) {
    if (list.length <= room) return list;
    var out = [], step = list.length / room;
    for (var k = 0; k < room; k++) out.push(list[Math.floor(k * step)]);
    return out;
  }
  function bars(list, start, stop, width, color, extra) {
    var trace = {type: "bar", orientation: "h", base: [], x: [], y: [], width: width,
                 marker: {color: color}, hoverinfo: "skip"};
    list.forEach(function (i) {
      var a = start(i), b = stop(i);
      trace.base.push(a); trace.x.push(Math.max(0, b - a)); trace.y.push(lane[i]);
    });
    return hoverable(Object.assign(trace, extra));
  }
  function ticks(list, at, size, color, width, extra) {
    var trace = {type: "scatter", mode: "markers", x: [], y: [], hoverinfo: "skip",
                 marker: {symbol: "line-ns-open", size: size, color: color,
                          line: {width: width, color: color}}};
    list.forEach(function (i) { trace.x.push(at(i)); trace.y.push(lane[i]); });
    return hoverable(Object.assign(trace, extra));
  }
  function hoverable(trace) {  // a trace given hover texts shows them
    if (trace.hovertext || trace.text) delete trace.hoverinfo;
    return trace;
  }
  var startOf = function (i) { return entered[i]; };
  var endOf = function (i) { return ends[i]; };
  var bodyStart = function (i) { return entered[i] + dispatched[i] * 1000; };
  var bodyEnd = function (i) {
    return entered[i] + (isFinite(settled[i]) ? settled[i] : finished[i]) * 1000;
  };
  var cancelAt = function (i) { return entered[i] + cancelled[i] * 1000; };
  var afterCancel = function (i) {
    var from = cancelled[i];
    if (isFinite(dispatched[i]) && dispatched[i] > from) from = dispatched[i];
    return entered[i] + from * 1000;
  };
  var settledAt = function (i) { return entered[i] + settled[i] * 1000; };
  var MIN_PX = 4;  // a bar narrower than this is drawn this wide, in its code's full colour
  var inView = D.codes.map(function () { return 0; }), lateInView = 0, minWidth = 0;
  var tickSize = Math.max(4, Math.min(16, D.lanePx * 0.75));
  var cancelSize = Math.max(6, Math.min(22, D.lanePx * 1.1));

  function overdueTraces(list) {
    var name = "overdue: body ran > " + D.overdue + " s after cancel (" +
      lateInView.toLocaleString("en") + ")";
    return [
      bars(list, startOf, endOf, 0.92, "rgba(0,0,0,0)", {
        name: name, legendgroup: "overdue", showlegend: true, uid: "overdue",
        marker: {color: "rgba(0,0,0,0)", line: {color: D.outline, width: 2.5}}}),
      bars(list, afterCancel, settledAt, 0.32, D.dark, {
        name: "after cancel", legendgroup: "overdue", showlegend: false, uid: "overdue-dark"}),
      ticks(list, cancelAt, cancelSize, D.dark, 2, {
        name: "cancel", legendgroup: "overdue", showlegend: false, uid: "overdue-cancel"})
    ];
  }
  function codeName(c) {
    return D.codes[c] + " (" + inView[c].toLocaleString("en") + ")";
  }
  function eachCall(list) {  // one bar per call, by code; then cancellations and overdue calls
    var traces = [], byCode = D.codes.map(function () { return []; });
    list.forEach(function (i) { byCode[code[i]].push(i); });
    byCode.forEach(function (group, c) {
      var texts = group.map(hover), color = D.colors[c], dark = D.darkColors[c];
      traces.push(bars(group, startOf, endOf, 0.8, D.lightColors[c], {
        name: codeName(c), legendgroup: D.codes[c], showlegend: true, uid: "bar-" + c,
        hovertext: texts, hovertemplate: "%{hovertext}<extra></extra>"}));
      var narrow = group.filter(function (i) { return ends[i] - entered[i] < minWidth; });
      if (narrow.length) {
        traces.push(bars(narrow, startOf, function (i) { return entered[i] + minWidth; }, 0.8,
          color, {name: D.codes[c] + ": too short to see", legendgroup: D.codes[c],
            showlegend: false, uid: "short-" + c, hovertext: narrow.map(hover),
            hovertemplate: "%{hovertext}<extra></extra>"}));
      }
      var bodies = group.filter(function (i) { return isFinite(dispatched[i]); });
      traces.push(bars(bodies, bodyStart, bodyEnd, 0.32, dark, {
        name: D.codes[c] + ": body", legendgroup: D.codes[c], showlegend: false,
        uid: "body-" + c}));
      traces.push(ticks(group, startOf, tickSize, dark, 1.5, {
        name: D.codes[c] + ": entry", legendgroup: D.codes[c], showlegend: false,
        uid: "entry-" + c, text: texts, hovertemplate: "%{text}<extra></extra>"}));
    });
    var cancels = list.filter(function (i) { return isFinite(cancelled[i]); });
    traces.push(ticks(cancels, cancelAt, cancelSize, D.dark, 2, {
      name: "cancellation arrived", showlegend: true, uid: "cancels"}));
    return traces.concat(overdueTraces(list.filter(function (i) { return late[i]; })));
  }
  function coverage(rows, bins, x0, width) {  // mean calls in flight per bin, per row
    var cover = rows.map(function () { return new Float64Array(bins); });
    var whole = rows.map(function () { return new Float64Array(bins + 1); });
    return {
      add: function (row, s, e) {
        var a = (Math.max(s, x0) - x0) / width, b = (Math.min(e, x0 + width * bins) - x0) / width;
        if (!(b > a)) return;
        var first = Math.floor(a), last = Math.min(bins - 1, Math.floor(b));
        if (first === last) { cover[row][first] += b - a; return; }
        cover[row][first] += first + 1 - a;
        cover[row][last] += b - last;
        whole[row][first + 1] += 1;
        whole[row][last] -= 1;
      },
      done: function () {
        return cover.map(function (values, row) {
          var running = 0;
          for (var k = 0; k < bins; k++) { running += whole[row][k]; values[k] += running; }
          return values;
        });
      }
    };
  }
  function heat(list, x0, x1) {  // per tool: calls in flight; overdue calls and failures on top
    var bins = D.bins, width = (x1 - x0) / bins;
    var counts = coverage(D.tools, bins, x0, width);
    var started = D.tools.map(function () { return new Int32Array(bins); });
    var failed = D.tools.map(function () { return new Int32Array(bins); });
    list.forEach(function (i) {
      counts.add(tool[i], entered[i], ends[i]);
      var at = Math.floor((entered[i] - x0) / width);
      if (at >= 0 && at < bins) {
        started[tool[i]][at] += 1;
        if (D.codes[code[i]] !== "ok") failed[tool[i]][at] += 1;
      }
    });
    var flight = counts.done(), z = [], text = [], ys = [], xs = [];
    for (var k = 0; k <= bins; k++) xs.push(x0 + k * width);
    D.blocks.forEach(function (block, t) {
      if (t > 0) {  // the gap between two tools: empty cells
        z.push(new Array(bins).fill(null));
        text.push(new Array(bins).fill(""));
      }
      ys.push(block[0] - 0.45, block[1] + 0.45);
      z.push(Array.from(flight[t]));
      text.push(Array.from(flight[t], function (value, k) {
        return "<b>" + D.tools[t] + "</b> " + iso(xs[k]) + "<br>" + value.toFixed(1) +
          " in flight, " + started[t][k] + " started, " + failed[t][k] + " failed";
      }));
    });
    var traces = [{type: "heatmap", x: xs, y: ys, z: z, text: text, zmin: 0, uid: "heat",
      hovertemplate: "%{text}<extra></extra>", hoverongaps: false, name: "in flight",
      colorscale: [[0, "#f4f6fb"], [1, "#1f3f73"]], showlegend: false,
      colorbar: {title: {text: "in flight"}, thickness: 10, len: 0.6, y: 0.62}}];
    var failures = evenly(list.filter(function (i) {
      return !late[i] && D.codes[code[i]] !== "ok";
    }), D.limit);
    var byCode = D.codes.map(function () { return []; });
    failures.forEach(function (i) { byCode[code[i]].push(i); });
    byCode.forEach(function (group, c) {
      traces.push(ticks(group, startOf, tickSize, D.colors[c], 2, {
        name: codeName(c), legendgroup: D.codes[c], showlegend: true, uid: "bar-" + c,
        text: group.map(hover), hovertemplate: "%{text}<extra></extra>"}));
    });
    var lateOnes = evenly(list.filter(function (i) { return late[i]; }), D.limit);
    var over = overdueTraces(lateOnes);
    over[0].hovertext = lateOnes.map(hover);  // hover anywhere on an overdue call's outline
    over[0].hovertemplate = "%{hovertext}<extra></extra>";
    return traces.concat(over.map(hoverable));
  }
  function inFlight(x0, x1) {  // every call, stacked by code, for the range in view
    var bins = D.bins, width = (x1 - x0) / bins, counts = coverage(D.codes, bins, x0, width);
    for (var i = 0; i < n; i++) {
      if (ends[i] >= x0 && entered[i] <= x1) counts.add(code[i], entered[i], ends[i]);
    }
    var xs = [];
    for (var k = 0; k < bins; k++) xs.push(x0 + k * width);
    return counts.done().map(function (values, c) {
      return {type: "scatter", mode: "lines", x: xs, y: Array.from(values), yaxis: "y2",
        stackgroup: "flight", name: D.codes[c], legendgroup: D.codes[c], showlegend: false,
        line: {shape: "hv", width: 0.5, color: D.colors[c]}, uid: "flight-" + c,
        hovertemplate: "%{y:.1f} " + D.codes[c] + " in flight<extra></extra>"};
    });
  }
  function plotWidth() {  // pixels across the plot area (a guess before the div is laid out)
    var margin = D.layout.margin, width = gd.clientWidth || 1000;
    return Math.max(100, width - margin.l - margin.r);
  }
  var drawing = false;
  function draw() {
    var x0 = view.x0, x1 = view.x1, list = [];
    for (var i = 0; i < n; i++) if (ends[i] >= x0 && entered[i] <= x1) list.push(i);
    inView = D.codes.map(function () { return 0; });
    lateInView = 0;
    list.forEach(function (i) { inView[code[i]] += 1; lateInView += late[i]; });
    minWidth = (x1 - x0) * MIN_PX / plotWidth();
    var each = list.length <= D.limit;
    var traces = (each ? eachCall(list) : heat(list, x0, x1)).concat(inFlight(x0, x1));
    var hidden = {};
    (gd.data || []).forEach(function (t) {
      if (t.visible === "legendonly" && t.legendgroup) hidden[t.legendgroup] = true;
    });
    traces.forEach(function (t) { if (hidden[t.legendgroup]) t.visible = "legendonly"; });
    var layout = JSON.parse(JSON.stringify(D.layout));
    layout.xaxis.range = [x0, x1];
    layout.xaxis.autorange = false;
    layout.yaxis.range = view.y.slice();
    layout.yaxis.autorange = false;
    layout.annotations = [{xref: "paper", yref: "paper", x: 1, y: 1, xanchor: "right",
      yanchor: "bottom", showarrow: false, font: {size: 11, color: "#555"},
      text: list.length.toLocaleString("en") + " calls in view" + (each ? "" :
        ": calls in flight per tool; drag to zoom in to " + D.limit.toLocaleString("en") +
        " or fewer to see each call")}];
    drawing = true;
    var done = function () { drawing = false; };
    Plotly.react(gd, traces, layout, config).then(done, done);
  }
  draw();
  gd.on("plotly_relayout", function (event) {
    if (drawing) return;
    var redraw = false;
    if (event["xaxis.autorange"] || event["autosize"]) {
      view.x0 = full[0]; view.x1 = full[1]; redraw = true;
    }
    var range = event["xaxis.range"] ||
      ("xaxis.range[0]" in event ? [event["xaxis.range[0]"], event["xaxis.range[1]"]] : null);
    if (range) {
      var a = toMs(range[0]), b = toMs(range[1]);
      if (isFinite(a) && isFinite(b) && b > a) { view.x0 = a; view.x1 = b; redraw = true; }
    }
    if (event["yaxis.autorange"]) { view.y = fullY.slice(); redraw = true; }
    if ("yaxis.range[0]" in event) {
      view.y = [event["yaxis.range[0]"], event["yaxis.range[1]"]]; redraw = true;
    }
    if (redraw) draw();
  });
}
"""
