"""`python -m toolreg report PATH... -o report.html`: one HTML page of what the calls did.

This module is the command: its options, the filters, and writing the page. `_calls` reads the
logs into `Call` rows and picks the calls the timeline draws; `_page` turns that into the page.
The plotting library (plotly, the `report` extra) is imported only when a report is written, so
`import toolreg` never needs it.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from datetime import datetime, timezone

from ._calls import EACH_CALL_LIMIT, SLOWEST_KEPT, collect, parse_time

__all__ = [
    "EXAMPLES",
    "HELP",
    "DEFAULT_MAX_BARS",
    "DEFAULT_OVERDUE",
    "MISSING_EXTRA",
    "add_arguments",
    "run",
]

DEFAULT_OVERDUE = 0.25
"""Seconds a body may keep running after cancellation before the report calls it overdue."""
DEFAULT_MAX_BARS = 100_000
"""Calls the page holds at most; beyond that it holds a sample (the page says which)."""

MISSING_EXTRA = (
    "python -m toolreg report needs the plotting library plotly: "
    "pip install 'toolreg-quiescent[report]'"
)

HELP = f"""\
Writes one self-contained HTML file (it opens without a network: the plotting library, plotly,
is inlined) from result logs written by toolreg.log.ResultLog:

* a timeline with one bar per call, from entry to the final result, grouped by tool (calls of
  a tool that overlap get lanes of their own) and colored by result code; inside each bar the
  body's span (dispatched to settled), a tick where the call's token was first seen cancelled,
  and, outlined in red, the calls whose body kept running more than --overdue seconds after
  that (default {DEFAULT_OVERDUE:g}): the non-quiescent bodies that hold a cancelled turn up.
  Under it, the mean number of calls in flight over time, by code;
* per-tool latency distributions (box and histogram), the overdue and the slowest calls;
* the table `python -m toolreg stats` prints, for the calls that pass the filters.

Log lines written before call timelines existed have no entry time or body span: such a call
is placed at `time - duration` (a little late: `time` is when the line was logged) and drawn
without a body or a cancellation tick; the page says how many calls that concerns.

Files are read as `stats` reads them (rotated and gzipped siblings too; --no-rotated reads only
the named files); bad lines are counted and listed, never fatal. Filters: --tool NAME (repeat
it for several tools); --since and --until (ISO 8601: a date YYYY-MM-DD or a time
YYYY-MM-DDTHH:MM:SSZ; a time without an offset is UTC) keep the calls that overlap the window
(entered before --until, finished after --since), and leave out calls without a usable time.

Large logs: the page draws each call while at most {EACH_CALL_LIMIT:,} are in view and redraws
as you zoom; with more in view it aggregates (per tool, a heat strip of calls in flight, with
overdue calls and failures still drawn one by one). Up to --max-bars calls (default
{DEFAULT_MAX_BARS:,}) go into the page; beyond that it keeps every overdue call, the
{SLOWEST_KEPT} slowest, then failures and an even sample of the rest, and says so. The
distributions and tables always count every call.

Exit status: 0; 1 if a PATH could not be read, no file could be read or the filters match no call
(then nothing is written), the output could not be written, or plotly is missing (pip install
'toolreg-quiescent[report]'); 2 for bad arguments."""

EXAMPLES = """\
examples:
  python -m toolreg report calls.jsonl -o report.html
  python -m toolreg report calls.jsonl -o slow.html --tool search --since YYYY-MM-DDT05:00Z
  python -m toolreg report calls.jsonl -o report.html --overdue 1   # overdue: > 1 s after cancel"""


# -- command line ----------------------------------------------------------------------------------


def _time_argument(text: str) -> float:
    moment = parse_time(text)
    if moment is None:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {text!r} (try 2026-12-01 or 2026-12-01T05:00:00Z)"
        )
    return moment


def _seconds_argument(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"not a number of seconds >= 0: {text!r}")
    return value


def _count_argument(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a whole number >= 1: {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `report` subcommand's arguments."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help="result log files")
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="the HTML file to write"
    )
    parser.add_argument(
        "--tool", action="append", default=[], metavar="NAME", help="only this tool (repeatable)"
    )
    parser.add_argument("--since", type=_time_argument, metavar="TIME", help="ISO 8601")
    parser.add_argument("--until", type=_time_argument, metavar="TIME", help="ISO 8601")
    parser.add_argument(
        "--overdue",
        type=_seconds_argument,
        default=DEFAULT_OVERDUE,
        metavar="SECONDS",
        help=f"a body still running this long after cancellation is overdue ({DEFAULT_OVERDUE:g})",
    )
    parser.add_argument(
        "--max-bars",
        type=_count_argument,
        default=DEFAULT_MAX_BARS,
        metavar="N",
        help=f"calls the timeline draws at most (default {DEFAULT_MAX_BARS:,})",
    )
    parser.add_argument(
        "--no-rotated", action="store_true", help="read only the named files, not their backups"
    )


def run(args: argparse.Namespace) -> int:
    """Run `report` with parsed arguments; the exit status."""
    if args.since is not None and args.until is not None and args.since > args.until:
        print("toolreg report: --since is after --until: no call could match", file=sys.stderr)
        return 2
    try:
        from . import _page
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] != "plotly":
            raise
        print(f"{MISSING_EXTRA}\n({exc})", file=sys.stderr)
        return 1
    data = collect(
        args.paths,
        include_rotated=not args.no_rotated,
        tools=args.tool,
        since=args.since,
        until=args.until,
    )
    for path, why in data.reading.unreadable.items():
        print(f"cannot read {path}: {why}", file=sys.stderr)
    if not data.reading.files:
        print("toolreg report: no log could be read; nothing written", file=sys.stderr)
        return 1
    filters = _filter_words(args)
    if filters and not data.table.records:
        print(
            f"toolreg report: no call matches {filters} (of {data.read:,} read); nothing written",
            file=sys.stderr,
        )
        return 1
    page = _page.render(data, overdue=args.overdue, max_bars=args.max_bars)
    try:
        _write_atomically(args.output, page)
    except OSError as exc:
        print(f"toolreg report: cannot write {args.output}: {exc}", file=sys.stderr)
        return 1
    reading = data.reading
    print(
        f"wrote {args.output}: {len(data.calls):,} call(s) on the timeline, {data.read:,} "
        f"record(s) read from {len(reading.files)} file(s), {reading.bad_lines:,} bad line(s)"
    )
    return 1 if reading.unreadable else 0


def _filter_words(args: argparse.Namespace) -> str:
    """The filters given, as the command line gave them ("" for none)."""
    words = [f"--tool {name}" for name in args.tool]
    words += [
        f"--{name} {_iso(getattr(args, name))}"
        for name in ("since", "until")
        if getattr(args, name) is not None
    ]
    return " ".join(words)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat().replace("+00:00", "Z")


def _write_atomically(path: str, text: str) -> None:
    # A reader (a browser reloading the page) never sees half a report.
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
