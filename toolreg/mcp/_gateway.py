"""`python -m toolreg mcp --config servers.json [TARGET]`: one MCP server in front of many.

The configuration is the usual client file, ``{"mcpServers": {name: entry}}``, where an entry
is ``{"command", "args", "env", "cwd"}`` (stdio) or ``{"url", "headers"}`` (streamable HTTP);
an entry with ``"disabled": true`` is skipped. Each upstream is mounted (`toolreg.mcp.mount`)
with the prefix ``name.`` into one registry: the local `TARGET` registry when one is given,
else a fresh one. That registry is then served like any other (`toolreg.mcp.serve`), so every
call, local or mounted, gets the same pipeline: `--log` adds a `ResultLog`, `--timeout` a
`TimeoutPolicy` whose default deadline applies to every tool without a timeout of its own, and
a client's cancel reaches the upstream as `notifications/cancelled` with its reason.

Every upstream must start (within 10 s each, started together) or the gateway exits with
status 1 naming the ones that failed; after that, an upstream that dies fails only its calls
in flight, and is started again on its next call. When serving ends, every upstream is closed
(its process stopped and reaped), then the log, then a registry the gateway made.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from .. import TimeoutPolicy, ToolRegistry  # the public classes, through the package
from .._cli import UsageError

if TYPE_CHECKING:
    from ._mount import Mount

__all__ = ["add_arguments", "read_config", "run", "wanted"]

PROG = "python -m toolreg mcp"
WORKERS = 32  # a registry the gateway makes: one worker per call the server admits at once
_NAME_RULE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The gateway's options of the `mcp` subcommand."""
    parser.add_argument(
        "--config", metavar="FILE", help='upstream MCP servers: {"mcpServers": {...}} (a gateway)'
    )
    parser.add_argument("--log", metavar="FILE", help="append every call's result to FILE (JSONL)")
    parser.add_argument(
        "--timeout", type=float, metavar="S", help="a deadline of S seconds for every tool call"
    )
    parser.add_argument(
        "--cancel-grace",
        type=float,
        default=None,
        metavar="S",
        help="seconds a cancelled upstream call waits for a late answer (default 1)",
    )


def wanted(args: argparse.Namespace) -> bool:
    """Whether the command line asks for anything the plain server does not do."""
    return any(
        getattr(args, option, None) is not None
        for option in ("config", "log", "timeout", "cancel_grace")
    )


def read_config(path: str) -> dict[str, Mapping[str, Any]]:
    """The enabled upstream entries of a configuration file, by server name.

    `OSError` if it cannot be read, `ValueError` (naming the problem) if it is not a
    ``{"mcpServers": {name: entry}}`` object or a name cannot prefix tool names.
    """
    with open(path, encoding="utf-8") as file:
        try:
            config = json.load(file)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not JSON: {exc}") from None
    servers = config.get("mcpServers") if isinstance(config, dict) else None
    if not isinstance(servers, dict):
        raise ValueError(f'{path} must be a JSON object with "mcpServers": {{name: entry}}')
    entries: dict[str, Mapping[str, Any]] = {}
    for name, entry in servers.items():
        if not _NAME_RULE.fullmatch(name):
            raise ValueError(
                f"server name {name!r} cannot prefix tool names: use letters, digits, _ and -"
            )
        if not isinstance(entry, dict):
            raise ValueError(f"server {name!r}: its entry must be a JSON object")
        if entry.get("disabled") is True:
            continue
        entries[name] = {key: value for key, value in entry.items() if key != "disabled"}
    return entries


def run(
    args: argparse.Namespace,
    load_registry: Callable[[str], tuple[ToolRegistry, bool]],
    serve: Callable[[ToolRegistry, argparse.Namespace], int],
) -> int:
    """Serve the gateway until stopped; 0 after a clean stop, 2 for a usage or configuration
    error, 1 when an upstream cannot be mounted.

    The command (`_cli`) passes in how it loads a `TARGET` (`load_registry`) and serves a
    registry (`serve`), so the gateway serves exactly as the plain command does."""
    if args.target is None and args.config is None:
        raise UsageError("give a TARGET registry, --config FILE, or both")
    if args.cancel_grace is not None and args.config is None:
        raise UsageError("--cancel-grace applies to upstreams: it needs --config")
    try:
        from . import mount
        from ._upstream import parse_upstream

        servers = read_config(args.config) if args.config is not None else {}
        for name, entry in servers.items():
            try:
                parse_upstream(entry)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"server {name!r}: {exc}") from None
        policy = TimeoutPolicy(default=args.timeout) if args.timeout is not None else None
    except (ImportError, OSError, TypeError, ValueError) as exc:
        return _fail(str(exc), 2)
    with ExitStack() as stack:
        try:
            registry = _registry(args.target, stack, load_registry)
            if policy is not None:
                stack.callback(registry.add_around(policy).remove)
            if args.log is not None:
                _add_log(registry, args.log, stack)
        except (ImportError, OSError, ValueError) as exc:
            return _fail(str(exc), 2)
        grace = 1.0 if args.cancel_grace is None else args.cancel_grace
        try:
            for mounted in _mount_all(mount, registry, servers, grace):
                stack.callback(mounted.close)
        except _MountFailed as exc:
            return _fail(str(exc), 1)
        return serve(registry, args)


def _registry(
    target: str | None,
    stack: ExitStack,
    load: Callable[[str], tuple[ToolRegistry, bool]],
) -> ToolRegistry:
    """The local registry `target` names, or a fresh one; closed on exit if made here."""
    if target is None:
        registry, owned = ToolRegistry(max_workers=WORKERS), True
    else:
        registry, owned = load(target)
    if owned:
        stack.callback(registry.close)
    return registry


def _add_log(registry: ToolRegistry, path: str, stack: ExitStack) -> None:
    from ..log import ResultLog

    log = ResultLog(path)
    stack.callback(log.close)  # after the observer is gone (the stack unwinds in reverse)
    stack.callback(registry.on_result(log).remove)


class _MountFailed(Exception):
    """Some upstreams could not be mounted (the message names each, with its cause)."""


def _mount_all(
    mount: Any, registry: ToolRegistry, servers: Mapping[str, Mapping[str, Any]], grace: float
) -> list[Mount]:
    """Mount every upstream, started together; all of them, or none (`_MountFailed`)."""
    if not servers:
        return []
    with ThreadPoolExecutor(len(servers), thread_name_prefix="toolreg-gateway") as pool:
        started = {
            name: pool.submit(mount, registry, entry, prefix=f"{name}.", cancel_grace=grace)
            for name, entry in servers.items()
        }
    mounted: list[Mount] = []
    failed: list[str] = []
    for name, future in started.items():
        try:
            mounted.append(future.result())
        except Exception as exc:
            failed.append(f"server {name!r}: {exc}")
    if failed:
        for each in mounted:
            each.close()
        raise _MountFailed("cannot mount " + "; ".join(failed))
    return mounted


def _fail(message: str, status: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return status
