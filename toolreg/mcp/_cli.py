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

from .. import ToolRegistry  # the public class, through the package (it loads with it)
from .._cli import UsageError
from . import _gateway

__all__ = ["EXAMPLES", "HELP", "add_arguments", "load_registry", "run", "serve"]

HELP = """\
Serve the tools of a ToolRegistry over the Model Context Protocol (needs the mcp extra:
pip install 'toolreg-quiescent[mcp]').

TARGET is module:attribute (module alone means module:registry): a ToolRegistry, or a
zero-argument callable returning one. stdio by default (for desktop and IDE clients); logs go
to stderr. EOF on stdin, SIGTERM or SIGINT cancels the calls in flight, waits for their bodies,
then exits 0.

As a gateway, --config FILE reads a client configuration ({"mcpServers": {name: {...}}}),
mounts each upstream server's tools as name.<tool>, and serves them (with TARGET's, if given)
as one server: one catalog, one cancellation contract, --log and --timeout for every call.

client configuration (stdio):
  {"mcpServers": {"tools": {"command": "/path/to/.venv/bin/python",
                            "args": ["-m", "toolreg", "mcp", "myapp.tools:registry"]}}}
"""

EXAMPLES = """\
examples:
  python -m toolreg mcp myapp.tools:registry       # stdio, for desktop and IDE clients
  python -m toolreg mcp myapp.tools --transport streamable-http --port 8000
      # serves http://127.0.0.1:8000/mcp
  python -m toolreg mcp --config servers.json --log calls.jsonl --timeout 60
      # a gateway to the servers of servers.json"""

_HTTP_DEFAULTS = {"host": "127.0.0.1", "port": 8000, "path": "/mcp"}  # HTTP-only options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `mcp` subcommand's arguments."""
    parser.add_argument(
        "target", metavar="TARGET", nargs="?", help="module:attribute of the registry"
    )
    parser.add_argument(
        "--transport",
        choices=("stdio", "streamable-http"),
        default="stdio",
        help="stdio (default) or streamable-http",
    )
    # The HTTP-only options default to None, so that `run` can tell they were given.
    parser.add_argument("--host", type=_host, help="HTTP: interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, help="HTTP: port (default 8000; 0: any free port)")
    parser.add_argument("--path", type=_path, help="HTTP: endpoint path (default /mcp)")
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
    _gateway.add_arguments(parser)  # --config, --log, --timeout, --cancel-grace


def _host(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("an interface is a name or an address, not empty")
    return text


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number 0-65535 (0: any free port): {text!r}")
    return port


def _path(text: str) -> str:
    if not text.startswith("/"):
        raise argparse.ArgumentTypeError(f"an endpoint path starts with /, e.g. /mcp: {text!r}")
    return text


def _http_options(args: argparse.Namespace) -> dict[str, Any]:
    """The HTTP-only options as `mcp.serve` takes them, with their defaults; a `UsageError` if
    any was given for stdio."""
    given = [f"--{name}" for name in _HTTP_DEFAULTS if getattr(args, name) is not None]
    given += [option for option, values in _allowed(args).items() if values]
    if given and args.transport != "streamable-http":
        raise UsageError(f"{', '.join(given)}: only with --transport streamable-http")
    options: dict[str, Any] = {
        name: default if getattr(args, name) is None else getattr(args, name)
        for name, default in _HTTP_DEFAULTS.items()
    }
    return {**options, "allowed_hosts": args.allow_host, "allowed_origins": args.allow_origin}


def _allowed(args: argparse.Namespace) -> dict[str, list[str]]:
    return {"--allow-host": args.allow_host, "--allow-origin": args.allow_origin}


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


def serve(registry: ToolRegistry, args: argparse.Namespace) -> int:
    """Serve `registry` as the command line says, until stopped; logs go to stderr.

    0 after a clean stop, 1 if it cannot listen on the address asked for.
    """
    from . import serve as serve_registry

    http = _http_options(args)
    # stderr is the log channel of a stdio server (stdout carries the protocol).
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s"
    )
    logging.getLogger("toolreg").setLevel(logging.INFO)
    try:
        serve_registry(registry, transport=args.transport, name=args.name, **http)
    except OSError as exc:  # the address is taken, or not this machine's
        where = f"{http['host']}:{http['port']}"
        print(f"python -m toolreg mcp: cannot serve on {where}: {exc}", file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    """Serve until stopped; 0 after a clean stop, 1 if it cannot listen (or an upstream cannot
    be mounted), 2 for a bad target, a misplaced option or a missing extra."""
    _http_options(args)  # a misplaced HTTP option is refused before anything loads
    if args.target is None or _gateway.wanted(args):
        # --config, --log, --timeout: the gateway's options
        return _gateway.run(args, load_registry, serve)
    try:
        from . import _server  # noqa: F401 - here, so that a missing extra is exit status 2
    except ImportError as exc:
        print(f"python -m toolreg mcp: {exc}", file=sys.stderr)
        return 2
    try:
        registry, owned = load_registry(args.target)
    except (ImportError, ValueError) as exc:
        raise UsageError(f"TARGET {args.target}: {exc}") from None
    try:
        return serve(registry, args)
    finally:
        if owned:
            registry.close()
