"""`python -m toolreg`: the version, usage errors instead of tracebacks, help with examples."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_demo import run

import toolreg

TESTS = Path(__file__).resolve().parent
LOG = '{"name": "search", "ok": true, "duration": 0.1, "time": "2026-12-01T05:00:00Z"}\n'


def toolreg_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run(*args, cwd=TESTS)  # in TESTS: `mcp_fixture` is importable as a target


def test_version_prints_the_distributions_version() -> None:
    done = toolreg_cli("--version")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"toolreg {toolreg.__version__}\n"


@pytest.mark.parametrize("command", ["demo", "stats", "report", "mcp"])
def test_each_commands_help_says_what_it_does_with_examples(command: str) -> None:
    done = toolreg_cli(command, "--help")
    assert (done.returncode, done.stderr) == (0, "")
    description = done.stdout.split("\n\n")[1]  # after the usage
    assert len(description.split()) >= 15, description
    examples = done.stdout.split("examples:\n", 1)[1].splitlines()
    assert examples and all(
        line.startswith(f"  python -m toolreg {command}") or line.startswith("      ")
        for line in examples
    )


def test_the_top_level_help_points_to_each_commands_help() -> None:
    done = toolreg_cli("--help")
    assert done.returncode == 0
    assert "python -m toolreg COMMAND --help" in done.stdout


def unwritable_dir(tmp_path: Path) -> str:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    return str(blocker / "logs")  # under a file: no one can create it, root included


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["nosuch"], "invalid choice: 'nosuch'"),
        (["demo", "--bogus"], "unrecognized arguments: --bogus"),
        (["demo", "--log-dir", "{unwritable}"], "--log-dir {unwritable}: cannot write"),
        (["stats"], "the following arguments are required: PATH"),
        (["report", "{log}"], "the following arguments are required: -o/--output"),
        (["report", "{log}", "-o", "{out}", "--since", "soon"], "not an ISO 8601 time: 'soon'"),
        (["report", "{log}", "-o", "{out}", "--max-bars", "0"], "not a whole number >= 1"),
        (["mcp"], "give a TARGET registry, --config FILE, or both"),
        (["mcp", "mcp_fixture", "--port", "99999"], "not a port number 0-65535"),
        (["mcp", "mcp_fixture", "--port", "http"], "not a port number 0-65535"),
        (["mcp", "mcp_fixture", "--transport", "sse"], "invalid choice: 'sse'"),
        (["mcp", "mcp_fixture", "--port", "8000"], "--port: only with --transport streamable-http"),
        (
            ["mcp", "mcp_fixture", "--host", "0.0.0.0", "--path", "/x"],
            "--host, --path: only with --transport streamable-http",
        ),
        (
            ["mcp", "mcp_fixture", "--transport", "streamable-http", "--path", "mcp"],
            "an endpoint path starts with /",
        ),
        (["mcp", "mcp_fixture", "--transport", "streamable-http", "--host", ""], "not empty"),
    ],
)
def test_a_bad_option_or_argument_is_a_usage_error_not_a_traceback(
    tmp_path: Path, args: list[str], says: str
) -> None:
    log = tmp_path / "calls.jsonl"
    log.write_text(LOG)
    names = {"unwritable": unwritable_dir(tmp_path), "log": str(log), "out": str(tmp_path / "o")}
    done = toolreg_cli(*(arg.format(**names) for arg in args))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    usage, _, error = done.stderr.rstrip("\n").rpartition("\n")
    assert usage.startswith("usage: python -m toolreg")
    assert error.startswith("python -m toolreg") and ": error: " in error
    assert says.format(**names) in error
    assert not (tmp_path / "o").exists()


def test_a_bad_mcp_target_is_a_usage_error() -> None:
    pytest.importorskip("mcp", reason="the target is loaded once the mcp extra is there")
    done = toolreg_cli("mcp", "no_such_module_here")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    error = done.stderr.rstrip("\n").rpartition("\n")[2]
    expected = "error: TARGET no_such_module_here: No module named 'no_such_module_here'"
    assert error.endswith(expected)


WITHOUT_THE_SDK = """
import runpy, sys
sys.modules["mcp"] = sys.modules["mcp_types"] = None  # as if the mcp extra were not installed
sys.argv = ["python -m toolreg", *sys.argv[1:]]
runpy.run_module("toolreg", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        (["mcp", "--help"], 0, "Serve the tools of a ToolRegistry"),
        (["mcp", "mcp_fixture", "--port", "80"], 2, "--port: only with --transport streamable"),
        (["mcp", "mcp_fixture"], 2, "needs the MCP SDK: pip install 'toolreg-quiescent[mcp]'"),
        (["mcp", "--config", "servers.json"], 2, "needs the MCP SDK"),
    ],
)
def test_the_mcp_command_reads_its_options_without_the_sdk(
    args: list[str], status: int, says: str
) -> None:
    # Every command loads `toolreg.mcp._cli` (its options): `toolreg.mcp` must load no SDK.
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_SDK, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=TESTS,
    )
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr
    assert says in done.stdout + done.stderr


def test_mcp_on_a_taken_port_says_so_in_one_line() -> None:
    pytest.importorskip("mcp", reason="needs the mcp extra")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        http = ["--transport", "streamable-http", "--port", str(port)]
        done = toolreg_cli("mcp", "mcp_fixture", *http)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith(f"python -m toolreg mcp: cannot serve on 127.0.0.1:{port}: ")
