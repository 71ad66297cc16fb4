"""Runs a model scenario on the real registry, through public API only, and records what the
call did in the model's terms (`contract_model.Outcome`).

Every hook, wrapper and body registered here is a small interpreter of the scenario of the
call it serves: it finds the call's `Run` from the call's arguments (`{"run": <id>}`), records
what it saw, cancels when the scenario says so (`Run.at`), and then decides as the scenario
says. A call without a run (the parent of a nested call) passes through untouched.

A registry (`Bench`) is set up once per entry mode; the hooks of one scenario *shape* (how many
hooks of each kind, which wrapper slots are the registry's own policies) are registered for all
the scenarios of that shape, then removed, so every path the engine picks for a set of hooks
(no hooks at all, a lone TimeoutPolicy, policies only, user wrappers) is taken.

Deadlines come due on the contract's test clock (`toolreg._cancel.manual_clock`, contract 1.15
and B.23: the token module's seam, not the pipeline's), advanced from inside a stage, so a
deadline fires exactly where the scenario says.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from contract_model import (
    ALLOW,
    ASK,
    CACHE,
    CALLER,
    CANCELLED,
    CLOSE,
    COOPERATIVE,
    DEADLINE,
    DENIED,
    DENY,
    ENTRY,
    FLAKY,
    HOOK_ERROR,
    KEEP,
    MALFORMED,
    NO,
    NONE,
    OTHER,
    RAISE,
    RETRY,
    RETRY_ATTEMPTS,
    SCOPE,
    SCOPE_OWNER,
    SUCCESS,
    TIMEOUT,
    TIMEOUT_SECONDS,
    TOOL_ERROR,
    VALUE,
    YES,
    Outcome,
    Scenario,
    Site,
)

from toolreg import (
    Allow,
    Ask,
    Cancelled,
    CancelSource,
    CancelToken,
    Deny,
    Dispatch,
    ErrorCode,
    Registration,
    RetryPolicy,
    TimeoutPolicy,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
)

WAIT = 10.0  # seconds any handshake may take before the scenario fails

#: Every run in flight, by id: the bodies of a threads Dask cluster find theirs here too.
RUNS: dict[int, Run] = {}
_ids = itertools.count(1)

TOOL = "t"  # the scenario tool: a sync body, exclusive in a batch
SAFE_TOOL = "t_safe"  # the same body, concurrency_safe=True (a parallel batch item)
ASYNC_TOOL = "t_async"  # the same body as an `async def`
PARENT_TOOL = "parent"  # a body that makes the scenario call with ctx.execute
FAST_TOOL = "t_fast"  # the sync body with a short real timeout (the concurrent layer)
FAST_SAFE_TOOL = "t_fast_safe"


class Run:
    """One scenario's call: its script, its caller's token, and what the call did."""

    def __init__(self, scenario: Scenario, clock: Any = None) -> None:
        self.id = next(_ids)
        self.scenario = scenario
        self.source = CancelSource()  # the caller's
        self.clock = clock  # advances the test clock (deadlines)
        self.events: list[tuple[Any, ...]] = []
        self.starts = 0
        self.settled = 0
        self.scopes: list[CancelSource] = []  # open SCOPE wrappers' sources, innermost last
        self.call_token: CancelToken | None = None  # the call's token, from the call hook
        self.observed: list[ToolResult[Any]] = []
        self.observed_event = threading.Event()
        self.caller_cancelled = False
        #: How the caller cancels from inside a stage (an MCP client cancels its request).
        self.cancel_caller: Callable[[], object] = self._cancel_source
        #: Starts registry.close() on another thread (set by the bench for CLOSE scenarios).
        self.close: Callable[[], object] | None = None
        self.returned: Any = None  # what a nested call returned to its parent body
        self.arguments = {"run": self.id}
        if scenario.site == ENTRY:
            self.source.cancel("cancelled before entry")

    def __enter__(self) -> Run:
        RUNS[self.id] = self
        return self

    def __exit__(self, *exc_info: object) -> None:
        del RUNS[self.id]

    def _cancel_source(self) -> None:
        self.source.cancel("caller")

    def at(self, site: Site) -> bool:
        """The scenario's own cancellation, if it lands at `site`; True if it did."""
        scenario = self.scenario
        if site != scenario.site:
            return False
        by = scenario.by
        if by == CALLER:
            self.caller_cancelled = self.caller_cancelled or not self.source.token.cancelled
            self.cancel_caller()
        elif by == SCOPE_OWNER:
            self.scopes[-1].cancel("scope")
        elif by == DEADLINE:
            self.clock.advance(TIMEOUT_SECONDS)
        elif by == CLOSE:
            assert self.close is not None, "a close() scenario needs its own registry"
            self.close()
        if by in (CALLER, CLOSE):  # close(), an MCP client's cancel: not synchronous
            assert self.call_token is not None and self.call_token.wait(WAIT), "never cancelled"
        return True


