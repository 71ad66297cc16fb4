"""Shared fixtures: a registry and its observer, the echo registry of the log tests, a manual
clock, the adapter and provider tests' scenario, resource hygiene, GC control and fast thread
switching, and a check that no test leaves a signal handler changed. Every fixture is defined
here once; test files only add fixtures of their own."""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from _adapter_helpers import Scenario, scenario
from _registry_helpers import Observed, gc_paused, open_registry

from toolreg import ToolRegistry, deadline
from toolreg._cancel import manual_clock
from toolreg._timer import ManualClock

if TYPE_CHECKING:
    from _mcp_upstreams import Fifos

_FD_DIR = "/proc/self/fd"
# The signals whose handlers tests (or what they run: asyncio, anyio, toolreg's own deferrals)
# swap on the main thread.
_CHECKED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGALRM, signal.SIGCHLD)


def _wakeup_fd() -> int:
    """The fd `signal.set_wakeup_fd` writes to, or -1; it can only be read by setting it."""
    fd = signal.set_wakeup_fd(-1)
    if fd != -1:
        signal.set_wakeup_fd(fd)
    return fd


@pytest.fixture(autouse=True)
def signal_handlers_restored() -> Iterator[None]:
    """Fail a test that leaves a signal handler or the signal wake-up fd changed.

    A leaked handler changes how every later test sees a Ctrl-C (a batch defers a press only
    under Python's default handler), and what fails then is far from the cause. Tests run on
    the main thread, the only one allowed to read these.
    """
    before = [signal.getsignal(signum) for signum in _CHECKED_SIGNALS]
    wakeup = _wakeup_fd()
    yield
    changed = []
    for signum, old in zip(_CHECKED_SIGNALS, before, strict=True):
        new = signal.getsignal(signum)
        if new is not old:
            changed.append(f"{signal.Signals(signum).name}: {old!r} -> {new!r}")
            if old is not None:  # None: installed outside Python, cannot be put back
                signal.signal(signum, old)  # so that only the leaking test fails
    left = _wakeup_fd()
    if left != wakeup:
        signal.set_wakeup_fd(wakeup)
        changed.append(f"wake-up fd: {wakeup} -> {left}")
    assert changed == [], f"signal state left changed: {changed}"


@pytest.fixture
def registry() -> Iterator[ToolRegistry]:
    """A registry with four workers, closed when the test ends."""
    with open_registry(max_workers=4) as reg:
        yield reg


@pytest.fixture
def observed(registry: ToolRegistry) -> Observed:
    """Every final result `registry` produces, in order."""
    seen = Observed()
    registry.on_result(seen)
    return seen


@pytest.fixture
def echo_registry() -> Iterator[ToolRegistry]:
    """A registry with four workers, `echo` (returns its arguments) and `boom` (raises), closed
    when the test ends."""
    with ToolRegistry(max_workers=4) as registry:

        @registry.tool
        def echo(args: Any, ctx: Any) -> Any:
            return dict(args)

        @registry.tool
        def boom(args: Any, ctx: Any) -> Any:
            raise ValueError("boom")

        yield registry


@pytest.fixture
def clock() -> Iterator[ManualClock]:
    """Deadlines created in the test fire only when it calls `clock.advance(seconds)`."""
    with manual_clock() as manual:
        yield manual


@pytest.fixture
def s() -> Iterator[Scenario]:
    """A `Scenario` (`_adapter_helpers`: a registry with the adapter tests' tools), closed with
    every call settled when the test ends."""
    with scenario() as made:
        yield made


def _open_fd_count() -> int | None:
    if not os.path.isdir(_FD_DIR):
        return None
    return len(os.listdir(_FD_DIR))


@pytest.fixture
def no_leaked_threads_or_fds() -> Iterator[None]:
    """Fail the test if it leaves threads running or file descriptors open.

    The shared `toolreg-timer` thread is process-wide and started lazily, so it is started before
    measuring: a test that merely creates the first deadline does not count as a leak.
    """
    warm = deadline(None, 3600.0)
    warm.token.on_cancel(lambda: None)  # a listener arms it, which starts the timer thread
    warm.close()
    threads_before = set(threading.enumerate())
    fds_before = _open_fd_count()
    yield
    for thread in set(threading.enumerate()) - threads_before:
        thread.join(timeout=5.0)  # a test's own helper may still be on its way out
    leaked = [t.name for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert leaked == [], f"threads left running: {leaked}"
    assert _open_fd_count() == fds_before, "file descriptors left open"


@pytest.fixture
def gc_disabled() -> Iterator[None]:
    """Run the test with the cyclic garbage collector off (memory must not depend on it)."""
    gc.collect()
    with gc_paused():
        yield


@pytest.fixture
def fast_thread_switching() -> Iterator[None]:
    """Switch threads every microsecond, so races interleave inside short critical paths."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@pytest.fixture(scope="module")
def fifos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fifos]:
    """The report and release FIFOs of the `mcp_upstream` bodies (see `_mcp_upstreams`)."""
    from _mcp_upstreams import Fifos  # here: it imports the MCP SDK, which may be missing

    made = Fifos(tmp_path_factory.mktemp("fifos"))
    yield made
    made.close()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stress",
        action="store_true",
        help="run the long stress runs too (tests/contract: 100,000 calls on 16 threads)",
    )
