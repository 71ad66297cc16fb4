"""Make `docs/report.png`, the documentation's picture of `python -m toolreg report`.

Run from anywhere, with the `report` extra installed and Chromium on the PATH
(`apt-get install chromium` on Debian)::

    .venv/bin/python docs/screenshot.py                        # the demo's own log
    .venv/bin/python docs/screenshot.py --log DIR/calls.jsonl  # any result log

Without `--log` it runs `python -m toolreg demo` into a temporary directory and draws its log:
calls cancelled mid-body and before dispatch, a denial, a timeout, a failure, a batch, and the
body that ignored its token (overdue, outlined in red).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--log", help="a result log (default: the demo's)")
    parser.add_argument("-o", "--output", default=os.path.join(ROOT, "docs", "report.png"))
    parser.add_argument("--size", default="1280,1150", help="the window, in pixels: W,H")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        parser.error("no chromium on the PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="toolreg-screenshot-") as directory:
        log = args.log
        toolreg = [sys.executable, "-m", "toolreg"]
        if log is None:
            demo = [*toolreg, "demo", "--json", "--log-dir", directory]
            subprocess.run(demo, check=True, stdout=subprocess.DEVNULL)
            log = "calls.jsonl"  # the page names the file it read: no temporary path
        page = os.path.join(directory, "report.html")
        command = [*toolreg, "report", log, "-o", page]
        subprocess.run(command, check=True, cwd=directory if args.log is None else None)
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={os.path.join(directory, 'profile')}",
                "--hide-scrollbars",
                "--force-device-scale-factor=1",
                f"--window-size={args.size}",
                f"--screenshot={os.path.abspath(args.output)}",
                f"file://{page}",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
