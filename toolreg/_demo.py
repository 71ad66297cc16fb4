"""The live demonstration behind `python -m toolreg demo`."""

from __future__ import annotations

import argparse
import threading
import time

from ._cancel import CancelSource, deadline, timeout_of


def _demo_tokens() -> None:
    turn = CancelSource()
    call = CancelSource(turn.token)
    budget = deadline(call.token, 0.2, code="TOOL_TIMEOUT")
    started = time.monotonic()
    budget.token.on_cancel(lambda: print(f"  budget fired after {time.monotonic() - started:.2f}s"))
    print(f"  tree: turn -> call -> budget(0.2s)   {budget.token!r}")
    budget.token.wait()
    print(f"  budget: timed_out={budget.timed_out} reason={timeout_of(budget.token)}")
    print(f"  call still live: {call.token!r}")
    worker_saw = threading.Event()

    def worker() -> None:
        call.token.wait()
        worker_saw.set()

    thread = threading.Thread(target=worker)
    thread.start()
    turn.cancel("user pressed stop")
    thread.join()
    print(f"  turn cancelled -> call {call.token!r}; worker woke: {worker_saw.is_set()}")
    budget.close()
    call.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolreg")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="a short live demonstration of the cancellation contract")
    args = parser.parse_args(argv)
    if args.command == "demo":
        print("toolreg demo: cancellation tokens")
        _demo_tokens()
    return 0
