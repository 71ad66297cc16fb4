"""The upstream of the gateway benchmark: `python -m toolreg mcp benchmarks._mcp_upstream`.

One tool, `search`, the same trivial body as `bench_mcp.search`, so a call's cost is the MCP
round trip (and, through the gateway, the second hop).
"""

from __future__ import annotations

from typing import Any

from toolreg import ToolRegistry

registry = ToolRegistry(max_workers=8)


@registry.tool(description="Search (returns at once)")
def search(args: Any, ctx: Any) -> str:
    return "ok"
