"""What the subcommands of `python -m toolreg` share: the usage error, and how to name ourselves."""

from __future__ import annotations

import os
import shlex
import sys

__all__ = ["UsageError", "command"]


class UsageError(Exception):
    """A bad option or argument found once parsing is done (a `--log-dir` that cannot be
    written, options that do not go together): printed like argparse's own errors (the usage,
    then one line), exit status 2, no traceback."""


def command() -> str:
    """How to run toolreg again, as this process was run: `.venv/bin/python -m toolreg` for a
    virtual environment under the current directory, the interpreter's full path otherwise, so
    a printed hint works when pasted."""
    python = sys.executable or "python3"
    try:
        relative = os.path.relpath(python)
    except ValueError:  # another drive (Windows)
        relative = python
    shown = python if relative.startswith(os.pardir) else relative
    if os.sep not in shown:
        shown = os.path.join(os.curdir, shown)  # `python` alone would be looked up on PATH
    return f"{shlex.quote(shown)} -m toolreg"
