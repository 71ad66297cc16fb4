"""Make `docs/report.png`, the README's picture of `python -m toolreg report`.

Run from anywhere, with the `report` extra installed and Chromium on the PATH
(`apt-get install chromium` on Debian)::

    python docs/screenshot.py                          # a made-up agent session (see below)
    python docs/screenshot.py --log DIR/calls.jsonl    # any result log, e.g. the demo's

Without `--log` the log is `benchmarks/_calls_log.py`'s: a few turns of an agent, with calls
cancelled mid-body, cancelled before dispatch, a timeout, failures and a body that ignored its
token (overdue), written as `ResultLog` lines with call timelines. Once results carry their
timelines, make the picture from the real demo instead::

    python -m toolreg demo --log-dir /tmp/demo
    python docs/screenshot.py --log /tmp/demo/calls.jsonl
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 88  # a session with every outcome the report distinguishes, in 45 calls
CALLS = 45
CANCEL_RATE = 0.35


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--log", help="a result log (default: a made-up agent session)")
    parser.add_argument("-o", "--output", default=os.path.join(ROOT, "docs", "report.png"))
    parser.add_argument("--size", default="1280,1150", help="the window, in pixels: W,H")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        parser.error("no chromium on the PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="toolreg-screenshot-") as directory:
        log = args.log
        if log is None:
            sys.path.insert(0, ROOT)
            from benchmarks._calls_log import write_log

            log = os.path.join(directory, "calls.jsonl")
            write_log(log, CALLS, seed=SEED, cancel_rate=CANCEL_RATE)
        page = os.path.join(directory, "report.html")
        command = [sys.executable, "-m", "toolreg", "report", os.path.abspath(log), "-o", page]
        if args.log is None:  # the page names the file it read: call it calls.jsonl
            command[4] = "calls.jsonl"
        subprocess.run(command, check=True, cwd=directory)
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
