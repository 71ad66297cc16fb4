"""Tool bodies for `test_distributed.py`, in a module the Dask workers can import.

They coordinate with the test through `distributed.Event`s named in their arguments (a
`threading.Event` cannot cross into a worker process). Every wait is bounded by `WAIT`.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from distributed import Event, get_worker

from toolreg import timeout_of

WAIT = 10.0  # seconds any handshake may take before the body gives up

Args = Any
Ctx = Any


def add(args: Args, ctx: Ctx) -> int:
    total: int = args["a"] + args["b"]
    return total


def fail(args: Args, ctx: Ctx) -> None:
    raise ValueError(f"bad input {args.get('what', '')}".strip())


def hold(args: Args, ctx: Ctx) -> str:
    """Occupy a worker thread until the test sets `release`."""
    Event(args["started"]).set()
    if not Event(args["release"]).wait(WAIT):
        raise TimeoutError("never released")
    return "released"


def mark(args: Args, ctx: Ctx) -> str:
    """Record that this body started (it must not, in the tests that use it)."""
    Event(args["started"]).set()
    return "ran"


def wait_for_cancel(args: Args, ctx: Ctx) -> str:
    """Wait for the call's cancellation; keep what the body saw as a deferred context.

    With `saw`/`release` in the arguments, it then holds on until the test releases it, so the
    test can check that the caller is still waiting.
    """
    Event(args["started"]).set()
    cancelled = ctx.token.wait(WAIT)
    reason = ctx.token.reason
    ctx.defer_context(
        {"cancelled": cancelled, "reason": str(reason), "timeout": timeout_of(reason) is not None}
    )
    if "release" in args:
        Event(args["saw"]).set()
        Event(args["release"]).wait(WAIT)
    ctx.token.raise_if_cancelled()
    return "never cancelled"


def ignore_token(args: Args, ctx: Ctx) -> str:
    """Never look at the token: run until the test releases it."""
    Event(args["started"]).set()
    Event(args["release"]).wait(WAIT)
    return "done anyway"


def token_state(args: Args, ctx: Ctx) -> list[Any]:
    return [ctx.token.cancelled, str(ctx.token.reason)]


def report(args: Args, ctx: Ctx) -> str:
    for step in range(1, 4):
        ctx.report_progress(step, 3, f"step {step}")
    return "reported"


def flaky(args: Args, ctx: Ctx) -> str:
    """Raise `ValueError(<this task's key>)` on the first `failures` attempts."""
    key = str(get_worker().get_current_task())
    for attempt in range(args["failures"]):
        marker = Event(f"{args['prefix']}-{attempt}")
        if not marker.is_set():
            marker.set()
            raise ValueError(key)
    return key


def lock_value(args: Args, ctx: Ctx) -> object:
    return threading.Lock()


class LockedError(Exception):
    """An exception carrying a lock: it cannot be pickled."""

    def __init__(self) -> None:
        super().__init__("holding a lock")
        self.lock = threading.Lock()


def lock_error(args: Args, ctx: Ctx) -> None:
    raise LockedError()


class TwoPartError(Exception):
    """Pickles, but cannot be rebuilt: its `__init__` takes two arguments."""

    def __init__(self, first: str, second: str) -> None:
        super().__init__(f"{first} and {second}")


def two_part_error(args: Args, ctx: Ctx) -> None:
    raise TwoPartError("one", "two")


def lock_context(args: Args, ctx: Ctx) -> str:
    ctx.defer_context({"kept": True})
    ctx.defer_context(threading.Lock())
    return "ok"


def nested(args: Args, ctx: Ctx) -> object:
    try:
        ctx.execute("add", {"a": 1, "b": 2})
    except RuntimeError as exc:
        return f"RuntimeError: {exc}"
    return "nested call ran"


def pickled_context(args: Args, ctx: Ctx) -> object:
    import pickle

    try:
        pickle.dumps(ctx)
    except TypeError as exc:
        return str(exc)
    return "pickled"


def die_once_started(args: Args, ctx: Ctx) -> str:
    """Count starts in Events (a second start sets `twice`), then wait to be killed."""
    first = Event(args["once"])
    if first.is_set():
        Event(args["twice"]).set()
    first.set()
    Event(args["release"]).wait(WAIT)
    return "survived"


async def die() -> None:
    """Run on a worker's event loop by `client.run`: the worker process exits at once."""
    os._exit(1)
