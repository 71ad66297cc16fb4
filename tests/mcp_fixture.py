"""The registry that the MCP subprocess tests serve: `python -m toolreg mcp mcp_fixture`.

Bodies report what they do as lines on stderr (written straight to fd 2, never through the
protocol stream); `held` waits for its cancellation, then for the test to write a byte to the
pipe whose read end is `TOOLREG_TEST_RELEASE_FD`, so the test decides when it returns.
"""

from __future__ import annotations

import atexit
import os
import select
import subprocess
import sys
from typing import Any

from toolreg import ToolContext, ToolRegistry

WAIT = 30.0  # no body here waits longer: a test that died leaves no process behind for long


def say(line: str) -> None:
    """One line on stderr, written to the descriptor at once."""
    os.write(2, f"{line}\n".encode())


registry = ToolRegistry(max_workers=4)
if "TOOLREG_TEST_RELEASE_FD" in os.environ:  # served by a test: report whether serve() closed it
    atexit.register(lambda: say(f"EXIT registry closed: {registry.closed}"))
registry.on_result(
    lambda result: say(
        f"RESULT {result.call.call_id} {result.error.code.value if result.error else 'OK'}"
    )
)


@registry.tool(
    description="Add two integers",
    parameters={
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
def add(args: Any, ctx: ToolContext) -> dict[str, int]:
    return {"sum": args["a"] + args["b"]}


@registry.tool(description="Write to stdout every way a tool can, then answer")
def noisy(args: Any, ctx: ToolContext) -> str:
    print("print() from a tool")
    sys.stdout.flush()
    os.write(1, b"a raw write to fd 1\n")
    # `cat` copies its stdin: it must read EOF (fd 0 is the null device), not the protocol.
    subprocess.run(["sh", "-c", "echo a child process; cat"], check=True, timeout=WAIT)
    return "quiet"


@registry.tool(description="Runs until cancelled, then until the test releases it")
def held(args: Any, ctx: ToolContext) -> str:
    say(f"BODY STARTED {ctx.call.call_id}")
    ctx.token.wait(WAIT)
    say(f"BODY CANCELLED {ctx.token.reason}")
    release = int(os.environ["TOOLREG_TEST_RELEASE_FD"])
    if select.select([release], [], [], WAIT)[0]:
        os.read(release, 1)
    say("BODY ENDED")
    return "late"


def make_registry() -> ToolRegistry:
    """A zero-argument factory, as `python -m toolreg mcp mcp_fixture:make_registry` accepts."""
    made = ToolRegistry(max_workers=1)
    made.tool(add)
    return made
