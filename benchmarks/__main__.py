"""`python -m benchmarks [--quick] [--only NAME,...] [--regime same|cross|free] [--markdown PATH]`.

Runs every `benchmarks/bench_*.py` module (or the ones named) in each regime (`_regime`): by
default both pinned regimes, `same` then `cross`, one after the other for each module; with
`--quick` (small sizes, for CI) only `same`; `--regime` picks one. A module that sets
`REGIME_INDEPENDENT = True` (nothing in it depends on where threads run) runs once, in the first
regime. Each module's `run(quick)` returns its rows, printed as a table (after whatever it
printed itself), with the placement of its threads (`_regime.placement`) and its time.
A module that raises is reported and makes the exit status 1; a missed target never does.

At the end, a summary: every row that carries a target, in each regime that ran. `--markdown PATH`
also writes the run's figures as the documentation's performance page (`_markdown`); it runs
both pinned regimes, with `--quick` too, unless `--regime` picks one. A target
of issue 18 has a limit for same and (in brackets, where it differs) for cross; a free run is
held to the cross limit.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import pkgutil
import sys
import time
import traceback
import types
from collections.abc import Sequence
from pathlib import Path

from . import _markdown, _regime
from ._harness import Row, format_grid, format_table

Result = tuple[str, str, list[Row]]  # (module, regime, rows)


def discover() -> list[str]:
    """Names of the benchmark modules, sorted: `bench_aio`, `bench_batch`, ..."""
    here = [str(Path(__file__).parent)]
    return sorted(m.name for m in pkgutil.iter_modules(here) if m.name.startswith("bench_"))


def run_module(name: str, quick: bool, regime: _regime.Regime) -> tuple[str, list[Row]]:
    """Run one module's benchmarks in `regime`; the table it printed or its rows make, and the
    rows."""
    module = importlib.import_module(f"{__package__}.{name}")
    printed = io.StringIO()
    with _regime.active(regime), contextlib.redirect_stdout(printed):
        rows = [_as_row(row) for row in module.run(quick)]
        placement = _regime.placement()
    table = format_table(f"{name} [{regime.name}]: {title(module)}", rows)
    if printed.getvalue().strip():  # what the module printed itself, then its rows
        table = f"{printed.getvalue().rstrip()}\n{table}"
    return f"{table}\n  threads: {placement}", rows


def _as_row(row: object) -> Row:
    if isinstance(row, Row):
        return row
    cells = [str(cell) for cell in row] if isinstance(row, Sequence) else [str(row)]
    return Row(*cells[:5])


def regimes_for(args: argparse.Namespace) -> list[_regime.Regime]:
    if args.regime is not None:
        names = [args.regime]
    else:
        names = ["same"] if args.quick and not args.markdown else ["same", "cross"]
    planned: list[_regime.Regime] = []
    for name in names:
        regime = _regime.plan(name)
        if any(_same_placement(regime, other) for other in planned):
            print(f"regime {name}: {regime.note or 'the same placement as another'}; not run twice")
            continue
        planned.append(regime)
    return planned


def _same_placement(a: _regime.Regime, b: _regime.Regime) -> bool:
    return (a.name, a.callers, a.workers) == (b.name, b.callers, b.workers)


def summary(results: list[Result], regimes: list[str]) -> str:
    """Every row with a target: its target and, in each regime, its value and verdict."""
    cells: dict[tuple[str, str], dict[str, Row]] = {}
    for module, regime, rows in results:
        for row in rows:
            if row.verdict:
                cells.setdefault((module, row.name), {})[regime] = row
    lines = []
    for (module, name), by_regime in cells.items():
        ran = [by_regime.get(regime) for regime in regimes]
        targets: list[str] = []
        for cell in ran:
            if cell is not None and cell.target not in targets:
                targets.append(cell.target)
        target = targets[0] + "".join(f" ({text})" for text in targets[1:])
        values = ["-" if c is None else f"{c.ratio or c.figure} {c.verdict}" for c in ran]
        lines.append([module.removeprefix("bench_"), name, target, *values])
    header = ["module", "benchmark", "target", *regimes]
    note = "  (-: not run in that regime; modules with nothing placed on threads run once)"
    return format_grid("Summary: every target", header, lines) + "\n" + note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="small sizes, regime same: for CI")
    parser.add_argument(
        "--only", metavar="NAME", help="modules to run, comma-separated: e.g. registry,batch"
    )
    parser.add_argument(
        "--regime",
        choices=_regime.NAMES,
        help="same: the process on one CPU; cross: callers on one CPU, workers on another; "
        "free: no pinning (default: same and cross; with --quick: same)",
    )
    parser.add_argument(
        "--markdown",
        metavar="PATH",
        help="also write the figures as a Markdown page (docs/performance.md), both regimes",
    )
    args = parser.parse_args(argv)
    # Once something in this process sets the root logger (or the client's) to INFO, the HTTP
    # client logs a line per request: thousands of lines between the tables. Its records stop
    # here whatever level it is given later.
    for name in ("httpx", "httpx2"):  # the SDK's client uses httpx2
        client = logging.getLogger(name)
        client.setLevel(logging.WARNING)
        client.propagate = False
        client.addHandler(logging.NullHandler())
    names = discover()
    if args.only:
        wanted = [n if n.startswith("bench_") else f"bench_{n}" for n in args.only.split(",")]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            parser.error(f"no benchmark module {unknown[0]!r}; have: {', '.join(names)}")
        names = wanted
    regimes = regimes_for(args)
    print("regimes: " + "; ".join(regime.describe() for regime in regimes) + "\n", flush=True)
    started_all = time.perf_counter()
    status = 0
    results: list[Result] = []
    for name in names:
        module = importlib.import_module(f"{__package__}.{name}")
        once = getattr(module, "REGIME_INDEPENDENT", False)
        for regime in regimes[:1] if once else regimes:
            started = time.perf_counter()
            try:
                table, rows = run_module(name, args.quick, regime)
            except Exception:
                status = 1
                print(f"{name} [{regime.name}]: FAILED\n{traceback.format_exc()}", flush=True)
                continue
            results.append((name, regime.requested, rows))
            elapsed = time.perf_counter() - started
            print(f"{table}\n  ({name} [{regime.name}]: {elapsed:.1f} s)\n", flush=True)
    print(summary(results, [regime.requested for regime in regimes]))
    if args.markdown:
        titles = {name: title(importlib.import_module(f"{__package__}.{name}")) for name in names}
        text = _markdown.page(results, [regime.requested for regime in regimes], titles)
        Path(args.markdown).write_text(text, encoding="utf-8")
        print(f"\nwrote {args.markdown}")
    print(f"\n(all: {time.perf_counter() - started_all:.1f} s)", flush=True)
    return status


def title(module: types.ModuleType) -> str:
    """The first line of a benchmark module's docstring: what it measures."""
    return (module.__doc__ or module.__name__).strip().splitlines()[0]


if __name__ == "__main__":
    sys.exit(main())