def run_of(call: ToolCall) -> Run | None:
    arguments = call.arguments
    if not isinstance(arguments, Mapping):
        return None
    return RUNS.get(arguments.get("run"))  # type: ignore[arg-type]


def code_of(result: ToolResult[Any]) -> str | None:
    code = result.code
    return None if code is None else str(code.value)


# -- the scenario's hooks ------------------------------------------------------------------------


def raise_for(decision: str, what: str) -> None:
    """A hook's decision to raise: RAISE raises an error, CANCELLED raises `Cancelled`."""
    if decision == RAISE:
        raise ValueError(f"{what} failed")
    if decision == CANCELLED:
        raise Cancelled(what)


def pre_hook(i: int) -> Callable[..., Any]:
    def hook(call: ToolCall, token: CancelToken) -> Any:
        run = run_of(call)
        if run is None:
            return None
        run.events.append(("pre", i, token.cancelled))
        run.at(("pre", i))
        decision = run.scenario.pre[i]
        if decision == NONE:
            return None
        if decision == ALLOW:
            return Allow()
        if decision == ASK:
            return Ask(f"ask{i}")
        if decision == DENY:
            return Deny(f"deny{i}")
        raise_for(decision, "pre-execute hook")
        assert decision == MALFORMED
        return 42

    return hook


def approver(call: ToolCall, reason: str, token: CancelToken) -> Any:
    run = run_of(call)
    if run is None:
        return True
    run.events.append(("approve", reason, token.cancelled))
    run.at(("approver",))
    answer = run.scenario.approver
    assert answer is not None
    raise_for(answer, "approver")
    return {YES: True, NO: False, OTHER: 1}[answer]


def guard(i: int) -> Callable[..., Any]:
    def check(call: ToolCall) -> Any:
        run = run_of(call)
        if run is None:
            return None
        run.events.append(("guard", i))
        run.at(("guard", i))
        verdict = run.scenario.guards[i]
        if verdict == DENY:
            return f"guard{i}"
        raise_for(verdict, "guard")
        return 42 if verdict == MALFORMED else None

    return check


def user_wrapper(i: int) -> Callable[..., Any]:
    def wrapper(dispatch: Dispatch, proceed: Callable[[], ToolResult[Any]]) -> Any:
        run = run_of(dispatch.call)
        if run is None:
            return proceed()
        kind = run.scenario.wrappers[i]
        run.events.append(("wrap", i, dispatch.token.cancelled))
        previous = dispatch.token
        scope = None
        if kind == SCOPE:
            scope = CancelSource(previous)
            dispatch.token = scope.token
            run.scopes.append(scope)
        try:
            run.at(("before", i))
            if kind == CACHE:
                return ToolResult.success(dispatch.call, "cached")
            raise_for(kind, "around wrapper")
            result = proceed()
            run.events.append(("unwrap", i, code_of(result)))
            run.at(("after", i))
            return 42 if kind == MALFORMED else result
        finally:
            if scope is not None:
                dispatch.token = previous
                run.scopes.remove(scope)
                scope.close()

    return wrapper


