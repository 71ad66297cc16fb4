"""Ctrl-C inside `execute`: it cancels that call (never the caller's token), completes the
pipeline, then re-raises.

docs/contract.md 4.8 and A.2 (where Ctrl-C may land). A `KeyboardInterrupt` is raised (or a
real SIGINT delivered) at each stage of a call in turn; SIGINT is only sent once the main thread
is seen blocked (`send_ctrl_c_when`).
"""

from __future__ import annotations

import _thread
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _registry_helpers import (
    ABORTED,
    BEFORE,
    WAIT,
    Args,
    Caller,
    Journal,
    Observed,
    Proceed,
    counting_tool,
    default_sigint,
    frame_of,
    holds_nothing,
    main_thread_sleeps,
    send_ctrl_c_when,
    wait_until,
)

import toolreg
from toolreg import (
    Ask,
    CancelSource,
    CancelToken,
    Dispatch,
    ErrorCode,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
)

TOOLREG_DIR = str(Path(toolreg.__file__).parent)


class CtrlCScene:
    """One registry where a KeyboardInterrupt lands at a chosen spot of a call."""

    def __init__(self, registry: ToolRegistry) -> None:
        self.registry = registry
        self.journal = Journal()
        self.observed = Observed()
        self.call_tokens: list[CancelToken] = []
        self.body_started = threading.Event()
        self.body_mode = "quick"
        self.release = threading.Event()
        registry.on_result(self.observed)
        registry.tool(name="work")(self._body)

    def _body(self, args: Args, ctx: ToolContext) -> str:
        self.call_tokens.append(ctx.token)
        self.journal("body start")
        self.body_started.set()
        if self.body_mode == "cooperative":
            ctx.token.wait(WAIT)
        elif self.body_mode == "uncooperative":
            self.release.wait(WAIT)  # ignores ctx.token
        self.journal("body end")
        return "done"

    def keep_token(self, token: CancelToken) -> None:
        self.call_tokens.append(token)


def _interrupt_in_pre_hook(scene: CtrlCScene) -> None:
    def hook(call: ToolCall, token: CancelToken) -> None:
        scene.keep_token(token)
        raise KeyboardInterrupt

    scene.registry.add_pre_execute(hook)


def _signal_during_pre_hook_wait(scene: CtrlCScene) -> threading.Event:
    waiting = threading.Event()

    def hook(call: ToolCall, token: CancelToken) -> None:
        scene.keep_token(token)
        waiting.set()
        threading.Event().wait(WAIT)  # Ctrl-C arrives while the hook blocks here

    scene.registry.add_pre_execute(hook)
    return waiting


def _interrupt_in_approver(scene: CtrlCScene) -> None:
    scene.registry.add_pre_execute(lambda call, token: Ask("?"))

    def approver(call: ToolCall, reason: str, token: CancelToken) -> bool:
        scene.keep_token(token)
        raise KeyboardInterrupt

    scene.registry.set_approver(approver)


def _interrupt_in_guard(scene: CtrlCScene) -> None:
    scene.registry.add_pre_execute(lambda call, token: scene.keep_token(token))

    def guard(call: ToolCall) -> None:
        raise KeyboardInterrupt

    scene.registry.add_guard(guard)


def _interrupt_in_wrapper_before_proceed(scene: CtrlCScene) -> None:
    def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        scene.keep_token(dispatch.token)
        raise KeyboardInterrupt

    scene.registry.add_around(wrapper)


