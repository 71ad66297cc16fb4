"""Shared set-up for the framework adapter tests: one registry with the tools every test uses.

* `add` (`a` required, `b` optional with a default): the success path; journals its arguments.
* `boom`: raises, a `TOOL_ERROR`.
* `cooperative`: waits for its token, then raises `Cancelled` (`ABORTED`).
* `stubborn`: notices its token, then keeps working until the test releases it, and returns a
  success (`"late"`) that cancellation must replace (`ABORTED`) and no model may see.

Threads are ordered with `Event`s only; every wait is bounded by `WAIT`.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

from _registry_helpers import WAIT, Journal, Observed

from toolreg import ToolRegistry

ADD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "default": 2}},
    "required": ["a"],
}


class Scenario:
    """A registry with the standard tools, its observer, a journal and the bodies' events."""

    def __init__(self, registry: ToolRegistry) -> None:
        self.registry = registry
        self.journal = Journal()
        self.observed = Observed()
        self.started = threading.Event()  # a blocking body (cooperative, stubborn) is running
        self.saw_cancel = threading.Event()  # a blocking body has seen its token cancelled
        self.release = threading.Event()  # lets the stubborn body return
        registry.on_result(self.observed)
        journal, started, release = self.journal, self.started, self.release
        saw_cancel = self.saw_cancel

        @registry.tool(description="Add a and b.", parameters=ADD_SCHEMA, concurrency_safe=True)
        def add(args: Any, ctx: Any) -> int:
            journal(("add", dict(args)))
            return int(args["a"]) + int(args.get("b", 2))

        @registry.tool(description="Always fails.")
        def boom(args: Any, ctx: Any) -> None:
            raise RuntimeError("kaput")

        @registry.tool(description="Waits until cancelled.")
        def cooperative(args: Any, ctx: Any) -> str:
            started.set()
            ctx.token.wait(WAIT)
            journal("body saw cancel")
            saw_cancel.set()
            ctx.token.raise_if_cancelled()
            return "late"

        @registry.tool(description="Ignores cancellation until released.")
        def stubborn(args: Any, ctx: Any) -> str:
            started.set()
            ctx.token.wait(WAIT)
            journal("body saw cancel")
            saw_cancel.set()
            release.wait(WAIT)
            journal("body returned")
            return "late"

    @property
    def bodies_run(self) -> list[Any]:
        """Journal entries of `add` bodies."""
        return [e for e in self.journal.entries if isinstance(e, tuple) and e[0] == "add"]


@contextlib.contextmanager
def scenario(max_workers: int = 4) -> Iterator[Scenario]:
    """A `Scenario` whose registry is closed (every call settled) when the block ends."""
    registry = ToolRegistry(max_workers=max_workers)
    try:
        yield Scenario(registry)
    finally:
        registry.close()


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` (dedented) in a fresh interpreter: for what importing does to `sys.modules`."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def wait_event(event: threading.Event) -> None:
    """Wait, off the event loop, for an event a worker sets."""
    assert await asyncio.to_thread(event.wait, WAIT), "the worker never reached the event"


async def still_pending(task: asyncio.Future[Any], seconds: float = 0.1) -> bool:
    """True if `task` is not done after `seconds` (a check that can only miss, never orders)."""
    done, _ = await asyncio.wait((task,), timeout=seconds)
    return not done


async def cancel_while_stubborn(s: Scenario, task: asyncio.Future[Any]) -> None:
    """Cancel `task` once the stubborn body runs, check that the task waits for that body,
    release it, and see `asyncio.CancelledError`; journals "task cancelled" last."""
    await wait_event(s.started)
    task.cancel()
    await wait_event(s.saw_cancel)  # the cancellation reached the body's token
    assert await still_pending(task), "the task did not wait for the body"
    s.release.set()
    try:
        await task
    except asyncio.CancelledError:
        s.journal("task cancelled")
    else:
        raise AssertionError("the task was not cancelled")
