"""`python -m toolreg demo`, run the way the README and CI run it: a subprocess, exit 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXPECTED = {"ABORTED", "ABORTED_BEFORE_DISPATCH", "DENIED", "TOOL_TIMEOUT", "TOOL_ERROR"}


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolreg", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


def test_demo_runs_and_shows_every_outcome(tmp_path: Path) -> None:
    done = run("demo", "--log-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    for code in EXPECTED:
        assert code in done.stdout
    log = tmp_path / "calls.jsonl"
    assert str(log) in done.stdout
    page = tmp_path / "report.html"
    assert f"-m toolreg report {log} -o {page}" in done.stdout
    stats = run("stats", "--json", str(log))
    assert stats.returncode == 0, stats.stderr
    document = json.loads(stats.stdout)
    assert document["bad_lines"] == 0
    assert set(document["total"]["codes"]) == EXPECTED
    assert document["total"]["aborted_after_dispatch"] == 2
    assert document["total"]["aborted_before_dispatch"] == 1


def test_demo_json_is_one_document_with_the_story(tmp_path: Path) -> None:
    done = run("demo", "--json", "--log-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["log"] == str(tmp_path / "calls.jsonl")
    codes = {result["code"] for result in document["results"]}
    assert codes == EXPECTED | {None}
    steps = {step["call"]: step for step in document["steps"]}
    crawl = steps["crawl (cancelled)"]
    assert crawl["code"] == "ABORTED" and crawl["contexts"], "deferred context kept"
    render = steps["render_video (cancelled)"]
    assert render["code"] == "ABORTED" and render["body_finished_before_return"]
    assert render["returned_at"] > render["cancelled_at"]
    assert steps["crawl (caller gone)"]["dispatched"] is False
    batch = document["batch"]
    assert batch["mode"] in ("execute_batch", "one by one")
    assert (batch["calls"], batch["codes"]) == (8, {"ok": 8})


def test_the_printed_report_command_writes_the_page(tmp_path: Path) -> None:
    pytest.importorskip("plotly")
    assert run("demo", "--json", "--log-dir", str(tmp_path)).returncode == 0
    page = tmp_path / "report.html"
    done = run("report", str(tmp_path / "calls.jsonl"), "-o", str(page))
    assert done.returncode == 0, done.stderr
    text = page.read_text(encoding="utf-8")
    for code in EXPECTED:
        assert code in text
    assert "render_video" in text


def test_the_printed_commands_work_pasted_into_a_shell(tmp_path: Path) -> None:
    # This interpreter, named as the shell can find it: a bare `python` may have no toolreg.
    cwd = Path(sys.executable).parent.parent.parent  # where `.venv/bin/python` is relative
    done = run("demo", "--log-dir", str(tmp_path), cwd=cwd)
    assert done.returncode == 0, done.stderr
    hint = "per-tool figures: "
    [stats] = [line[len(hint) :] for line in done.stdout.splitlines() if line.startswith(hint)]
    assert not stats.startswith("python ")
    pasted = subprocess.run(
        stats, shell=True, cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert pasted.returncode == 0, pasted.stderr
    assert "render_video" in pasted.stdout


def test_help_lists_the_subcommands() -> None:
    done = run("--help")
    assert done.returncode == 0
    assert "demo" in done.stdout and "stats" in done.stdout and "report" in done.stdout