def post_hook(i: int) -> Callable[..., Any]:
    def hook(result: ToolResult[Any], token: CancelToken) -> Any:
        run = run_of(result.call)
        if run is None:
            return None
        run.events.append(("post", i, code_of(result), token.cancelled))
        run.at(("post", i))
        action = run.scenario.post[i]
        if action == KEEP:
            return None
        if action == SUCCESS:
            return ToolResult.success(result.call, "post")
        if action == DENY:
            return ToolResult.failure(result.call, ErrorCode.DENIED, "post")
        raise_for(action, "post-execute hook")
        assert action == MALFORMED
        return 42

    return hook


class Trace:
    """The call hook's trace of one run: its body() and end() are events."""

    def __init__(self, run: Run) -> None:
        self.run = run

    @contextlib.contextmanager
    def body(self, ctx: ToolContext) -> Iterator[None]:
        self.run.events.append(("trace_body",))
        yield

    def end(self, result: ToolResult[Any]) -> None:
        self.run.events.append(("end", code_of(result)))


def call_hook(call: ToolCall, token: CancelToken) -> Trace | None:
    run = run_of(call)
    if run is None:
        return None
    run.call_token = token
    run.events.append(("call", token.cancelled))
    run.at(("call",))
    return Trace(run)


def observer(result: ToolResult[Any]) -> None:
    run = run_of(result.call)
    if run is None:
        return
    run.events.append(("observe", code_of(result)))
    run.observed.append(result)
    run.observed_event.set()


# -- the body ------------------------------------------------------------------------------------


def begin(run: Run, ctx: Any) -> int:
    """A start of the body: count it, record what it saw, defer its context, cancel if due."""
    run.starts += 1
    start = run.starts
    run.events.append(("body", start, ctx.token.cancelled))
    ctx.defer_context(f"a{start}")
    if run.at(("body",)):
        # Whatever cancelled is an ancestor of the body's token; a remote body's token hears
        # of it through the cluster, so wait until it reads cancelled.
        assert ctx.token.wait(WAIT), "the body's token was never cancelled"
    return start


def outcome_at(run: Run, start: int) -> str:
    """What this start of the body does: FLAKY raises the first time only."""
    outcome = run.scenario.body
    if outcome == FLAKY:
        return RAISE if start == 1 else VALUE
    return outcome


def settle(run: Run, token: CancelToken, start: int) -> str:
    """The body's outcome, as the scenario says."""
    outcome = outcome_at(run, start)
    if outcome == COOPERATIVE:
        token.raise_if_cancelled()
    raise_for(outcome, "body")
    return "body"


def body(args: Any, ctx: Any) -> str:
    """The scenario tool's body (also run remotely by a Dask worker: only `ctx.token` and
    `ctx.defer_context` are used)."""
    run = RUNS[args["run"]]
    try:
        start = begin(run, ctx)
        return settle(run, ctx.token, start)
    finally:
        run.settled += 1


async def async_body(args: Any, ctx: ToolContext) -> str:
    """The body as an `async def`. It awaits once before an outcome that its task's cancellation
    would turn into the same result (8.5: cancelling its token cancels its task, and that is
    ABORTED; B.15: not when the call was pre-aborted, whose body's own outcome stands), never
    before raising an error, which a cancellation landing at the await would replace."""
    run = RUNS[args["run"]]
    try:
        start = begin(run, ctx)
        if outcome_at(run, start) != RAISE:
            await asyncio.sleep(0)
        return settle(run, ctx.token, start)
    finally:
        run.settled += 1


def parent_body(args: Any, ctx: ToolContext) -> str:
    run = RUNS[args["nest"]]
    run.returned = ctx.execute(args.get("tool", TOOL), run.arguments)
    return "parent"


# -- a registry set up for the scenarios ---------------------------------------------------------


