"""The model against the engine, scenario by scenario, in every way a call enters.

Coverage (`contract_scenarios` lists the families; the counts are checked below):

* The main entry modes run the whole enumeration (6,858 scenarios each): `execute` on the
  registry's own pool, `execute` with a ThreadPoolExecutor passed in (a ToolCall, not a name), a
  nested `ctx.execute`, a parallel and an exclusive `execute_batch` item, an awaited call
  through `toolreg.aio`, and an `async def` body.
* Two variants of `execute` run a seeded sample of 1,000 plus every scenario cancelled at
  entry: `start_if_cancelled=False` (they differ from `execute` only there) and the toolreg
  logger at DEBUG (which turns the engine's shortcuts off).
* The slow entries run a seeded sample each, without close() (final, and the MCP server and the
  cluster are shared): 300 over MCP (`tools/call` from the SDK's in-memory client, which
  cancels a request by cancelling its own call), 150 through each adapter entry (LangChain
  `invoke` and `ainvoke` with a model's tool call, the OpenAI Agents SDK's `on_invoke_tool`,
  pydantic-ai's `call_tool`), 60 on a threads Dask `LocalCluster` (the body on a worker).

The seed is the mode's name: the same scenarios on every run. A mismatch prints the scenario,
and each field in which the engine and the model differ.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable

import pytest
from contract_model import CLOSE, ENTRY, Outcome, Scenario, predict
from contract_modes import MAIN, SLOW, VARIANTS, Driver
from contract_scenarios import FAMILIES, enumeration, sample

from toolreg._cancel import manual_clock  # the contract's test clock (1.15, B.23)

SCENARIOS = enumeration()
VARIANT_SAMPLE = 1000
SLOW_SAMPLE = {
    "mcp": 300,
    "langchain": 150,
    "langchain_async": 150,
    "openai_agents": 150,
    "pydantic_ai": 150,
    "dask": 60,
}


def mismatches(mode: str, ran: list[tuple[Scenario, Outcome]]) -> list[str]:
    found = []
    for scenario, outcome in ran:
        expected = predict(scenario, mode)
        if outcome == expected:
            continue
        lines = [f"{mode}: {scenario}"]
        for field in dataclasses.fields(Outcome):
            got, want = getattr(outcome, field.name), getattr(expected, field.name)
            if got != want:
                pad = " " * len(field.name)
                lines.append(f"  {field.name}: engine {got!r}\n  {pad}  model  {want!r}")
        found.append("\n".join(lines))
    return found


def agree(mode: str, make: Callable[[], Driver], scenarios: list[Scenario]) -> None:
    with manual_clock() as clock:
        ran = make().run(scenarios, clock)
    assert len(ran) == len(scenarios), "a scenario was not run"
    found = mismatches(mode, ran)
    assert not found, f"{len(found)} of {len(ran)} disagree; the first:\n" + "\n".join(found[:5])


def test_the_enumeration_has_the_documented_size() -> None:
    sizes = {name: sum(1 for _ in family()) for name, family in FAMILIES.items()}
    assert sizes == {
        "gate_pairs": 1064,
        "approval": 1129,
        "around": 2200,
        "post": 1956,
        "cross": 678,
    }
    assert len(SCENARIOS) == 6858  # a few scenarios are in two families


@pytest.mark.parametrize("mode", sorted(MAIN))
def test_every_scenario_agrees_with_the_model(mode: str) -> None:
    agree(mode, MAIN[mode], SCENARIOS)


@pytest.mark.parametrize("mode", sorted(VARIANTS))
def test_a_sample_agrees_with_the_model(mode: str) -> None:
    at_entry = [s for s in SCENARIOS if s.site == ENTRY]
    rest = [s for s in SCENARIOS if s.site != ENTRY]
    agree(mode, VARIANTS[mode], at_entry + sample(rest, VARIANT_SAMPLE, mode))


@pytest.mark.parametrize("mode", sorted(SLOW))
def test_a_sample_agrees_with_the_model_through_an_integration(mode: str) -> None:
    module, make = SLOW[mode]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (its extra is not)")
    without_close = [s for s in SCENARIOS if s.by != CLOSE]
    agree(mode, make, sample(without_close, SLOW_SAMPLE[mode], mode))
