"""`python -m toolreg mcp package.module:registry`: serve a registry over MCP.

The target is `module:attribute` (`module` alone means `module:registry`; the attribute may be
dotted). It names a `ToolRegistry`, or a zero-argument callable that returns one; a registry
made by that callable is closed when serving ends, one found in the module is not (it is not
ours). The MCP SDK is imported only when the command runs (extra `toolreg[mcp]`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Any

from . import ToolRegistry  # the public class, through the package (it loads with it)

__all__ = ["HELP", "add_arguments", "load_registry", "run"]

HELP = """\
Serve the tools of a ToolRegistry over the Model Context Protocol (needs toolreg[mcp]).

TARGET is module:attribute (module alone means module:registry): a ToolRegistry, or a
zero-argument callable returning one. stdio by default (for desktop and IDE clients); logs go
to stderr. EOF on stdin, SIGTERM or SIGINT cancels the calls in flight, waits for their bodies,
then exits 0.

client configuration (stdio):
  {"mcpServers": {"tools": {"command": "python",
                            "args": ["-m", "toolreg", "mcp", "myapp.tools:registry"]}}}
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `mcp` subcommand's arguments."""
    parser.add_argument("target", metavar="TARGET", help="module:attribute of the registry")
    parser.add_argument(
        "--transport",
        choices=("stdio", "streamable-http"),
        default="stdio",
        help="stdio (default) or streamable-http",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="HTTP: interface to bind (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="HTTP: port (default 8000; 0: any free port)"
    )
    parser.add_argument("--path", default="/mcp", help="HTTP: endpoint path (default /mcp)")
    parser.add_argument("--name", default="toolreg", help="server name shown to clients")
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="HTTP: a browser origin allowed besides loopback ones, e.g. https://app.example "
        "(repeatable; others get 403)",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="HTTP: a Host header allowed besides loopback names and the bind address, e.g. "
        "tools.example or tools.example:8000 (repeatable; others get 421)",
    )


def load_registry(target: str) -> tuple[ToolRegistry, bool]:
    """The registry `target` names, and whether it was made here (then the caller closes it).

    Raises `ValueError` with the fix for a target that does not name a registry.
    """
    module_name, _, attribute = target.partition(":")
    attribute = attribute or "registry"
    if not module_name or not all(part.isidentifier() for part in attribute.split(".")):
        raise ValueError(
            f"TARGET must be module:attribute, e.g. myapp.tools:registry; got {target!r}"
        )
    module = importlib.import_module(module_name)
    found: Any = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no attribute {attribute!r}") from None
    if isinstance(found, ToolRegistry):
        return found, False
    if callable(found):
        made = found()
        if isinstance(made, ToolRegistry):
            return made, True
        raise ValueError(f"{target} returned {type(made).__name__}, not a ToolRegistry")
    raise ValueError(
        f"{target} is a {type(found).__name__}: name a ToolRegistry or a zero-argument "
        "callable that returns one"
    )


def run(args: argparse.Namespace) -> int:
    """Serve until stopped; 0 after a clean stop, 2 for a bad target or a missing extra."""
    try:
        from . import mcp
    except ImportError as exc:
        print(f"python -m toolreg mcp: {exc}", file=sys.stderr)
        return 2
    try:
        registry, owned = load_registry(args.target)
    except (ImportError, ValueError) as exc:
        print(f"python -m toolreg mcp: {exc}", file=sys.stderr)
        return 2
    # stderr is the log channel of a stdio server (stdout carries the protocol).
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s"
    )
    logging.getLogger("toolreg").setLevel(logging.INFO)
    try:
        mcp.serve(
            registry,
            transport=args.transport,
            host=args.host,
            port=args.port,
            path=args.path,
            name=args.name,
            allowed_hosts=args.allow_host,
            allowed_origins=args.allow_origin,
        )
    finally:
        if owned:
            registry.close()
    return 0
