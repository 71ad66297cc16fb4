"""The demo's report page in a real browser: headless Chromium (Debian's `chromium` package).

The page is opened as a user opens it (a local file, no network). A probe script added to a
copy of the page records every error and console error from the first script on, waits for
the charts, checks each one was drawn (an SVG with its traces), that the demo's overdue call
is outlined, then zooms the timeline to that call and reads the note and the legend back from
the DOM. Chromium prints the DOM (`--dump-dom`) once the page has settled; the test reads the
probe's verdict from it. Skipped, with the reason, without Chromium or the `report` extra.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("plotly", reason="the report needs the report extra (plotly)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on the PATH (Debian: apt-get install chromium)"
)

# Installed before every other script: from here on, an error anywhere is recorded.
_CATCH = """<script>
window.toolregErrors = [];
window.addEventListener("error", function (e) { toolregErrors.push(String(e.message)); });
window.addEventListener("unhandledrejection", function (e) {
  toolregErrors.push("unhandled rejection: " + String(e.reason));
});
(function () {
  var error = console.error;
  console.error = function () {
    toolregErrors.push(Array.prototype.join.call(arguments, " "));
    return error.apply(console, arguments);
  };
})();
</script>"""

_PROBE = """<pre id="toolreg-probe">pending</pre>
<script>
(function () {
  function figure(div) {
    return {id: div.id, drawn: !!div._fullLayout && div.querySelector(".main-svg") !== null,
            traces: (div.data || []).filter(function (t) {
              return (t.x || t.z || []).length > 0; }).length};
  }
  function legend(div) {
    return Array.prototype.map.call(div.querySelectorAll(".legendtext"),
                                    function (node) { return node.textContent; });
  }
  function note(div) {
    return div.querySelector(".annotation-text").textContent;
  }
  function outlined(div) {  // SVG bar paths stroked in the overdue outline's red
    return Array.prototype.filter.call(div.querySelectorAll(".bars path"), function (path) {
      return getComputedStyle(path).stroke === "rgb(214, 39, 40)";
    }).length;
  }
  function report(result) {
    result.errors = window.toolregErrors;
    document.getElementById("toolreg-probe").textContent = JSON.stringify(result);
  }
  window.addEventListener("load", function () {
    setTimeout(function () {
      var timeline = document.getElementById("timeline");
      var result = {figures: Array.prototype.map.call(document.querySelectorAll(".figure"),
                                                      figure)};
      result.before = {note: note(timeline), legend: legend(timeline),
                       outlined: outlined(timeline)};
      var late = timeline.data.filter(function (t) { return t.uid === "overdue"; })[0];
      var start = late.base[0], stop = late.base[0] + late.x[0];
      result.overdue = [];  // the hover texts of the calls under the outlines
      timeline.data.forEach(function (t) {
        if (!/^bar-/.test(t.uid)) return;
        t.base.forEach(function (base, k) {
          if (base === start && t.y[k] === late.y[0]) result.overdue.push(t.hovertext[k]);
        });
      });
      var pad = (stop - start) * 0.05;
      Plotly.relayout(timeline, {"xaxis.range": [start - pad, stop + pad]}).then(function () {
        setTimeout(function () {
          result.zoomed = {note: note(timeline), legend: legend(timeline),
                           outlined: outlined(timeline)};
          report(result);
        }, 500);
      }, function (error) { toolregErrors.push(String(error)); report(result); });
    }, 500);
  });
})();
</script>"""


def _open(page: Path, profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--window-size=1280,1000",
            "--virtual-time-budget=20000",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _counts(legend: list[str]) -> dict[str, int]:
    """`CODE (N)` entries of a legend, by their first word."""
    found = {}
    for entry in legend:
        match = re.fullmatch(r"(\S+?):?(?: .*)? \(([\d,]+)\)", entry)
        if match:
            found[match.group(1)] = int(match.group(2).replace(",", ""))
    return found


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("browser")
    toolreg = [sys.executable, "-m", "toolreg"]
    demo = subprocess.run(
        [*toolreg, "demo", "--json", "--log-dir", str(directory)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert demo.returncode == 0, demo.stderr
    page = directory / "report.html"
    done = subprocess.run(
        [*toolreg, "report", str(directory / "calls.jsonl"), "-o", str(page)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = page.read_text(encoding="utf-8")
    probe = directory / "probed.html"
    head = text.index("<head>") + len("<head>")
    body = text.rindex("</body>")
    probe.write_text(text[:head] + _CATCH + text[head:body] + _PROBE + text[body:], "utf-8")
    opened = _open(probe, directory / "profile")
    assert opened.returncode == 0, opened.stderr[-2000:]
    match = re.search(r'<pre id="toolreg-probe">(.*?)</pre>', opened.stdout, re.S)
    assert match is not None, opened.stdout[-2000:]
    assert match.group(1) != "pending", "the probe never finished"
    result: dict[str, Any] = json.loads(html.unescape(match.group(1)))
    result["console"] = [line for line in opened.stderr.splitlines() if "CONSOLE" in line]
    return result


def test_the_page_opens_without_an_error(probed: dict[str, Any]) -> None:
    assert probed["errors"] == []
    assert [line for line in probed["console"] if "rror" in line] == []


def test_every_chart_is_drawn(probed: dict[str, Any]) -> None:
    figures = {figure["id"]: figure for figure in probed["figures"]}
    assert set(figures) == {"timeline", "latency", "histogram"}
    for figure in figures.values():
        assert figure["drawn"] and figure["traces"] > 0, figure


def test_the_demos_overdue_call_is_outlined(probed: dict[str, Any]) -> None:
    [hover] = probed["overdue"]
    assert hover.startswith("<b>render_video</b>") and "ABORTED" in hover
    assert probed["before"]["outlined"] == 1
    assert _counts(probed["before"]["legend"])["overdue"] == 1


def test_the_legend_counts_what_is_in_view_after_a_zoom(probed: dict[str, Any]) -> None:
    for view in ("before", "zoomed"):
        in_view = int(probed[view]["note"].split(" calls in view")[0].replace(",", ""))
        counts = _counts(probed[view]["legend"])
        assert sum(n for code, n in counts.items() if code != "overdue") == in_view, probed[view]
    zoomed = _counts(probed["zoomed"]["legend"])
    assert zoomed["ABORTED"] >= 1 and zoomed["overdue"] == 1
    assert probed["zoomed"]["outlined"] == 1
