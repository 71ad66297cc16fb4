"""The concurrent layer: scenarios whose cancellation comes from another thread at a random
moment, each call checked against the set of outcomes the model allows
(`contract_model.allowed_outcomes`: the cancellation lands before any one of the call's steps,
or never).

Every call also keeps what holds whatever the timing (`contract_harness.outcome_of`): exactly
one observed result, the one the entry returned, and every started body joined. Between them,
the allowed set rules out a body started after a stage saw the cancellation, a success let
through after it, and a stage run after a recheck that should have stopped the call.

Who cancels: the caller (its source, from a partner thread after a random spin), the owner of
a scope wrapper (the same), or a TimeoutPolicy deadline of a short real timeout (the timer
thread). The registries are shared by all threads: one per scenario shape, each with its own
pool, and the same again on a ThreadPoolExecutor passed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import queue
import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from contract_harness import (
    FAST_SAFE_TOOL,
    FAST_TOOL,
    PARENT_TOOL,
    SAFE_TOOL,
    TOOL,
    WAIT,
    Bench,
    Run,
    outcome_of,
)
from contract_model import (
    ASK,
    CACHE,
    CALLER,
    CANCELLED,
    COOPERATIVE,
    DEADLINE,
    FLAKY,
    KEEP,
    NONE,
    PASS,
    RAISE,
    RETRY,
    SCOPE,
    SCOPE_OWNER,
    SUCCESS,
    TIMEOUT,
    VALUE,
    YES,
    Outcome,
    Scenario,
    allowed_outcomes,
)

from toolreg import ToolCall, ToolRegistry, ToolResult
from toolreg.aio import AsyncToolRegistry

FAST_TIMEOUT = 0.0002  # seconds: a deadline that comes due at a random point of the call
SLOW_TIMEOUT = 3600.0  # the other calls' timeout: it never comes due
MAX_SPINS = 3000  # the partner spins up to this many loop turns before it cancels

BODIES = (VALUE, RAISE, CANCELLED, COOPERATIVE, FLAKY)

#: The scenarios of each shape (the hooks a shared registry has registered).
SHAPES: dict[str, list[Scenario]] = {
    "plain": [Scenario(body=b) for b in BODIES],
    "timeout": [Scenario(wrappers=(TIMEOUT,), body=b) for b in BODIES],
    "retry_timeout": [Scenario(wrappers=(RETRY, TIMEOUT), body=b) for b in BODIES],
    "timeout_retry": [Scenario(wrappers=(TIMEOUT, RETRY), body=b) for b in BODIES],
    "scope": [Scenario(wrappers=(SCOPE, TIMEOUT), post=(KEEP,), body=b) for b in BODIES],
    "gate": [
        Scenario(pre=(d,), approver=a, guards=(PASS,), wrappers=(w,), post=(p,), body=b)
        for d, a, w, p, b in itertools.product(
            (NONE, ASK, CANCELLED),
            (YES, CANCELLED),
            (PASS, SCOPE, CACHE),
            (KEEP, SUCCESS, CANCELLED),
            (VALUE, COOPERATIVE),
        )
    ],
}

MODES = ("execute", "execute_executor", "nested", "batch_parallel", "batch_exclusive", "awaited")


def cancellers(scenario: Scenario) -> tuple[str, ...]:
    return (
        (CALLER,)
        + ((SCOPE_OWNER,) if SCOPE in scenario.wrappers else ())
        + ((DEADLINE,) if TIMEOUT in scenario.wrappers else ())
    )


@dataclasses.dataclass(frozen=True)
class Violation:
    mode: str
    scenario: Scenario
    by: str
    outcome: Outcome | str

    def __str__(self) -> str:
        return f"{self.mode}, {self.scenario}, cancelled by the {self.by}: {self.outcome}"


class Partner:
    """A thread that cancels for one caller thread: after a random spin, runs the job's fn."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], object], int] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="contract-canceller", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, spins = job
            for _ in range(spins):
                pass
            fn()

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "a canceller thread did not stop"


def cancel_scope(run: Run) -> None:
    with contextlib.suppress(IndexError):  # the wrapper may have closed it meanwhile
        run.scopes[-1].cancel("scope")


