"""An executable model of docs/contract.md sections 3-5 and of the policies of section 6.

Sequential, small and deliberately naive: it knows nothing of threads and nothing of toolreg's
code (it does not import toolreg), so a reader checks it against the contract's sentences, not
against the engine. Given a `Scenario` (what each hook, wrapper and the body decide, and where
a cancellation lands) and an entry mode, `predict` says what the contract makes of it: which
stages run and in what order, with what each saw; how many times the body starts; the final
code, `dispatched`, content and deferred contexts; and what the call hook's trace and the
observers see. The engine is then run on the same scenario (`contract_harness`) and must
produce exactly that.

Every rule is a method marked `@rule("4.2", ...)` with the contract items it encodes;
`NO_RULE` says why the other items of sections 3-5 have none. `test_contract_coverage.py`
checks both lists against docs/contract.md.

Cancellation comes from inside the stages, so each scenario is deterministic: `Scenario.site`
is the stage where it lands (inside a hook before it returns its decision, inside a wrapper
before or after `proceed()`, inside the body before its outcome) and `Scenario.by` who cancels.
For the concurrent layer the model also takes `landing`: the steps (every read of a token that
the contract or the scenario's own code makes is one) before which an asynchronous cancellation
takes effect; `allowed_outcomes` runs every landing and gives the set the contract allows. A
caller or a scope owner cancels once; each deadline comes due on its own (a retry outside a
TimeoutPolicy gives each attempt one), so a deadline's landing may be several steps.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any, TypeVar

# -- the vocabulary of a scenario ---------------------------------------------------------------

# A pre-execute hook's decision (stage 2).
NONE, ALLOW, ASK, DENY, RAISE, CANCELLED, MALFORMED = (
    "none",  # returns None
    "allow",  # returns Allow()
    "ask",  # returns Ask("ask<i>")
    "deny",  # returns Deny("deny<i>")
    "raise",  # raises ValueError
    "cancelled",  # raises Cancelled (whether or not its token is cancelled)
    "malformed",  # returns something its stage does not allow (an int)
)
PRE_DECISIONS = (NONE, ALLOW, ASK, DENY, RAISE, CANCELLED, MALFORMED)

# The approver's answer (stage 3); None in a scenario means no approver is set.
YES, NO, OTHER = "yes", "no", "other"  # True; False; a truthy value that is not True
APPROVER_ANSWERS = (YES, NO, OTHER, RAISE, CANCELLED)

# A guard's verdict (stage 4): PASS returns None, DENY returns "guard<i>".
PASS = "pass"
GUARD_VERDICTS = (PASS, DENY, RAISE, CANCELLED, MALFORMED)

# An around wrapper (stage 5), outermost first. PASS, SCOPE, CACHE, RAISE, CANCELLED and
# MALFORMED are user wrappers; TIMEOUT and RETRY are the registry's own policies (section 6).
SCOPE = "scope"  # dispatch.token = CancelSource(dispatch.token).token around proceed()
TIMEOUT = "timeout"  # TimeoutPolicy(); the tool has a timeout
RETRY = "retry"  # RetryPolicy(attempts=2, backoff=0)
CACHE = "cache"  # returns ToolResult.success(call, "cached") without proceed()
# RAISE and CANCELLED raise before proceed(); MALFORMED calls proceed() and returns an int.
WRAPPER_KINDS = (PASS, SCOPE, TIMEOUT, RETRY, CACHE, RAISE, CANCELLED, MALFORMED)
USER_WRAPPERS = frozenset(WRAPPER_KINDS) - {TIMEOUT, RETRY}
RETRY_ATTEMPTS = 2

# The body's outcome (stage 6). Every start defers the context "a<start>" first.
VALUE = "value"  # returns "body" without looking at its token
COOPERATIVE = "cooperative"  # raises Cancelled if its token is cancelled, else returns "body"
FLAKY = "flaky"  # raises ValueError on the first start, returns "body" on later ones
# RAISE raises ValueError; CANCELLED raises Cancelled whether or not its token is cancelled.
BODY_OUTCOMES = (VALUE, RAISE, CANCELLED, COOPERATIVE, FLAKY)

# A post-execute hook's action (stage 7).
KEEP = "keep"  # returns None
SUCCESS = "success"  # returns ToolResult.success(call, "post")
# DENY returns ToolResult.failure(call, DENIED, "post"); MALFORMED returns an int; RAISE and
# CANCELLED raise.
POST_ACTIONS = (KEEP, SUCCESS, DENY, MALFORMED, RAISE, CANCELLED)

# Who cancels.
CALLER = "caller"  # the caller's CancelSource
SCOPE_OWNER = "scope"  # the innermost open SCOPE wrapper's source
DEADLINE = "deadline"  # every open TimeoutPolicy deadline comes due
CLOSE = "close"  # registry.close(), from another thread
CANCELLERS = (CALLER, SCOPE_OWNER, DEADLINE, CLOSE)

# Where it lands: ("entry",) means before execute (a pre-aborted call); otherwise inside a
# stage: ("call",) the call hook, ("pre", i), ("approver",), ("guard", i), ("before", i) and
# ("after", i) around wrapper i's proceed(), ("body",), ("post", i).
Site = tuple[Any, ...]
ENTRY: Site = ("entry",)

# Error codes, as the contract spells them (5.5).
ABORTED = "ABORTED"
BEFORE = "ABORTED_BEFORE_DISPATCH"
TOOL_TIMEOUT = "TOOL_TIMEOUT"
DENIED = "DENIED"
TOOL_ERROR = "TOOL_ERROR"
HOOK_ERROR = "HOOK_ERROR"

TIMEOUT_SECONDS = 10.0  # the scenario tool's timeout, as TimeoutPolicy reports it (5.6)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One call: what every stage decides, and where and by whom a cancellation lands."""

    pre: tuple[str, ...] = ()
    approver: str | None = None
    guards: tuple[str, ...] = ()
    wrappers: tuple[str, ...] = ()
    body: str = VALUE
    post: tuple[str, ...] = ()
    site: Site | None = None
    by: str = CALLER

    def __str__(self) -> str:
        fields = dataclasses.asdict(self)
        if self.site is None:
            del fields["by"]
        parts = [f"{k}={v!r}" for k, v in fields.items() if v not in ((), None)]
        return "Scenario(" + ", ".join(parts) + ")"

    @property
    def shape(self) -> tuple[Any, ...]:
        """What must be registered to run it: hook counts, the approver, the wrapper slots."""
        slots = tuple(kind if kind in (TIMEOUT, RETRY) else "user" for kind in self.wrappers)
        return (len(self.pre), self.approver is not None, len(self.guards), slots, len(self.post))


