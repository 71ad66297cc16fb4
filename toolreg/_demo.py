"""The live demonstration behind `python -m toolreg demo`.

A registry with a few tools (one that cooperates with cancellation, one that ignores it, one that
fails, one behind an approver, one with a timeout) runs a short script of calls: two cancelled
mid-flight, a denial, a timeout, a caller that was already gone, and a small batch. Every result
goes to a `ResultLog` in a temporary directory; the demo ends with a table of the results.
Nothing to configure; it takes about a second.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

# The public names, as a user would import them.
from . import (
    Ask,
    CancelSource,
    CancelToken,
    TimeoutPolicy,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
)
from ._cli import UsageError, command
from .log import ResultLog

__all__ = ["EXAMPLES", "HELP", "add_arguments", "run"]

HELP = """\
A live demonstration of the cancellation contract, about a second long. A registry with a few
tools runs a short script of calls, narrated as they happen:

1. two calls cancelled mid-flight by their caller: a cooperative crawler that stops at once
   (its deferred context survives), and a renderer that ignores its token, which execute()
   waits for (drained, not abandoned) before reporting ABORTED;
2. a tool behind an approver: one call approved, one DENIED;
3. a TimeoutPolicy deadline (TOOL_TIMEOUT) and a tool that raises (TOOL_ERROR);
4. a model-driven call whose turn was already cancelled: ABORTED_BEFORE_DISPATCH, no body;
5. a batch of eight fetches with a progress bar.

Every result goes to a result log (calls.jsonl in --log-dir, default a new temporary
directory); the demo ends with a table of the results and the commands that summarize the log
(stats) and draw it (report)."""

EXAMPLES = """\
examples:
  python -m toolreg demo
  python -m toolreg demo --log-dir /tmp/demo     # then: stats and report on /tmp/demo/calls.jsonl
  python -m toolreg demo --json                  # the story as one JSON document"""

_CRAWL_STEP = 0.05  # seconds per page of the cooperative tool
_RENDER_TIME = 0.6  # seconds the uncooperative tool works, whatever happens
_SEARCH_TIMEOUT = 0.2
_BATCH_SIZE = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `demo` subcommand's arguments."""
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--log-dir", metavar="DIR", help="where to write calls.jsonl (default: a new temp dir)"
    )


def run(args: argparse.Namespace) -> int:
    """Run the demonstration with parsed arguments; the exit status."""
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="toolreg-demo-")
    log_path = os.path.join(log_dir, "calls.jsonl")
    try:
        os.makedirs(log_dir, exist_ok=True)
        with open(log_path, "ab"):  # the log appends: fail here, before any call runs
            pass
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise UsageError(f"--log-dir {log_dir}: cannot write {log_path} ({why})") from None
    demo = _Demo(log_path, quiet=args.json)
    report = demo.run()
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=repr)
        sys.stdout.write("\n")
    return 0