class Layer:
    """The shared registries, and one call of a random scenario at a time per thread."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.benches: dict[tuple[str, bool], Bench] = {}
        for shape in SHAPES:
            for given in (False, True):
                registry = stack.enter_context(_registry(given))
                bench = Bench(registry, timeout=SLOW_TIMEOUT, fast=FAST_TIMEOUT)
                stack.enter_context(bench.shaped(SHAPES[shape][0]))
                self.benches[shape, given] = bench
        self.violations: list[Violation] = []
        self.calls = 0
        self.not_nested = 0
        self._lock = threading.Lock()  # guards violations, calls and not_nested

    def worker(self, seed: int, calls: int) -> None:
        """One caller thread: `calls` random calls, each with its own random cancellation."""
        rng = random.Random(seed)
        partner = Partner()
        loop = asyncio.new_event_loop()
        facades: dict[int, AsyncToolRegistry] = {}
        try:
            for _ in range(calls):
                self.one(rng, partner, loop, facades)
        finally:
            partner.stop()
            for facade in facades.values():
                loop.run_until_complete(facade.aclose())
            loop.close()

    def one(
        self,
        rng: random.Random,
        partner: Partner,
        loop: asyncio.AbstractEventLoop,
        facades: dict[int, AsyncToolRegistry],
    ) -> None:
        shape = rng.choice(list(SHAPES))
        scenario = rng.choice(SHAPES[shape])
        mode = rng.choice(MODES)
        by = rng.choice(cancellers(scenario))
        bench = self.benches[shape, mode == "execute_executor"]
        registry = bench.registry
        fast = by == DEADLINE
        try:
            with Run(scenario) as run:
                if by != DEADLINE and rng.random() < 0.9:
                    fn = run.source.cancel if by == CALLER else lambda: cancel_scope(run)
                    partner.jobs.put((fn, rng.randrange(MAX_SPINS)))
                returned = call(registry, run, mode, fast, loop, facades)
                if mode == "nested" and run.call_token is None and not run.events:
                    # Cancelled before the parent's body started: no nested call was made.
                    with self._lock:
                        self.not_nested += 1
                    return
                outcome: Outcome | str = outcome_of(run)
                assert returned is run.observed[0], "the entry returned another result"
        except AssertionError as exc:
            outcome = f"broke an invariant: {exc}"
        timeout = FAST_TIMEOUT if fast else SLOW_TIMEOUT
        allowed = allowed_outcomes(scenario, mode, by, timeout)
        with self._lock:
            self.calls += 1
            if outcome not in allowed:
                self.violations.append(Violation(mode, scenario, by, outcome))


@contextlib.contextmanager
def _registry(given: bool) -> Iterator[ToolRegistry]:
    if not given:
        with ToolRegistry(max_workers=8, thread_name_prefix="contract-layer") as registry:
            yield registry
        return
    pool = ThreadPoolExecutor(8, thread_name_prefix="contract-layer-tpe")
    with pool, ToolRegistry(executor=pool) as registry:
        yield registry


def call(
    registry: ToolRegistry,
    run: Run,
    mode: str,
    fast: bool,
    loop: asyncio.AbstractEventLoop,
    facades: dict[int, AsyncToolRegistry],
) -> ToolResult[Any]:
    """One call of `run` entered as `mode`."""
    tool = FAST_TOOL if fast else TOOL
    token = run.source.token
    if mode in ("execute", "execute_executor"):
        return registry.execute(tool, run.arguments, token=token)
    if mode == "nested":
        registry.execute(PARENT_TOOL, {"nest": run.id, "tool": tool}, token=token)
        returned: ToolResult[Any] = run.returned
        return returned
    if mode.startswith("batch"):
        if mode == "batch_parallel":
            tool = FAST_SAFE_TOOL if fast else SAFE_TOOL
        [result] = registry.execute_batch([ToolCall(tool, run.arguments)], token=token)
        return result
    assert mode == "awaited"
    facade = facades.get(id(registry))
    if facade is None:
        facade = facades[id(registry)] = AsyncToolRegistry(registry)
    return loop.run_until_complete(facade.execute(tool, run.arguments, token=token))


def run_layer(threads: int, calls_per_thread: int, seed: int) -> Layer:
    """`threads` caller threads, each making `calls_per_thread` calls; the layer's findings."""
    with contextlib.ExitStack() as stack:
        layer = Layer(stack)
        failures: list[BaseException] = []

        def work(index: int) -> None:
            try:
                layer.worker(seed * 1000 + index, calls_per_thread)
            except BaseException as exc:  # reported by the test, never lost in the thread
                failures.append(exc)

        workers = [
            threading.Thread(target=work, args=(i,), name=f"contract-caller-{i}")
            for i in range(threads)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if failures:
            raise failures[0]
    return layer
