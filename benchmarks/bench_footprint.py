"""Footprint: the time `import toolreg` takes, what it pulls in, and memory over many calls.

* import: `python -X importtime -c "import toolreg"` in fresh interpreters, the cumulative time
  of the `toolreg` line, median of the runs. With a warm bytecode cache: the package is
  compiled first (`compileall`; this environment may set PYTHONDONTWRITEBYTECODE, and then
  every run would compile it again) and one untimed run imports it with bytecode writing on,
  so whatever it imports has its cache too. Target (issue 18): <= 20 ms.
* pulled in: the modules `import toolreg` adds to a fresh interpreter's `sys.modules`; none of
  asyncio, ssl, fastjsonschema and typing_extensions may be among them (what only async
  bodies, the facade or remote `$ref`s need loads when first needed). The costliest modules it
  imports (cumulative time of the imports made directly by toolreg's modules) are listed.
* memory: `registry.execute` of a trivial tool on one long-lived caller token, 1,000,000 times
  (quick: 20,000), with the cyclic GC off: the tracemalloc-traced bytes still allocated after
  them (must stay flat: < 64 KiB), and what the caller token holds (listeners and children:
  must be 0).

Nothing here depends on where threads run, so it runs once, in the first regime.
"""

from __future__ import annotations

import collections
import compileall
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import toolreg
from toolreg import CancelSource, Tool, ToolRegistry

from ._harness import Row, Target, judged

REGIME_INDEPENDENT = True
IMPORT_TARGET = Target(0.020, unit="ms")
FORBIDDEN = ("asyncio", "ssl", "fastjsonschema", "typing_extensions")
FLAT_BYTES = 64 * 1024
SUBPROCESS_TIMEOUT = 120.0  # seconds: a fresh interpreter on a loaded machine


@dataclass(frozen=True)
class Sizes:
    imports: int  # fresh interpreters timed (the figure is their median)
    calls: int  # calls on one caller token


QUICK = Sizes(imports=5, calls=20_000)
FULL = Sizes(imports=21, calls=1_000_000)


@dataclass(frozen=True)
class Entry:
    """One line of `-X importtime`: a module, its nesting level and its times (us)."""

    level: int
    name: str
    self_us: int
    cumulative_us: int


def parse_importtime(stderr: str) -> list[Entry]:
    """The entries of `-X importtime` output, in the order printed (a module after its imports)."""
    entries = []
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:") :].split("|", 2)
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue  # the header
        raw = parts[2][1:]  # one space after the bar, then two per level of nesting
        level = (len(raw) - len(raw.lstrip(" "))) // 2
        entries.append(Entry(level, raw.strip(), int(parts[0]), int(parts[1])))
    return entries


def foreign_imports(entries: list[Entry]) -> dict[str, int]:
    """Cumulative us of each top-level package imported directly by a toolreg module."""
    costs: collections.Counter[str] = collections.Counter()
    for index, entry in enumerate(entries):
        if entry.name.split(".")[0] == "toolreg":
            continue
        parent = next((e for e in entries[index + 1 :] if e.level < entry.level), None)
        if parent is not None and parent.name.split(".")[0] == "toolreg":
            costs[entry.name.split(".")[0]] += entry.cumulative_us
    return dict(costs)


def _python(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=True,
        env=env,
    )


def warm_bytecode() -> None:
    """Compile toolreg, then import it once with bytecode writing on (its imports get caches)."""
    compileall.compile_dir(str(Path(toolreg.__file__).parent), quiet=2)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    _python("-c", "import toolreg", env=env)


def import_times(runs: int) -> tuple[list[float], dict[str, float]]:
    """Seconds `import toolreg` took in each fresh interpreter; median us of its foreign imports."""
    seconds = []
    foreign: dict[str, list[int]] = collections.defaultdict(list)
    for _ in range(runs):
        entries = parse_importtime(_python("-X", "importtime", "-c", "import toolreg").stderr)
        top = [e for e in entries if e.name == "toolreg" and e.level == 0]
        if not top:
            raise RuntimeError("-X importtime printed no line for toolreg")
        seconds.append(top[0].cumulative_us / 1e6)
        for name, cost in foreign_imports(entries).items():
            foreign[name].append(cost)
    return seconds, {name: statistics.median(costs) for name, costs in foreign.items()}


def pulled_in() -> list[str]:
    """The modules `import toolreg` adds to a fresh interpreter's `sys.modules`."""
    script = (
        "import json, sys; before = set(sys.modules); import toolreg; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    return list(json.loads(_python("-c", script).stdout))


def _body(args: Any, ctx: Any) -> int:
    return 1


def growth(calls: int) -> tuple[int, int, float]:
    """Traced bytes grown over `calls` calls on one caller token, what the token holds after
    them, and the seconds they took."""
    with ToolRegistry(max_workers=2) as registry:
        registry.register(Tool("one", _body))
        caller = CancelSource()
        for _ in range(1000):  # warm caches and pool threads before measuring
            registry.execute("one", token=caller.token)
        gc.collect()
        gc.disable()
        tracemalloc.start()
        started = time.perf_counter()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(calls):
                registry.execute("one", token=caller.token)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            elapsed = time.perf_counter() - started
            tracemalloc.stop()
            gc.enable()
        token = caller.token
        held = len(token._listeners or ()) + len(token._children or ())
        return grown, held, elapsed


def run(quick: bool) -> list[Row]:
    """Measure and return the table's rows."""
    sizes = QUICK if quick else FULL
    warm_bytecode()
    seconds, foreign = import_times(sizes.imports)
    median = statistics.median(seconds)
    loaded = pulled_in()
    heavy = [n for n in FORBIDDEN if any(m == n or m.startswith(f"{n}.") for m in loaded)]
    costliest = sorted(foreign.items(), key=lambda item: -item[1])[:5]
    grown, held, elapsed = growth(sizes.calls)
    flat = held == 0 and grown < FLAT_BYTES
    return [
        judged(
            "import toolreg, warm bytecode cache (fresh interpreters)",
            f"{median * 1e3:.1f} ms",
            median,
            IMPORT_TARGET,
        ),
        Row(
            f"import toolreg loads {', '.join(FORBIDDEN)}",
            f"{', '.join(heavy) if heavy else 'none of them'} ({len(loaded)} modules in all)",
            "",
            "none",
            "MISS" if heavy else "PASS",
        ),
        Row(
            "costliest imports made by toolreg's modules (cumulative, median)",
            ", ".join(f"{name} {cost / 1e3:.1f} ms" for name, cost in costliest) or "-",
        ),
        Row(
            f"memory after {sizes.calls:,} calls on one caller token",
            f"{grown / 1024:.1f} KiB grown, {held} held ({elapsed:.0f} s traced)",
            "",
            "< 64 KiB, 0 held",
            "PASS" if flat else "MISS",
        ),
    ]


if __name__ == "__main__":
    from .__main__ import main

    sys.exit(main(["--only", "footprint", *sys.argv[1:]]))