class _Demo:
    def __init__(self, log_path: str, quiet: bool) -> None:
        self.log_path = log_path
        self.quiet = quiet
        self.rows: list[tuple[str, ToolResult[Any]]] = []
        self.steps: list[dict[str, Any]] = []
        self.crawl_progress = threading.Event()  # set once the crawler has done some pages
        self.render_started = threading.Event()
        self.render_finished_at = 0.0

    def say(self, text: str = "") -> None:
        if not self.quiet:
            print(text, flush=True)

    # -- the tools -------------------------------------------------------------------------------

    def build(self, registry: ToolRegistry) -> None:
        @registry.tool(description="Crawl pages; stops promptly when cancelled")
        def crawl(args: Any, ctx: ToolContext) -> Any:
            for page in range(args.get("pages", 10)):
                if page == 2:
                    self.crawl_progress.set()
                if ctx.token.wait(_CRAWL_STEP):
                    # Keep what was learnt: a deferred context survives the cancellation.
                    ctx.defer_context({"pages_crawled": page, "resume_from": page})
                    ctx.token.raise_if_cancelled()
            return {"pages_crawled": args.get("pages", 10)}

        @registry.tool(description="Render a video; never looks at its token")
        def render_video(args: Any, ctx: ToolContext) -> Any:
            time.sleep(_RENDER_TIME / 6)  # uncooperative on purpose: never looks at ctx.token
            self.render_started.set()
            time.sleep(_RENDER_TIME * 5 / 6)
            self.render_finished_at = time.monotonic()
            return "video.mp4"

        @registry.tool(description="Call an upstream API that is down")
        def flaky_api(args: Any, ctx: ToolContext) -> Any:
            raise ConnectionError("upstream returned 503")

        @registry.tool(description="Delete a file (needs approval; the demo deletes nothing)")
        def delete_file(args: Any, ctx: ToolContext) -> Any:
            return f"would delete {args['path']}"

        @registry.tool(description="Search slowly", timeout=_SEARCH_TIMEOUT)
        def slow_search(args: Any, ctx: ToolContext) -> Any:
            ctx.token.wait(5.0)  # cooperative: wakes up when its deadline fires
            ctx.token.raise_if_cancelled()
            return []

        @registry.tool(description="Fetch a URL", concurrency_safe=True)
        def fetch(args: Any, ctx: ToolContext) -> Any:
            ctx.token.wait(0.03 + 0.01 * (len(args["url"]) % 4))
            ctx.token.raise_if_cancelled()
            return {"url": args["url"], "status": 200}

        def ask_before_deleting(call: ToolCall, token: CancelToken) -> Ask | None:
            if call.name != "delete_file":
                return None
            return Ask(f"delete {(call.arguments or {}).get('path')}?")

        def approver(call: ToolCall, reason: str, token: CancelToken) -> bool:
            approved = str((call.arguments or {}).get("path")).startswith("/tmp/")
            self.say(f"   approver asked {reason!r}: {'approved' if approved else 'denied'}")
            return approved

        registry.add_pre_execute(ask_before_deleting)
        registry.set_approver(approver)
        registry.add_around(TimeoutPolicy())

    # -- the script ------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        log = ResultLog(self.log_path)
        registry = ToolRegistry(max_workers=4)
        try:
            registry.on_result(log)
            self.build(registry)
            self.say("toolreg demo: cooperative, quiescent cancellation")
            self.say(f"result log: {self.log_path}")
            self.cancel_mid_flight(registry)
            self.approvals(registry)
            self.timeout_and_failure(registry)
            self.caller_already_gone(registry)
            batch = self.batch(registry)
        finally:
            registry.close()
            log.close()
        self.table()
        self.say(f"\n{len(self.rows)} results written to {self.log_path}")
        toolreg, path = command(), shlex.quote(self.log_path)
        self.say(f"per-tool figures: {toolreg} stats {path}")
        page = shlex.quote(os.path.join(os.path.dirname(self.log_path), "report.html"))
        needs = "" if importlib.util.find_spec("plotly") else "  (needs the report extra)"
        self.say(f"see what happened: {toolreg} report {path} -o {page}{needs}")
        return {
            "log": self.log_path,
            "steps": self.steps,
            "batch": batch,
            "results": [_row(label, result) for label, result in self.rows],
        }

    def record(self, label: str, result: ToolResult[Any], **facts: Any) -> None:
        self.rows.append((label, result))
        self.steps.append({**_row(label, result), **facts})

    def cancel_after(
        self, registry: ToolRegistry, call: ToolCall, ready: threading.Event
    ) -> tuple[ToolResult[Any], float, float, float]:
        """Run `call`; a "user" thread cancels it once `ready` is set.

        Returns the result, when the cancel came and when `execute` returned (seconds after the
        call started), and the `time.monotonic()` of that return.
        """
        source = CancelSource()
        started = time.monotonic()
        cancelled_at: list[float] = []

        def user() -> None:
            ready.wait(5.0)  # bounded: a body that never starts must not hang the demo
            cancelled_at.append(time.monotonic() - started)
            source.cancel("user pressed stop")

        thread = threading.Thread(target=user, name="demo-user")
        thread.start()
        result = registry.execute(call, token=source.token)
        returned = time.monotonic()
        thread.join()
        return result, cancelled_at[0], returned - started, returned

    def cancel_mid_flight(self, registry: ToolRegistry) -> None:
        self.say("\n1. cancelled mid-flight by the caller")
        call = ToolCall("crawl", {"pages": 40})
        result, at, took, _ = self.cancel_after(registry, call, self.crawl_progress)
        self.say(
            f"   crawl (cooperative): cancel at {at:.2f}s, execute returned at {took:.2f}s"
            f" -> {_code(result)}"
        )
        self.say(f"   its deferred context survived the cancellation: {list(result.contexts)}")
        self.record("crawl (cancelled)", result, cancelled_at=at, returned_at=took)

        call = ToolCall("render_video", {"scene": 1})
        result, at, took, returned = self.cancel_after(registry, call, self.render_started)
        drained = 0 < self.render_finished_at <= returned
        self.say(
            f"   render_video (ignores its token): cancel at {at:.2f}s, execute returned at"
            f" {took:.2f}s -> {_code(result)}"
        )
        if drained:
            self.say(
                "   drained: execute returned only after the body finished its "
                f"{_RENDER_TIME:g}s of work, and its success did not escape"
            )
        self.record(
            "render_video (cancelled)",
            result,
            cancelled_at=at,
            returned_at=took,
            body_finished_before_return=drained,
        )

    def approvals(self, registry: ToolRegistry) -> None:
        self.say("\n2. a tool behind an approver")
        for path in ("/tmp/scratch.txt", "/etc/passwd"):
            result = registry.execute("delete_file", {"path": path})
            self.say(f"   delete_file {path}: {_code(result)} {_detail(result)}")
            self.record(f"delete_file {path}", result)

    def timeout_and_failure(self, registry: ToolRegistry) -> None:
        self.say("\n3. a timeout (TimeoutPolicy) and a failing tool")
        result = registry.execute("slow_search", {"q": "quiescent"})
        limit = f"{_SEARCH_TIMEOUT:g}s"
        self.say(f"   slow_search (timeout {limit}): {_code(result)} {_detail(result)}")
        self.record("slow_search", result)
        result = registry.execute("flaky_api", {})
        self.say(f"   flaky_api: {_code(result)} {_detail(result)}")
        self.record("flaky_api", result)

    def caller_already_gone(self, registry: ToolRegistry) -> None:
        self.say("\n4. a model-driven call whose turn was already cancelled")
        gone = CancelSource()
        gone.cancel("turn abandoned")
        result = registry.execute("crawl", {"pages": 3}, token=gone.token, start_if_cancelled=False)
        self.say(f"   crawl: {_code(result)}, dispatched={result.dispatched} (no body started)")
        self.record("crawl (caller gone)", result)

    def batch(self, registry: ToolRegistry) -> dict[str, Any]:
        urls = [f"https://example.com/{i}" for i in range(_BATCH_SIZE)]
        calls = [ToolCall("fetch", {"url": url}) for url in urls]
        # The batch API lands separately: use it when this registry has it.
        execute_batch: Callable[..., list[ToolResult[Any]]] | None = getattr(
            registry, "execute_batch", None
        )
        mode = "execute_batch" if execute_batch is not None else "one by one"
        self.say(f"\n5. a batch of {len(calls)} fetches ({mode})")
        bar = _ProgressBar(len(calls), self.quiet)
        if execute_batch is not None:
            results = execute_batch(calls, max_parallel=4, on_progress=bar.update)
        else:
            results = []
            for call in calls:
                results.append(registry.execute(call))
                bar.update(len(results), len(calls))
        bar.finish()
        for url, result in zip(urls, results, strict=True):
            self.rows.append((f"fetch {url.rsplit('/', 1)[1]}", result))
        codes = Counter(_code(result) for result in results)
        return {"mode": mode, "calls": len(calls), "codes": dict(codes)}

    def table(self) -> None:
        head = ("call", "code", "dispatched", "duration")
        lines = [head] + [
            (label, _code(result), "yes" if result.dispatched else "no", f"{result.duration:.3f}s")
            for label, result in self.rows
        ]
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
        self.say("\nresults")
        for line in lines:
            cells = zip(line, widths, strict=True)
            self.say("   " + "  ".join(cell.ljust(width) for cell, width in cells).rstrip())


