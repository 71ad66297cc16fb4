"""A realistic result log with call timelines, for `bench_report` and the README screenshot.

An agent works in turns: each turn asks for a few tool calls at once (a registry running up to
`max_parallel` of them, the rest queued), and some turns are cancelled by the user part-way.
The tools behave like the demo's: `search` and `fetch` are quick and cooperative, `crawl` is
long and cooperative (it stops within a few milliseconds of a cancel), `render_video` ignores
its token (it runs to its end: overdue once cancelled), `slow_search` has a 1 s timeout,
`flaky_api` fails now and then, `delete_file` is sometimes denied, and a model occasionally asks
for a tool that does not exist. Lines carry the fields `ResultLog` writes plus the `timeline`
object (entry time, then seconds after entry), written here by hand because results do not
carry timelines yet. The same seed gives the same log.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any

START = 1_796_108_400.0  # 2026-12-01T07:00:00Z: a fixed time, so the same seed gives one log
TIMEOUT = 1.0  # slow_search's deadline
PID = 4242


@dataclass
class _Tool:
    name: str
    median: float  # seconds of work
    spread: float  # lognormal sigma
    cooperative: bool = True
    error_rate: float = 0.0
    deny_rate: float = 0.0


TOOLS = [
    _Tool("search", 0.08, 0.5),
    _Tool("fetch", 0.25, 0.6),
    _Tool("crawl", 2.5, 0.4),
    _Tool("render_video", 1.6, 0.3, cooperative=False),
    _Tool("slow_search", 0.6, 0.7),
    _Tool("flaky_api", 0.15, 0.5, error_rate=0.3),
    _Tool("delete_file", 0.02, 0.3, deny_rate=0.5),
]
_WEIGHTS = [30, 30, 8, 4, 10, 8, 4]


def write_log(path: str, calls: int, *, seed: int = 7, cancel_rate: float = 0.2) -> int:
    """Write about `calls` result lines to `path`; the number written."""
    rng = random.Random(seed)
    written = 0
    now = START
    with open(path, "w", encoding="utf-8") as stream:
        while written < calls:
            batch = min(calls - written, rng.randint(1, 6))
            now, lines = _turn(rng, now, batch, written, cancel_rate)
            stream.writelines(lines)
            written += len(lines)
    return written


def _turn(
    rng: random.Random, now: float, size: int, serial: int, cancel_rate: float
) -> tuple[float, list[str]]:
    """One turn of `size` calls entered together, at most 3 bodies at a time."""
    cancel_at = rng.uniform(0.2, 2.0) if rng.random() < cancel_rate else None
    slots = [0.0, 0.0, 0.0]  # when each of the 3 workers is free again (seconds into the turn)
    records = []
    turn_end = 0.0
    for index in range(size):
        tool = rng.choices(TOOLS, _WEIGHTS)[0]
        entered = index * rng.uniform(0.0005, 0.002)  # the model's calls arrive together
        worker = min(range(len(slots)), key=slots.__getitem__)
        start = max(entered + rng.uniform(0.0002, 0.001), slots[worker])
        record = _call(rng, tool, entered, start, cancel_at, f"call_{serial + index:07d}")
        timeline = record["timeline"]
        if timeline["settled"] is not None:
            slots[worker] = entered + timeline["settled"]
        timeline["entered"] = _iso(now + entered)
        end = entered + record["duration"]
        record["time"] = _iso(now + end + 0.0001)  # logged just after the result
        turn_end = max(turn_end, end)
        records.append(record)
    records.sort(key=lambda record: str(record["time"]))  # lines are written as calls finish
    gap = rng.expovariate(1 / 0.8)  # the model thinks before the next turn
    lines = [json.dumps(record, separators=(",", ":")) + "\n" for record in records]
    return now + turn_end + gap, lines


def _call(
    rng: random.Random,
    tool: _Tool,
    entered: float,
    start: float,
    cancel_at: float | None,
    call_id: str,
) -> dict[str, Any]:
    """One call's record (`time` and `timeline.entered` are the caller's to set).

    `entered`, `start` and `cancel_at` are seconds into the turn; the timeline's offsets are
    seconds after `entered`.
    """
    timeline: dict[str, Any] = {"dispatched": None, "cancelled": None, "settled": None}
    code: str | None = None
    message: str | None = None
    name = tool.name if rng.random() > 0.004 else "summarise"  # a tool the model made up
    if name != tool.name:
        code, message, finished = "UNKNOWN_TOOL", f"unknown tool {name!r}", 0.00004
    elif rng.random() < tool.deny_rate:
        code, message, finished = "DENIED", "the approver said no", rng.uniform(0.2, 1.5)
    elif cancel_at is not None and cancel_at <= start:
        code, message = "ABORTED_BEFORE_DISPATCH", "tool call aborted before dispatch"
        timeline["cancelled"] = max(0.0, cancel_at - entered)
        finished = timeline["cancelled"] + 0.00005
    else:
        work = tool.median * rng.lognormvariate(0.0, tool.spread)
        end = start + work
        timeline["dispatched"] = start - entered
        deadline = start + TIMEOUT if tool.name == "slow_search" else None
        stop = min(t for t in (cancel_at, deadline, end) if t is not None)
        if stop < end:  # cancelled (by the user or the deadline) before the work was done
            timeline["cancelled"] = stop - entered
            if tool.cooperative:
                end = stop + rng.uniform(0.001, 0.02)  # notices at its next wait
            code = "TOOL_TIMEOUT" if stop == deadline else "ABORTED"
            message = "tool call timed out after 1s" if code == "TOOL_TIMEOUT" else "aborted"
        elif rng.random() < tool.error_rate:
            code, message = "TOOL_ERROR", "ConnectionError: upstream returned 503"
        timeline["settled"] = end - entered
        finished = timeline["settled"] + rng.uniform(0.0001, 0.0006)
    timeline["finished"] = round(finished, 6)
    for key in ("dispatched", "cancelled", "settled"):
        if timeline[key] is not None:
            timeline[key] = round(timeline[key], 6)
    record = {
        "time": "",
        "call_id": call_id,
        "name": name,
        "ok": code is None,
        "code": code,
        "message": message,
        "dispatched": timeline["dispatched"] is not None,
        "duration": timeline["finished"],
        "arguments": {"q": f"query {call_id[-3:]}"},
        "pid": PID,
        "timeline": timeline,
    }
    return record


def _iso(epoch: float) -> str:
    seconds = int(epoch)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{int((epoch - seconds) * 1e6):06d}Z"
