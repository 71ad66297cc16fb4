"""The upstream registry of the mount and gateway tests: `python -m toolreg mcp mcp_upstream`.

Bodies talk to the test through two FIFOs the environment names: each report is one line
written to `TOOLREG_TEST_REPORT` (`STARTED <call id> <pid>`, `CANCELLED <reason>`, ...), and
`steps` returns once the test has written a byte to `TOOLREG_TEST_RELEASE`. Nothing here
sleeps: every wait is on the call's token or on the release FIFO, bounded by `WAIT`.

`local` is a registry of its own, the gateway tests' local TARGET.
"""

from __future__ import annotations

import os
import select
from typing import Any

from toolreg import ToolContext, ToolRegistry

WAIT = 30.0  # no body waits longer: a test that died leaves no process behind for long


def report(line: str) -> None:
    """One line on the report FIFO (a write shorter than PIPE_BUF is never torn)."""
    fd = os.open(os.environ["TOOLREG_TEST_REPORT"], os.O_WRONLY)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def wait_for_release(ctx: ToolContext) -> bool:
    """Block until the test releases one body (True) or the call is cancelled (False)."""
    release = os.open(os.environ["TOOLREG_TEST_RELEASE"], os.O_RDWR | os.O_NONBLOCK)
    woken, wake = os.pipe()  # the token's cancel writes here: select() sees either
    try:
        with ctx.token.on_cancel(lambda: os.write(wake, b"x")):
            while True:
                ready = select.select([release, woken], [], [], WAIT)[0]
                if release not in ready:
                    return False  # cancelled (or WAIT passed)
                try:
                    os.read(release, 1)
                    return True
                except BlockingIOError:  # another body took that byte
                    continue
    finally:
        for fd in (release, woken, wake):
            os.close(fd)


registry = ToolRegistry(max_workers=4)


@registry.tool(
    description="Add two integers",
    parameters={
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
    title="Adder",
    annotations={"readOnlyHint": True, "idempotentHint": True},
)
def add(args: Any, ctx: ToolContext) -> dict[str, int]:
    return {"sum": args["a"] + args["b"]}


@registry.tool(description="Say it back", parameters={"properties": {"text": {"type": "string"}}})
def echo(args: Any, ctx: ToolContext) -> str:
    return str(args.get("text", ""))


@registry.tool(description="The upstream's process id")
def pid(args: Any, ctx: ToolContext) -> int:
    return os.getpid()


@registry.tool(description="Always fails")
def fails(args: Any, ctx: ToolContext) -> str:
    raise ValueError("nope, said the upstream")


@registry.tool(description="Runs until cancelled; reports its start and its cancellation")
def held(args: Any, ctx: ToolContext) -> str:
    report(f"STARTED {ctx.call.call_id} {os.getpid()}")
    ctx.token.wait(WAIT)
    report(f"CANCELLED {ctx.token.reason}")
    return "late"


@registry.tool(description="Reports progress 1..3 of 3, then returns once released")
def steps(args: Any, ctx: ToolContext) -> str:
    for step in (1, 2, 3):
        ctx.report_progress(step, 3, f"step {step}")
    report("STEPPED")
    return "stepped" if wait_for_release(ctx) else "cancelled"


local = ToolRegistry(max_workers=4)


@local.tool(description="A local tool of the gateway")
def hello(args: Any, ctx: ToolContext) -> str:
    return "hello from the gateway"
