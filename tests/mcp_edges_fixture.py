"""`mcp_fixture`'s registry plus tools that put hostile text on the wire or leave output behind.

Served by the subprocess tests of `test_mcp_edges.py` as `python -m toolreg mcp
mcp_edges_fixture`.
"""

from __future__ import annotations

import os
from typing import Any

from mcp_fixture import registry

from toolreg import ToolContext

__all__ = ["LATIN1_NAME", "registry"]

LATIN1_NAME = os.fsdecode(b"caf\xe9.txt")  # what os.listdir() yields: a lone surrogate


@registry.tool(
    description="Puts a lone surrogate where the client will see it",
    parameters={"properties": {"how": {"enum": ["return", "raise", "progress", "object"]}}},
)
def lone_surrogate(args: Any, ctx: ToolContext) -> object:
    how = args["how"]
    if how == "raise":
        raise ValueError(LATIN1_NAME)
    if how == "progress":
        ctx.report_progress(1, 2, LATIN1_NAME)
        return "reported"
    if how == "object":
        ctx.defer_context({"file": LATIN1_NAME})
        return {"file": LATIN1_NAME, LATIN1_NAME: 1}
    return LATIN1_NAME


@registry.tool(description="print()s without flushing, then answers")
def buffered_print(args: Any, ctx: ToolContext) -> str:
    print("stray output a tool left in sys.stdout's buffer")
    return "printed"
