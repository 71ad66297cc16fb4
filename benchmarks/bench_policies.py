"""Around-wrapper policies: what TimeoutPolicy (and RetryPolicy) add to `execute`.

Every variant calls `registry.execute("timed", token=caller)`, a trivial tool declaring
`timeout=30` (the deadline never fires: this is the cost of arming, fusing and closing it), with
a caller token, as an agent loop passes one. A trivial tool is the worst case: a real tool's own
work dwarfs the policy.

* execute, no wrapper: the baseline, seconds per call.
* + TimeoutPolicy: the same registry with `TimeoutPolicy()` added, paired (target <= 1.10x).
* + a pass-through wrapper (`lambda dispatch, proceed: proceed()`): the share of the wrapper
  chain itself, so the rest is the deadline (a `deadline()` source, a timer, the fused token).
* + RetryPolicy: whose first attempt succeeds (it only adds a call and a result check).

The ratios are paired: each run times the bare registry and the one with the wrapper back to back
(ABBA, the wrapper added and removed on the same registry), and the table shows the median of
those ratios, which cancels most of the drift of a busy, shared machine. The absolute figures are
medians over the same interleaved repeats (`_harness.interleaved`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from toolreg import CancelSource, Dispatch, RetryPolicy, TimeoutPolicy, Tool, ToolRegistry

from ._harness import Row, format_time, interleaved, timed_once, verdict

TARGET = 1.10  # execute with TimeoutPolicy, as a multiple of execute without it
TOOL_TIMEOUT = 30.0  # seconds: never reached, so no deadline fires while timing


@dataclass(frozen=True)
class Sizes:
    calls: int  # calls per timed run
    repeats: int


QUICK = Sizes(calls=400, repeats=5)
FULL = Sizes(calls=2_000, repeats=15)

Wrapper = Callable[[Dispatch, Callable[[], Any]], Any]


def _pass_through(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
    return proceed()


WRAPPERS: dict[str, Callable[[], Wrapper]] = {
    "TimeoutPolicy": TimeoutPolicy,
    "pass-through": lambda: _pass_through,
    "RetryPolicy": RetryPolicy,
}


def _registry() -> tuple[ToolRegistry, CancelSource]:
    registry = ToolRegistry(max_workers=2)
    registry.register(Tool("timed", lambda args, ctx: "ok", timeout=TOOL_TIMEOUT))
    caller = CancelSource()
    _calls(registry, caller, 100)  # start the pool's threads, warm the caches
    return registry, caller


def _calls(registry: ToolRegistry, caller: CancelSource, n: int) -> None:
    token = caller.token
    for _ in range(n):
        registry.execute("timed", token=token)


def _per_call(count: int, wrapper: str | None) -> float:
    """Seconds per call, in a fresh registry with `wrapper` (or none) added."""
    registry, caller = _registry()
    with registry:
        if wrapper is not None:
            registry.add_around(WRAPPERS[wrapper]())
        return timed_once(partial(_calls, registry, caller), count) / count


def _paired(count: int, wrapper: str) -> float:
    """Seconds per call with `wrapper` over without, one registry, ABBA order."""
    registry, caller = _registry()
    run = partial(_calls, registry, caller)
    with registry:
        bare = timed_once(run, count)
        added = registry.add_around(WRAPPERS[wrapper]())
        wrapped = timed_once(run, count)
        wrapped += timed_once(run, count)
        added.remove()
        bare += timed_once(run, count)
    return wrapped / bare


def measure(quick: bool) -> dict[str, float]:
    """Medians: seconds per call (`execute`, `execute + X`) and paired ratios (`X / bare`)."""
    sizes = QUICK if quick else FULL
    n = sizes.calls
    variants: dict[str, Callable[[], float]] = {"execute": partial(_per_call, n, None)}
    for name in WRAPPERS:
        variants[f"execute + {name}"] = partial(_per_call, n, name)
        variants[f"{name} / bare"] = partial(_paired, n // 2, name)
    return interleaved(variants, sizes.repeats)


def run(quick: bool) -> list[Row]:
    """Measure and return the table's rows."""
    m = measure(quick)
    bare = m["execute"]
    rows = [Row("execute, tool timeout=30, no wrapper (baseline)", format_time(bare), "1.00x")]
    labels = {
        "TimeoutPolicy": "execute + TimeoutPolicy(), paired",
        "pass-through": "execute + pass-through around wrapper, paired",
        "RetryPolicy": "execute + RetryPolicy() (first try succeeds), paired",
    }
    for name, label in labels.items():
        factor = m[f"{name} / bare"]
        target = f"<= {TARGET:.2f}x" if name == "TimeoutPolicy" else ""
        result = verdict(factor, TARGET) if name == "TimeoutPolicy" else ""
        added = bare * (factor - 1)
        sign = "+" if added >= 0 else "-"
        figure = f"{format_time(m[f'execute + {name}'])} ({sign}{format_time(abs(added))})"
        rows.append(Row(label, figure, f"{factor:.2f}x", target, result))
    return rows


if __name__ == "__main__":
    import sys

    from ._harness import format_table

    print(format_table("bench_policies", run(quick="--quick" in sys.argv)))