def _interrupt_in_wrapper_after_proceed(scene: CtrlCScene) -> None:
    def wrapper(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        proceed()
        scene.keep_token(dispatch.token)
        raise KeyboardInterrupt

    scene.registry.add_around(wrapper)


def _interrupt_in_post_hook(scene: CtrlCScene) -> None:
    def post(result: ToolResult[Any], token: CancelToken) -> None:
        scene.keep_token(token)
        raise KeyboardInterrupt

    scene.registry.add_post_execute(post)


def _signal_while_joining_cooperative_body(scene: CtrlCScene) -> threading.Event:
    scene.body_mode = "cooperative"
    return scene.body_started


def _signal_while_joining_uncooperative_body(scene: CtrlCScene) -> threading.Event:
    scene.body_mode = "uncooperative"

    def release_once_cancelled() -> None:
        assert scene.body_started.wait(WAIT)
        wait_until(lambda: scene.call_tokens[0].cancelled, "Ctrl-C to cancel the call")
        scene.release.set()

    Caller(release_once_cancelled, name="releaser")
    return scene.body_started


@pytest.mark.parametrize(
    ("setup", "code", "body_ran"),
    [
        (_interrupt_in_pre_hook, BEFORE, False),
        (_signal_during_pre_hook_wait, BEFORE, False),
        (_interrupt_in_approver, BEFORE, False),
        (_interrupt_in_guard, BEFORE, False),
        (_interrupt_in_wrapper_before_proceed, BEFORE, False),
        (_interrupt_in_wrapper_after_proceed, ABORTED, True),
        (_interrupt_in_post_hook, ABORTED, True),
        (_signal_while_joining_cooperative_body, ABORTED, True),
        (_signal_while_joining_uncooperative_body, ABORTED, True),
    ],
    ids=lambda value: value.__name__.strip("_") if callable(value) else None,
)
def test_ctrl_c_cancels_only_the_call_finishes_the_pipeline_then_reraises(
    registry: ToolRegistry,
    setup: Callable[[CtrlCScene], threading.Event | None],
    code: ErrorCode,
    body_ran: bool,
) -> None:
    scene = CtrlCScene(registry)
    moment = setup(scene)
    caller = CancelSource()
    with default_sigint():
        presser = send_ctrl_c_when(moment) if moment is not None else None
        with pytest.raises(KeyboardInterrupt):
            registry.execute("work", token=caller.token)
        if presser is not None:
            presser.join()
    assert not caller.token.cancelled
    assert scene.call_tokens and all(token.cancelled for token in scene.call_tokens)
    assert scene.observed.codes == [code]
    assert scene.observed.results[0].dispatched is body_ran
    assert scene.journal.entries == (["body start", "body end"] if body_ran else [])
    assert holds_nothing(caller.token)
    assert registry.in_flight() == []


def _main_thread_waits_in_toolreg() -> bool:
    """The main thread is blocked, and its innermost frame (past threading.py) is toolreg's."""
    frame = frame_of(threading.main_thread().ident)
    while frame is not None and frame.f_code.co_filename == threading.__file__:
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(TOOLREG_DIR):
        return False
    return main_thread_sleeps()


FRAMES_UNDER_COLLECTION = """
import gc, sys, threading
from _registry_helpers import frame_of
gc.set_threshold(1)  # a collection at (almost) every allocation
parked = threading.Event()
other = threading.Thread(target=parked.wait)
other.start()
for _ in range(2000):
    holder = {"local": threading.local()}
    holder["self"] = holder  # a cycle: only the collector frees this threading.local
    del holder
    assert frame_of(other.ident) is not None
parked.set()
other.join()
"""


def test_reading_frames_survives_a_collection_that_frees_a_thread_local() -> None:
    """Regression: with a bare `sys._current_frames()` the child froze holding the GIL (see
    `frame_of`), and a parked-caller check froze the whole suite, pytest-timeout included."""
    child = subprocess.run(
        [sys.executable, "-c", FRAMES_UNDER_COLLECTION],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        timeout=WAIT * 3,
    )
    assert child.returncode == 0, child.stderr


def test_ctrl_c_handled_as_the_body_returns_is_reraised_not_hung(registry: ToolRegistry) -> None:
    """`_thread.interrupt_main()` makes Ctrl-C pending without waking the blocked caller: it is
    handled right after the join's wait returns -- where a real SIGINT lands when it arrives
    just as the body finishes (or just before the caller blocked)."""
    observed = Observed()
    registry.on_result(observed)
    returned = threading.Event()
    finished = threading.Event()
    rescued = threading.Event()

    @registry.tool
    def work(args: Args, ctx: ToolContext) -> str:
        pause = threading.Event()
        streak = 0
        for _ in range(300):  # until the caller sits in the join (bounded: 3 s)
            streak = streak + 1 if _main_thread_waits_in_toolreg() else 0
            if streak >= 5:
                break
            pause.wait(0.01)
        _thread.interrupt_main()
        returned.set()
        return "done"

    def rescue() -> None:
        # Unblocks a hung caller so that the suite goes on (the test then fails, as it should).
        assert returned.wait(WAIT)
        if finished.wait(2.0):  # a bound on a call that needs microseconds after its body
            return
        rescued.set()
        for state in list(registry._dispatcher._calls.values()):
            body = getattr(state, "body", None)  # a call's latest body run (a batch has none)
            done = getattr(body, "_done", None)
            if done is not None and done.locked():
                done.release()

    with default_sigint():
        rescuer = Caller(rescue, name="rescuer")
        try:
            with pytest.raises(KeyboardInterrupt):
                registry.execute("work")
        finally:
            finished.set()
            rescuer.join()
    assert not rescued.is_set(), "execute() hung after the body returned"
    assert observed.codes == [ABORTED]


def test_ctrl_c_in_an_observer_still_notifies_the_others_then_reraises(
    registry: ToolRegistry,
) -> None:
    counting_tool(registry)
    first, last = Observed(), Observed()
    registry.on_result(first)

    def interrupted(result: ToolResult[Any]) -> None:
        raise KeyboardInterrupt

    registry.on_result(interrupted)
    registry.on_result(last)
    caller = CancelSource()
    with pytest.raises(KeyboardInterrupt):
        registry.execute("work", token=caller.token)
    assert first.codes == last.codes == [None]
    assert first.results[0] is last.results[0]
    assert not caller.token.cancelled
