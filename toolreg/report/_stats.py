"""`python -m toolreg stats PATH...`: per-tool figures from `ResultLog` files."""

from __future__ import annotations

import argparse
import gzip
import io
import json
import math
import os
import re
import sys
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from .._text import escape_surrogates

__all__ = [
    "EXAMPLES",
    "HELP",
    "LogStats",
    "ToolStats",
    "add_arguments",
    "code_table_cells",
    "format_seconds",
    "iter_records",
    "log_files",
    "number_or_none",
    "read_logs",
    "run",
    "table_cells",
    "tool_key",
]

HELP = """\
Per tool: calls, successes, failures, cancelled calls, each error code and p50/p95/max duration.
A call is counted once: ok, failed (an error code other than the two aborts), aborted after
dispatch (ABORTED: a body had started) or aborted before dispatch (ABORTED_BEFORE_DISPATCH: no
body ran); the four add up to the calls. A cancellation is the caller's decision, not a fault of
the tool, so it is never counted as failed.

Each PATH is a result log written by toolreg.log.ResultLog. Its rotated siblings are read too:
given calls.jsonl, also calls.jsonl.1, calls.jsonl.2.gz, ... (--no-rotated reads only the named
files). A file named twice (say by a shell glob) is read once. Gzipped files are recognised by
their content, whatever their name. Durations are seconds from entry to result, over all calls;
percentiles use the nearest-rank method. Lines that are not a result record (bad JSON, a line cut
short by a crash, a line still being written) are counted and listed, never fatal. Exit status:
0, or 1 if a PATH could not be read."""

EXAMPLES = """\
examples:
  python -m toolreg stats calls.jsonl            # also reads calls.jsonl.1, calls.jsonl.2.gz, ...
  python -m toolreg stats --json logs/*.jsonl    # one JSON document, for scripts"""

_GZIP_MAGIC = b"\x1f\x8b"
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # the JSON escape of a surrogate
_SHOWN_BAD_LINES = 10


@dataclass
class ToolStats:
    """The figures of one tool."""

    name: str
    calls: int = 0
    ok: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    durations: list[float] = field(default_factory=list)

    @property
    def aborted_after_dispatch(self) -> int:
        """Calls cancelled after their body started (`ABORTED`)."""
        return self.codes["ABORTED"]

    @property
    def aborted_before_dispatch(self) -> int:
        """Calls cancelled before any body started (`ABORTED_BEFORE_DISPATCH`)."""
        return self.codes["ABORTED_BEFORE_DISPATCH"]

    @property
    def failed(self) -> int:
        """Calls that failed for another reason than a cancellation (neither abort code)."""
        return self.calls - self.ok - self.aborted_after_dispatch - self.aborted_before_dispatch

    def add(self, ok: bool, code: str | None, duration: float | None) -> None:
        self.calls += 1
        if ok:
            self.ok += 1
        else:
            self.codes[code or "UNKNOWN"] += 1
        if duration is not None:
            self.durations.append(duration)

    def merge(self, other: ToolStats) -> None:
        self.calls += other.calls
        self.ok += other.ok
        self.codes.update(other.codes)
        self.durations.extend(other.durations)

    def percentiles(self) -> dict[str, float | None]:
        """`p50`, `p95` and `max` of the durations (None when there are none)."""
        ordered = sorted(self.durations)
        return {
            "p50": _nearest_rank(ordered, 0.50),
            "p95": _nearest_rank(ordered, 0.95),
            "max": ordered[-1] if ordered else None,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "ok": self.ok,
            "failed": self.failed,
            "codes": dict(sorted(self.codes.items())),
            "aborted_after_dispatch": self.aborted_after_dispatch,
            "aborted_before_dispatch": self.aborted_before_dispatch,
            "duration": self.percentiles(),
        }


@dataclass
class BadLine:
    """A line that is not a result record, or a file that ended in the middle of a stream."""

    path: str
    line: int
    reason: str


