"""`python -m toolreg <command>`: `demo` (a live demonstration), `stats` and `report` (of
logs), `mcp` (serve a registry).

`mcp` serves a registry over the Model Context Protocol and `report` draws result logs; their
optional dependencies are imported only when they run, so the other commands never need the
`toolreg[mcp]` or `toolreg[report]` extras.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Protocol

import toolreg

from . import _demo
from ._cli import UsageError
from .mcp import _cli as _mcp_cli
from .report import _cli as _report_cli
from .report import _stats


class _Command(Protocol):
    """What a subcommand module offers."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# name -> (one-line help, the module that adds its arguments and runs it)
_COMMANDS: dict[str, tuple[str, _Command]] = {
    "demo": ("a short live demonstration of the cancellation contract", _demo),
    "stats": ("per-tool figures from result logs", _stats),
    "report": (
        "an HTML page of the calls in result logs: timeline, latencies, the stats table",
        _report_cli,
    ),
    "mcp": ("serve a registry over the Model Context Protocol (needs the mcp extra)", _mcp_cli),
}


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the command line), run the subcommand, return its exit status.

    A bad option or argument is a usage error, as argparse reports one (the usage, one line
    saying what is wrong, exit status 2): argparse's own raise `SystemExit(2)`, those a
    command finds later (`UsageError`) return 2.
    """
    parser = argparse.ArgumentParser(
        prog="python -m toolreg",
        description="toolreg: tool calls with quiescent cancellation",
        epilog="Run python -m toolreg COMMAND --help for what a command does, with examples.",
    )
    parser.add_argument("--version", action="version", version=f"toolreg {toolreg.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers: dict[str, argparse.ArgumentParser] = {}
    for name, (summary, module) in _COMMANDS.items():
        doc = (getattr(module, "__doc__", None) or "").splitlines()
        parsers[name] = command = commands.add_parser(
            name,
            help=summary,
            description=getattr(module, "HELP", doc[0] if doc else None),
            epilog=getattr(module, "EXAMPLES", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(command)
    args = parser.parse_args(argv)
    try:
        return _COMMANDS[args.command][1].run(args)
    except UsageError as exc:
        parsers[args.command].print_usage(sys.stderr)
        print(f"{parsers[args.command].prog}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `python -m toolreg demo | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    sys.exit(status)