class _ProgressBar:
    """A text bar: redrawn in place on a terminal, drawn once at the end otherwise."""

    def __init__(self, total: int, quiet: bool, width: int = 24) -> None:
        self.total = total
        self.done = 0
        self.width = width
        self.quiet = quiet
        self.live = not quiet and sys.stdout.isatty()
        self.lock = threading.Lock()  # guards done and the terminal line (batch threads report)

    def update(self, done: int, total: int) -> None:
        """`on_progress(done, total)`."""
        with self.lock:
            self.done, self.total = max(self.done, done), total
            if self.live:
                self._draw(end="")

    def finish(self) -> None:
        if not self.quiet:
            with self.lock:
                self._draw(end="\n")

    def _draw(self, end: str) -> None:
        filled = self.width * self.done // max(self.total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        print(f"\r   [{bar}] {self.done}/{self.total}", end=end, flush=True)


def _code(result: ToolResult[Any]) -> str:
    return "ok" if result.ok else str(result.code)


def _detail(result: ToolResult[Any]) -> str:
    return f"({result.error.message})" if result.error is not None else f"-> {result.content}"


def _row(label: str, result: ToolResult[Any]) -> dict[str, Any]:
    return {
        "call": label,
        "name": result.call.name,
        "call_id": result.call.call_id,
        "ok": result.ok,
        "code": None if result.code is None else str(result.code),
        "message": None if result.error is None else result.error.message,
        "dispatched": result.dispatched,
        "duration": round(result.duration, 6),
        "contexts": list(result.contexts),
    }
