"""Tests for the gateway: `python -m toolreg mcp --config servers.json [TARGET]`.

The SDK's real client talks to a real gateway process, which mounts two real upstreams: a
toolreg registry over stdio (`mcp_upstream`, reporting on a FIFO) and the SDK's `MCPServer`
over streamable HTTP, in this process. One gateway serves streamable HTTP to every test of the
module; one more, over stdio, shows the timeout, the log and a clean exit. A `list_changed`
while serving is shown on a gateway built in process (`mount` + `build_server`), where the
registry's own callback is the handshake. Usage and configuration errors run `main()`.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")
pytest.importorskip("uvicorn")

import anyio
import mcp_types as types
from _mcp_upstreams import (
    ROOT,
    TESTS,
    WAIT,
    Fifos,
    HttpUpstream,
    exists,
    http_upstream,
    stdio_entry,
)
from mcp import Client, StdioServerParameters

from toolreg import ToolRegistry
from toolreg.__main__ import main
from toolreg.mcp import build_server, mount


def run(work: Any) -> Any:
    return anyio.run(work, backend="asyncio")


def text(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


def environment() -> dict[str, str]:
    path = os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def write_config(directory: Path, servers: dict[str, Any]) -> Path:
    config = directory / "servers.json"
    config.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
    return config


# -- one gateway over streamable HTTP for the module ---------------------------------------


class Gateway:
    """A gateway process: its URL, and its stderr lines (with the upstream's) in a queue."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toolreg", "mcp", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=environment(),
            cwd=str(ROOT),
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = self.expect(" at http://").split(" at ", 1)[1]

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in iter(self.proc.stderr.readline, b""):
            self.lines.put(line.decode(errors="replace").rstrip())

    def expect(self, fragment: str) -> str:
        limit = time.monotonic() + WAIT
        while True:
            line = self.lines.get(timeout=max(0.0, limit - time.monotonic()))
            if fragment in line:
                return line

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        status = self.proc.wait(WAIT)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return status


@pytest.fixture(scope="module")
def web() -> Iterator[HttpUpstream]:
    with http_upstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, fifos: Fifos, web: HttpUpstream
) -> Iterator[Gateway]:
    directory = tmp_path_factory.mktemp("gateway")
    config = write_config(directory, {"up": stdio_entry(fifos), "web": {"url": web.url}})
    running = Gateway(
        "mcp_upstream:local",
        "--config",
        str(config),
        "--cancel-grace",
        "0.2",
        "--transport",
        "streamable-http",
        "--port",
        "0",
    )
    try:
        yield running
    finally:
        assert running.stop() == 0


def test_the_gateway_serves_the_local_and_every_mounted_tool_as_one_catalog(
    gateway: Gateway,
) -> None:
    async def main() -> tuple[list[str], list[Any]]:
        async with Client(gateway.url) as client:
            listing = await client.list_tools()
            answers = [
                await client.call_tool("hello"),
                await client.call_tool("up.add", {"a": 2, "b": 5}),
                await client.call_tool("web.echo", {"text": "via the gateway"}),
                await client.call_tool("up.fails"),
            ]
        return [tool.name for tool in listing.tools], answers

    names, (hello, added, echoed, failed) = run(main)
    assert names == [
        "hello",
        "up.add",
        "up.echo",
        "up.fails",
        "up.held",
        "up.pid",
        "up.steps",
        "web.echo",
        "web.grow",
        "web.slow",
        "web.steps",
    ]
    assert text(hello) == "hello from the gateway"
    assert added.structured_content == {"sum": 7}
    assert echoed.structured_content == {"text": "via the gateway"}
    assert failed.is_error and "nope, said the upstream" in text(failed)
    assert (failed.meta or {})["toolreg/code"] == "TOOL_ERROR"


def test_a_clients_cancel_reaches_the_upstream_body_through_the_gateway_with_its_reason(
    gateway: Gateway, fifos: Fifos
) -> None:
    async def main() -> None:
        async with Client(gateway.url, mode="legacy") as client:  # 2025: the cancel has words
            async with anyio.create_task_group() as group:
                group.start_soon(partial(client.call_tool, "up.held"))
                await anyio.to_thread.run_sync(fifos.expect, "STARTED")
                group.cancel_scope.cancel()  # the SDK sends notifications/cancelled
            # The connection goes on: the next call is answered.
            assert (await client.call_tool("up.add", {"a": 1, "b": 1})).structured_content

    run(main)
    reason = fifos.expect("CANCELLED")
    # The upstream's request, cancelled by the gateway, because the client cancelled its own.
    assert reason.startswith("MCP request ")
    assert "cancelled by the client: MCP request " in reason
    assert reason.endswith("cancelled by the client: caller cancelled")


@pytest.mark.parametrize("tool", ["up.steps", "web.steps"])
def test_upstream_progress_passes_through_both_hops(
    gateway: Gateway, fifos: Fifos, web: HttpUpstream, tool: str
) -> None:
    arrived = threading.Event()
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))
        if progress == 3:
            arrived.set()

    def release_after_progress() -> None:
        assert arrived.wait(WAIT)
        if tool == "up.steps":
            fifos.release()
        else:
            web.release.set()

    answers: list[types.CallToolResult] = []

    async def main() -> None:
        async with Client(gateway.url) as client, anyio.create_task_group() as group:
            group.start_soon(anyio.to_thread.run_sync, release_after_progress)
            answers.append(await client.call_tool(tool, progress_callback=progress))

    web.release.clear()
    run(main)
    (result,) = answers
    assert text(result) in ("stepped", '{"result": "stepped"}')  # MCPServer wraps a str
    assert seen[-1] == (3.0, 3.0, "step 3")
    assert [value for value, _, _ in seen] == sorted({value for value, _, _ in seen})


