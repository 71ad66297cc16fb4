"""The report's data: logged calls placed in time (`Call`), read and filtered from result logs
(`collect`, with the `stats` reader, so rotated, gzipped and bad lines are handled the same way),
and the calls the timeline draws when there are too many (`choose_drawn`). `_page` draws it;
`_cli` (the `report` command) reads it. Nothing here imports plotly.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ._stats import LogStats, iter_records, number_or_none, tool_key

__all__ = [
    "EACH_CALL_LIMIT",
    "SLOWEST_KEPT",
    "Call",
    "ReportData",
    "choose_drawn",
    "collect",
    "parse_time",
]

EACH_CALL_LIMIT = 2_000
"""The timeline draws each call while at most this many are in view; with more, heat strips."""
SLOWEST_KEPT = 100  # the slowest calls are always drawn, whatever the sample
_LONGEST_CALL = 1e9  # seconds; a longer duration or offset is not placed in time


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
    slowest = heapq.nlargest(SLOWEST_KEPT, calls, key=lambda call: call.finished)
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
