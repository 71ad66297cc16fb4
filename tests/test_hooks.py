"""The hook stages around a call: pre-execute, approval, guards, post-execute and observers.

docs/contract.md section 3: every hook runs once, in stage order; a call uses the hooks
registered at its entry; a malformed answer or an exception fails closed as `HOOK_ERROR`;
nothing later turns a denial or a failure into success. The around wrappers have their own
file, test_wrappers.py.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from _registry_helpers import (
    ABORTED,
    BEFORE,
    Args,
    Caller,
    Journal,
    Observed,
    Proceed,
    counting_tool,
    echo,
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
    Tool,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
)

# == registration and stage order =============================================================


Decision = TypeVar("Decision")


def journaled(journal: Journal, entry: str, decision: Decision) -> Callable[..., Decision]:
    """A hook (or approver) that notes `entry` in `journal`, then returns `decision`."""

    def hook(*args: object) -> Decision:
        journal(entry)
        return decision

    return hook


def _registrations(registry: ToolRegistry, journal: Journal) -> dict[str, Registration]:
    def around(dispatch: Dispatch, proceed: Proceed) -> ToolResult[Any]:
        journal("around")
        return proceed()

    return {
        "pre": registry.add_pre_execute(journaled(journal, "pre", Ask("?"))),
        "approver": registry.set_approver(journaled(journal, "approver", True)),
        "guard": registry.add_guard(lambda call: journal("guard")),
        "around": registry.add_around(around),
        "post": registry.add_post_execute(lambda result, token: journal("post")),
        "observer": registry.on_result(lambda result: journal("observer")),
    }


def test_every_hook_runs_once_in_stage_order(registry: ToolRegistry) -> None:
    journal = Journal()

    def body(args: Args, ctx: ToolContext) -> str:
        journal("body")
        return "ok"

    registry.tool(name="work")(body)
    _registrations(registry, journal)
    assert registry.execute("work").ok
    assert journal.entries == ["pre", "approver", "guard", "around", "body", "post", "observer"]


@pytest.mark.parametrize("kind", ["pre", "approver", "guard", "around", "post", "observer"])
def test_each_registration_removes_its_hook_once(registry: ToolRegistry, kind: str) -> None:
    journal = Journal()
    counting_tool(registry)
    registrations = _registrations(registry, journal)
    assert all(isinstance(r, Registration) for r in registrations.values())
    assert registrations[kind].remove() is True
    assert registrations[kind].remove() is False
    result = registry.execute("work")
    everything = ["pre", "approver", "guard", "around", "post", "observer"]
    if kind == "pre":  # nobody asks: the approver is not consulted
        assert journal.entries == ["guard", "around", "post", "observer"]
    elif kind == "approver":  # an Ask without an approver is a denial
        assert journal.entries == ["pre", "post", "observer"]
        assert result.code == ErrorCode.DENIED
    else:
        assert journal.entries == [entry for entry in everything if entry != kind]


def test_hooks_registered_during_a_call_serve_only_later_calls(registry: ToolRegistry) -> None:
    journal = Journal()
    counting_tool(registry)
    late: list[Registration] = []

    def late_around(d: Dispatch, p: Proceed) -> ToolResult[Any]:
        journal(("late-around", d.call.call_id))
        return p()

    def first(call: ToolCall, token: CancelToken) -> None:
        journal(("first", call.call_id))
        if not late:
            late.append(registry.add_pre_execute(lambda c, t: journal(("late-pre", c.call_id))))
            late.append(registry.add_around(late_around))
            late.append(
                registry.add_post_execute(lambda r, t: journal(("late-post", r.call.call_id)))
            )
            late.append(registry.on_result(lambda r: journal(("late-observer", r.call.call_id))))
            late.append(registry.add_guard(lambda c: journal(("late-guard", c.call_id))))

    registry.add_pre_execute(first)
    one = registry.execute(ToolCall("work", call_id="one"))
    assert journal.entries == [("first", "one")]
    registry.execute(ToolCall("work", call_id="two"))
    assert journal.entries[1:] == [
        ("first", "two"),
        ("late-pre", "two"),
        ("late-guard", "two"),
        ("late-around", "two"),
        ("late-post", "two"),
        ("late-observer", "two"),
    ]
    assert one.ok


def test_hooks_removed_during_a_call_still_serve_that_call(registry: ToolRegistry) -> None:
    journal = Journal()
    counting_tool(registry)
    registrations: dict[str, Registration] = {}

    def remover(call: ToolCall, token: CancelToken) -> None:
        for registration in registrations.values():
            registration.remove()

    registry.add_pre_execute(remover)
    registrations["post"] = registry.add_post_execute(lambda r, t: journal("post"))
    registrations["observer"] = registry.on_result(lambda r: journal("observer"))
    registry.execute("work")
    assert journal.entries == ["post", "observer"]
    registry.execute("work")
    assert journal.entries == ["post", "observer"]


def test_hook_lists_can_change_while_calls_are_in_flight(registry: ToolRegistry) -> None:
    counting_tool(registry)
    stop = threading.Event()

    def churn() -> int:
        rounds = 0
        while not (rounds and stop.is_set()):  # at least one round, however late it starts
            registrations = [
                registry.add_pre_execute(lambda call, token: None),
                registry.add_around(lambda dispatch, proceed: proceed()),
                registry.add_post_execute(lambda result, token: None),
                registry.on_result(lambda result: None),
                registry.add_guard(lambda call: None),
            ]
            for registration in reversed(registrations):
                assert registration.remove() is True
            rounds += 1
        return rounds

    churner = Caller(churn, name="hook-churn")
    try:
        results = [registry.execute("work") for _ in range(300)]
    finally:
        stop.set()
    assert churner.join() > 0
    assert all(result.ok for result in results)


# == failures: malformed answers and exceptions ===============================================

PRE_MALFORMED = ["yes", True, 1, Deny, {"allow": True}]
GUARD_MALFORMED = [42, True, b"no", ["no"]]
WRAPPER_MALFORMED = [None, "ok", {"ok": True}, 0]
POST_MALFORMED = ["x", True, {"ok": False}, 0]


def _malformed_cases() -> list[Any]:
    cases: list[Any] = []
    for value in PRE_MALFORMED:
        cases.append(pytest.param("pre", value, id=f"pre-{value!r}"))
    for value in GUARD_MALFORMED:
        cases.append(pytest.param("guard", value, id=f"guard-{value!r}"))
    for value in WRAPPER_MALFORMED:
        cases.append(pytest.param("around", value, id=f"around-{value!r}"))
    for value in POST_MALFORMED:
        cases.append(pytest.param("post", value, id=f"post-{value!r}"))
    return cases


@pytest.mark.parametrize(("kind", "value"), _malformed_cases())
def test_malformed_hook_return_fails_closed_with_hook_error(
    registry: ToolRegistry, observed: Observed, kind: str, value: Any
) -> None:
    journal = Journal()
    counting_tool(registry)
    if kind == "pre":
        registry.add_pre_execute(lambda call, token: value)
    elif kind == "guard":
        registry.add_guard(lambda call: value)
    elif kind == "around":
        registry.add_around(lambda dispatch, proceed: value)
    else:
        registry.add_post_execute(lambda result, token: value)
    registry.add_post_execute(lambda result, token: journal(("post", result.code)))
    result = registry.execute("work")
    assert result.code == ErrorCode.HOOK_ERROR
    assert type(value).__name__ in result.error.message  # type: ignore[union-attr]
    assert journal.entries == []  # a registry-made HOOK_ERROR skips the (later) post hooks
    assert observed.results == [result]


def _add_hook(registry: ToolRegistry, kind: str, hook: Callable[..., Any]) -> Registration:
    adders: dict[str, Callable[[Any], Registration]] = {
        "pre": registry.add_pre_execute,
        "guard": registry.add_guard,
        "around": registry.add_around,
        "post": registry.add_post_execute,
    }
    return adders[kind](hook)


@pytest.mark.parametrize("kind", ["pre", "guard", "around", "post"])
def test_hook_exception_becomes_hook_error_with_the_exception(
    registry: ToolRegistry, observed: Observed, kind: str
) -> None:
    boom = LookupError("hook broke")

    def fail(*args: Any) -> Any:
        raise boom

    counting_tool(registry)
    _add_hook(registry, kind, fail)
    result = registry.execute("work")
    assert result.code == ErrorCode.HOOK_ERROR
    assert result.error.exception is boom  # type: ignore[union-attr]
    assert "hook broke" in result.content
    assert observed.results == [result]


@pytest.mark.parametrize("kind", ["pre", "guard", "around", "post"])
def test_hook_raising_cancelled_while_the_token_is_live_is_a_hook_error(
    registry: ToolRegistry, kind: str
) -> None:
    def fail(*args: Any) -> Any:
        raise Cancelled("not ours")

    counting_tool(registry)
    _add_hook(registry, kind, fail)
    assert registry.execute("work", token=CancelSource().token).code == ErrorCode.HOOK_ERROR


@pytest.mark.parametrize(
    ("kind", "code"),
    [("pre", BEFORE), ("guard", BEFORE), ("around", BEFORE), ("post", ABORTED)],
)
def test_hook_raising_cancelled_once_the_call_is_cancelled_is_cancellation(
    registry: ToolRegistry, kind: str, code: ErrorCode
) -> None:
    caller = CancelSource()

    def give_up(*args: Any) -> Any:
        caller.cancel("stop")
        raise Cancelled("stop")

    counting_tool(registry)
    _add_hook(registry, kind, give_up)
    assert registry.execute("work", token=caller.token).code == code


# == approval and guards ======================================================================


@pytest.mark.parametrize("answer", [False, None, 1, "yes", [True], Allow()])
def test_approver_answer_other_than_true_denies(registry: ToolRegistry, answer: Any) -> None:
    starts = counting_tool(registry)
    registry.add_pre_execute(lambda call, token: Ask("delete everything?"))
    registry.set_approver(lambda call, reason, token: answer)
    result = registry.execute("work")
    assert result.code == ErrorCode.DENIED
    assert result.error.message == "delete everything?"  # type: ignore[union-attr]
    assert starts == []


def test_approver_exception_denies(registry: ToolRegistry) -> None:
    starts = counting_tool(registry)
    registry.add_pre_execute(lambda call, token: Ask("confirm?"))

    def broken(call: ToolCall, reason: str, token: CancelToken) -> bool:
        raise OSError("approval service down")

    registry.set_approver(broken)
    assert registry.execute("work").code == ErrorCode.DENIED
    assert starts == []


def test_ask_without_an_approver_is_denied_with_its_reason(registry: ToolRegistry) -> None:
    starts = counting_tool(registry)
    registry.add_pre_execute(lambda call, token: Ask("needs a human"))
    result = registry.execute("work")
    assert result.code == ErrorCode.DENIED
    assert result.content == "Error: needs a human"
    assert starts == []


def test_approver_is_called_once_with_the_first_asks_reason(registry: ToolRegistry) -> None:
    counting_tool(registry)
    calls: list[tuple[str, str, CancelToken]] = []
    hook_tokens: list[CancelToken] = []

    def first(call: ToolCall, token: CancelToken) -> Ask:
        hook_tokens.append(token)
        return Ask("first")

    def approver(call: ToolCall, reason: str, token: CancelToken) -> bool:
        calls.append((call.name, reason, token))
        return True

    registry.add_pre_execute(first)
    registry.add_pre_execute(lambda call, token: Allow())
    registry.add_pre_execute(lambda call, token: Ask("second"))
    registry.set_approver(approver)
    assert registry.execute("work").ok
    assert [(name, reason) for name, reason, _ in calls] == [("work", "first")]
    assert calls[0][2] is hook_tokens[0]  # the call's token


def test_first_deny_stops_the_stage_and_skips_the_approver(registry: ToolRegistry) -> None:
    journal = Journal()
    starts = counting_tool(registry)

    registry.add_pre_execute(journaled(journal, "ask", Ask("?")))
    registry.add_pre_execute(journaled(journal, "deny", Deny("policy")))
    registry.add_pre_execute(lambda call, token: journal("never"))
    registry.set_approver(journaled(journal, "approver", True))
    registry.add_guard(lambda call: journal("guard"))
    result = registry.execute("work")
    assert result.code == ErrorCode.DENIED
    assert result.content == "Error: policy"
    assert journal.entries == ["ask", "deny"]
    assert starts == []


def test_set_approver_replaces_the_previous_one(registry: ToolRegistry) -> None:
    journal = Journal()
    counting_tool(registry)
    registry.add_pre_execute(lambda call, token: Ask("?"))

    def refuse(call: ToolCall, reason: str, token: CancelToken) -> bool:
        journal("first")
        return False

    def approve(call: ToolCall, reason: str, token: CancelToken) -> bool:
        journal("second")
        return True

    first = registry.set_approver(refuse)
    second = registry.set_approver(approve)
    assert registry.execute("work").ok
    assert journal.entries == ["second"]
    assert first.remove() is False  # it was replaced already: nothing to remove
    assert registry.execute("work").ok  # ... and removing it did not remove the second
    assert second.remove() is True
    assert registry.execute("work").code == ErrorCode.DENIED


def test_guard_string_denies_with_that_reason(registry: ToolRegistry) -> None:
    starts = counting_tool(registry)
    registry.add_guard(lambda call: None)
    registry.add_guard(lambda call: f"{call.name} is off limits")
    result = registry.execute("work")
    assert result.code == ErrorCode.DENIED
    assert result.content == "Error: work is off limits"
    assert starts == []


# == post-execute hooks and observers =========================================================


@pytest.mark.parametrize("denial", ["pre", "guard", "approver"])
def test_post_hook_cannot_turn_a_denial_into_success(registry: ToolRegistry, denial: str) -> None:
    counting_tool(registry)
    if denial == "pre":
        registry.add_pre_execute(lambda call, token: Deny("no"))
    elif denial == "guard":
        registry.add_guard(lambda call: "no")
    else:
        registry.add_pre_execute(lambda call, token: Ask("?"))
        registry.set_approver(lambda call, reason, token: False)
    seen: list[ErrorCode | None] = []

    def launder(result: ToolResult[Any], token: CancelToken) -> ToolResult[Any]:
        seen.append(result.code)
        return ToolResult.success(result.call, "allowed after all")

    registry.add_post_execute(launder)
    result = registry.execute("work")
    assert seen == [ErrorCode.DENIED]
    assert result.code == ErrorCode.HOOK_ERROR
    assert not result.dispatched


def test_post_hook_cannot_turn_a_tool_error_into_success(registry: ToolRegistry) -> None:
    registry.tool(name="fail")(lambda args, ctx: 1 / 0)
    registry.add_post_execute(lambda result, token: ToolResult.success(result.call, "fine"))
    assert registry.execute("fail").code == ErrorCode.HOOK_ERROR


def test_post_hook_may_turn_a_success_into_a_failure_and_none_keeps_it(
    registry: ToolRegistry,
) -> None:
    registry.register(Tool("echo", echo))
    seen: list[Any] = []
    registry.add_post_execute(lambda result, token: seen.append(result.value))
    registry.add_post_execute(
        lambda result, token: (
            ToolResult.failure(result.call, "TOOL_ERROR", "output rejected")
            if result.value.get("secret")
            else None
        )
    )
    registry.add_post_execute(lambda result, token: seen.append(result.code))
    assert registry.execute("echo", {"secret": False}).ok
    rejected = registry.execute("echo", {"secret": True})
    assert rejected.code == ErrorCode.TOOL_ERROR
    assert rejected.content == "Error: output rejected"
    assert seen == [{"secret": False}, None, {"secret": True}, ErrorCode.TOOL_ERROR]


def test_post_hook_may_replace_a_success_with_another_success(registry: ToolRegistry) -> None:
    registry.register(Tool("echo", echo))
    registry.add_post_execute(
        lambda result, token: ToolResult.success(result.call, {"redacted": True})
    )
    result = registry.execute("echo", {"password": "hunter2"})
    assert result.ok
    assert result.value == {"redacted": True}
    assert result.dispatched


def _success(registry: ToolRegistry) -> ToolResult[Any]:
    return registry.execute("work")


def _tool_error(registry: ToolRegistry) -> ToolResult[Any]:
    return registry.execute("fail")


def _denied(registry: ToolRegistry) -> ToolResult[Any]:
    registry.add_guard(lambda call: "no")
    return registry.execute("work")


def _aborted_in_pre_hook(registry: ToolRegistry) -> ToolResult[Any]:
    caller = CancelSource()

    def cancel_the_caller(call: ToolCall, token: CancelToken) -> None:
        caller.cancel()

    registry.add_pre_execute(cancel_the_caller)
    return registry.execute("work", token=caller.token)


def _invalid_args(registry: ToolRegistry) -> ToolResult[Any]:
    return registry.execute("work", {"x": {1}})


def _unknown(registry: ToolRegistry) -> ToolResult[Any]:
    return registry.execute("nope")


def _schema_violation(registry: ToolRegistry) -> ToolResult[Any]:
    return registry.execute("typed", {"n": "one"})


def _hook_error(registry: ToolRegistry) -> ToolResult[Any]:

    def broken(call: ToolCall) -> str | None:
        raise ZeroDivisionError("division by zero")

    registry.add_guard(broken)
    return registry.execute("work")


def _model_driven_abort(registry: ToolRegistry) -> ToolResult[Any]:
    caller = CancelSource()
    caller.cancel()
    return registry.execute("work", token=caller.token, start_if_cancelled=False)


@pytest.mark.parametrize(
    ("scenario", "code", "post_sees_it"),
    [
        (_success, None, True),
        (_tool_error, ErrorCode.TOOL_ERROR, True),
        (_denied, ErrorCode.DENIED, True),
        (_aborted_in_pre_hook, BEFORE, True),
        (_invalid_args, ErrorCode.INVALID_ARGS, False),
        (_unknown, ErrorCode.UNKNOWN_TOOL, False),
        (_schema_violation, ErrorCode.INVALID_ARGS, False),
        (_hook_error, ErrorCode.HOOK_ERROR, False),
        (_model_driven_abort, BEFORE, False),
    ],
)
def test_post_hooks_see_outcomes_denials_and_aborts_but_not_entry_or_registry_errors(
    registry: ToolRegistry,
    observed: Observed,
    scenario: Callable[[ToolRegistry], ToolResult[Any]],
    code: ErrorCode | None,
    post_sees_it: bool,
) -> None:
    counting_tool(registry)
    registry.tool(name="fail")(lambda args, ctx: 1 / 0)
    registry.register(
        Tool("typed", echo, parameters={"type": "object", "properties": {"n": {"type": "integer"}}})
    )
    post_saw: list[ErrorCode | None] = []
    registry.add_post_execute(lambda result, token: post_saw.append(result.code))
    result = scenario(registry)
    assert result.code == code
    assert post_saw == ([code] if post_sees_it else [])
    assert observed.results == [result]


def test_observers_see_the_returned_frozen_result_exactly_once(registry: ToolRegistry) -> None:
    counting_tool(registry)
    first, second = Observed(), Observed()
    registry.on_result(first)
    registry.on_result(second)
    results = [registry.execute("work"), registry.execute("nope"), registry.execute("work")]
    assert len(first.results) == len(second.results) == 3
    for returned, one, two in zip(results, first.results, second.results, strict=True):
        assert returned is one
        assert returned is two
        with pytest.raises(dataclasses.FrozenInstanceError):
            one.content = "changed"  # type: ignore[misc]


def test_observer_exceptions_are_logged_not_raised(
    registry: ToolRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    counting_tool(registry)
    after = Observed()

    def broken(result: ToolResult[Any]) -> None:
        raise RuntimeError("observer broke")

    registry.on_result(broken)
    registry.on_result(after)
    with caplog.at_level(logging.ERROR, logger="toolreg"):
        ok = registry.execute("work")
        unknown = registry.execute("nope")
    assert ok.ok
    assert unknown.code == ErrorCode.UNKNOWN_TOOL
    assert after.results == [ok, unknown]
    logged = [r for r in caplog.records if r.name == "toolreg" and r.exc_info]
    assert len(logged) == 2
    assert all("observer broke" in str(r.exc_info[1]) for r in logged)  # type: ignore[index]


def test_hooks_are_checked_callable_at_registration(registry: ToolRegistry) -> None:
    for add in (
        registry.add_pre_execute,
        registry.add_guard,
        registry.add_around,
        registry.add_post_execute,
        registry.on_result,
        registry.set_approver,
    ):
        with pytest.raises(TypeError, match="callable"):
            add("not callable")  # type: ignore[arg-type]
