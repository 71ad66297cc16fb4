"""The MCP SDK's own high-level server, for `bench_mcp`: `python -m benchmarks._mcp_peer`.

What a user serves the same sync tool with when not using toolreg: an `MCPServer` (FastMCP
before mcp 2) whose `search(q, limit)` returns at once, like `_mcp_upstream.search`; the SDK
builds its input schema from the signature, validates the arguments and runs the sync function
on a worker thread. `--transport stdio` (the default) or `--transport streamable-http --port N`
(port 0: a free one); over HTTP it announces `... at http://127.0.0.1:PORT/mcp` on stderr, as
`python -m toolreg mcp` does, and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import socket
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("peer")


@server.tool(description="Search (returns at once)")
def search(q: str, limit: int = 10) -> str:
    return "ok"


def serve_http(port: int) -> None:
    import anyio
    import uvicorn

    app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        bound = sock.getsockname()[1]
        config = uvicorn.Config(app, host="127.0.0.1", port=bound, log_level="warning")
        print(f"MCPServer 'peer' at http://127.0.0.1:{bound}/mcp", file=sys.stderr, flush=True)
        anyio.run(uvicorn.Server(config).serve, [sock])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._mcp_peer")
    parser.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    if args.transport == "stdio":
        server.run("stdio")
    else:
        serve_http(args.port)


if __name__ == "__main__":
    main()
