"""The concurrent layer (`contract_concurrent`): calls cancelled from another thread at a random
moment, each checked against every outcome the model allows for that scenario.

A short run is part of every test run; `pytest --stress` adds a run of at least 100,000 calls on
16 threads with a 1 us switch interval. The seed is random and printed with any failure;
`CONTRACT_SEED=<n>` replays it.
"""

from __future__ import annotations

import os
import random

import pytest
from contract_concurrent import run_layer

pytestmark = pytest.mark.stress

SEED = int(os.environ.get("CONTRACT_SEED", random.randrange(1 << 30)))


def check(threads: int, calls_per_thread: int) -> int:
    layer = run_layer(threads, calls_per_thread, SEED)
    shown = "\n".join(map(str, layer.violations[:5]))
    assert not layer.violations, (
        f"CONTRACT_SEED={SEED}: {len(layer.violations)} of {layer.calls} calls left the outcomes "
        f"the model allows; the first:\n{shown}"
    )
    # Nested calls whose parent was cancelled before its body made them are not calls at all.
    assert layer.calls + layer.not_nested == threads * calls_per_thread
    assert layer.calls >= 0.9 * threads * calls_per_thread
    print(f"CONTRACT_SEED={SEED}: {layer.calls} calls on {threads} threads, each as allowed")
    return layer.calls


@pytest.mark.usefixtures("fast_thread_switching", "no_leaked_threads_or_fds")
def test_random_cancellation_only_ever_gives_an_outcome_the_model_allows() -> None:
    check(threads=8, calls_per_thread=150)


@pytest.mark.timeout(3600)
@pytest.mark.usefixtures("fast_thread_switching")
def test_stress_100000_calls_on_16_threads(request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("--stress"):
        pytest.skip("a long run: pytest --stress")
    assert check(threads=16, calls_per_thread=6_900) >= 100_000
