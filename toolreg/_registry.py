"""`ToolRegistry`: a façade over the catalog, the hook table and the dispatcher."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from typing_extensions import Self

    from ._batch import Progress
    from ._dispatch import Dispatcher

from . import _validate
from ._body import ToolContext, owned_call
from ._call import CallMode, Stage
from ._cancel import CancelToken, Registration, caller_token
from ._catalog import Catalog, SchemaStyle, ToolTable
from ._hooks import (
    Approver,
    AroundWrapper,
    CallHook,
    Guard,
    HookTable,
    PostExecuteHook,
    PreExecuteHook,
    ResultObserver,
)
from ._interrupts import INTERRUPTS
from ._logger import logger as _logger
from ._progress import ProgressCallback, ProgressSink
from ._record import record
from ._results import ToolCall, ToolResult
from ._tools import ConcurrencySafe, Tool

__all__ = ["InFlightCall", "ToolFunction", "ToolRegistry"]

_NEVER = CancelToken.never()
_DIRECT = CallMode.direct(True)
_DIRECT_MODEL = CallMode.direct(False)


class ToolFunction(Protocol):
    """The type of a tool's body: `fn(args, ctx) -> value`, called with both positionally.

    `args` is the call's validated arguments, read-only (a `FrozenDict`); `ctx` is the call's
    `ToolContext` (its token, progress, deferred contexts and nested calls). The registry calls
    the body once per started call, on a worker thread or inline, and joins it; what it
    returns is the call's value (`Tool(render=)` makes the content), what it raises a
    `TOOL_ERROR`. An `async def` body returns a coroutine, which the registry runs to the end.
    A body marked with `DaskBackend.remote` gets a `RemoteContext` on the worker instead (the
    same members; nested calls raise). The parameter names are free.

    Example::

        def search(args: Mapping[str, Any], ctx: ToolContext) -> list[str]:
            ctx.token.raise_if_cancelled()
            return index.lookup(args["q"])

        registry.register(Tool("search", search))  # or @registry.tool on the function
    """

    def __call__(self, args: Mapping[str, Any], ctx: ToolContext, /) -> Any: ...


F = TypeVar("F", bound=ToolFunction)

# `_batch.execute_batch`, loaded with the first batch (not by `import toolreg`) and kept here: an
# import statement in `execute_batch` would go through the import machinery on every batch, even
# once the module is loaded.
_run_batch: Callable[..., list[ToolResult[Any]]] | None = None


def _name_of(fn: object) -> str:
    name = getattr(fn, "__name__", None)  # a callable object or a partial has none
    if not isinstance(name, str):
        raise TypeError(f"registry.tool() needs name= for a {type(fn).__name__}, which has no name")
    return name


def _load_batch() -> Callable[..., list[ToolResult[Any]]]:
    global _run_batch
    from ._batch import execute_batch

    _run_batch = execute_batch
    return execute_batch


DEFAULT_MAX_WORKERS = 8


@record(frozen=True)
class InFlightCall:
    """A snapshot of one call in progress (times are `time.monotonic()` seconds).

    `stage` is a `Stage` (its members compare equal to their names in lower case: `"body"`).
    """

    call: ToolCall
    stage: Stage
    started: float
    cancelled: bool
    cancelled_at: float | None
    dispatched: bool

    def __init__(
        self,
        call: ToolCall,
        stage: Stage,
        started: float,
        cancelled: bool,
        cancelled_at: float | None,
        dispatched: bool,
    ) -> None:
        self.__dict__.update(
            call=call,
            stage=stage,
            started=started,
            cancelled=cancelled,
            cancelled_at=cancelled_at,
            dispatched=dispatched,
        )


class ToolRegistry:
    """Runs tool calls with cooperative, quiescent cancellation.

    Each `execute` runs the pipeline (pre-execute hooks, approval, guards, around wrappers, the
    body on a worker, post-execute hooks, observers) in the calling thread, except the body,
    which runs on the registry's `WorkerPool` (or the executor passed in) while the caller joins
    it. No body starts after its live caller token was cancelled, no success escapes after
    cancellation, and every started body is waited for.

    `max_workers` sizes the pool the registry creates and owns (default 8). `executor=` takes a
    `WorkerPool` or a `ThreadPoolExecutor` the caller owns instead (the registry never shuts it
    down; a `ThreadPoolExecutor` costs a `Future` per body, so it is slower); passing both is a
    `TypeError`. `overdue_after` (seconds, or None) is when a body still running after its
    cancellation is reported, once, as a WARNING on the `toolreg` logger. A `max_workers` that
    is not an int or an `overdue_after` that is not a number (a `bool` is neither) is a
    `TypeError`; `max_workers < 1` or an `overdue_after` that is not finite and positive is a
    `ValueError`.

    Thread-safe: tools and hooks may be added or removed while calls are in flight (a call uses
    the hooks present at its entry). `close()` (or leaving a `with` block) cancels every call in
    flight, waits for all of them, and shuts down the pool the registry owns.

    Example::

        with ToolRegistry(max_workers=4) as registry:
            @registry.tool(description="Add two numbers")
            def add(args, ctx):
                return args["a"] + args["b"]

            registry.execute("add", {"a": 1, "b": 2}).content    # '3'
    """

    def __init__(
        self,
        max_workers: int | None = None,
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
            from ._pool import WorkerPool  # with concurrent.futures: not paid by `import toolreg`

            workers = DEFAULT_MAX_WORKERS if max_workers is None else max_workers
            executor = WorkerPool(workers, thread_name_prefix)
            owns = True
        else:
            if max_workers is not None:
                raise TypeError(
                    "pass max_workers (for a pool the registry owns) or executor (one you own), "
                    "not both"
                )
            _check_executor(executor)
            owns = False
        # The dispatcher's modules (the pipeline, the coroutine runner) load with the first
        # registry, not with `import toolreg`.
        from ._dispatch import Dispatcher

        self._hooks = HookTable()
        self._tools = ToolTable(self._tools_changed)
        self._dispatcher: Dispatcher = Dispatcher(
            self._tools, self._hooks, executor, owns, overdue_after, thread_name_prefix, self
        )

    # -- tools -----------------------------------------------------------------------------------

    def register(self, tool: Tool) -> Registration:
        """Add a tool; `ValueError` for a duplicate name or an invalid schema."""
        if not isinstance(tool, Tool):
            raise TypeError(f"register() takes a Tool, got {type(tool).__name__}")
        return self._tools.register(tool)

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
        title: str | None = None,
        annotations: Mapping[str, Any] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        validate_output: bool = False,
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
        title: str | None = None,
        annotations: Mapping[str, Any] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        validate_output: bool = False,
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
        title: str | None = None,
        annotations: Mapping[str, Any] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        validate_output: bool = False,
    ) -> F | Callable[[F], F]:
        """Decorator: register `fn(args, ctx)` as a tool and return it unchanged.

        The name defaults to the function's name and the description to its docstring; the
        other options are `Tool`'s fields.
        """

        def decorate(fn: F) -> F:
            import inspect  # only for a docstring: `import toolreg` does not pay for it

            text = description if description is not None else inspect.getdoc(fn) or ""
            tool = Tool(
                name or _name_of(fn),
                fn,
                description=text,
                parameters=parameters,
                timeout=timeout,
                concurrency_safe=concurrency_safe,
                render=render,
                title=title,
                annotations=annotations,
                output_schema=output_schema,
                validate_output=validate_output,
            )
            self.register(tool)
            return fn

        return decorate if fn is None else decorate(fn)

    def get(self, name: str) -> Tool | None:
        """The tool registered under `name`, or None."""
        entry = self._tools.lookup(name)
        return None if entry is None else entry.tool

    def tools(self) -> tuple[Tool, ...]:
        """The registered tools, sorted by name."""
        return self._tools.catalog().tools

    def schemas(self, style: SchemaStyle = "openai") -> list[dict[str, Any]]:
        """Tool definitions in the shape a model or client expects, sorted by name.

        `"openai"` (function calling), `"anthropic"` (tool use) or `"mcp"` (`tools/list`); see
        `Catalog.schemas`. Each call returns fresh, JSON-serializable copies.
        """
        return self._tools.catalog().schemas(style)

    def catalog(self) -> Catalog:
        """The registered tools and their schemas, taken from one registration state."""
        return self._tools.catalog()

    def on_tools_changed(self, fn: Callable[[], object]) -> Registration:
        """`fn()` runs on the registering thread after every register or unregister.

        It runs outside any lock, so it may read `catalog()`; its exceptions are logged.
        """
        return self._add_hook("tools_changed", fn, "on_tools_changed callback")

    def _tools_changed(self) -> None:
        for listener in self._hooks.current.tools_changed:
            try:
                listener()
            except INTERRUPTS:
                raise
            except BaseException:
                _logger.exception("toolreg: on_tools_changed callback %r raised", listener)

    # -- hooks -----------------------------------------------------------------------------------

    def add_pre_execute(self, hook: PreExecuteHook) -> Registration:
        """`hook(call, token) -> None | Allow() | Deny(reason) | Ask(reason)`, in order."""
        return self._add_hook("pre_execute", hook, "pre-execute hook")

    def set_approver(self, approver: Approver) -> Registration:
        """`approver(call, reason, token) -> bool`; replaces any previous approver."""
        _check_callable(approver, "approver")
        return self._hooks.set_approver(approver)

    def add_guard(self, guard: Guard) -> Registration:
        """`guard(call) -> str | None`; a string denies the call with that reason."""
        return self._add_hook("guards", guard, "guard")

    def add_around(self, wrapper: AroundWrapper) -> Registration:
        """`wrapper(dispatch, proceed) -> ToolResult`; the first registered is outermost."""
        return self._add_hook("around", wrapper, "around wrapper")

    def add_post_execute(self, hook: PostExecuteHook) -> Registration:
        """`hook(result, token) -> ToolResult | None`; may fail a success, never the reverse."""
        return self._add_hook("post_execute", hook, "post-execute hook")

    def add_call_hook(self, hook: CallHook) -> Registration:
        """`hook(call, token) -> CallTrace | None` at the entry of every call (tracing).

        Unlike the stage hooks it sees every call, entry failures included, and its trace can
        wrap the body on the body's own thread; see `CallHook` and `CallTrace`.
        """
        return self._add_hook("call_hooks", hook, "call hook")

    def on_result(self, observer: ResultObserver) -> Registration:
        """`observer(result)` sees every final result once; its exceptions are logged."""
        return self._add_hook("observers", observer, "observer")

    def _add_hook(self, kind: str, hook: Callable[..., Any], what: str) -> Registration:
        _check_callable(hook, what)
        return self._hooks.add(kind, hook)

    # -- calls -----------------------------------------------------------------------------------

    def execute(
        self,
        call_or_name: ToolCall | str,
        arguments: Mapping[str, Any] | None = None,
        *,
        token: CancelToken | None = None,
        start_if_cancelled: bool = True,
        progress: ProgressCallback | None = None,
    ) -> ToolResult[Any]:
        """Run one call through the pipeline and return its final `ToolResult`; blocks.

        `token` is the caller's token (default: never cancelled). With a token that is already
        cancelled, `start_if_cancelled=True` (the default, for direct callers) still runs the
        call so the body can clean up; `False` (what a server or agent loop should pass) starts
        nothing and returns `ABORTED_BEFORE_DISPATCH`. `progress(update)` receives the body's
        `ctx.report_progress` updates (increasing values only), on the body's thread. Never
        raises for a tool-level problem; raises `RuntimeError` after `close()`, `TypeError` for
        a call that is not a `ToolCall` or a name, and re-raises a Ctrl-C (or any exception a
        signal handler raised meanwhile) once the call has settled and been observed.
        """
        call, owned = owned_call(call_or_name, arguments)  # a name: made and owned here
        if token is None:  # `caller_token`, its usual cases inline: each call comes through here
            caller = _NEVER
        elif type(token) is CancelToken:
            caller = token
        else:
            caller = caller_token(token)
        mode = _DIRECT if start_if_cancelled else _DIRECT_MODEL
        sink = None if progress is None else progress_sink(progress)
        # Positional (no admitted entry, no watcher): a keyword call costs more on this hot path.
        result, interrupted = self._dispatcher.run(call, caller, mode, sink, None, None, owned)
        if interrupted is not None:
            raise interrupted  # once the call is complete and observed
        return result

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
        `TypeError` before anything starts for an item that is not a `ToolCall`, or a
        `max_parallel` that is not an int, and `ValueError` for duplicate call ids or
        `max_parallel < 1`.
        """
        run = _run_batch or _load_batch()
        caller = caller_token(token)
        return run(self._dispatcher, calls, caller, max_parallel, on_progress)

    def in_flight(self) -> list[InFlightCall]:
        """A snapshot of the calls in progress (past their entry checks), oldest first."""
        return [
            InFlightCall(
                state.call,
                state.stage,
                state.entered,
                state.token.cancelled,
                state.cancelled_at(),
                state.body_started(),
            )
            for state in self._dispatcher.in_flight()
        ]

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no call (direct, nested, batch or awaited) is in flight; True if idle.

        A call is in flight until its `execute` returns, observers included. With `timeout`
        (seconds), returns False if calls were still in flight when it ran out. From inside
        one of this registry's own calls (a hook, a body, an observer) it raises
        `RuntimeError`: it would wait for itself.
        """
        return self._dispatcher.wait_idle(_validate.wait_timeout(timeout))

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel every call in flight, wait for all of them, shut down an owned pool.

        Idempotent. Afterwards `execute` raises `RuntimeError`. Calling it from inside one of
        this registry's own calls (a hook, a body, an observer) raises `RuntimeError` instead of
        waiting for itself. A Ctrl-C while it waits does not cut the wait short (the calls are
        cancelled; cooperative ones end): it is re-raised once they have.
        """
        self._dispatcher.close()

    @property
    def closed(self) -> bool:
        """True once `close()` has finished."""
        return self._dispatcher.closed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        dispatcher = self._dispatcher
        state = "closed" if dispatcher.closed else "closing" if dispatcher.closing else "open"
        return (
            f"<ToolRegistry {state} tools={len(self._tools.entries)} "
            f"in_flight={dispatcher.active()}>"
        )


