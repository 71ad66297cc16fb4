"""The stages of one call, and the cancellation contract they keep.

One `CallState` per call holds everything the stages share: the caller's token captured at entry
and whether it was live then (read once), the call's own token (a child of the caller's that
`close()` and Ctrl-C cancel too), whether a body started, the start time, the stage. Wrappers
only ever see a `Dispatch`, so nothing they can reach can detach the caller.

The contract, stage by stage (API.md sections 3 and 4):

* A token live at entry is rechecked after the pre-execute hooks, after approval, and on the
  body's thread immediately before the body, where the call's token is fused with whatever
  `dispatch.token` holds then. Cancelled at any of those points: `ABORTED_BEFORE_DISPATCH`, and
  the body never starts.
* Once a body starts it is joined, however long it ignores its token.
* Cancellation that wins before the final result is materialized replaces a *success*: `ABORTED`
  if a body started, else `ABORTED_BEFORE_DISPATCH`, keeping deferred contexts. Failures stay.
* Pre-aborted entry (`start_if_cancelled=True` and a cancelled caller token): the call goes
  through and the body's own outcome stands.

The check-then-start race on the body's thread is decided by `BodyRun`'s claim: if cancellation
lands after the check, the body starts with a cancelled token and its success becomes `ABORTED`
(it is `dispatched`); `ABORTED_BEFORE_DISPATCH` is only ever reported for a body that never runs.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ._body import INTERRUPTS, MAIN_THREAD_SLICE, BodyRun
from ._cancel import Cancelled, CancelSource, CancelToken, Registration
from ._hooks import Allow, Ask, Deny, Dispatch, HookSet
from ._progress import ProgressSink
from ._results import ErrorCode, ToolCall, ToolResult, render_content
from ._tools import Tool, ToolContext, Validator

if TYPE_CHECKING:
    from ._registry import ToolRegistry

logger = logging.getLogger("toolreg")

_ABORTED = ErrorCode.ABORTED
_BEFORE = ErrorCode.ABORTED_BEFORE_DISPATCH


class CallState:
    """Everything the stages of one call share (one object per call)."""

    __slots__ = (
        "body_run",
        "call",
        "caller_token",
        "debug",
        "dispatched",
        "hook_error",
        "hooks",
        "inline",
        "interrupted",
        "live_at_entry",
        "output_validator",
        "own_result",
        "proceeds",
        "progress",
        "registry",
        "source",
        "stage",
        "started",
        "token",
        "tool",
        "validator",
    )

    def __init__(
        self,
        registry: ToolRegistry,
        call: ToolCall,
        tool: Tool,
        hooks: HookSet,
        caller_token: CancelToken,
        live_at_entry: bool,
        source: CancelSource,
        started: float,
        inline: bool,
        output_validator: Validator | None = None,
    ) -> None:
        self.registry = registry
        self.call = call
        self.tool = tool
        self.hooks = hooks
        self.caller_token = caller_token
        self.live_at_entry = live_at_entry  # read once, at entry, by the registry
        self.source = source  # the call's own source: caller + registry root (+ Ctrl-C)
        self.token = source.token
        self.started = started
        self.inline = inline  # run bodies on this thread (nested calls, batch, asyncio)
        self.dispatched = False
        self.proceeds: _Proceeds | None = None  # proceed() calls in flight (with wrappers only)
        self.stage = "entry"
        self.debug = logger.isEnabledFor(logging.DEBUG)  # one cheap check per call
        self.interrupted: BaseException | None = None
        self.hook_error: ToolResult[Any] | None = None  # a registry-made HOOK_ERROR
        self.body_run: BodyRun | None = None  # the latest start of the body
        self.own_result: ToolResult[Any] | None = None  # a result no user code has seen yet
        self.progress: ProgressSink | None = None  # the caller's progress= (direct calls only)
        self.output_validator = output_validator

    def at(self, stage: str) -> None:
        """Enter a stage (shown by `in_flight()`; logged at DEBUG when enabled)."""
        self.stage = stage
        if self.debug:
            logger.debug(
                "toolreg: %s %s: %s (token %s)",
                self.call.name,
                self.call.call_id,
                stage,
                "cancelled" if self.token.cancelled else "live",
            )

    # -- results ---------------------------------------------------------------------------------

    def aborted(self, contexts: tuple[Any, ...] = ()) -> ToolResult[Any]:
        if self.dispatched:
            return ToolResult.failure(self.call, _ABORTED, "tool call aborted", contexts)
        return ToolResult.failure(self.call, _BEFORE, "tool call aborted before dispatch", contexts)

    def hook_failure(
        self, what: str, problem: str, exc: BaseException | None = None
    ) -> ToolResult[Any]:
        if exc is not None:
            logger.error("toolreg: %s failed for %s", what, self.call.call_id, exc_info=exc)
        result = ToolResult.failure(self.call, ErrorCode.HOOK_ERROR, f"{what} {problem}", (), exc)
        self.hook_error = result
        return result

    def raised(self, what: str, exc: BaseException, token: CancelToken) -> ToolResult[Any]:
        """The result of a hook or wrapper that raised `exc`."""
        if isinstance(exc, INTERRUPTS):
            self.interrupt(exc)
            return self.aborted()
        if isinstance(exc, Cancelled) and (self.token.cancelled or token.cancelled):
            return self.aborted()
        return self.hook_failure(what, f"raised {type(exc).__name__}: {exc}", exc)

    def interrupt(self, exc: BaseException) -> None:
        """Ctrl-C inside the call: cancel the call (never the caller), finish, re-raise later."""
        if self.interrupted is None:
            self.interrupted = exc
        self.source.cancel(type(exc).__name__)

    def cancelled_at(self) -> float | None:
        """When the call's token was cancelled (monotonic seconds), or None while live."""
        token = self.token
        return token._cancelled_at if token.cancelled else None

    def body_started(self) -> bool:
        """Whether a body of this call has started (it may still be running)."""
        run = self.body_run
        return self.dispatched or (run is not None and run.started)

    def revoked(self) -> bool:
        """A token live at entry has been cancelled since (a recheck)."""
        return self.live_at_entry and self.token.cancelled

    # -- stages ----------------------------------------------------------------------------------

    def run(self) -> tuple[ToolResult[Any], bool]:
        """Run the stages; return the result and whether it goes through post-execute hooks."""
        result = self._admit()
        if result is None:
            if self.hooks.around:
                dispatch = Dispatch(self.call, self.tool, self.caller_token, self.token)
                self.at("around")
                self.proceeds = _Proceeds()
                result = self.proceed(0, dispatch)
                self._end_wrappers()
            else:
                result = self._run_body(self.token)
        if self.hook_error is not None and result is self.hook_error:
            return result, False
        return self._unless_revoked(result), True

    def _admit(self) -> ToolResult[Any] | None:
        """Pre-execute hooks, approval, guards: a result if the call stops here, else None."""
        hooks = self.hooks
        if not (hooks.pre_execute or hooks.guards):
            return None
        # A denial returned while the call's token is cancelled is the cancellation: the hook or
        # approver that said no may have said it *because* its turn was cancelled.
        ask = self._pre_execute()
        if self.revoked() and (ask is None or not self._malfunction(ask)):
            return self.aborted()
        if isinstance(ask, ToolResult):
            return ask
        if ask is not None:
            denial = self._approve(ask)
            if self.revoked():
                return self.aborted()
            if denial is not None:
                return denial
        return self._guards()

    def _malfunction(self, outcome: ToolResult[Any] | Ask) -> bool:
        """A registry-made HOOK_ERROR (a hook that raised or returned nonsense) stays one."""
        return outcome is self.hook_error

    def _pre_execute(self) -> ToolResult[Any] | Ask | None:
        first_ask: Ask | None = None
        self.at("pre_execute")
        for hook in self.hooks.pre_execute:
            try:
                decision: object = hook(self.call, self.token)
            except BaseException as exc:
                return self.raised("pre-execute hook", exc, self.token)
            if decision is None or isinstance(decision, Allow):
                continue
            if isinstance(decision, Deny):
                return self._denied(decision.reason)
            if isinstance(decision, Ask):
                first_ask = first_ask or decision
                continue
            return self.hook_failure("pre-execute hook", f"returned {type(decision).__name__}")
        return first_ask

    def _approve(self, ask: Ask) -> ToolResult[Any] | None:
        approver = self.hooks.approver
        if approver is None:
            return self._denied(ask.reason)
        self.at("approval")
        try:
            approved = approver(self.call, ask.reason, self.token)
        except INTERRUPTS as exc:
            self.interrupt(exc)
            return self.aborted()
        except Cancelled:
            if self.token.cancelled:
                return self.aborted()
            approved = False
        except BaseException as exc:
            logger.warning(
                "toolreg: the approver raised; denying %s", self.call.call_id, exc_info=exc
            )
            approved = False
        return None if approved is True else self._denied(ask.reason)

    def _guards(self) -> ToolResult[Any] | None:
        self.at("guards")
        for guard in self.hooks.guards:
            try:
                verdict: object = guard(self.call)
            except BaseException as exc:
                return self.raised("guard", exc, self.token)
            if verdict is None:
                continue
            if isinstance(verdict, str):
                return self._denied(verdict)
            return self.hook_failure("guard", f"returned {type(verdict).__name__}")
        return None

    def _denied(self, reason: object) -> ToolResult[Any]:
        return ToolResult.failure(self.call, ErrorCode.DENIED, str(reason))

    def _unless_revoked(
        self, result: ToolResult[Any], contexts: tuple[Any, ...] | None = None
    ) -> ToolResult[Any]:
        """Cancellation that won replaces a success (keeping its contexts); failures stay."""
        if result.ok and self.revoked():
            return self.aborted(result.contexts if contexts is None else contexts)
        return result

    # -- around wrappers and the body -----------------------------------------------------------

    def proceed(self, index: int, dispatch: Dispatch) -> ToolResult[Any]:
        """Run wrapper `index` (or, past the last, the body); never raises."""
        wrappers = self.hooks.around
        if index == len(wrappers):
            return self._body(dispatch)
        wrapper = wrappers[index]

        def proceed() -> ToolResult[Any]:
            proceeds = self.proceeds
            if proceeds is None or not proceeds.enter():
                return self.hook_failure("around wrapper", "called proceed() after the call ended")
            try:
                return self.proceed(index + 1, dispatch)
            finally:
                proceeds.leave()

        try:
            result: object = wrapper(dispatch, proceed)
        except BaseException as exc:
            return self.raised("around wrapper", exc, dispatch.token)
        if not isinstance(result, ToolResult):
            return self.hook_failure("around wrapper", f"returned {type(result).__name__}")
        return result

    def _body(self, dispatch: Dispatch) -> ToolResult[Any]:
        self.at("dispatch")
        wrapper_token: object = dispatch.token
        fused = None
        token = self.token
        if wrapper_token is not token:
            if not isinstance(wrapper_token, CancelToken):
                return self.hook_failure("around wrapper", "left a non-token in dispatch.token")
            fused = CancelSource(token, wrapper_token)
            token = fused.token
        try:
            return self._run_body(token)
        finally:
            if fused is not None:
                fused.close()  # nothing of this body stays registered on the caller's token

    def _run_body(self, token: CancelToken) -> ToolResult[Any]:
        registry = self.registry
        ctx = ToolContext(self.call, token, registry._nested, self.progress)
        tool = self.tool
        args = self.call.arguments
        run = BodyRun(
            lambda: registry._run_body_here(tool, args, ctx),
            token,
            self.live_at_entry,
            self.call,
            registry._overdue_after,
        )
        self.body_run = run
        registration: Registration | None = None
        if self.live_at_entry:
            # on_cancel runs run.on_cancel inline if the token is cancelled already: the body
            # is then claimed and never starts.
            registration = token.on_cancel(run.on_cancel)
        else:
            run.watch_overdue()  # pre-aborted: the body starts under a cancelled token
        try:
            refused = self._start_and_join(run)
        except INTERRUPTS as exc:  # between submit and join: the claim decides, then we join
            self.interrupt(exc)
            run.claim_or_join(self.interrupt)
            refused = None
        finally:
            run.finish(registration)
            contexts = ctx.settle()
        if refused is not None:
            return ToolResult.failure(self.call, ErrorCode.TOOL_ERROR, refused)
        return self._body_result(run, token, contexts)

    def _start_and_join(self, run: BodyRun) -> str | None:
        """Run the body inline or on the executor and join it; a problem message, or None."""
        self.at("body")
        if run.settled:  # a canceller claimed it while we registered: it never starts
            return None
        if self.inline:
            run.run()
            return None
        try:
            run.submit_and_join(self.registry._executor, self.interrupt)
        except RuntimeError as exc:  # the executor was shut down by its owner
            return f"the executor refused the body: {exc}"
        return None

    def _body_result(
        self, run: BodyRun, token: CancelToken, contexts: tuple[Any, ...]
    ) -> ToolResult[Any]:
        if not run.started:
            return self.aborted()
        self.dispatched = True
        self.at("after_body")
        error = run.error
        if error is None:
            return self._success(run.value, run.live_on_return, contexts)
        if isinstance(error, Cancelled) and token.cancelled:
            return self.aborted(contexts)
        message = f"{type(error).__name__}: {error}"
        return ToolResult.failure(self.call, ErrorCode.TOOL_ERROR, message, contexts, error)

    def _success(self, value: Any, live: bool, contexts: tuple[Any, ...]) -> ToolResult[Any]:
        # `live`: the body's token as the body's thread saw it on return. A caller that
        # cancelled after that is still caught by the recheck after the wrappers.
        if self.live_at_entry and not live:
            return self.aborted(contexts)
        validator = self.output_validator
        if validator is not None:
            problem = _output_problem(validator, value)
            if problem is not None:
                message = f"the value does not match the output schema: {problem}"
                return ToolResult.failure(self.call, ErrorCode.TOOL_ERROR, message, contexts)
        try:
            content = render_content(value, self.tool.render)
        except Exception as exc:
            message = f"cannot render a {type(value).__name__} result: {exc}"
            return ToolResult.failure(self.call, ErrorCode.TOOL_ERROR, message, contexts, exc)
        result: ToolResult[Any] = ToolResult(self.call, True, content, value, None, contexts)
        if not (self.hooks.around or self.hooks.post_execute):
            self.own_result = result
        return result

    def _end_wrappers(self) -> None:
        """The chain returned: refuse new proceed() calls, join any still running elsewhere.

        A wrapper may run `proceed()` on another thread and return without waiting for it; the
        body that proceed starts is still this call's, so it is joined before the result.
        """
        proceeds = self.proceeds
        assert proceeds is not None
        drained = proceeds.close()
        if drained is None:
            return
        main = threading.current_thread() is threading.main_thread()
        while not drained.is_set():
            try:
                drained.wait(MAIN_THREAD_SLICE if main else None)
            except INTERRUPTS as exc:
                self.interrupt(exc)

    # -- after the wrappers ----------------------------------------------------------------------

    def post_execute(self, result: ToolResult[Any]) -> ToolResult[Any]:
        self.at("post_execute")
        for hook in self.hooks.post_execute:
            try:
                replaced: object = hook(result, self.token)
            except BaseException as exc:
                outcome = self.raised("post-execute hook", exc, self.token)
                if outcome is self.hook_error or not result.ok:
                    return outcome if outcome is self.hook_error else result
                return self.aborted(result.contexts)
            if replaced is None:
                continue
            if not isinstance(replaced, ToolResult):
                return self.hook_failure("post-execute hook", f"returned {type(replaced).__name__}")
            if replaced.ok and not result.ok:
                return self.hook_failure("post-execute hook", "turned a failure into a success")
            result = replaced
        return self._unless_revoked(result)

    def finalize(self, result: ToolResult[Any]) -> ToolResult[Any]:
        """The frozen final result: the registry sets call, dispatched and duration."""
        duration = time.monotonic() - self.started
        if self.own_result is result:
            # Made by the registry in this call and never shown to user code: finish it in place.
            object.__setattr__(result, "dispatched", self.dispatched)
            object.__setattr__(result, "duration", duration)
            return result
        return ToolResult(
            self.call,
            result.ok,
            result.content,
            result.value,
            result.error,
            tuple(result.contexts),
            self.dispatched,
            duration,
        )

    def notify(self, result: ToolResult[Any]) -> None:
        """Each observer sees the final result once; exceptions are logged, never raised."""
        self.at("observers")
        for observer in self.hooks.observers:
            try:
                observer(result)
            except INTERRUPTS as exc:
                self.interrupt(exc)
            except BaseException:
                logger.exception("toolreg: result observer %r raised", observer)


