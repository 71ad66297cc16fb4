"""The benchmark harness itself: paired per-round ratios, thread placement per regime, and the
`-X importtime` parser. (The benchmarks' figures are never asserted: they live in
`python -m benchmarks`, not in timed tests.)"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `benchmarks` lives next to `tests`, outside the package
    sys.path.insert(0, str(ROOT))

from benchmarks import _markdown, _regime  # noqa: E402
from benchmarks._harness import Rounds, Row, Target, interleaved  # noqa: E402
from benchmarks.bench_footprint import foreign_imports, parse_importtime  # noqa: E402

WAIT = 10.0

two_cpus = pytest.mark.skipif(
    not _regime.can_pin() or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux CPU affinity and two usable CPUs",
)


def test_ratio_is_the_median_of_per_round_ratios_not_the_ratio_of_medians() -> None:
    rounds = Rounds({"a": [1.0, 10.0, 3.0], "b": [1.0, 2.0, 3.0]})
    assert rounds["a"] == 3.0 and rounds["b"] == 2.0  # medians: their ratio would be 1.5
    assert rounds.ratio("a", "b") == 1.0  # per round: 1, 5, 1
    assert rounds.difference("a", "b") == 0.0  # per round: 0, 8, 0


def test_interleaved_rotates_the_order_every_round_with_the_gc_off() -> None:
    seen: list[tuple[str, bool]] = []

    def variant(name: str) -> Callable[[], float]:
        def measure() -> float:
            seen.append((name, gc.isenabled()))
            return 1.0

        return measure

    rounds = interleaved({"x": variant("x"), "y": variant("y"), "z": variant("z")}, 3)
    assert [name for name, _ in seen] == list("xyzyzxzxy")
    assert not any(enabled for _, enabled in seen)
    assert rounds.samples == {"x": [1.0] * 3, "y": [1.0] * 3, "z": [1.0] * 3}


def test_a_target_holds_free_runs_to_the_cross_limit() -> None:
    target = Target(1.00, 1.10)
    assert (target.verdict(1.05, "same"), target.verdict(1.05, "cross")) == ("MISS", "PASS")
    assert target.verdict(1.05, "free") == "PASS"
    assert target.text("same") == "<= 1.00x" and target.text("cross") == "<= 1.10x"


def test_cross_degrades_to_same_on_one_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if not _regime.can_pin():
        pytest.skip("needs Linux CPU affinity")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    regime = _regime.plan("cross")
    assert (regime.name, regime.requested) == ("same", "cross")
    assert regime.callers == regime.workers == frozenset({3})
    assert "one CPU" in regime.note


class Parked:
    """A thread parked on an Event until released, so its affinity can be read from outside."""

    def __init__(
        self, role: Callable[[], contextlib.AbstractContextManager[None]] | None = None
    ) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.role = role
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.started.wait(WAIT)

    def _run(self) -> None:
        if self.role is None:
            self._park()
        else:
            with self.role():
                self._park()

    def _park(self) -> None:
        self.started.set()
        self.release.wait(WAIT)

    @property
    def cpus(self) -> set[int]:
        assert self.thread.native_id is not None
        return os.sched_getaffinity(self.thread.native_id)

    def join(self) -> None:
        self.release.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive()


@pytest.fixture
def parked() -> Iterator[list[Parked]]:
    threads: list[Parked] = []
    yield threads
    for thread in threads:
        thread.join()


@two_cpus
def test_cross_puts_callers_on_one_cpu_and_every_other_thread_on_the_other(
    parked: list[Parked],
) -> None:
    before = os.sched_getaffinity(0)
    regime = _regime.plan("cross")
    assert regime.name == "cross" and not regime.callers & regime.workers
    older = Parked()  # alive before the regime: a worker once it is entered
    parked.append(older)
    with _regime.active(regime):
        assert os.sched_getaffinity(0) == regime.callers
        assert older.cpus == regime.workers
        with _regime.worker_side():
            born_there = Parked()  # a pool thread started during warm-up
        parked.append(born_there)
        assert born_there.cpus == regime.workers
        assert os.sched_getaffinity(0) == regime.callers  # back on the callers' CPU
        late = Parked()  # started by a caller after warm-up: moved by the next settle()
        caller = Parked(_regime.caller)
        parked += [late, caller]
        assert late.cpus == regime.callers
        _regime.settle()
        assert late.cpus == regime.workers
        assert caller.cpus == regime.callers
        placement = _regime.placement()
        assert placement.startswith("cross: callers on CPU")
    for thread in (older, born_there, late, caller):
        assert thread.cpus == before
    assert os.sched_getaffinity(0) == before


@two_cpus
def test_same_pins_every_thread_even_one_started_before_it(parked: list[Parked]) -> None:
    before = os.sched_getaffinity(0)
    regime = _regime.plan("same")
    older = Parked()
    parked.append(older)
    with _regime.active(regime):
        newer = Parked()
        parked.append(newer)
        assert older.cpus == newer.cpus == os.sched_getaffinity(0) == set(regime.callers)
        assert len(regime.callers) == 1
    assert older.cpus == newer.cpus == os.sched_getaffinity(0) == before


def test_a_regime_cannot_be_entered_twice() -> None:
    with _regime.active(_regime.plan("free")):
        again = _regime.active(_regime.plan("free"))
        with pytest.raises(RuntimeError, match="already"):
            again.__enter__()


IMPORTTIME = """\
import time: self [us] | cumulative | imported package
import time:       100 |        100 |   _weakrefset
import time:       300 |        400 | threading
import time:        50 |         50 |       _heapq
import time:       200 |        250 |     heapq
import time:       700 |        950 |   toolreg._timer
import time:        80 |         80 |     logging.handlers
import time:       400 |        480 |   logging
import time:       100 |       1530 | toolreg
"""


def test_importtime_lines_are_parsed_with_their_nesting() -> None:
    entries = parse_importtime(IMPORTTIME)
    assert [(e.level, e.name, e.cumulative_us) for e in entries] == [
        (1, "_weakrefset", 100),
        (0, "threading", 400),
        (3, "_heapq", 50),
        (2, "heapq", 250),
        (1, "toolreg._timer", 950),
        (2, "logging.handlers", 80),
        (1, "logging", 480),
        (0, "toolreg", 1530),
    ]
    # Imports made by toolreg's own modules, by top-level package (not their own imports).
    assert foreign_imports(entries) == {"heapq": 250, "logging": 480}


# -- the performance page (`python -m benchmarks --markdown PATH`) ------------------------------


def test_each_row_of_the_page_names_its_baseline() -> None:
    rows = [
        Row("import time", "9 ms", "", "<= 20 ms", "PASS"),  # before any baseline: none
        Row("fast path", "1 us", "0.50x", "<= 1.00x", "PASS", baseline="pool"),  # named
        Row("pool (baseline)", "2 us", "1.00x"),
        Row("pool, wrapped", "3 us", "1.50x"),
        Row("one call (baseline of the next two)", "4 us"),
        Row("batch of one", "8 us", "2.00x"),
        Row("a count", "0 per 1,000", "", "<= 1 per 1,000", "PASS", baseline=""),  # none
        Row("a note, no ratio", "7 things"),
    ]
    assert _markdown.baselines(rows) == [
        "",
        "pool",
        "baseline",
        "pool",
        "baseline",
        "one call",
        "",
        "",
    ]


def test_the_page_has_both_regimes_the_summary_and_a_table_per_module() -> None:
    same = [
        Row("hop (baseline)", "2 us", "1.00x"),
        Row("execute", "1 us", "0.50x", "<= 1.00x", "PASS"),
    ]
    cross = [
        Row("hop (baseline)", "9 us", "1.00x"),
        Row("execute", "9 us", "1.10x", "<= 1.10x", "PASS"),
    ]
    page = _markdown.page(
        [("bench_registry", "same", same), ("bench_registry", "cross", cross)],
        ["same", "cross"],
        {"bench_registry": "The registry | against the hop."},
    )
    assert page.startswith("# Performance\n")
    assert (
        "| execute (registry) | hop | <= 1.00x (same); <= 1.10x (cross) | 0.50x PASS | 1.10x PASS |"
        in page
    )
    assert "### bench_registry\n\nThe registry | against the hop.\n" in page
    header = (
        "| benchmark | against | same: median | same: vs base | cross: median | cross: vs base |"
    )
    assert f"{header} target |" in page
    row = "| execute | hop | 1 us | 0.50x PASS | 9 us | 1.10x PASS |"
    assert f"{row} <= 1.00x (same); <= 1.10x (cross) |" in page
    assert page.endswith("|\n") and "\n\n\n" not in page
