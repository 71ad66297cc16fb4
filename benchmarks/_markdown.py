"""The performance page: `python -m benchmarks --markdown PATH` writes a run's figures in Markdown.

One summary table (every row with a target, in each regime) and one table per module, each
row with the baseline it is measured against: the module's last row named `... (baseline)`
before it, which is how every module lays out its table.
"""

from __future__ import annotations

import os
import platform
import re
import time
from collections.abc import Sequence

from ._harness import Row

Result = tuple[str, str, list[Row]]  # (module, regime, rows), as `__main__` collects them

_ONCE = "Run once: nothing in it depends on where threads run."
_BASELINE = re.compile(r"\(baseline\b[^)]*\)")

INTRO = """\
# Performance

What toolreg costs, measured by its benchmark suite against a baseline measured in the same
run. Each benchmark runs its variants in interleaved rounds (every round in a rotated order,
the cyclic GC off while timing) and reports medians; a ratio is the median of the per-round
ratios, so both sides of it ran side by side. A ratio below 1.00x is faster than the baseline.

Threads are pinned to CPUs, in two regimes:

- **same**: the whole process on one CPU, so a hand-off between threads is a context switch;
- **cross**: the calling threads on one CPU and the workers on another, so a hand-off is a
  wake-up across CPUs.

A target is a limit the figure should stay under (in the cross regime where it differs);
PASS or MISS says whether this run met it. Wall-clock figures move with the machine's load;
instruction counts (`bench_bytecode`) do not.
"""


def page(results: Sequence[Result], regimes: Sequence[str], titles: dict[str, str]) -> str:
    """The whole page for the run's `results`, in the order the modules ran."""
    parts = [INTRO, _machine(), _summary(results, regimes)]
    parts.append("## Every figure\n")
    for module in dict.fromkeys(module for module, _, _ in results):
        parts.append(_module(module, titles.get(module, ""), results, regimes))
    return "\n".join(parts).rstrip("\n") + "\n"


def _machine() -> str:
    when = time.strftime("%Y-%m-%d", time.gmtime())
    python = f"{platform.python_implementation()} {platform.python_version()}"
    system = f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs"
    return (
        f"Measured on {when} with {python} on {system}. Regenerate this page with\n"
        "`python -m benchmarks --markdown docs/performance.md` (install `.[bench]` for the\n"
        "peers it compares with).\n"
    )


def _summary(results: Sequence[Result], regimes: Sequence[str]) -> str:
    lines = [["benchmark", "against", "target", *regimes]]
    cells: dict[tuple[str, str], tuple[str, dict[str, Row]]] = {}
    for module, regime, rows in results:
        for row, against in zip(rows, baselines(rows), strict=True):
            if row.verdict:
                cells.setdefault((module, row.name), (against, {}))[1][regime] = row
    for (module, name), (against, by_regime) in cells.items():
        values = [_judged(by_regime[r]) if r in by_regime else "-" for r in regimes]
        label = f"{name} ({module.removeprefix('bench_')})"
        lines.append([label, against, _target(by_regime), *values])
    return "## Summary: every target\n\n" + _table(lines) + "\n"


def _module(module: str, title: str, results: Sequence[Result], regimes: Sequence[str]) -> str:
    ran = {regime: rows for name, regime, rows in results if name == module}
    names: list[str] = []
    against: dict[str, str] = {}
    for rows in ran.values():
        for row, baseline in zip(rows, baselines(rows), strict=True):
            if row.name not in against:
                names.append(row.name)
                against[row.name] = baseline
    header = ["benchmark", "against"]
    for regime in ran:
        header += [f"{regime}: median", f"{regime}: vs base"]
    lines = [[*header, "target"]]
    for name in names:
        line = [name, against[name]]
        judged: dict[str, Row] = {}
        for regime, rows in ran.items():
            found = next((row for row in rows if row.name == name), None)
            if found is None:
                line += ["-", "-"]
                continue
            line += [found.figure, _judged(found, with_ratio=True)]
            if found.verdict:
                judged[regime] = found
        lines.append([*line, _target(judged) if judged else ""])
    once = (
        "" if len(ran) == len(regimes) else " Run once: nothing in it depends on where threads run."
    )
    return f"### {module}\n\n{title}{once}\n\n{_table(lines)}\n"


def baselines(rows: Sequence[Row]) -> list[str]:
    """What each row is measured against: its own `baseline`, else the last row named
    `... (baseline)` or `... (baseline of ...)` before it ("" if none; "baseline" for such a
    row itself)."""
    current = ""
    out = []
    for row in rows:
        named = _BASELINE.search(row.name)
        if named:
            current = (row.name[: named.start()] + row.name[named.end() :]).strip()
            out.append("baseline")
        elif row.baseline is not None:
            out.append(row.baseline)
        else:
            out.append(current if row.ratio or row.verdict else "")
    return out


def _judged(row: Row, with_ratio: bool = False) -> str:
    value = row.ratio or ("" if with_ratio else row.figure)
    return f"{value} {row.verdict}".strip()


def _target(by_regime: dict[str, Row]) -> str:
    """The rows' target; each regime's when they differ (same and cross limits)."""
    targets = {regime: row.target for regime, row in by_regime.items() if row.target}
    if len(set(targets.values())) <= 1:
        return next(iter(targets.values()), "")
    return "; ".join(f"{target} ({regime})" for regime, target in targets.items())


def _table(lines: Sequence[Sequence[str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|") or " "

    out = ["| " + " | ".join(cell(text) for text in lines[0]) + " |"]
    out.append("|" + "|".join("---" for _ in lines[0]) + "|")
    out.extend("| " + " | ".join(cell(text) for text in line) + " |" for line in lines[1:])
    return "\n".join(out)