@dataclass
class LogStats:
    """Everything `stats` found in a set of files."""

    files: list[str] = field(default_factory=list)
    records: int = 0
    bad_lines: int = 0
    bad: list[BadLine] = field(default_factory=list)  # the first few, for the report
    unreadable: dict[str, str] = field(default_factory=dict)  # path -> why
    tools: dict[str, ToolStats] = field(default_factory=dict)

    def add_bad(self, path: str, line: int, reason: str) -> None:
        self.bad_lines += 1
        if len(self.bad) < _SHOWN_BAD_LINES:
            self.bad.append(BadLine(path, line, reason))

    def add_line(self, path: str, number: int, raw: bytes) -> None:
        """Count one raw line: a result record is added, anything else counted as bad."""
        record = self.parse_line(path, number, raw)
        if record is not None:
            self.add_record(record)

    def parse_line(self, path: str, number: int, raw: bytes) -> dict[str, Any] | None:
        """The result record on `raw`, or None (a bad line is counted, a blank one ignored)."""
        if not raw.endswith(b"\n"):
            self.add_bad(path, number, "partial line (no newline at the end of the file)")
            return None
        if not raw.strip():
            return None  # blank lines carry nothing
        try:
            record = json.loads(raw)
            if _SURROGATE_ESCAPE.search(raw):  # rare: looked for in the line, not in the record
                record = _printable(record)
        except (ValueError, RecursionError) as exc:
            # Not UTF-8, not JSON, an int of 4,300 digits or more, or nested too deep.
            self.add_bad(path, number, f"not JSON ({exc})")
            return None
        problem = _check_record(record)
        if problem:
            self.add_bad(path, number, problem)
            return None
        return cast("dict[str, Any]", record)  # _check_record made sure it is one

    def add_record(self, record: dict[str, Any]) -> None:
        """Add a checked result record (from `parse_line`) to its tool's figures."""
        key = tool_key(record["name"])
        tool = self.tools.get(key)
        if tool is None:
            tool = self.tools[key] = ToolStats(key)
        tool.add(record["ok"], record.get("code"), number_or_none(record.get("duration")))
        self.records += 1

    def total(self) -> ToolStats:
        """All tools together."""
        total = ToolStats("(all)")
        for tool in self.tools.values():
            total.merge(tool)
        return total

    def table_rows(self) -> list[ToolStats]:
        """The tools by name, then the total; [] when there are none."""
        rows = [self.tools[name] for name in sorted(self.tools)]
        return [*rows, self.total()] if rows else []

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "unreadable": self.unreadable,
            "records": self.records,
            "bad_lines": self.bad_lines,
            "bad_line_examples": [
                {"path": bad.path, "line": bad.line, "reason": bad.reason} for bad in self.bad
            ],
            "tools": {name: self.tools[name].to_json() for name in sorted(self.tools)},
            "total": self.total().to_json(),
        }

    def format(self) -> str:
        """A human-readable report."""
        out = [f"{len(self.files)} file(s), {self.records} record(s), {self.bad_lines} bad line(s)"]
        rows = self.table_rows()
        if rows:
            out.append("")
            out.extend(_table(rows))
            out.extend(_code_table(rows))
        if self.bad:
            out.append("")
            out.append(f"bad lines (first {len(self.bad)} of {self.bad_lines}):")
            out.extend(f"  {bad.path}:{bad.line}: {bad.reason}" for bad in self.bad)
        for path, why in self.unreadable.items():
            out.append(f"cannot read {path}: {why}")
        return "\n".join(out)


def tool_key(name: object) -> str:
    """The tool name a record is counted under (a name that is not a string: its JSON)."""
    return name if isinstance(name, str) else json.dumps(name)