# -- over stdio: the timeout, the log, a clean exit ----------------------------------------


def test_the_timeout_and_the_log_apply_to_mounted_calls_and_exit_leaves_no_process(
    tmp_path: Path, fifos: Fifos
) -> None:
    config = write_config(tmp_path, {"up": stdio_entry(fifos)})
    log = tmp_path / "calls.jsonl"
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            *("-m", "toolreg", "mcp", "--config", str(config), "--log", str(log)),
            *("--timeout", "0.5", "--cancel-grace", "0.2"),
        ],
        env={"PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])},
        cwd=str(ROOT),
    )

    async def main() -> tuple[int, types.CallToolResult, types.CallToolResult]:
        async with Client(params) as client:
            pid = int(text(await client.call_tool("up.pid")))
            added = await client.call_tool("up.add", {"a": 1, "b": 2})
            held = await client.call_tool("up.held")
        return pid, added, held

    started = time.monotonic()
    pid, added, held = run(main)
    assert time.monotonic() - started < WAIT
    assert added.structured_content == {"sum": 3}
    assert held.is_error and text(held) == "Error: tool call timed out after 0.5s"
    assert (held.meta or {})["toolreg/code"] == "TOOL_TIMEOUT"
    reason = fifos.expect("CANCELLED")
    assert reason.endswith("cancelled by the client: TOOL_TIMEOUT: timed out after 0.5s")
    # The client stopped the gateway by closing its stdin; the gateway closed its mount,
    # which stopped and reaped the upstream, before it exited.
    assert not exists(pid)
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert [(line["name"], line["code"]) for line in lines] == [
        ("up.pid", None),
        ("up.add", None),
        ("up.held", "TOOL_TIMEOUT"),
    ]
    assert lines[2]["dispatched"] is True and lines[2]["duration"] >= 0.5


# -- in process: a list_changed while serving ----------------------------------------------


def test_a_list_changed_while_serving_reaches_the_gateways_clients(web: HttpUpstream) -> None:
    with ToolRegistry(max_workers=4) as registry:
        fresh = threading.Event()

        def changed() -> None:
            if registry.get("web.fresh") is not None:
                fresh.set()

        registry.on_tools_changed(changed)
        with mount(registry, web.url, prefix="web.", names=["grow", "fresh"]):
            server = build_server(registry)

            async def main() -> tuple[list[str], list[str], types.CallToolResult]:
                async with Client(server, mode="legacy") as client:
                    before = [tool.name for tool in (await client.list_tools()).tools]
                    await client.call_tool("web.grow")
                    assert await anyio.to_thread.run_sync(fresh.wait, WAIT)
                    after = [tool.name for tool in (await client.list_tools()).tools]
                    return before, after, await client.call_tool("web.fresh")

            before, after, called = run(main)
    assert before == ["web.grow"]
    assert after == ["web.fresh", "web.grow"]
    assert text(called) == "fresh!"


# -- usage and configuration errors --------------------------------------------------------


def test_usage_and_configuration_errors_exit_2_and_name_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def status(*args: str) -> tuple[int, str]:
        code = main(["mcp", *args])
        return code, capsys.readouterr().err

    not_json = tmp_path / "not.json"
    not_json.write_text("{", encoding="utf-8")
    no_servers = tmp_path / "empty.json"
    no_servers.write_text("{}", encoding="utf-8")
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    bad_name = write_config(tmp_path / "a", {"my server": {"command": "x"}})
    bad_entry = write_config(tmp_path / "b", {"s": {"command": "x", "colour": "red"}})
    cases = {
        (): "give a TARGET registry, --config FILE, or both",
        ("mcp_upstream:local", "--cancel-grace", "1"): "--cancel-grace applies to upstreams",
        ("--config", str(tmp_path / "missing.json")): "No such file",
        ("--config", str(not_json)): "is not JSON",
        ("--config", str(no_servers)): '"mcpServers"',
        ("--config", str(bad_name)): "server name 'my server' cannot prefix tool names",
        ("--config", str(bad_entry)): "server 's': a stdio upstream entry takes",
        ("mcp_upstream:local", "--timeout", "0"): "default must be a finite number of seconds",
        ("no_such_module_here", "--log", "x.jsonl"): "No module named 'no_such_module_here'",
    }
    for args, fragment in cases.items():
        code, err = status(*args)
        assert code == 2, (args, err)
        # Usage errors print the usage first (argparse's form); the others are one line.
        last = err.splitlines()[-1]
        assert fragment in last and last.startswith("python -m toolreg mcp: "), (args, err)


def test_an_upstream_that_cannot_be_mounted_exits_1_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path,
        {
            "broken": {"command": "/nonexistent/mcp-server"},
            "off": {"command": "/also/missing", "disabled": True},  # skipped
        },
    )
    assert main(["mcp", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "cannot mount server 'broken': MCP upstream /nonexistent/mcp-server" in err
    assert "could not be started" in err and "/also/missing" not in err
