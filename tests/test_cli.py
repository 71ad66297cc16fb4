"""`python -m toolreg`: the version, usage errors instead of tracebacks, help with examples."""

from __future__ import annotations

import subprocess
import sys

import toolreg


def toolreg_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolreg", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_version_prints_the_distributions_version() -> None:
    done = toolreg_cli("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"toolreg {toolreg.__version__}\n", "")
