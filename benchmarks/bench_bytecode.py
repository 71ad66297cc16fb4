"""Bytecode: the Python instructions one call executes, counted, so a change is measured exactly.

The timed benchmarks swing by a few microseconds from run to run on a shared VM, more than a
trim of the pipeline saves. This one counts: the bytecode instructions (`sys.settrace` with
`f_trace_opcodes`) and the Python function calls of one call, with every stage and the body
on one thread. Each call is made nested, from inside a body running on a `WorkerPool` worker,
so it runs inline there: what is counted is the pipeline's own Python, without the hand-off.
On this machine one instruction of this code costs about 10 ns (3.11), so a count also reads
as the inline time it costs; the hop setting pays it again, up to twice over, in wake-ups.

* execute, no hooks: the baseline, a trivial tool on a caller token.
* one hook of each kind alone (pre-execute hook, guard, pass-through around wrapper,
  `TimeoutPolicy`, post-execute hook, observer), and the six together as in bench_registry.
* a batch item: `execute_batch` of 100 calls made inline (on a body thread the batch runs its
  calls one by one), per call.

Counts are exact and repeat from run to run (a count that differs between two runs of the same
call is reported as an error); they differ between Python versions, whose bytecode differs.
Nothing here depends on where threads run, so it runs once, in the first regime.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import FrameType
from typing import Any

from toolreg import (
    Allow,
    CancelSource,
    Dispatch,
    TimeoutPolicy,
    Tool,
    ToolCall,
    ToolContext,
    ToolRegistry,
    WorkerPool,
)

from ._harness import Row

REGIME_INDEPENDENT = True
BATCH = 100  # calls in the counted batch
TOOL_TIMEOUT = 30.0  # seconds: never reached


@dataclass(frozen=True)
class Count:
    instructions: int
    calls: int  # Python function calls (frames entered)


def _body(args: object, ctx: ToolContext) -> str:
    return "ok"


def _pass_through(dispatch: Dispatch, proceed: Callable[[], Any]) -> Any:
    return proceed()


def _add(registry: ToolRegistry, hook: str) -> None:
    """Register one hook of kind `hook` (a key of HOOKS) that lets every call through."""
    if hook == "pre-execute hook":
        registry.add_pre_execute(lambda call, token: Allow())
    elif hook == "guard":
        registry.add_guard(lambda call: None)
    elif hook == "around wrapper (pass-through)":
        registry.add_around(_pass_through)
    elif hook == "TimeoutPolicy":
        registry.add_around(TimeoutPolicy())
    elif hook == "post-execute hook":
        registry.add_post_execute(lambda result, token: None)
    else:
        registry.on_result(lambda result: None)


HOOKS = (
    "pre-execute hook",
    "guard",
    "around wrapper (pass-through)",
    "TimeoutPolicy",
    "post-execute hook",
    "observer",
)
SIX = (  # bench_registry's six, in its order
    "pre-execute hook",
    "guard",
    "TimeoutPolicy",
    "around wrapper (pass-through)",
    "post-execute hook",
    "observer",
)


def count(work: Callable[[], object]) -> Count:
    """The instructions and Python calls `work()` executes on this thread."""
    instructions = calls = 0

    def trace(frame: FrameType, event: str, arg: object) -> Callable[..., Any]:
        nonlocal instructions, calls
        if event == "opcode":
            instructions += 1
        elif event == "call":
            calls += 1
            frame.f_trace_opcodes = True
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        work()
    finally:
        sys.settrace(previous)
    # The trace function runs untraced: only the code `work()` runs is counted.
    return Count(instructions, calls)


def _exact(work: Callable[[], object]) -> Count:
    work()  # warm: first-use imports and caches
    first, second = count(work), count(work)
    if first != second:
        raise RuntimeError(f"counts differ between two runs: {first} and {second}")
    return first


def _registry(pool: WorkerPool, hooks: tuple[str, ...]) -> ToolRegistry:
    registry = ToolRegistry(executor=pool)
    registry.register(Tool("one", _body, timeout=TOOL_TIMEOUT, concurrency_safe=True))
    for hook in hooks:
        _add(registry, hook)
    return registry


def measure() -> dict[str, Count]:
    """Per variant, the count of one call (a batch item: of the batch, divided by BATCH)."""
    caller = CancelSource()
    token = caller.token
    pool = WorkerPool(2)
    variants: dict[str, tuple[str, ...]] = {"execute, no hooks": ()}
    variants.update({f"+ {name}": (name,) for name in HOOKS})
    variants["six hooks incl. TimeoutPolicy"] = SIX
    registries = {name: _registry(pool, hooks) for name, hooks in variants.items()}
    batch = [ToolCall("one", {}) for _ in range(BATCH)]

    def on_worker(args: object, ctx: ToolContext) -> dict[str, Count]:
        counts = {
            name: _exact(partial(registry.execute, "one", token=token))
            for name, registry in registries.items()
        }
        plain = registries["execute, no hooks"]
        whole = _exact(lambda: plain.execute_batch(batch, token=token))
        counts["execute_batch item"] = Count(whole.instructions // BATCH, whole.calls // BATCH)
        return counts

    host = ToolRegistry(executor=pool)
    host.register(Tool("count", on_worker, render=repr))
    try:
        result = host.execute("count")
        if not result.ok:
            raise RuntimeError(f"counting failed: {result.content}")
        counts: dict[str, Count] = result.value  # type: ignore[assignment]  # on_worker's
        return counts
    finally:
        host.close()
        for registry in registries.values():
            registry.close()
        pool.shutdown()


def run(quick: bool) -> list[Row]:
    """Count and return the table's rows (quick or not: a count takes no repeats)."""
    counts = measure()
    base = counts["execute, no hooks"].instructions
    rows = []
    for name, c in counts.items():
        figure = f"{c.instructions} instr, {c.calls} calls"
        label = f"{name} (baseline)" if name == "execute, no hooks" else name
        rows.append(Row(label, figure, f"{c.instructions / base:.2f}x"))
    return rows


if __name__ == "__main__":
    from .__main__ import main

    sys.exit(main(["--only", "bytecode", *sys.argv[1:]]))
