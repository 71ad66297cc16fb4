"""Hook kinds: decisions, the `Protocol` of each stage's callable, and the `Dispatch` slot."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ._cancel import CancelToken, Registration
from ._record import record
from ._results import ToolCall, ToolResult

if TYPE_CHECKING:
    from ._tools import Tool

__all__ = [
    "Allow",
    "Approver",
    "Ask",
    "AroundWrapper",
    "CallHook",
    "CallTrace",
    "Deny",
    "Dispatch",
    "Guard",
    "OwnPolicy",
    "PostExecuteHook",
    "PreExecuteHook",
    "ResultObserver",
]


@record(frozen=True)
class Allow:
    """A pre-execute decision: go on (the same as returning None)."""


@record(frozen=True)
class Deny:
    """A pre-execute decision: refuse the call (`DENIED` with `reason`); final."""

    reason: str

    def __init__(self, reason: str) -> None:
        self.__dict__["reason"] = reason


@record(frozen=True)
class Ask:
    """A pre-execute decision: go on only if the approver approves (`reason` is shown to it)."""

    reason: str

    def __init__(self, reason: str) -> None:
        self.__dict__["reason"] = reason


Decision = Allow | Deny | Ask


class PreExecuteHook(Protocol):
    """`hook(call, token) -> None | Allow() | Deny(reason) | Ask(reason)`."""

    def __call__(self, call: ToolCall, token: CancelToken, /) -> Decision | None: ...


class Approver(Protocol):
    """`fn(call, reason, token) -> bool`: only `True` approves."""

    def __call__(self, call: ToolCall, reason: str, token: CancelToken, /) -> bool: ...


class Guard(Protocol):
    """`fn(call) -> str | None`: a returned string denies the call with that reason."""

    def __call__(self, call: ToolCall, /) -> str | None: ...


class Proceed(Protocol):
    """Runs the rest of the wrapper chain and, last, the body; never raises."""

    def __call__(self) -> ToolResult[Any]: ...


class AroundWrapper(Protocol):
    """`wrapper(dispatch, proceed) -> ToolResult`; the first registered is the outermost."""

    def __call__(self, dispatch: Dispatch, proceed: Proceed, /) -> ToolResult[Any]: ...


# How the registry runs one of its own policies: `run(dispatch, proceed, *args)` calls
# `proceed(*args)` for the rest of the chain (`HookSet.chain_runs`).
ChainRun = Callable[..., ToolResult[Any]]


class OwnPolicy(Protocol):
    """The internal protocol of the registry's own around wrappers (`TimeoutPolicy`,
    `RetryPolicy`): what lets the registry run one without a `proceed()` made per call, finish
    a result it hands on in place, and run a deadline policy that is alone around the body as
    the body's deadline, with no chain.

    A class takes part by defining `_run_in_chain` in its own body (`own_policy`): a subclass
    may override `__call__`, so it is an ordinary wrapper unless it defines it again. Only
    `HookSet` reads the protocol, into its derived fields; the pipeline uses those.
    """

    #: It hands on the result it got, or a new one, and keeps neither.
    _keeps_no_result: ClassVar[bool]
    #: It has a deadline to offer (`_open_deadline`, `_close_deadline`).
    _runs_as_deadline: ClassVar[bool]

    def _run_in_chain(
        self, dispatch: Dispatch, proceed: Callable[..., ToolResult[Any]], *args: Any
    ) -> ToolResult[Any]:
        """`__call__`, with the rest of the chain as `proceed(*args)`."""
        ...

    def _open_deadline(self, tool: Tool, parent: CancelToken) -> CancelToken | None:
        """The deadline of a call of `tool`: a lazy child of `parent`; None for none."""
        ...

    def _close_deadline(
        self, tool: Tool, budget: CancelToken, result: ToolResult[Any]
    ) -> ToolResult[Any]:
        """After the body: `result`, or its `TOOL_TIMEOUT` if `budget` is what cancelled it;
        `budget` closed."""
        ...


# A deadline policy run as data around the body: its `_open_deadline` and `_close_deadline`.
Deadline = tuple[
    Callable[["Tool", CancelToken], "CancelToken | None"],
    Callable[["Tool", CancelToken, "ToolResult[Any]"], "ToolResult[Any]"],
]


class PostExecuteHook(Protocol):
    """`hook(result, token) -> ToolResult | None`; may turn success into failure, not back."""

    def __call__(
        self, result: ToolResult[Any], token: CancelToken, /
    ) -> ToolResult[Any] | None: ...


class ResultObserver(Protocol):
    """`observer(result)`: sees each final, frozen result exactly once."""

    def __call__(self, result: ToolResult[Any], /) -> object: ...


class CallTrace(Protocol):
    """What a `CallHook` follows one call with; every method is optional.

    * `body(ctx)`: a context manager entered on the body's thread around each start of the body
      (so whatever the body does there runs inside it), and exited when the body settles.
    * `overdue(ctx)`: the body has not settled `overdue_after` seconds after its cancellation
      (the moment the registry logs its warning).
    * `end(result)`: the final, frozen result, before the observers see it.

    Exceptions are logged on the `toolreg` logger and never change the call.
    """


class CallHook(Protocol):
    """`hook(call, token) -> CallTrace | None`, at the entry of every call.

    Called before the entry checks (so a call that fails them is seen too), on the thread and in
    the `contextvars` context where the call was entered: the caller's thread for `execute`, the
    awaiting task's context for the asyncio facade, the batch caller's context for batch calls.
    `call` is the call as given; `token` is the call's own token (cancelled with the caller's,
    by `close()` and by Ctrl-C). The returned trace follows the call to its end.
    """

    def __call__(self, call: ToolCall, token: CancelToken, /) -> CallTrace | None: ...


class Dispatch:
    """What an around wrapper sees of one call.

    `call`, `tool`, `caller_token` and `call_token` (the call's own token: the caller's, plus
    `close()` and Ctrl-C) are read-only. `token` is the token everything downstream observes; a
    wrapper may replace it (say with a deadline derived from it) and should restore it
    afterwards. Replacing it can never detach the caller: immediately before the body starts,
    the registry fuses the call's token with whatever `token` holds then.
    """

    __slots__ = ("_call", "_call_token", "_caller_token", "_token", "_tool")

    def __init__(self, call: ToolCall, tool: Tool, caller_token: CancelToken, token: CancelToken):
        self._call = call
        self._tool = tool
        self._caller_token = caller_token
        self._call_token = token
        self._token = token

    @property
    def token(self) -> CancelToken:
        """The token downstream stages and the body observe (fused with the call's token)."""
        return self._token

    @token.setter
    def token(self, token: CancelToken) -> None:
        if not isinstance(token, CancelToken):
            raise TypeError(f"dispatch.token must be a CancelToken, got {type(token).__name__}")
        self._token = token

    @token.deleter
    def token(self) -> None:
        raise AttributeError("dispatch.token cannot be deleted: assign a CancelToken instead")

    @property
    def call(self) -> ToolCall:
        """The call, with its frozen arguments."""
        return self._call

    @property
    def tool(self) -> Tool:
        """The tool being called."""
        return self._tool

    @property
    def caller_token(self) -> CancelToken:
        """The caller's token, captured at entry."""
        return self._caller_token

    @property
    def call_token(self) -> CancelToken:
        """The call's own token: cancelled with the caller's, by `close()` and by Ctrl-C."""
        return self._call_token

    def __repr__(self) -> str:
        return f"<Dispatch {self._call.name!r} token={self._token!r}>"


@record(frozen=True)
class HookSet:
    """The hooks of one moment: a call uses the set that was current at its entry."""

    pre_execute: tuple[PreExecuteHook, ...] = ()
    approver: Approver | None = None
    guards: tuple[Guard, ...] = ()
    around: tuple[AroundWrapper, ...] = ()
    post_execute: tuple[PostExecuteHook, ...] = ()
    observers: tuple[ResultObserver, ...] = ()
    call_hooks: tuple[CallHook, ...] = ()
    tools_changed: tuple[Callable[[], object], ...] = ()  # registry-level, not per call
    #: No pre-execute hook, guard or around wrapper: nothing runs before the body. Derived,
    #: not a field (as are the ones below).
    bare = True
    #: A pre-execute hook or a guard: the call passes the gate before its body.
    gated = False
    #: No post hook, and every around wrapper is one of the registry's own policies that keeps
    #: no reference to a result it hands on (`OwnPolicy._keeps_no_result`): a result the
    #: registry makes for the body then reaches finalizing unseen by user code, and is finished
    #: in place rather than copied.
    results_unseen = True
    #: Per around wrapper, aligned with `around`: how the registry runs one of its own policies
    #: (`OwnPolicy._run_in_chain`), with the rest of the chain as `proceed(*args)` rather than a
    #: `proceed()` made per call; None for any other wrapper.
    chain_runs: tuple[ChainRun | None, ...] = ()
    #: There are around wrappers, and every one has a chain run: no `proceed()` is ever handed
    #: to user code, so none can run on another thread or after the chain.
    chain_only = False
    #: The one around wrapper, when it is a deadline policy of the registry's own
    #: (`TimeoutPolicy`): the call then runs no chain, and the policy's deadline (if the tool
    #: has one) is the body's token.
    deadline: Deadline | None = None

    def __init__(
        self,
        pre_execute: tuple[PreExecuteHook, ...] = (),
        approver: Approver | None = None,
        guards: tuple[Guard, ...] = (),
        around: tuple[AroundWrapper, ...] = (),
        post_execute: tuple[PostExecuteHook, ...] = (),
        observers: tuple[ResultObserver, ...] = (),
        call_hooks: tuple[CallHook, ...] = (),
        tools_changed: tuple[Callable[[], object], ...] = (),
    ) -> None:
        owns = tuple(map(own_policy, around))
        chain_runs = tuple(None if own is None else own._run_in_chain for own in owns)
        self.__dict__.update(
            pre_execute=pre_execute,
            approver=approver,
            guards=guards,
            around=around,
            post_execute=post_execute,
            observers=observers,
            call_hooks=call_hooks,
            tools_changed=tools_changed,
            bare=not (pre_execute or guards or around),
            gated=bool(pre_execute or guards),
            results_unseen=not post_execute
            and all(own is not None and _declares(own, "_keeps_no_result") for own in owns),
            chain_runs=chain_runs,
            chain_only=bool(around) and None not in chain_runs,
            deadline=_deadline(owns),
        )

    def replace(self, **changes: Any) -> HookSet:
        """A copy with `changes` (field name: value), like `dataclasses.replace`."""
        fields = {**self.__dict__, **changes}
        derived = ("bare", "gated", "results_unseen", "chain_runs", "chain_only", "deadline")
        for name in derived:
            del fields[name]
        return HookSet(**fields)


def _registered(hook: object) -> object:
    """The callable behind a registered hook (`HookTable.add` keeps a bare partial of it)."""
    if type(hook) is functools.partial and not hook.args and not hook.keywords:
        return hook.func
    return hook


def own_policy(wrapper: object) -> OwnPolicy | None:
    """The registered `wrapper` if it is one of the registry's own policies (`OwnPolicy`,
    defined in its own class), else None."""
    policy = _registered(wrapper)
    if "_run_in_chain" in type(policy).__dict__:
        return policy  # type: ignore[return-value]  # it defines the protocol in its class
    return None


def _deadline(owns: tuple[OwnPolicy | None, ...]) -> Deadline | None:
    if len(owns) != 1 or owns[0] is None or not _declares(owns[0], "_runs_as_deadline"):
        return None
    return owns[0]._open_deadline, owns[0]._close_deadline


def _declares(policy: OwnPolicy, marker: str) -> bool:
    """Whether `policy` says True to `marker` (`_keeps_no_result`, `_runs_as_deadline`)."""
    return getattr(policy, marker, False) is True


class HookRegistration(Registration):
    """Removes one hook (or tool) from its registry: `remove()` is True the first time."""

    __slots__ = ("_lock", "_removed", "_undo")

    def __init__(self, undo: Callable[[], bool]) -> None:
        self._undo = undo
        self._removed = False
        self._lock = threading.Lock()  # guards _removed, so two remove() calls undo once

    def remove(self) -> bool:
        with self._lock:
            if self._removed:
                return False
            self._removed = True
        return self._undo()

    def __repr__(self) -> str:
        return f"<Registration {'removed' if self._removed else 'active'}>"


class HookTable:
    """The registered hooks: one `HookSet`, replaced copy-on-write.

    A call reads `current` once, without a lock, and keeps that set for its whole life. A
    change builds the new set outside the lock and swaps it in only if nobody changed the set
    meanwhile: nothing is allocated under the lock, so a garbage collection (which may run a
    finalizer that removes a registration) can never run while it is held.
    """

    def __init__(self) -> None:
        self.current = HookSet()
        self._lock = threading.Lock()  # guards the swap of `current`

    def add(self, kind: str, hook: Callable[..., Any]) -> Registration:
        """Append `hook` to the `kind` tuple; its registration removes exactly this entry."""
        # A fresh callable per registration (a C-level partial: no extra Python frame), so the
        # same function registered twice is two registrations, each removed exactly once.
        key = functools.partial(hook)

        def add(hooks: HookSet) -> HookSet:
            changes: dict[str, Any] = {kind: (*getattr(hooks, kind), key)}
            return hooks.replace(**changes)

        self._swap(add)
        return HookRegistration(lambda: self._remove(kind, key))

    def set_approver(self, approver: Approver) -> Registration:
        """Make `approver` the approver; its registration removes it if it is still current."""
        self._swap(lambda hooks: hooks.replace(approver=approver))

        def undo() -> bool:
            return self._swap(
                lambda hooks: hooks.replace(approver=None) if hooks.approver is approver else None
            )

        return HookRegistration(undo)

    def _remove(self, kind: str, key: Callable[..., Any]) -> bool:
        def remove(hooks: HookSet) -> HookSet | None:
            current = getattr(hooks, kind)
            kept = tuple(entry for entry in current if entry is not key)
            if len(kept) == len(current):
                return None
            changes: dict[str, Any] = {kind: kept}
            return hooks.replace(**changes)

        return self._swap(remove)

    def _swap(self, change: Callable[[HookSet], HookSet | None]) -> bool:
        """Replace the set with `change(current)` (None: no change); False if none."""
        while True:
            current = self.current
            changed = change(current)
            if changed is None:
                return False
            with self._lock:
                if self.current is current:
                    self.current = changed
                    return True
