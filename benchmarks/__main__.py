"""`python -m benchmarks [--quick] [--only NAME]`: run every `benchmarks/bench_*.py` module.

Each module's `run(quick)` returns its rows. A module that prints its own table is shown as it
printed it; otherwise its rows are printed with `_harness.format_table`. One table per module.
A module that raises is reported and makes the exit status 1 (a missed target never does).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import pkgutil
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from ._harness import Row, format_table


def discover() -> list[str]:
    """Names of the benchmark modules, sorted: `bench_cancel`, `bench_log`, ..."""
    here = [str(Path(__file__).parent)]
    return sorted(m.name for m in pkgutil.iter_modules(here) if m.name.startswith("bench_"))


def run_module(name: str, quick: bool) -> str:
    """Run one module's benchmarks; return the table it printed or that its rows make."""
    module = importlib.import_module(f"{__package__}.{name}")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rows = module.run(quick)
    if printed.getvalue().strip():
        return printed.getvalue().rstrip()
    title = (module.__doc__ or name).strip().splitlines()[0]
    return format_table(f"{name}: {title}", [_as_row(row) for row in rows])


def _as_row(row: object) -> Row:
    if isinstance(row, Row):
        return row
    cells = [str(cell) for cell in row] if isinstance(row, Sequence) else [str(row)]
    return Row(*cells[:5])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="small sizes: seconds per module")
    parser.add_argument("--only", metavar="NAME", help="one module, e.g. cancel or bench_cancel")
    args = parser.parse_args(argv)
    names = discover()
    if args.only:
        wanted = args.only if args.only.startswith("bench_") else f"bench_{args.only}"
        if wanted not in names:
            parser.error(f"no benchmark module {wanted!r}; have: {', '.join(names)}")
        names = [wanted]
    status = 0
    for name in names:
        started = time.perf_counter()
        try:
            table = run_module(name, args.quick)
        except Exception:
            status = 1
            print(f"{name}: FAILED\n{traceback.format_exc()}", flush=True)
            continue
        print(f"{table}\n  ({name}: {time.perf_counter() - started:.1f} s)\n", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