def number_or_none(value: object) -> float | None:
    """`value` as a float if it is a finite JSON number (not a bool, NaN or infinity), else None.

    `json.loads` accepts `NaN` and `Infinity`; ResultLog never writes them, and a duration like
    that would make every percentile of its tool meaningless.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float: as unusable as an infinity
            return None
        if math.isfinite(number):
            return number
    return None


def _printable(value: Any) -> Any:
    """`value` with every surrogate code point in its strings (keys too) escaped: a log line may
    hold one (ResultLog writes the name of a call to an unknown tool as given), and text holding
    one cannot be printed or written as UTF-8."""
    if isinstance(value, str):
        return escape_surrogates(value)
    if isinstance(value, list):
        return [_printable(item) for item in value]
    if isinstance(value, dict):
        return {escape_surrogates(key): _printable(item) for key, item in value.items()}
    return value


def _check_record(record: object) -> str | None:
    if not isinstance(record, dict):
        return f"not a result record (a JSON {type(record).__name__})"
    missing = [key for key in ("name", "ok") if key not in record]
    if missing:
        return f"not a result record (no {', '.join(missing)})"
    if not isinstance(record["ok"], bool):
        return "not a result record ('ok' is not true or false)"
    code = record.get("code")
    if code is not None and not isinstance(code, str):
        return "not a result record ('code' is not a string)"
    return None


def _nearest_rank(ordered: list[float], fraction: float) -> float | None:
    if not ordered:
        return None
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def format_seconds(value: float | None) -> str:
    """A duration as `12.3ms` or `4.56s` (`-` for None)."""
    if value is None:
        return "-"
    if value < 1.0:
        return f"{value * 1000:.1f}ms"
    return f"{value:.2f}s"


def _table(rows: list[ToolStats]) -> list[str]:
    return _aligned(table_cells(rows))


def _code_table(rows: list[ToolStats]) -> list[str]:
    cells = code_table_cells(rows)
    return ["", *_aligned(cells)] if cells else []


def table_cells(rows: list[ToolStats]) -> list[list[str]]:
    """The cells of the per-tool table (two header rows, then one row per tool)."""
    head = ["tool", "calls", "ok", "failed", "aborted", "aborted before", "p50", "p95", "max"]
    cells = [head, ["", "", "", "", "(dispatched)", "dispatch", "", "", ""]]
    for tool in rows:
        spread = tool.percentiles()
        cells.append(
            [
                tool.name,
                str(tool.calls),
                str(tool.ok),
                str(tool.failed),
                str(tool.aborted_after_dispatch),
                str(tool.aborted_before_dispatch),
                format_seconds(spread["p50"]),
                format_seconds(spread["p95"]),
                format_seconds(spread["max"]),
            ]
        )
    return cells


def code_table_cells(rows: list[ToolStats]) -> list[list[str]]:
    """The cells of the errors-by-code table (a header row, then one row per tool); [] if none."""
    codes = sorted({code for tool in rows for code in tool.codes})
    if not codes:
        return []
    cells = [["errors by code", *codes]]
    cells.extend([tool.name, *(str(tool.codes[code]) for code in codes)] for tool in rows)
    return cells


def _aligned(cells: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in cells
    ]


# -- files -----------------------------------------------------------------------------------------


def log_files(paths: Iterable[str], include_rotated: bool = True) -> list[str]:
    """The files to read, oldest first: each path's rotated siblings, then the path.

    Siblings of `p` are `p.<n>` and `p.<n>.gz` (what `ResultLog` rotates to), highest `n` (the
    oldest) first. A file reached twice is listed once.
    """
    files: list[str] = []
    seen: set[str] = set()
    for path in paths:
        group = [*(_rotated(path) if include_rotated else []), path]
        for name in group:
            key = os.path.realpath(name)
            if key not in seen:
                seen.add(key)
                files.append(name)
    return files


def _rotated(path: str) -> list[str]:
    directory, base = os.path.split(path)
    pattern = re.compile(re.escape(base) + r"\.([0-9]+)(\.gz)?")
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return []
    numbered = []
    for name in names:
        match = pattern.fullmatch(name)
        if match:
            numbered.append((-int(match.group(1)), name))
    return [os.path.join(directory, name) for _, name in sorted(numbered)]


def read_logs(paths: Iterable[str], include_rotated: bool = True) -> LogStats:
    """Read every file of `log_files(paths)` into one `LogStats`; bad lines are counted."""
    stats = LogStats()
    for record in iter_records(paths, stats, include_rotated):
        stats.add_record(record)
    return stats


def iter_records(
    paths: Iterable[str], stats: LogStats, include_rotated: bool = True
) -> Iterator[dict[str, Any]]:
    """Yield the result records of every file of `log_files(paths)`, oldest file first.

    Only the reading is recorded in `stats`: the files read, the unreadable ones, bad lines.
    What to do with each record (`stats.add_record`, a filter, ...) is the caller's choice.
    """
    for path in log_files(paths, include_rotated):
        try:
            stream = _open(path)
        except OSError as exc:
            stats.unreadable[path] = exc.strerror or str(exc)
            continue
        stats.files.append(path)
        with stream:
            number = 0
            try:
                for number, raw in enumerate(stream, 1):
                    record = stats.parse_line(path, number, raw)
                    if record is not None:
                        yield record
            except (OSError, EOFError, zlib.error) as exc:
                # A gzip cut short, or a read error: keep what was read, report where it ended.
                stats.add_bad(path, number + 1, f"file ends unexpectedly ({exc})")


def _open(path: str) -> io.BufferedIOBase:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == _GZIP_MAGIC:
        return gzip.open(path, "rb")
    return open(path, "rb")  # the caller closes it


# -- command line ----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `stats` subcommand's arguments."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help="result log files")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--no-rotated", action="store_true", help="read only the named files, not their backups"
    )


def run(args: argparse.Namespace) -> int:
    """Run `stats` with parsed arguments; the exit status."""
    stats = read_logs(args.paths, include_rotated=not args.no_rotated)
    if args.json:
        json.dump(stats.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(stats.format())
    return 1 if stats.unreadable else 0
