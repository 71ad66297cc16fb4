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

from . import _demo, _mcp_cli, _report, _stats


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the command line), run the subcommand, return its exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m toolreg", description="toolreg: tool calls with quiescent cancellation"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="a short live demonstration of the cancellation contract",
        description=_demo.__doc__.splitlines()[0] if _demo.__doc__ else None,
    )
    _demo.add_arguments(demo)
    stats = commands.add_parser(
        "stats",
        help="per-tool figures from result logs",
        description=_stats.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _stats.add_arguments(stats)
    report = commands.add_parser(
        "report",
        help="an HTML page of the calls in result logs: timeline, latencies, the stats table",
        description=_report.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _report.add_arguments(report)
    mcp = commands.add_parser(
        "mcp",
        help="serve a registry over the Model Context Protocol (needs toolreg[mcp])",
        description=_mcp_cli.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _mcp_cli.add_arguments(mcp)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo.run(args)
    if args.command == "report":
        return _report.run(args)
    if args.command == "mcp":
        return _mcp_cli.run(args)
    return _stats.run(args)


if __name__ == "__main__":
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `python -m toolreg demo | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    sys.exit(status)
