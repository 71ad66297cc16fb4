"""Around-wrapper policies: what TimeoutPolicy (and RetryPolicy) add to `execute`.

Every variant calls `registry.execute("timed", token=caller)`, a trivial tool declaring
`timeout=30` (the deadline never fires: this is the cost of arming, fusing and closing it), with
a caller token, as an agent loop passes one. A trivial tool is the worst case: a real tool's own
work dwarfs the policy. Each variant has a registry of its own (8 workers, all started before
timing), alike but for the one wrapper:

* execute, no wrapper: the baseline, seconds per call.
* + TimeoutPolicy: `TimeoutPolicy()` added. Target (issue 18, every regime): at most 5 us more
  per call, the median of the per-round differences from the baseline.
* + a pass-through wrapper (`lambda dispatch, proceed: proceed()`): the share of the wrapper
  chain itself, so the rest of TimeoutPolicy's cost is its deadline.
* + RetryPolicy: whose first attempt succeeds (it only adds a call and a result check).

Variants run interleaved in rounds (`_harness.interleaved`); figures are medians, the added
microseconds and ratios medians of the per-round differences and ratios.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from toolreg import CancelSource, Dispatch, RetryPolicy, TimeoutPolicy, Tool, ToolRegistry

from . import _regime
from ._harness import (
    Rounds,
    Row,
    Target,
    format_time,
    interleaved,
    judged,
    start_registry_workers,
    timed_once,
)

TARGET = Target(5e-6, unit="+us")  # seconds TimeoutPolicy may add to a call, in every regime
TOOL_TIMEOUT = 30.0  # seconds: never reached, so no deadline fires while timing
WORKERS = 8


@dataclass(frozen=True)
class Sizes:
    calls: int  # calls per timed run
    repeats: int


QUICK = Sizes(calls=500, repeats=7)
FULL = Sizes(calls=2_000, repeats=21)

Wrapper = Callable[[Dispatch, Callable[[], Any]], Any]


def _pass_through(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
    return proceed()


WRAPPERS: dict[str, Callable[[], Wrapper]] = {
    "TimeoutPolicy": TimeoutPolicy,
    "pass-through": lambda: _pass_through,
    "RetryPolicy": RetryPolicy,
}
LABELS = {
    "TimeoutPolicy": "execute + TimeoutPolicy()",
    "pass-through": "execute + pass-through around wrapper",
    "RetryPolicy": "execute + RetryPolicy() (first try succeeds)",
}


def _registry(wrapper: str | None) -> ToolRegistry:
    registry = ToolRegistry(max_workers=WORKERS)
    registry.register(Tool("timed", lambda args, ctx: "ok", timeout=TOOL_TIMEOUT))
    if wrapper is not None:
        registry.add_around(WRAPPERS[wrapper]())
    return registry


def _calls(registry: ToolRegistry, caller: CancelSource, n: int) -> None:
    token = caller.token
    for _ in range(n):
        registry.execute("timed", token=token)


def _per_call(registry: ToolRegistry, caller: CancelSource, n: int) -> float:
    return timed_once(partial(_calls, registry, caller), n) / n


def measure(quick: bool) -> Rounds:
    """Seconds per call of each variant (`execute`, `execute + <wrapper>`), per round."""
    sizes = QUICK if quick else FULL
    caller = CancelSource()
    registries: dict[str, ToolRegistry] = {}
    try:
        with _regime.worker_side():
            for wrapper in (None, *WRAPPERS):
                name = "execute" if wrapper is None else f"execute + {wrapper}"
                registry = registries[name] = _registry(wrapper)
                start_registry_workers(registry, WORKERS)
                _calls(registry, caller, 100)  # warm the caches
        variants = {
            name: partial(_per_call, registry, caller, sizes.calls)
            for name, registry in registries.items()
        }
        return interleaved(variants, sizes.repeats)
    finally:
        for registry in registries.values():
            registry.close()


def run(quick: bool) -> list[Row]:
    """Measure and return the table's rows."""
    m = measure(quick)
    bare = m["execute"]
    rows = [Row("execute, tool timeout=30, no wrapper (baseline)", format_time(bare), "")]
    for name, label in LABELS.items():
        key = f"execute + {name}"
        added = m.difference(key, "execute")
        figure = f"{format_time(m[key])} ({m.ratio(key, 'execute'):.2f}x)"
        if name == "TimeoutPolicy":
            rows.append(judged(label, figure, added, TARGET))
        else:
            rows.append(Row(label, figure, TARGET.show(added)))
    return rows


if __name__ == "__main__":
    import sys

    from .__main__ import main

    sys.exit(main(["--only", "policies", *sys.argv[1:]]))
