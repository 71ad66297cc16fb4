"""The upstream of the gateway benchmark: `python -m toolreg mcp benchmarks._mcp_upstream`.

One tool, `search`, the same trivial body as `bench_mcp.search`, so a call's cost is the MCP
round trip (and, through the gateway, the second hop). Its arguments are validated against the
schema the SDK's `MCPServer` builds for `_mcp_peer.search(q, limit)`, so both servers check
the same input.
"""

from __future__ import annotations

from typing import Any

from toolreg import ToolRegistry

registry = ToolRegistry(max_workers=8)


SCHEMA = {
    "type": "object",
    "properties": {"q": {"type": "string"}, "limit": {"type": "integer", "default": 10}},
    "required": ["q"],
}


@registry.tool(description="Search (returns at once)", parameters=SCHEMA)
def search(args: Any, ctx: Any) -> str:
    return "ok"