@dataclasses.dataclass(frozen=True)
class EntryMode:
    """A way a call enters, as far as the contract tells the ways apart.

    Every documented difference between entry modes is a field here, set once, by name.
    """

    name: str
    #: 4.6 / 4.7: a caller's token cancelled at entry still reaches the body (a direct call),
    #: or starts nothing and runs no hook (a model-driven call).
    start_if_cancelled: bool
    #: What the caller is handed back (`answer`): "result" (the ToolResult itself, the very
    #: object the observers saw), "mcp" (12.4: a tools/call answer, none for a request the
    #: client cancelled, 12.3), "langchain" (13.2: a ToolMessage with the result as artifact),
    #: "content" (13.3: result.content), "pydantic" (13.4: content, ModelRetry or ToolFailed).
    answer: str = "result"


MODES: dict[str, EntryMode] = {
    mode.name: mode
    for mode in (
        EntryMode("execute", True),  # stage list of section 3; 4.6 for a cancelled caller
        EntryMode("execute_model_driven", False),  # execute(..., start_if_cancelled=False), 4.7
        EntryMode("execute_executor", True),  # 2.6: a ThreadPoolExecutor passed in
        EntryMode("execute_debug", True),  # the toolreg logger at DEBUG (B.17): same contract
        EntryMode("nested", False),  # 2.4: ctx.execute is model-driven, under the body's token
        EntryMode("batch_parallel", False),  # 7, 4.7: batch calls are model-driven
        EntryMode("batch_exclusive", False),
        EntryMode("awaited", True),  # 8: the same arguments and results as execute
        EntryMode("async_body", True),  # 8.5: an async def body, joined like any other
        EntryMode("mcp", False, "mcp"),  # 12.1: tools/call is model-driven
        EntryMode("langchain", False, "langchain"),  # 13.1: every adapter is model-driven
        EntryMode("langchain_async", False, "langchain"),
        EntryMode("openai_agents", False, "content"),
        EntryMode("pydantic_ai", False, "pydantic"),
        EntryMode("dask", True),  # 14.1, 14.3: only the body moves; section 4 unchanged
    )
}


