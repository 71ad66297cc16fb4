"""Provider loops: `run_tool_calls` on one model turn against a hand-written loop over `execute`.

One turn of a Chat Completions loop: a completion (a plain dict in the API's wire format, so
no SDK is needed) asking for 8 calls of a trivial tool (it returns a constant, so the figure is
pure overhead), turned into the 8 `tool` messages the next request sends.

* Hand-written loop (the baseline): for each tool call, parse its JSON arguments, run it with
  `registry.execute(ToolCall(...), token=turn, start_if_cancelled=False)` and build its
  `{"role": "tool", "tool_call_id", "content"}` message: what a careful user writes by hand.
* `run_tool_calls(registry, completion, token=turn)`: the same messages, the calls run as one
  model-driven `execute_batch`. Target <= 1.10x the hand-written loop, for a tool that is not
  `concurrency_safe` (the calls run one at a time either way).
* `execute_batch` on the same calls, parsed beforehand: how much of the difference is the
  batch's own (a scheduler that hands each exclusive call to a worker) rather than the
  parsing and the messages. No target.
* The same with a `concurrency_safe=True` tool (the batch may overlap the calls; the hand loop
  still runs them one by one). No target: reported so that it stays measured.

The figure is the median time per turn; ratios are medians of per-round ratios
(`_harness.interleaved`), on a registry whose workers are all started before timing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolreg import CancelSource, CancelToken, ToolCall, ToolRegistry
from toolreg.providers import openai as tp

from . import _regime
from ._harness import Rounds, Row, Target, format_time, interleaved, judged, start_registry_workers
from ._harness import timed_once as timed

WORKERS = 8
CALLS = 8  # tool calls in the turn
TARGET = Target(1.10)  # run_tool_calls / the hand-written loop
ARGUMENTS = '{"q": "quiescent cancellation", "limit": 10}'


@dataclass(frozen=True)
class Sizes:
    turns: int  # turns per timed run
    repeats: int


QUICK = Sizes(turns=50, repeats=5)
FULL = Sizes(turns=400, repeats=15)


def search(args: Any, ctx: Any) -> str:
    """The tool body every variant runs."""
    return "ok"


def completion(tool: str) -> dict[str, Any]:
    """A ChatCompletion, as the API sends it, asking for CALLS calls of `tool`."""
    calls = [
        {"id": f"call_{n}", "type": "function", "function": {"name": tool, "arguments": ARGUMENTS}}
        for n in range(CALLS)
    ]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    return {"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"message": message}]}


def hand_written(registry: ToolRegistry, source: dict[str, Any], turn: CancelToken) -> list[Any]:
    """The baseline: the loop a user writes over `registry.execute`."""
    messages = []
    for tool_call in source["choices"][0]["message"]["tool_calls"] or ():
        function = tool_call["function"]
        try:
            arguments = json.loads(function["arguments"] or "{}")
        except ValueError:
            arguments = function["arguments"]  # the registry refuses it: INVALID_ARGS
        call = ToolCall(function["name"], arguments, tool_call["id"])
        result = registry.execute(call, token=turn, start_if_cancelled=False)
        message = {"role": "tool", "tool_call_id": tool_call["id"], "content": result.content}
        messages.append(message)
    return messages


def measure(quick: bool) -> Rounds:
    """Seconds per turn of each variant, per round."""
    sizes = QUICK if quick else FULL
    turn = CancelSource().token
    with _regime.worker_side():
        registry = ToolRegistry(max_workers=WORKERS, thread_name_prefix="bench-providers")
        start_registry_workers(registry, WORKERS)
    registry.tool(search)
    registry.tool(name="search_safe", concurrency_safe=True)(search)
    exclusive, safe = completion("search"), completion("search_safe")
    parsed = tp.tool_calls(exclusive)
    try:
        assert hand_written(registry, exclusive, turn) == tp.run_tool_calls(
            registry, exclusive, token=turn
        ), "the two variants must build the same messages"

        def per_turn(run: Callable[[], object]) -> Callable[[], float]:
            def turns(n: int) -> None:
                for _ in range(n):
                    run()

            return lambda: timed(turns, sizes.turns) / sizes.turns

        variants: dict[str, Callable[[], float]] = {
            "hand": per_turn(lambda: hand_written(registry, exclusive, turn)),
            "provider": per_turn(lambda: tp.run_tool_calls(registry, exclusive, token=turn)),
            "batch": per_turn(lambda: registry.execute_batch(parsed, token=turn)),
            "hand, safe": per_turn(lambda: hand_written(registry, safe, turn)),
            "provider, safe": per_turn(lambda: tp.run_tool_calls(registry, safe, token=turn)),
        }
        with _regime.worker_side():  # a thread the warm-up starts (a batch runner) is a worker
            for variant in variants.values():
                variant()
        return interleaved(variants, sizes.repeats)
    finally:
        registry.close()


def run(quick: bool) -> list[Row]:
    """Measure and return the table's rows."""
    m = measure(quick)

    def figure(seconds: float) -> str:
        return f"{format_time(seconds)}/turn ({format_time(seconds / CALLS)}/call)"

    return [
        Row(f"loop over execute, {CALLS} calls (baseline)", figure(m["hand"]), "1.00x"),
        judged(
            f"run_tool_calls, {CALLS} calls",
            figure(m["provider"]),
            m.ratio("provider", "hand"),
            TARGET,
        ),
        Row(
            "execute_batch of the same calls, parsed beforehand (what the batch costs)",
            figure(m["batch"]),
            f"{m.ratio('batch', 'hand'):.2f}x",
        ),
        Row("loop over execute, concurrency_safe tool", figure(m["hand, safe"])),
        Row(
            "run_tool_calls, concurrency_safe tool (vs the hand loop on it)",
            figure(m["provider, safe"]),
            f"{m.ratio('provider, safe', 'hand, safe'):.2f}x",
        ),
    ]


if __name__ == "__main__":
    import sys

    from .__main__ import main

    sys.exit(main(["--only", "providers", *sys.argv[1:]]))