class Bench:
    """A registry with the scenario tools, the call hook and the observer; `shaped` registers
    the hooks of one scenario shape."""

    def __init__(
        self,
        registry: ToolRegistry,
        body_fn: Callable[..., Any] = body,
        timeout: float = TIMEOUT_SECONDS,
        fast: float | None = None,
    ) -> None:
        self.registry = registry
        registry.tool(name=TOOL, timeout=timeout)(body_fn)
        registry.tool(name=SAFE_TOOL, timeout=timeout, concurrency_safe=True)(body_fn)
        registry.tool(name=ASYNC_TOOL, timeout=timeout)(async_body)
        registry.tool(name=PARENT_TOOL)(parent_body)
        if fast is not None:
            registry.tool(name=FAST_TOOL, timeout=fast)(body_fn)
            registry.tool(name=FAST_SAFE_TOOL, timeout=fast, concurrency_safe=True)(body_fn)
        registry.add_call_hook(call_hook)
        registry.on_result(observer)

    @contextlib.contextmanager
    def shaped(self, scenario: Scenario) -> Iterator[None]:
        """The hooks `scenario` needs, registered for the block."""
        registry = self.registry
        added: list[Registration] = []
        added += [registry.add_pre_execute(pre_hook(i)) for i in range(len(scenario.pre))]
        if scenario.approver is not None:
            added.append(registry.set_approver(approver))
        added += [registry.add_guard(guard(i)) for i in range(len(scenario.guards))]
        for i, kind in enumerate(scenario.wrappers):
            if kind == TIMEOUT:
                added.append(registry.add_around(TimeoutPolicy()))
            elif kind == RETRY:
                added.append(registry.add_around(RetryPolicy(RETRY_ATTEMPTS, backoff=0)))
            else:
                added.append(registry.add_around(user_wrapper(i)))
        added += [registry.add_post_execute(post_hook(i)) for i in range(len(scenario.post))]
        try:
            yield
        finally:
            for registration in added:
                registration.remove()


def closer(registry: ToolRegistry) -> tuple[Callable[[], object], Callable[[], None]]:
    """`start()` runs registry.close() on a thread of its own; `join()` waits for it."""
    thread = threading.Thread(target=registry.close, name="contract-close", daemon=True)

    def join() -> None:
        if thread.ident is not None:
            thread.join(WAIT)
            assert not thread.is_alive(), "close() never returned"

    return thread.start, join


# -- what a run did --------------------------------------------------------------------------------


def own_tokens(scenario: Scenario) -> bool:
    """Whether a wrapper gives the body a token of its own (a scope, a deadline)."""
    return SCOPE in scenario.wrappers or TIMEOUT in scenario.wrappers


def outcome_of(run: Run) -> Outcome:
    """The run in the model's terms; checks what holds for every call on the way."""
    assert len(run.observed) == 1, f"observed {len(run.observed)} times"
    assert run.starts == run.settled, "a body started and was not joined"
    [result] = run.observed
    code = code_of(result)
    timeline = result.timeline
    assert timeline is not None
    assert result.dispatched == (timeline.dispatched is not None)
    assert timeline.finished == result.duration
    if code is None and run.events[0] == ("call", False) and not own_tokens(run.scenario):
        # 4.5 with 16.1: live at entry (its call hook, which runs after the capture, saw it
        # live) and no token but the call's own: a success means the call's token was not
        # cancelled when the result became final, which the timeline would show.
        assert timeline.cancelled is None, "a success let through after its cancellation"
    assert result.call.arguments == run.arguments, "the final result carries another call"
    content: str | None = result.content
    if code in (TOOL_ERROR, HOOK_ERROR):  # 5.6: "Error: <message>"
        assert result.error is not None and content == f"Error: {result.error.message}"
        content = None
    if code is None:
        detail = result.value
    else:
        assert result.error is not None
        detail = result.error.message if code == DENIED else None
    return Outcome(
        events=tuple(run.events),
        starts=run.starts,
        code=code,
        dispatched=result.dispatched,
        detail=detail,
        content=content,
        contexts=tuple(result.contexts),
        caller_cancelled=run.caller_cancelled,
    )
