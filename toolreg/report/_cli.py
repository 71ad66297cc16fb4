"""`python -m toolreg report PATH... -o report.html`: one HTML page of what the calls did.

This module reads the logs into `Call` rows (with the `stats` reader, so rotated, gzipped and bad
lines are handled the same way), applies the filters, and picks the calls the timeline draws;
`_page` turns that into the page. The plotting library (plotly, the `report` extra) is
imported only when a report is written, so `import toolreg` never needs it.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import math
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ._stats import LogStats, iter_records, number_or_none, tool_key

__all__ = [
    "EXAMPLES",
    "HELP",
    "DEFAULT_MAX_BARS",
    "EACH_CALL_LIMIT",
    "DEFAULT_OVERDUE",
    "Call",
    "ReportData",
    "add_arguments",
    "collect",
    "parse_time",
    "run",
]

DEFAULT_OVERDUE = 0.25
"""Seconds a body may keep running after cancellation before the report calls it overdue."""
DEFAULT_MAX_BARS = 100_000
"""Calls the page holds at most; beyond that it holds a sample (the page says which)."""
EACH_CALL_LIMIT = 2_000
"""The timeline draws each call while at most this many are in view; with more, heat strips."""
_SLOWEST_KEPT = 100  # the slowest calls are always drawn, whatever the sample
_LONGEST_CALL = 1e9  # seconds; a longer duration or offset is not placed in time

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
it for several tools); --since and --until (ISO 8601: 2026-12-01, 2026-12-01T05:00:00Z, ...; a
time without an offset is UTC) keep the calls that overlap the window (entered before --until,
finished after --since), and leave out calls without a usable time.

Large logs: the page draws each call while at most {EACH_CALL_LIMIT:,} are in view and redraws
as you zoom; with more in view it aggregates (per tool, a heat strip of calls in flight, with
overdue calls and failures still drawn one by one). Up to --max-bars calls (default
{DEFAULT_MAX_BARS:,}) go into the page; beyond that it keeps every overdue call, the
{_SLOWEST_KEPT} slowest, then failures and an even sample of the rest, and says so. The
distributions and tables always count every call.

Exit status: 0; 1 if a PATH could not be read, no file could be read or the filters match no call
(then nothing is written), the output could not be written, or plotly is missing (pip install
'toolreg-quiescent[report]'); 2 for bad arguments."""

EXAMPLES = """\
examples:
  python -m toolreg report calls.jsonl -o report.html
  python -m toolreg report calls.jsonl -o slow.html --tool search --since 2026-12-01T05:00Z
  python -m toolreg report calls.jsonl -o report.html --overdue 1   # overdue: > 1 s after cancel"""


@dataclass(frozen=True)
class Call:
    """One logged call, placed in time: an epoch entry time and offsets from it in seconds."""

    name: str
    call_id: str
    code: str  # "ok" or the error code
    message: str | None
    entered: float  # epoch seconds
    finished: float  # seconds after entry (the duration)
    dispatched: float | None = None  # the body started
    cancelled: float | None = None  # the call's token was first seen cancelled
    settled: float | None = None  # the body returned or raised
    estimated: bool = False  # no timeline in the log: entered is `time - duration`

    @property
    def overrun(self) -> float | None:
        """How long the body ran after cancellation (`settled - cancelled`), if both happened."""
        if self.cancelled is None or self.settled is None:
            return None
        return max(0.0, self.settled - self.cancelled)

    @property
    def end(self) -> float:
        """Epoch seconds of the final result."""
        return self.entered + self.finished


@dataclass
class ReportData:
    """What the report shows: the kept calls, their `stats` figures, and how reading went."""

    reading: LogStats  # files, unreadable files, bad lines
    table: LogStats  # the figures of the kept records (the `stats` table)
    calls: list[Call] = field(default_factory=list)  # kept and placed in time, by entry
    read: int = 0  # result records read
    unplaced: int = 0  # kept records without a usable time (in the table, not drawn)
    estimated: int = 0  # calls placed from `time - duration` (no timeline)
    bad_timelines: int = 0  # records whose `timeline` was unusable (placed as estimated)
    tools: tuple[str, ...] = ()  # the --tool filter
    since: float | None = None
    until: float | None = None


