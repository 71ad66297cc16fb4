"""`ToolRegistry`: tools, hooks, the body executor, and the lifecycle of calls."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

import fastjsonschema

from . import _validate
from ._batch import BatchRun, Progress, check_batch, unstarted_call
from ._body import INTERRUPTS
from ._cancel import CancelSource, CancelToken, Registration
from ._coro import CoroutineRunner
from ._hooks import (
    Approver,
    AroundWrapper,
    Guard,
    HookRegistration,
    HookSet,
    PostExecuteHook,
    PreExecuteHook,
    ResultObserver,
)
from ._interrupts import SigintRequest, deferred_sigint
from ._pipeline import CallState, entry_failure
from ._results import ErrorCode, ToolCall, ToolResult, frozen_call
from ._tools import (
    ConcurrencySafe,
    InvalidArguments,
    Tool,
    ToolContext,
    Validator,
    compile_schema,
    freeze_arguments,
)

__all__ = ["InFlightCall", "ToolRegistry"]

logger = logging.getLogger("toolreg")
F = TypeVar("F", bound=Callable[..., Any])
SchemaStyle = Literal["openai", "anthropic", "mcp"]


@dataclass(frozen=True)
class InFlightCall:
    """A snapshot of one call in progress (times are `time.monotonic()` seconds)."""

    call: ToolCall
    stage: str
    started: float
    cancelled: bool
    cancelled_at: float | None
    dispatched: bool


@dataclass(frozen=True)
class _Entry:
    tool: Tool
    schema: dict[str, Any]  # a private copy of the parameters schema, as compiled
    validator: Validator | None
    is_async: bool  # an `async def` body: it runs on the registry's event loop thread


class ToolRegistry:
    """Runs tool calls with cooperative, quiescent cancellation.

    Each `execute` runs the pipeline (pre-execute hooks, approval, guards, around wrappers, the
    body on the executor, post-execute hooks, observers) in the calling thread, except the body,
    which runs on the registry's `ThreadPoolExecutor` (or the thread executor passed in) while
    the caller joins it. No body starts after its live caller token was cancelled, no success
    escapes after cancellation, and every started body is waited for.

    Thread-safe: tools and hooks may be added or removed while calls are in flight (a call uses
    the hooks present at its entry). `close()` (or leaving a `with` block) cancels every call in
    flight, waits for all of them, and shuts down an executor the registry owns.

    Example::

        with ToolRegistry(max_workers=4) as registry:
            @registry.tool(description="Add two numbers")
            def add(args, ctx):
                return args["a"] + args["b"]

            registry.execute("add", {"a": 1, "b": 2}).content    # '3'
    """

    def __init__(
        self,
        max_workers: int | None = 8,
        *,
        executor: Executor | None = None,
        thread_name_prefix: str = "toolreg",
        overdue_after: float | None = 30.0,
    ) -> None:
        if overdue_after is not None:  # infinity is refused too: None is how to disable it
            overdue_after = _validate.seconds(
                overdue_after, "overdue_after", unlimited="None disables it"
            )
        if executor is None:
            self._executor: Executor = ThreadPoolExecutor(max_workers, thread_name_prefix)
            self._owns_executor = True
        else:
            _check_executor(executor)
            self._executor = executor
            self._owns_executor = False
        self._overdue_after = overdue_after
        # Guards the swaps of _tools and _hooks, and _batches, _active, _closing, _closed, and the
        # snapshots of _calls (whose single inserts and pops need no lock). Tools and hooks are
        # replaced copy-on-write, so calls read them without the lock.
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when _active drops to 0
        self._tools: dict[str, _Entry] = {}
        self._hooks = HookSet()
        self._calls: dict[int, CallState] = {}
        self._batches: dict[int, CancelSource] = {}
        self._active = 0
        self._closing = False
        self._closed = False
        self._local = threading.local()  # .depth > 0 while this thread is inside one of our calls
        self._coroutines = CoroutineRunner(thread_name_prefix, self._local)  # `async def` bodies

    # -- tools -----------------------------------------------------------------------------------

    def register(self, tool: Tool) -> Registration:
        """Add a tool; `ValueError` for a duplicate name or an invalid schema."""
        if not isinstance(tool, Tool):
            raise TypeError(f"register() takes a Tool, got {type(tool).__name__}")
        schema, validator = compile_schema(tool)
        entry = _Entry(tool, schema, validator, inspect.iscoroutinefunction(tool.fn))
        while True:  # copy-on-write: build outside the lock, swap under it if nothing changed
            current = self._tools
            if tool.name in current:
                raise ValueError(f"a tool named {tool.name!r} is already registered")
            tools = {**current, tool.name: entry}
            with self._lock:
                if self._tools is current:
                    self._tools = tools
                    break
        return HookRegistration(lambda: self._unregister(entry))

    def _unregister(self, entry: _Entry) -> bool:
        while True:
            current = self._tools
            if current.get(entry.tool.name) is not entry:
                return False
            tools = {name: kept for name, kept in current.items() if kept is not entry}
            with self._lock:
                if self._tools is current:
                    self._tools = tools
                    return True

    @overload
    def tool(
        self,
        fn: F,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        concurrency_safe: ConcurrencySafe = False,
        render: Callable[[Any], str] | None = None,
    ) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        concurrency_safe: ConcurrencySafe = False,
        render: Callable[[Any], str] | None = None,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        concurrency_safe: ConcurrencySafe = False,
        render: Callable[[Any], str] | None = None,
    ) -> F | Callable[[F], F]:
        """Decorator: register `fn(args, ctx)` as a tool and return it unchanged.

        The name defaults to the function's name and the description to its docstring.
        """

        def decorate(fn: F) -> F:
            text = description if description is not None else inspect.getdoc(fn) or ""
            tool = Tool(
                name or fn.__name__, fn, text, parameters, timeout, concurrency_safe, render
            )
            self.register(tool)
            return fn

        return decorate if fn is None else decorate(fn)

    def get(self, name: str) -> Tool | None:
        """The tool registered under `name`, or None."""
        entry = self._tools.get(name)
        return None if entry is None else entry.tool

    def tools(self) -> tuple[Tool, ...]:
        """The registered tools, sorted by name."""
        return tuple(entry.tool for _, entry in sorted(self._tools.items()))

    def schemas(self, style: SchemaStyle = "openai") -> list[dict[str, Any]]:
        """Tool definitions in the shape a model or client expects, sorted by name.

        `"openai"` (function calling), `"anthropic"` (tool use) or `"mcp"` (`tools/list`). A
        tool without `parameters` gets an empty object schema. Each call returns fresh copies.
        """
        shapes: dict[str, Callable[[Tool, dict[str, Any]], dict[str, Any]]] = {
            "openai": lambda t, s: {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": s},
            },
            "anthropic": lambda t, s: {
                "name": t.name,
                "description": t.description,
                "input_schema": s,
            },
            "mcp": lambda t, s: {"name": t.name, "description": t.description, "inputSchema": s},
        }
        shape = shapes.get(style)
        if shape is None:
            raise ValueError(f"unknown schema style {style!r}; use one of {sorted(shapes)}")
        entries = [entry for _, entry in sorted(self._tools.items())]
        return [shape(entry.tool, copy.deepcopy(entry.schema)) for entry in entries]

    # -- hooks -----------------------------------------------------------------------------------

    def add_pre_execute(self, hook: PreExecuteHook) -> Registration:
        """`hook(call, token) -> None | Allow() | Deny(reason) | Ask(reason)`, in order."""
        return self._add_hook("pre_execute", hook)

    def set_approver(self, approver: Approver) -> Registration:
        """`approver(call, reason, token) -> bool`; replaces any previous approver."""
        _check_callable(approver, "approver")
        self._swap_hooks(lambda hooks: dataclasses.replace(hooks, approver=approver))

        def undo() -> bool:
            replaced = self._swap_hooks(
                lambda hooks: (
                    dataclasses.replace(hooks, approver=None)
                    if hooks.approver is approver
                    else None
                )
            )
            return replaced

        return HookRegistration(undo)

    def _swap_hooks(self, change: Callable[[HookSet], HookSet | None]) -> bool:
        """Replace the hook set with `change(current)` (None: no change); False if none.

        The new set is built outside the lock and swapped in only if nobody changed the set
        meanwhile: no allocation under the lock, so a garbage collection (which may run a
        finalizer that removes a registration) can never run while we hold it.
        """
        while True:
            current = self._hooks
            changed = change(current)
            if changed is None:
                return False
            with self._lock:
                if self._hooks is current:
                    self._hooks = changed
                    return True

    def add_guard(self, guard: Guard) -> Registration:
        """`guard(call) -> str | None`; a string denies the call with that reason."""
        return self._add_hook("guards", guard)

    def add_around(self, wrapper: AroundWrapper) -> Registration:
        """`wrapper(dispatch, proceed) -> ToolResult`; the first registered is outermost."""
        return self._add_hook("around", wrapper)

    def add_post_execute(self, hook: PostExecuteHook) -> Registration:
        """`hook(result, token) -> ToolResult | None`; may fail a success, never the reverse."""
        return self._add_hook("post_execute", hook)

    def on_result(self, observer: ResultObserver) -> Registration:
        """`observer(result)` sees every final result once; its exceptions are logged."""
        return self._add_hook("observers", observer)

    def _add_hook(self, kind: str, hook: Callable[..., Any]) -> Registration:
        _check_callable(hook, kind.replace("_", "-").rstrip("s"))
        # A fresh callable per registration (a C-level partial: no extra Python frame), so the
        # same function registered twice is two registrations, each removed exactly once.
        key = functools.partial(hook)

        def add(hooks: HookSet) -> HookSet:
            changes: dict[str, Any] = {kind: (*getattr(hooks, kind), key)}
            return dataclasses.replace(hooks, **changes)

        self._swap_hooks(add)
        return HookRegistration(lambda: self._remove_hook(kind, key))

    def _remove_hook(self, kind: str, key: Callable[..., Any]) -> bool:
        def remove(hooks: HookSet) -> HookSet | None:
            current = getattr(hooks, kind)
            kept = tuple(entry for entry in current if entry is not key)
            if len(kept) == len(current):
                return None
            changes: dict[str, Any] = {kind: kept}
            return dataclasses.replace(hooks, **changes)

        return self._swap_hooks(remove)

    # -- calls -----------------------------------------------------------------------------------

    def execute(
        self,
        call_or_name: ToolCall | str,
        arguments: Mapping[str, Any] | None = None,
        *,
        token: CancelToken | None = None,
        start_if_cancelled: bool = True,
    ) -> ToolResult[Any]:
        """Run one call through the pipeline and return its final `ToolResult`; blocks.

        `token` is the caller's token (default: never cancelled). With a token that is already
        cancelled, `start_if_cancelled=True` (the default, for direct callers) still runs the
        call so the body can clean up; `False` (what a server or agent loop should pass) starts
        nothing and returns `ABORTED_BEFORE_DISPATCH`. Never raises for a tool-level problem;
        raises `RuntimeError` after `close()`, `TypeError` for a call that is not a `ToolCall`
        or a name, and re-raises a Ctrl-C once the call has settled.
        """
        started = time.monotonic()
        call = _as_call(call_or_name, arguments)
        caller = _as_token(token)
        return self._execute(call, caller, start_if_cancelled, False, started, nested=False)

    def _nested(
        self, call_or_name: object, arguments: Mapping[str, Any] | None, token: CancelToken
    ) -> ToolResult[Any]:
        started = time.monotonic()
        call = _as_call(call_or_name, arguments)
        return self._execute(call, token, False, True, started, nested=True)

    def _execute(
        self,
        call: ToolCall,
        caller: CancelToken,
        start_if_cancelled: bool,
        inline: bool,
        started: float,
        nested: bool,
        extra: CancelToken | None = None,
        entered: bool = False,
        on_interrupt: Callable[[BaseException], None] | None = None,
    ) -> ToolResult[Any]:
        """Run one call; `extra` is a second token that cancels the call but not the caller.

        `entered`: the caller already counted the call in (the asyncio facade does that at
        `areg.execute`, the call's entry); it is counted out here either way. `on_interrupt`:
        a Ctrl-C or SystemExit inside the call is handed to it (after the call completed and
        was observed) instead of being re-raised, so a batch keeps the observed result.
        """
        if not entered:
            self._enter(nested)
        local = self._local
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        # Already inside one of our calls on this thread (a body calling registry.execute):
        # waiting for another worker could deadlock a busy pool, so the body runs here.
        inline = inline or depth > 0
        try:
            return self._run(call, caller, start_if_cancelled, inline, started, extra, on_interrupt)
        finally:
            local.depth -= 1
            self._leave()

    def _run(
        self,
        call: ToolCall,
        caller: CancelToken,
        start_if_cancelled: bool,
        inline: bool,
        started: float,
        extra: CancelToken | None,
        on_interrupt: Callable[[BaseException], None] | None,
    ) -> ToolResult[Any]:
        hooks = self._hooks  # the hooks present at entry serve the whole call
        admitted = self._admit(call, started)
        if isinstance(admitted, ToolResult):
            return _notify(hooks.observers, admitted, on_interrupt)
        call, tool = admitted
        # Read once: "live at entry" decides both this check and the rechecks later. Reading it
        # twice let a cancellation in between skip this check *and* the rechecks.
        live_at_entry = not caller.cancelled
        if (not live_at_entry and not start_if_cancelled) or (
            extra is not None and extra.cancelled
        ):
            aborted = entry_failure(
                call,
                ErrorCode.ABORTED_BEFORE_DISPATCH,
                "tool call aborted before dispatch",
                started,
            )
            return _notify(hooks.observers, aborted, on_interrupt)
        source = CancelSource(caller) if extra is None else CancelSource(caller, extra)
        state = CallState(self, call, tool, hooks, caller, live_at_entry, source, started, inline)
        key = id(state)
        # Single dict operations are atomic, and close() sets _closing before it lists the calls:
        # either it sees this call, or this call sees _closing. No lock needed on this hot path.
        self._calls[key] = state
        if self._closing:  # close() may have listed the calls before this one
            source.cancel("registry closed")
        try:
            return self._run_state(state, on_interrupt)
        finally:
            source.close()
            self._calls.pop(key, None)

    def _run_state(
        self, state: CallState, on_interrupt: Callable[[BaseException], None] | None
    ) -> ToolResult[Any]:
        try:
            result, post = state.run()
            if post:
                result = state.post_execute(result)
        except INTERRUPTS as exc:  # landed between guarded spots: cancel, finish, re-raise
            state.interrupt(exc)
            result = state.aborted()
        final = state.finalize(result)
        state.notify(final)
        if state.interrupted is not None:
            if on_interrupt is None:
                raise state.interrupted
            on_interrupt(state.interrupted)
        return final

    def _admit(self, call: ToolCall, started: float) -> ToolResult[Any] | tuple[ToolCall, Tool]:
        """Entry checks, in the contract's order; a failed result or (frozen call, tool)."""
        try:
            frozen = freeze_arguments(call.arguments)
        except InvalidArguments as exc:
            bad = frozen_call(call.name, None, call.call_id)
            return entry_failure(bad, ErrorCode.INVALID_ARGS, str(exc), started)
        call = frozen_call(call.name, frozen, call.call_id)
        entry = self._tools.get(call.name) if isinstance(call.name, str) else None
        if entry is None:
            message = f"unknown tool {call.name!r}"
            return entry_failure(call, ErrorCode.UNKNOWN_TOOL, message, started)
        if entry.validator is not None:
            try:
                entry.validator(frozen)
            except fastjsonschema.JsonSchemaException as exc:
                message = getattr(exc, "message", str(exc))
                return entry_failure(call, ErrorCode.INVALID_ARGS, message, started)
        return call, entry.tool

    def execute_batch(
        self,
        calls: Iterable[ToolCall],
        *,
        token: CancelToken | None = None,
        max_parallel: int = 8,
        on_progress: Progress | None = None,
    ) -> list[ToolResult[Any]]:
        """Run the calls of one agent step; one result per call, in input order.

        Consecutive calls whose tool is `concurrency_safe` (exactly `True`, or a callable that
        returns exactly `True` for the arguments) overlap, up to `max_parallel`; any other call
        runs alone, as a barrier. Calls start in input order; each call's stages and body run
        on one pool worker. Once `token` is cancelled no further call starts: each unstarted
        call gets `ABORTED_BEFORE_DISPATCH` without entering any hook (observers still see it).
        Returns only after every started call has settled. `on_progress(done, total)` is called
        from this thread. A Ctrl-C cancels the batch, drains it, then re-raises. Raises
        `ValueError` before anything starts for a non-`ToolCall` item, duplicate call ids or
        `max_parallel < 1`.
        """
        batch = check_batch(calls, max_parallel)
        caller = _as_token(token)
        if on_progress is not None and not callable(on_progress):
            raise TypeError("on_progress must be callable")
        with deferred_sigint() as ctrl_c:  # a Ctrl-C here becomes a cancellation request
            self._enter(nested=self._inside())
            return self._execute_batch(batch, caller, max_parallel, on_progress, ctrl_c)

    def _execute_batch(
        self,
        batch: list[ToolCall],
        caller: CancelToken,
        max_parallel: int,
        on_progress: Progress | None,
        ctrl_c: SigintRequest | None = None,
    ) -> list[ToolResult[Any]]:
        """Run a checked batch; the caller has already `_enter`ed, this `_leave`s."""
        try:
            source = CancelSource(caller)
            local = self._local
            depth = getattr(local, "depth", 0)
            local.depth = depth + 1
            try:
                return self._run_batch(batch, source, max_parallel, on_progress, depth > 0, ctrl_c)
            finally:
                local.depth = depth
                source.close()
        finally:
            self._leave()

    def _run_batch(
        self,
        batch: list[ToolCall],
        source: CancelSource,
        max_parallel: int,
        on_progress: Progress | None,
        inline: bool,
        ctrl_c: SigintRequest | None,
    ) -> list[ToolResult[Any]]:
        key = id(source)
        with self._lock:
            self._batches[key] = source
            closing = self._closing
        try:
            if closing:
                source.cancel("registry closed")
            run = BatchRun(self, batch, source, max_parallel, on_progress, inline, ctrl_c)
            return run.run()
        finally:
            with self._lock:
                del self._batches[key]

    def _parallel_safe(self, call: ToolCall) -> bool:
        """Whether a batch call may overlap others: only an exact True counts."""
        entry = self._tools.get(call.name) if isinstance(call.name, str) else None
        if entry is None:
            return False
        safe = entry.tool.concurrency_safe
        if safe is False:
            return False
        try:
            arguments = freeze_arguments(call.arguments)
            if entry.validator is not None:
                entry.validator(arguments)  # bad arguments mean exclusive, even for True
            return safe is True or (not isinstance(safe, bool) and safe(arguments) is True)
        except Exception:
            logger.debug(
                "toolreg: %s is exclusive: its classifier failed", call.call_id, exc_info=True
            )
            return False

    def _unstarted(
        self,
        call: ToolCall,
        error: BaseException | None = None,
        on_interrupt: Callable[[BaseException], None] | None = None,
    ) -> ToolResult[Any]:
        """The result of a batch call that never started (observers see it)."""
        frozen = unstarted_call(call)
        started = time.monotonic()
        if error is None:
            code, message = ErrorCode.ABORTED_BEFORE_DISPATCH, "tool call aborted before dispatch"
        else:
            code, message = ErrorCode.TOOL_ERROR, f"toolreg internal error: {error!r}"
        result = entry_failure(frozen, code, message, started)
        return _notify(self._hooks.observers, result, on_interrupt)

    def _run_body_here(self, tool: Tool, args: Any, ctx: ToolContext) -> Any:
        """The body, on whatever thread runs it, marked as inside this registry."""
        local = self._local
        local.depth = getattr(local, "depth", 0) + 1
        try:
            fn = tool.fn
            entry = self._tools.get(tool.name)
            if entry is not None and entry.tool is tool:
                is_async = entry.is_async
            else:  # unregistered (or replaced) since the call's entry
                is_async = inspect.iscoroutinefunction(fn)
            if is_async:
                return self._coroutines.run(lambda: fn(args, ctx), ctx.token)
            return fn(args, ctx)
        finally:
            local.depth -= 1

    def in_flight(self) -> list[InFlightCall]:
        """A snapshot of the calls in progress (past their entry checks), oldest first."""
        states = list(self._calls.values())  # one C-level copy: atomic, no lock needed
        snapshot = [
            InFlightCall(
                state.call,
                state.stage,
                state.started,
                state.token.cancelled,
                state.cancelled_at(),
                state.body_started(),
            )
            for state in states
        ]
        return sorted(snapshot, key=lambda entry: entry.started)

    # -- lifecycle -------------------------------------------------------------------------------

    def _inside(self) -> bool:
        """Whether this thread is inside one of this registry's calls (a hook, a body, ...)."""
        return getattr(self._local, "depth", 0) > 0

    def _enter(self, nested: bool) -> None:
        with self._lock:
            if self._closed or (self._closing and not nested):
                raise RuntimeError("this ToolRegistry is closed: create a new one to run calls")
            self._active += 1

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1
            if self._closing and not self._active:
                self._idle.notify_all()

    def close(self) -> None:
        """Cancel every call in flight, wait for all of them, shut down an owned executor.

        Idempotent. Afterwards `execute` raises `RuntimeError`. Calling it from inside one of
        this registry's own calls (a hook, a body, an observer) raises `RuntimeError` instead of
        waiting for itself.
        """
        if getattr(self._local, "depth", 0):
            raise RuntimeError(
                "close() from inside one of this registry's calls would wait forever"
            )
        with self._lock:
            self._closing = True
        # Snapshots after _closing is set: a call registered later sees _closing itself.
        states = list(self._calls.values())  # one C-level copy: atomic w.r.t. other threads
        sources = [state.source for state in states]
        with self._lock:
            batches = list(self._batches.values())
        sources.extend(batches)
        # Cancelling again is harmless (first reason wins), and it makes a close() that was
        # interrupted (Ctrl-C while waiting) finish properly when it is called again.
        for source in sources:  # later calls see _closing and cancel themselves
            source.cancel("registry closed")
        with self._lock:
            while self._active:
                self._idle.wait()
        if self._owns_executor:
            self._executor.shutdown(wait=True)  # idempotent
        self._coroutines.close()  # idempotent
        with self._lock:
            self._closed = True

    @property
    def closed(self) -> bool:
        """True once `close()` has finished."""
        return self._closed

    def __enter__(self) -> ToolRegistry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "closing" if self._closing else "open"
        return f"<ToolRegistry {state} tools={len(self._tools)} in_flight={self._active}>"


def _notify(
    observers: tuple[ResultObserver, ...],
    result: ToolResult[Any],
    on_interrupt: Callable[[BaseException], None] | None = None,
) -> ToolResult[Any]:
    """Every observer sees `result`; a Ctrl-C in one is re-raised (or handed to
    `on_interrupt`) only after all of them have."""
    interrupted: BaseException | None = None
    for observer in observers:
        try:
            observer(result)
        except INTERRUPTS as exc:
            interrupted = interrupted or exc
        except BaseException:
            logger.exception("toolreg: result observer %r raised", observer)
    if interrupted is not None:
        if on_interrupt is None:
            raise interrupted
        on_interrupt(interrupted)
    return result


def _as_call(call_or_name: object, arguments: Mapping[str, Any] | None) -> ToolCall:
    if isinstance(call_or_name, ToolCall):
        if arguments is not None:
            raise TypeError("pass arguments inside the ToolCall, not beside it")
        return call_or_name
    if isinstance(call_or_name, str):
        return ToolCall(call_or_name, arguments)
    raise TypeError(f"execute() takes a ToolCall or a tool name, got {type(call_or_name).__name__}")


def _as_token(token: object) -> CancelToken:
    if token is None:
        return CancelToken.never()
    if not isinstance(token, CancelToken):
        hint = " (pass source.token)" if isinstance(token, CancelSource) else ""
        raise TypeError(f"token must be a CancelToken, got {type(token).__name__}{hint}")
    return token


def _check_callable(fn: object, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"the {what} must be callable, got {type(fn).__name__}")


def _check_executor(executor: object) -> None:
    if isinstance(executor, ThreadPoolExecutor):
        return
    raise TypeError(
        f"executor must be a ThreadPoolExecutor (tool bodies share tokens and contexts with this "
        f"process), got {type(executor).__name__}"
    )