# -- what the model predicts --------------------------------------------------------------------

Event = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a call did, as far as the contract fixes it.

    `events`, in order: ("call", seen) the call hook at entry; ("pre", i, seen); ("approve",
    reason, seen); ("guard", i); ("wrap", i, seen) and ("unwrap", i, code) around a user
    wrapper's proceed(); ("trace_body",) the trace's body() entered, then ("body", start, seen);
    ("post", i, code, seen); ("end", code) the trace's end(); ("observe", code). `seen` is
    whether the token that stage was handed read cancelled when it began.
    """

    events: tuple[Event, ...]
    starts: int  # how many times the body started
    code: str | None
    dispatched: bool
    #: The success's value, or a denial's reason; None for other failures.
    detail: str | None
    #: The exact content, or None where it is "Error: " + the message, which the contract
    #: leaves to the engine (a tool's or a hook's exception).
    content: str | None
    contexts: tuple[str, ...]
    #: The caller cancelled during the call (not before it).
    caller_cancelled: bool


# -- the rules -----------------------------------------------------------------------------------

#: rule (method) name -> the contract items it encodes.
RULES: dict[str, tuple[str, ...]] = {}

#: Contract items of sections 3-5 that no rule of this model encodes, and why.
NO_RULE: dict[str, str] = {
    "stage 1": "every scenario calls one registered tool with valid arguments; the entry checks "
    "are tests/test_arguments.py's (the model starts after them, as admitted calls do)",
    "3.2": "hooks registered or removed during a call: the scenarios register theirs before the "
    "call (tests/test_hooks.py pins the snapshot)",
    "3.5": "a proceed() called after its call ended or on another thread: the scenarios' "
    "wrappers call proceed() on the stage thread during the call (tests/test_wrappers.py)",
    "4.8": "interrupts (Ctrl-C, SystemExit): no scenario raises one; tests/test_ctrl_c.py "
    "raises them at every stage",
    "4.9": "listeners left on the caller's token are not an outcome of the call "
    "(tests/test_contract.py, tests/test_hygiene.py)",
    "5.7": "a message whose str() raises: the scenarios' exceptions have plain messages "
    "(tests/test_results.py)",
}

F = TypeVar("F", bound=Callable[..., Any])


def rule(*items: str) -> Callable[[F], F]:
    """Mark a method as the rule encoding `items` of the contract; count it when it applies."""

    def mark(method: F) -> F:
        RULES[method.__name__] = items

        @functools.wraps(method)
        def applied(self: Model, *args: Any, **kwargs: Any) -> Any:
            self.applied.add(method.__name__)
            return method(self, *args, **kwargs)

        return applied  # type: ignore[return-value]

    return mark


class Token:
    """A cancellation token as the contract describes it (section 1): cancelled once any
    parent is, or by its own cause; the first cause in time wins (1.12)."""

    def __init__(self, *parents: Token) -> None:
        self.parents = parents
        self.at: int | None = None  # the moment of its own cause, if that came first
        self.by_timer = False  # its own cause was its timer (a deadline coming due)

    def cause(self) -> int | None:
        """When it was first cancelled (by itself or through a parent), or None."""
        moments = [parent.cause() for parent in self.parents]
        moments.append(self.at)
        found = [moment for moment in moments if moment is not None]
        return min(found) if found else None

    @property
    def cancelled(self) -> bool:
        return self.cause() is not None

    def cancel(self, now: int, by_timer: bool = False) -> None:
        if not self.cancelled:  # a cancelled token stays cancelled with its first cause (1.2)
            self.at, self.by_timer = now, by_timer

    def timed_out(self) -> bool:
        """Its own timer fired before any parent was cancelled (1.11, `source.timed_out`)."""
        return self.by_timer and self.cause() == self.at


@dataclasses.dataclass(frozen=True)
class Result:
    """A result inside the pipeline, before it is final."""

    code: str | None  # None: a success
    detail: str | None = None
    contexts: tuple[str, ...] = ()
    #: A HOOK_ERROR the registry made itself (for a broken hook or wrapper): it skips the
    #: post-execute hooks (stage 7). Passed through by a wrapper that hands it back as it is.
    registry_made: bool = False
    #: A TOOL_ERROR carrying an `Exception` the body raised (what RetryPolicy retries).
    retryable: bool = False

    @property
    def ok(self) -> bool:
        return self.code is None


Landing = frozenset[int]
QUIET: Landing = frozenset()

Ask = int  # the index of the first hook that asked (its reason is "ask<i>")
PreOutcome = Result | Ask | None


class Model:
    """One call through the contract, step by step. Use `predict()`."""

    def __init__(
        self,
        scenario: Scenario,
        mode: EntryMode,
        landing: Landing,
        lands_by: str,
        timeout: float = TIMEOUT_SECONDS,
    ) -> None:
        self.s = scenario
        self.timeout = timeout  # the tool's timeout, as TOOL_TIMEOUT's content shows it
        self.mode = mode
        self.landing = landing  # the steps before which an asynchronous cancellation lands
        self.lands_by = lands_by
        self.steps = 0
        self.now = 0  # a logical clock: every cancellation gets its own moment
        self.applied: set[str] = set()
        self.events: list[Event] = []
        self.starts = 0
        self.caller_cancelled = False
        self.reached: set[Site] = set()
        self.caller = Token()
        self.call = Token(self.caller)  # the call's token, a child of the caller's
        self.dispatch = self.call  # dispatch.token: what a wrapper holds now
        self.scopes: list[Token] = []  # open SCOPE wrappers' tokens, innermost last
        self.deadlines: list[Token] = []  # open TimeoutPolicy deadlines
        self.live = True

    # -- cancellation ----------------------------------------------------------------------------

    def cancel(self, by: str) -> None:
        """`by` cancels now: the caller its own token (which the call's token follows), a
        scope's owner its scope, a deadline comes due (every deadline open now: they share the
        tool's timeout), or close()."""
        self.now += 1
        if by == CALLER:
            self.caller.cancel(self.now)
        elif by == CLOSE:
            self.close_registry()
        elif by == SCOPE_OWNER:
            if self.scopes:
                self.scopes[-1].cancel(self.now)
        elif by == DEADLINE:
            for deadline in self.deadlines:
                deadline.cancel(self.now, by_timer=True)
        else:
            raise ValueError(f"unknown canceller {by!r}")

    @rule("4.10")
    def close_registry(self) -> None:
        """close() cancels every call in flight: the call's token, never the caller's."""
        self.call.cancel(self.now)

    def read(self, token: Token) -> bool:
        """A read of `token` that the contract or the scenario's own code makes: one step."""
        self.steps += 1
        if self.steps in self.landing:
            self.cancel(self.lands_by)
        return token.cancelled

    def at(self, site: Site) -> None:
        """The scenario's own cancellation, from inside the stage at `site`."""
        self.reached.add(site)
        if site == self.s.site:
            if self.s.by == CALLER and site != ENTRY and not self.caller.cancelled:
                self.caller_cancelled = True
            self.cancel(self.s.by)

    # -- results ---------------------------------------------------------------------------------

    @rule("4.5", "5.5")
    def aborted(self, contexts: tuple[str, ...] = ()) -> Result:
        """A cancellation's result: ABORTED if a body of the call started, else
        ABORTED_BEFORE_DISPATCH (nothing ran)."""
        return Result(ABORTED if self.starts else BEFORE, contexts=contexts)

    def denied(self, reason: str) -> Result:
        return Result(DENIED, reason)

    @rule("3.3")
    def hook_error(self) -> Result:
        """A hook or wrapper that returns what its stage does not allow, or raises: HOOK_ERROR."""
        return Result(HOOK_ERROR, registry_made=True)

    @rule("3.3", "4.11")
    def raised_cancelled(self, held: Token) -> Result:
        """`Cancelled` raised by a hook or wrapper: cancellation if the call's token (or the
        token the wrapper holds) is cancelled, else a malfunction."""
        if self.read(self.call) or (held is not self.call and self.read(held)):
            return self.aborted()
        return self.hook_error()

    # -- the pipeline ----------------------------------------------------------------------------

    def run(self) -> Outcome:
        if self.s.site == ENTRY:
            self.at(ENTRY)
        self.capture()
        self.call_hook()
        if not self.live and not self.mode.start_if_cancelled:
            return self.finish(self.refused_at_entry())
        result = self.gate()
        if result is None:
            result = self.proceed(0)
            result = self.replace_success(result)
        if not result.registry_made and self.s.post:
            result = self.post_execute(result)
            result = self.replace_success(result)
        return self.finish(result)

    @rule("4.1", "4.2")
    def capture(self) -> None:
        """The caller's token is captured at entry, and whether it was live is read once."""
        self.live = not self.read(self.caller)

    @rule("3.6")
    def call_hook(self) -> None:
        """The call hook runs at entry (after the capture), with the call's token."""
        self.events.append(("call", self.read(self.call)))
        self.at(("call",))

    @rule("4.7")
    def refused_at_entry(self) -> Result:
        """A model-driven call under a token cancelled at entry: no hook runs, no body."""
        return Result(BEFORE)

    @rule("4.2", "4.11")
    def gate(self) -> Result | None:
        """Stages 2-4, with the rechecks after the pre-execute hooks and after approval.

        Cancelled at a recheck: ABORTED_BEFORE_DISPATCH, even when the stage denied; a
        malfunction stays HOOK_ERROR (4.11). The recheck does not depend on what the hooks
        returned: a hook that decided nothing is rechecked like one that allowed.
        """
        decided = self.pre_execute()
        malfunction = isinstance(decided, Result) and decided.registry_made
        if self.live and self.read(self.call) and not malfunction:
            return self.aborted()
        if isinstance(decided, Result):
            return decided
        if decided is not None:  # some hook asked
            denial = self.approval(decided)
            if self.live and self.read(self.call):
                return self.aborted()
            if denial is not None:
                return denial
        return self.guard_stage()

    @rule("stage 2", "3.1", "3.3")
    def pre_execute(self) -> PreOutcome:
        """In registration order; the first Deny (or failure) ends the stage; remember the
        first Ask. Each hook gets the call's token."""
        first_ask: Ask | None = None
        for i, decision in enumerate(self.s.pre):
            self.events.append(("pre", i, self.read(self.call)))
            self.at(("pre", i))
            if decision in (NONE, ALLOW):
                continue
            if decision == ASK:
                first_ask = i if first_ask is None else first_ask
                continue
            if decision == DENY:
                return self.denied(f"deny{i}")
            if decision == CANCELLED:
                return self.raised_cancelled(self.call)
            return self.hook_error()  # RAISE, MALFORMED
        return first_ask

    @rule("stage 3", "3.1")
    def approval(self, ask: Ask) -> Result | None:
        """The approver, consulted once with the first Ask's reason: only True approves;
        without an approver an Ask is a denial; an approver that raises denies (B.7), unless it
        raised Cancelled because its turn was cancelled."""
        reason = f"ask{ask}"
        if self.s.approver is None:
            return self.denied(reason)
        self.events.append(("approve", reason, self.read(self.call)))
        self.at(("approver",))
        answer = self.s.approver
        if answer == YES:
            return None
        if answer == CANCELLED and self.read(self.call):
            return self.aborted()
        return self.denied(reason)  # NO, OTHER, RAISE, CANCELLED while live

    @rule("stage 4", "3.3")
    def guard_stage(self) -> Result | None:
        """`fn(call) -> str | None`: a string denies. No recheck follows the guards: the check
        before the body catches a cancellation that lands here (4.2)."""
        for i, verdict in enumerate(self.s.guards):
            self.events.append(("guard", i))
            self.at(("guard", i))
            if verdict == PASS:
                continue
            if verdict == DENY:
                return self.denied(f"guard{i}")
            if verdict == CANCELLED:
                return self.raised_cancelled(self.call)
            return self.hook_error()  # RAISE, MALFORMED
        return None

    @rule("stage 5")
    def proceed(self, i: int) -> Result:
        """Wrapper `i` (the first registered is the outermost), or the body past the last."""
        if i == len(self.s.wrappers):
            return self.body()
        kind = self.s.wrappers[i]
        if kind == TIMEOUT:
            return self.timeout_policy(i)
        if kind == RETRY:
            return self.retry_policy(i)
        return self.user_wrapper(i, kind)

    @rule("stage 5", "3.3")
    def user_wrapper(self, i: int, kind: str) -> Result:
        self.events.append(("wrap", i, self.read(self.dispatch)))
        previous = self.dispatch
        if kind == SCOPE:
            self.dispatch = Token(previous)
            self.scopes.append(self.dispatch)
        self.at(("before", i))
        if kind == CACHE:
            return Result(None, "cached")  # its own success: ToolResult.success(call, "cached")
        if kind == RAISE:
            return self.hook_error()
        if kind == CANCELLED:
            return self.raised_cancelled(self.dispatch)
        result = self.proceed(i + 1)
        self.events.append(("unwrap", i, result.code))
        self.at(("after", i))
        if kind == SCOPE:
            self.scopes.pop()
            self.dispatch = previous
        if kind == MALFORMED:
            return self.hook_error()
        return result  # PASS, SCOPE: the very result proceed() returned

    @rule("6.1")
    def timeout_policy(self, i: int) -> Result:
        """A deadline derived from dispatch.token (and from the call's token when a wrapper
        replaced it) around proceed(); TOOL_TIMEOUT only if its own timer fired before the
        call's token was cancelled and the result is a cancellation. Closed after proceed():
        nothing that happens later can fire it."""
        previous = self.dispatch
        parent = previous if previous is self.call else Token(previous, self.call)
        deadline = Token(parent)
        self.dispatch = deadline
        self.deadlines.append(deadline)
        result = self.proceed(i + 1)
        expired = result.code in (ABORTED, BEFORE) and self.read_timed_out(deadline)
        self.deadlines.remove(deadline)
        self.dispatch = previous
        if expired:
            return Result(TOOL_TIMEOUT, contexts=result.contexts)
        return result

    def read_timed_out(self, deadline: Token) -> bool:
        self.read(deadline)  # one step: the policy reads its deadline
        return deadline.timed_out()

    @rule("6.2")
    def retry_policy(self, i: int) -> Result:
        """Re-run proceed() while the result is a TOOL_ERROR carrying an Exception, up to the
        attempts, waiting on dispatch.token fused with the call's token; never once either is
        cancelled. The last attempt's result stands."""
        attempt = 1
        result = self.proceed(i + 1)
        while attempt < RETRY_ATTEMPTS and result.retryable:
            if self.read(Token(self.dispatch, self.call)):
                return result
            attempt += 1
            result = self.proceed(i + 1)
        return result

    @rule("stage 6", "4.2", "4.3", "4.4", "4.6")
    def body(self) -> Result:
        """The body's token is the call's, fused with what dispatch.token holds now. For a call
        live at entry it is checked once more right before the body: cancelled, the body never
        starts. Started, the body is joined (this method returns only once it settled). A
        success returned with its token cancelled, or Cancelled raised while it is, is ABORTED;
        a pre-aborted call's body outcome stands, except Cancelled under its cancelled token."""
        token = self.call if self.dispatch is self.call else Token(self.call, self.dispatch)
        if self.live and self.read(token):
            return self.aborted()
        self.starts += 1
        start = self.starts
        self.events.append(("trace_body",))
        self.events.append(("body", start, self.read(token)))
        contexts = (f"a{start}",)
        self.at(("body",))
        outcome = self.s.body
        if outcome == FLAKY:
            outcome = RAISE if start == 1 else VALUE
        if outcome == COOPERATIVE:
            outcome = CANCELLED if self.read(token) else VALUE
        if outcome == RAISE:
            return Result(TOOL_ERROR, contexts=contexts, retryable=True)
        if outcome == CANCELLED:
            if self.read(token):
                return self.aborted(contexts)
            return Result(TOOL_ERROR, contexts=contexts)  # Cancelled is no Exception: not retried
        live_on_return = not self.read(token)
        if self.live and not live_on_return:
            return self.aborted(contexts)
        return Result(None, "body", contexts)

    @rule("4.5")
    def replace_success(self, result: Result) -> Result:
        """After the wrappers, and again after the post-execute hooks: a cancellation of the
        call's token that won meanwhile replaces a success (keeping its contexts); failures
        stay. Not for a pre-aborted call (4.6)."""
        if result.ok and self.live and self.read(self.call):
            return self.aborted(result.contexts)
        return result

    @rule("stage 7", "3.1", "3.3", "5.3")
    def post_execute(self, result: Result) -> Result:
        """Each hook gets the result so far and the call's token; None keeps it; a failure may
        not become a success (HOOK_ERROR); a hook that raises Cancelled while the call's token
        is cancelled ends the stage as a cancellation (a success is replaced, a failure stays)."""
        for i, action in enumerate(self.s.post):
            self.events.append(("post", i, result.code, self.read(self.call)))
            self.at(("post", i))
            if action == KEEP:
                continue
            if action == SUCCESS:
                if not result.ok:
                    return self.hook_error()
                result = Result(None, "post")
                continue
            if action == DENY:
                result = Result(DENIED, "post")
                continue
            if action == CANCELLED and self.read(self.call):
                return self.aborted(result.contexts) if result.ok else result
            return self.hook_error()  # MALFORMED, RAISE, CANCELLED while live
        return result

    @rule("stage 8", "3.4", "3.6", "5.1", "5.2")
    def finish(self, result: Result) -> Outcome:
        """The final result: `dispatched` is whether a body of this call started, whatever a
        hook returned; the trace's end() sees it, then each observer once; execute returns it."""
        self.events.append(("end", result.code))
        self.events.append(("observe", result.code))
        return Outcome(
            events=tuple(self.events),
            starts=self.starts,
            code=result.code,
            dispatched=self.starts > 0,
            detail=result.detail if result.code in (None, DENIED) else None,
            content=self.content(result),
            contexts=result.contexts,
            caller_cancelled=self.caller_cancelled,
        )

    @rule("5.4", "5.6")
    def content(self, result: Result) -> str | None:
        """A str value is its own content; failures read "Error: <message>", with fixed texts
        for the two aborts and TOOL_TIMEOUT."""
        if result.ok:
            return result.detail
        fixed = {
            ABORTED: "Error: tool call aborted",
            BEFORE: "Error: tool call aborted before dispatch",
            TOOL_TIMEOUT: f"Error: tool call timed out after {format(self.timeout, 'g')}s",
        }
        if result.code in fixed:
            return fixed[result.code]
        if result.code == DENIED:
            return f"Error: {result.detail}"
        return None


# -- using the model -------------------------------------------------------------------------------


def predict(
    scenario: Scenario, mode: str, landing: Landing = QUIET, lands_by: str = CALLER
) -> Outcome:
    """What the contract says `scenario` does when entered as `mode`."""
    return Model(scenario, MODES[mode], landing, lands_by).run()


def trace(scenario: Scenario, mode: str) -> Model:
    """The model after running `scenario` (to read which sites and rules it reached)."""
    model = Model(scenario, MODES[mode], QUIET, CALLER)
    model.run()
    return model


@functools.cache
def allowed_outcomes(
    scenario: Scenario, mode: str, lands_by: str, timeout: float = TIMEOUT_SECONDS
) -> frozenset[Outcome]:
    """Every outcome the contract allows when `lands_by` cancels at any moment, or never: the
    cancellation lands before one of the steps (a read of a token), or after the last."""
    entry = MODES[mode]
    quiet = Model(scenario, entry, QUIET, lands_by, timeout)
    outcomes = {quiet.run()}
    # Each deadline comes due on its own: a retry outside a TimeoutPolicy opens one per attempt.
    wrappers = scenario.wrappers
    retried = RETRY in wrappers and TIMEOUT in wrappers[wrappers.index(RETRY) :]
    times = RETRY_ATTEMPTS if lands_by == DEADLINE and retried else 1
    longest = quiet.steps  # a cancellation may lengthen the call: every step counts
    for count in range(1, times + 1):
        for landing in itertools.combinations(range(1, longest + 1), count):
            model = Model(scenario, entry, frozenset(landing), lands_by, timeout)
            outcomes.add(model.run())
            longest = max(longest, model.steps) if count == 1 else longest
    return frozenset(outcomes)


def answer(mode: str, result: Outcome, client_cancelled: bool) -> Any:
    """What the entry hands its caller for `result` (`EntryMode.answer`)."""
    kind = MODES[mode].answer
    failed = result.code is not None
    if kind == "mcp":
        if client_cancelled:
            return None  # 12.3: a request the client cancelled is never answered
        return {"isError": failed, "code": result.code, "dispatched": result.dispatched}
    if kind == "langchain":
        return {"content": result.content, "status": "error" if failed else "success"}
    if kind == "content":
        return result.content
    if kind == "pydantic":
        if not failed:
            return ("return", result.content)
        return ("retry" if result.code == "INVALID_ARGS" else "failed", result.content)
    return result