def parse_time(text: object) -> float | None:
    """An ISO 8601 time as epoch seconds (no offset means UTC); None if it is not one."""
    if not isinstance(text, str) or not text:
        return None
    if text[-1] in "Zz":  # Python 3.10's fromisoformat does not read the Z suffix
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def collect(
    paths: Iterable[str],
    *,
    include_rotated: bool = True,
    tools: Iterable[str] = (),
    since: float | None = None,
    until: float | None = None,
) -> ReportData:
    """Read the logs and keep the calls of `tools` (all if empty) overlapping [since, until]."""
    data = ReportData(LogStats(), LogStats(), tools=tuple(tools), since=since, until=until)
    wanted = set(data.tools)
    windowed = since is not None or until is not None
    for record in iter_records(paths, data.reading, include_rotated):
        data.read += 1
        if wanted and tool_key(record["name"]) not in wanted:
            continue
        call = _place(record, data)
        if call is None:
            if windowed:
                continue
            data.unplaced += 1
        elif (since is not None and call.end < since) or (
            until is not None and call.entered > until
        ):
            continue
        else:
            data.calls.append(call)
            data.estimated += call.estimated
        data.table.add_record(record)
    data.calls.sort(key=lambda call: call.entered)
    return data


def _place(record: dict[str, Any], data: ReportData) -> Call | None:
    code = record.get("code")
    message = record.get("message")
    call_id = record.get("call_id")
    common: dict[str, Any] = {
        "name": tool_key(record["name"]),
        "call_id": call_id if isinstance(call_id, str) else str(call_id),
        "code": "ok" if record["ok"] else (code or "UNKNOWN"),
        "message": message if isinstance(message, str) else None,
    }
    duration = number_or_none(record.get("duration"))
    timeline = record.get("timeline")
    if timeline is not None:
        placed = _from_timeline(timeline, duration, common)
        if placed is not None:
            return placed
        data.bad_timelines += 1
    logged = parse_time(record.get("time"))
    if logged is None or duration is None or not _offset_ok(duration):
        return None
    return Call(**common, entered=logged - duration, finished=duration, estimated=True)


def _from_timeline(timeline: object, duration: float | None, common: dict[str, Any]) -> Call | None:
    if not isinstance(timeline, dict):
        return None
    entered = parse_time(timeline.get("entered"))
    finished = number_or_none(timeline.get("finished"))
    if finished is None:
        finished = duration
    if entered is None or finished is None or not _offset_ok(finished):
        return None
    offsets: dict[str, float | None] = {}
    for key in ("dispatched", "cancelled", "settled"):
        value = timeline.get(key)
        offset = number_or_none(value)
        if value is not None and (offset is None or not _offset_ok(offset)):
            return None
        offsets[key] = offset
    return Call(
        **common,
        entered=entered,
        finished=finished,
        dispatched=offsets["dispatched"],
        cancelled=offsets["cancelled"],
        settled=offsets["settled"],
    )


def _offset_ok(seconds: float) -> bool:
    # Past ~31 years a duration is corrupt, and `time - duration` would leave the calendar.
    return 0.0 <= seconds <= _LONGEST_CALL


# -- what the timeline draws -----------------------------------------------------------------------


def choose_drawn(calls: list[Call], limit: int, overdue: float) -> tuple[list[Call], str]:
    """At most `limit` calls (by entry) and a sentence saying how they were chosen."""
    if len(calls) <= limit:
        return calls, ""
    late = sorted(
        (call for call in calls if (call.overrun or 0.0) > overdue),
        key=lambda call: call.overrun or 0.0,
        reverse=True,
    )
    chosen: set[int] = {id(call) for call in late[:limit]}
    slowest = heapq.nlargest(_SLOWEST_KEPT, calls, key=lambda call: call.finished)
    picked = [f"{min(len(late), limit):,} overdue"]
    room = limit - len(chosen)
    fresh = [call for call in slowest if id(call) not in chosen][:room]
    chosen.update(id(call) for call in fresh)
    picked.append(f"the {len(fresh):,} slowest others")
    for label, group in (
        ("failed", [c for c in calls if c.code != "ok" and id(c) not in chosen]),
        ("successful", [c for c in calls if c.code == "ok" and id(c) not in chosen]),
    ):
        if not group:
            continue
        room = limit - len(chosen)
        taken = _evenly(group, room)
        chosen.update(id(call) for call in taken)
        if len(taken) == len(group):
            picked.append(f"all {len(group):,} {label}")
        else:
            picked.append(f"{len(taken):,} of {len(group):,} {label} (an even sample)")
    drawn = [call for call in calls if id(call) in chosen]
    note = (
        f"The timeline and its in-flight chart show {len(drawn):,} of {len(calls):,} calls: "
        f"{', '.join(picked)}. The distributions and the tables count every call."
    )
    return drawn, note


def _evenly(group: list[Call], room: int) -> list[Call]:
    if room <= 0:
        return []
    if len(group) <= room:
        return group
    step = len(group) / room
    return [group[int(index * step)] for index in range(room)]


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
