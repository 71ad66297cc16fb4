"""`python -m toolreg report`: the time to turn a 100,000-call log into its HTML page.

The log is `_calls_log.write_log`'s (calls with timelines: turns of parallel calls, cancels,
overdue bodies, timeouts, failures); quick mode uses 10,000 calls. Both variants read the same
file from the page cache:

* baseline: `stats`'s reader (`_stats.read_logs`): open, split, `json.loads`, per-tool figures.
* report: the whole command minus argument parsing: read with the same reader, place the calls
  in time, lay out the lanes, encode the typed arrays, the distributions and the tables, and
  write the page (plotly.js inlined: about 4.8 MB before any call) to a file.

Figures are medians over interleaved repeats (`_harness.interleaved`).

When `chromium` is on the PATH, the page is also opened in headless Chromium (software
rendering: no GPU) and timed from navigation to the end of the page's scripts (the timeline
drawn), against the page of a 100-call log from the same generator as the baseline: the page
draws only the calls in view (each call up to 2,000, heat strips beyond), so the ratio shows
what the extra calls cost to decode and aggregate. Browser start-up is not in either figure.
Without plotly (the `report` extra) the module reports that and measures nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import tempfile

from toolreg.report._calls import collect
from toolreg.report._cli import DEFAULT_OVERDUE
from toolreg.report._stats import read_logs

from ._calls_log import write_log
from ._harness import Row, interleaved, timed_once

REGIME_INDEPENDENT = True  # one thread (and a browser): measured once, in the first regime
TARGET = 5.0  # the report may cost this many times the bare read (all of it Python)
BROWSER_TARGET = 3.0  # opening the big page against the 100-call page
_RENDERED = re.compile(r"TOOLREG-BENCH-RENDERED ([0-9.]+)")


def measure(quick: bool) -> dict[str, float]:
    from toolreg.report import _page

    calls = 10_000 if quick else 100_000
    repeats = 3 if quick else 5
    with tempfile.TemporaryDirectory(prefix="bench-report-") as directory:
        log = os.path.join(directory, "calls.jsonl")
        write_log(log, calls)
        page_path = os.path.join(directory, "report.html")

        def read(n: int) -> None:
            read_logs([log])

        def report(n: int) -> None:
            data = collect([log])
            page = _page.render(data, overdue=DEFAULT_OVERDUE, max_bars=calls)
            with open(page_path, "w", encoding="utf-8") as stream:
                stream.write(page)

        figures: dict[str, float] = dict(
            interleaved(
                {"read": lambda: timed_once(read, 1), "report": lambda: timed_once(report, 1)},
                repeats,
            )
        )
        figures["calls"] = calls
        figures["bytes"] = os.path.getsize(page_path)
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium is not None:
            small_log = os.path.join(directory, "small.jsonl")
            small_page = os.path.join(directory, "small.html")
            write_log(small_log, 100)
            with open(small_page, "w", encoding="utf-8") as stream:
                data = collect([small_log])
                stream.write(_page.render(data, overdue=DEFAULT_OVERDUE, max_bars=100))
            pages = {"browser small": small_page, "browser": page_path}
            for name, path in pages.items():
                runs = 1 if quick else repeats  # a browser start costs seconds
                samples = [_browser_ms(chromium, path, directory) for _ in range(runs)]
                figures[name] = statistics.median(samples) / 1000
    return figures


def _browser_ms(chromium: str, page: str, directory: str) -> float:
    """Milliseconds from navigation to the end of the page's scripts, in headless Chromium."""
    timed = os.path.join(directory, "timed.html")
    with open(page, encoding="utf-8") as stream:
        text = stream.read()
    probe = '<script>console.log("TOOLREG-BENCH-RENDERED " + performance.now());</script>'
    with open(timed, "w", encoding="utf-8") as stream:
        stream.write(text.replace("</body>", probe + "</body>"))
    with tempfile.TemporaryDirectory(dir=directory) as profile:
        done = subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--enable-logging=stderr",
                "--v=0",
                "--dump-dom",
                f"file://{timed}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    found = _RENDERED.search(done.stderr)
    if found is None:
        raise RuntimeError(f"chromium did not report the page rendered: {done.stderr[-500:]}")
    return float(found.group(1))


def run(quick: bool) -> list[Row]:
    """Measure and return the table's rows."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        return [
            Row(
                "report: skipped, plotly is missing",
                "-",
                "",
                "pip install 'toolreg-quiescent[report]'",
            )
        ]
    m = measure(quick)
    calls = int(m["calls"])
    factor = m["report"] / m["read"]
    rows = [
        Row(f"stats reader, {calls:,} calls (baseline)", f"{m['read']:.2f} s", "1.00x"),
        Row(
            f"report, {calls:,} calls to a {m['bytes'] / 1e6:.1f} MB page",
            f"{m['report']:.2f} s",
            f"{factor:.2f}x",
            f"<= {TARGET:g}x",
            "PASS" if factor <= TARGET else "MISS",
        ),
    ]
    if "browser" not in m:
        rows.append(Row("browser: not measured (no chromium on the PATH)", "-"))
        return rows
    opened = m["browser"] / m["browser small"]
    rows.append(Row("Chromium opens the 100-call page (baseline)", f"{m['browser small']:.2f} s"))
    rows.append(
        Row(
            f"Chromium opens the {calls:,}-call page",
            f"{m['browser']:.2f} s",
            f"{opened:.2f}x",
            f"<= {BROWSER_TARGET:g}x",
            "PASS" if opened <= BROWSER_TARGET else "MISS",
        )
    )
    return rows