def progress_sink(progress: object) -> ProgressSink | None:
    """The per-call filter in front of a `progress=` callback."""
    if progress is None:
        return None
    if not callable(progress):
        raise TypeError(f"progress must be callable, got {type(progress).__name__}")
    return ProgressSink(progress)


def _check_callable(fn: object, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"the {what} must be callable, got {type(fn).__name__}")


def _check_executor(executor: object) -> None:
    # Imported only for a caller's own executor: `import toolreg` does not pay for them.
    from concurrent.futures import ThreadPoolExecutor

    from ._pool import WorkerPool

    if isinstance(executor, WorkerPool):
        return

    if isinstance(executor, ThreadPoolExecutor):
        return
    if type(executor).__module__.partition(".")[0] == "distributed":
        # Read from the type, so that checking never imports distributed.
        raise TypeError(
            f"executor cannot be a Dask {type(executor).__name__} (client.get_executor()): it "
            "reports a running body as cancelled and abandons it, and tokens and contexts "
            "cannot cross processes; run tool bodies on a cluster with "
            "toolreg.distributed.DaskBackend(client) and @backend.remote instead"
        )
    raise TypeError(
        f"executor must be a WorkerPool or a ThreadPoolExecutor (tool bodies share tokens and "
        f"contexts with this process), got {type(executor).__name__}"
    )