class _Proceeds:
    """Counts the `proceed()` calls of one call that are still running."""

    __slots__ = ("_drained", "_lock", "_open", "_running")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the three fields below
        self._running = 0
        self._open = True  # False once the wrapper chain returned
        self._drained: threading.Event | None = None

    def enter(self) -> bool:
        with self._lock:
            if not self._open:
                return False
            self._running += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._running -= 1
            drained = self._drained if self._running == 0 else None
        if drained is not None:
            drained.set()

    def close(self) -> threading.Event | None:
        """Refuse new entries; an Event set when the running ones left, or None if none run."""
        with self._lock:
            self._open = False
            if self._running == 0:
                return None
        drained = threading.Event()  # allocated outside the lock
        with self._lock:
            if self._running == 0:
                return None
            self._drained = drained
            return drained


def _output_problem(validator: Validator, value: Any) -> str | None:
    """Why `value` fails the output schema, or None if it passes."""
    try:
        validator(value)
    except Exception as exc:
        return str(getattr(exc, "message", exc))
    return None


def entry_failure(call: ToolCall, code: ErrorCode, message: str, started: float) -> ToolResult[Any]:
    """A result for a call that failed the entry checks (it skips every hook)."""
    failed = ToolResult.failure(call, code, message)
    return ToolResult(
        call, False, failed.content, None, failed.error, (), False, time.monotonic() - started
    )
