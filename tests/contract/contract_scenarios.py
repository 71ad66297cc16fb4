"""The scenarios: every combination over small domains, in five families.

A family is the full product of its dimensions; the families together put every decision of
every stage next to every place a cancellation can land. Each base scenario is run without
cancellation, then once per place (`sites`) and per canceller that can act there, keeping only
the places the call reaches.

* `GATE_PAIRS`: two pre-execute hooks, every pair of decisions (and one hook, and none), with
  and without an approver that approves and a guard that passes; cancelled by the caller at
  entry or inside any of those stages.
* `APPROVAL`: one pre-execute hook (every decision) x every approver answer (and none) x every
  guard verdict (and none); cancelled by the caller at entry or inside any stage.
* `AROUND`: up to two wrappers of every kind, in every order, x every body outcome; cancelled at
  entry, inside each wrapper before and after proceed(), or inside the body, by the caller, by a
  scope wrapper's owner or by a deadline coming due (wherever one is open).
* `POST`: up to two post-execute hooks, every pair of actions, x three body outcomes, with and
  without a wrapper returning its own result, and after a denial, a broken pre-execute hook and
  a broken wrapper; cancelled by the caller at entry, in any stage, or inside either hook.
* `CROSS`: one of each stage (a pre hook that allows or asks, an approver, a guard, the main
  wrapper compositions, a post hook) x three body outcomes, cancelled at every place by every
  canceller, close() included.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator

from contract_model import (
    ALLOW,
    APPROVER_ANSWERS,
    ASK,
    BODY_OUTCOMES,
    CACHE,
    CALLER,
    CLOSE,
    COOPERATIVE,
    DEADLINE,
    DENY,
    ENTRY,
    FLAKY,
    GUARD_VERDICTS,
    KEEP,
    MALFORMED,
    PASS,
    POST_ACTIONS,
    PRE_DECISIONS,
    RAISE,
    RETRY,
    SCOPE,
    SCOPE_OWNER,
    TIMEOUT,
    USER_WRAPPERS,
    VALUE,
    WRAPPER_KINDS,
    YES,
    Scenario,
    Site,
    trace,
)


def sequences(domain: Iterable[str], longest: int) -> list[tuple[str, ...]]:
    """Every sequence over `domain` of length 0..`longest`."""
    items = tuple(domain)
    found: list[tuple[str, ...]] = []
    for length in range(longest + 1):
        found.extend(itertools.product(items, repeat=length))
    return found


def sites(scenario: Scenario) -> list[tuple[Site, tuple[str, ...]]]:
    """Every place a cancellation can land in `scenario`, with who can cancel there."""
    plain = (CALLER, CLOSE)
    found: list[tuple[Site, tuple[str, ...]]] = [(ENTRY, (CALLER,)), (("call",), plain)]
    found += [(("pre", i), plain) for i in range(len(scenario.pre))]
    if scenario.approver is not None:
        found.append((("approver",), plain))
    found += [(("guard", i), plain) for i in range(len(scenario.guards))]
    scopes = deadlines = 0
    open_at: list[tuple[int, int]] = []  # (scopes, deadlines) open inside wrapper i

    def who(scopes: int, deadlines: int) -> tuple[str, ...]:
        return plain + ((SCOPE_OWNER,) if scopes else ()) + ((DEADLINE,) if deadlines else ())

    for i, kind in enumerate(scenario.wrappers):
        scopes += kind == SCOPE
        deadlines += kind == TIMEOUT
        open_at.append((scopes, deadlines))
        if kind in USER_WRAPPERS:
            found.append((("before", i), who(scopes, deadlines)))
    found.append((("body",), who(scopes, deadlines)))
    for i in reversed(range(len(scenario.wrappers))):
        if scenario.wrappers[i] in (PASS, SCOPE, MALFORMED):  # the ones that call proceed()
            found.append((("after", i), who(*open_at[i])))
    found += [(("post", i), plain) for i in range(len(scenario.post))]
    return found


def with_cancellations(
    bases: Iterable[Scenario], cancellers: tuple[str, ...] = (CALLER, SCOPE_OWNER, DEADLINE)
) -> Iterator[Scenario]:
    """Each base without cancellation, then cancelled at each place it reaches, by each of
    `cancellers` that can act there."""
    for base in bases:
        yield base
        reached = trace(base, "execute").reached
        for site, able in sites(base):
            if site != ENTRY and site not in reached:
                continue
            for by in able:
                if by in cancellers:
                    yield Scenario(**{**base.__dict__, "site": site, "by": by})


def gate_pairs() -> Iterator[Scenario]:
    for pre, approver, guards in itertools.product(
        sequences(PRE_DECISIONS, 2), (None, YES), ((), (PASS,))
    ):
        yield Scenario(pre=pre, approver=approver, guards=guards)


def approval() -> Iterator[Scenario]:
    for pre, approver, guards in itertools.product(
        sequences(PRE_DECISIONS, 1)[1:],
        (None, *APPROVER_ANSWERS),
        sequences(GUARD_VERDICTS, 1),
    ):
        yield Scenario(pre=pre, approver=approver, guards=guards)


def around() -> Iterator[Scenario]:
    for wrappers, body in itertools.product(sequences(WRAPPER_KINDS, 2), BODY_OUTCOMES):
        yield Scenario(wrappers=wrappers, body=body)


def post() -> Iterator[Scenario]:
    for posts in sequences(POST_ACTIONS, 2):
        for body, wrappers in itertools.product((VALUE, RAISE, COOPERATIVE), ((), (CACHE,))):
            yield Scenario(post=posts, body=body, wrappers=wrappers)
        # What else reaches the post hooks, or skips them: a denial, and the registry's own
        # HOOK_ERROR for a broken pre-execute hook or wrapper.
        yield Scenario(pre=(DENY,), post=posts)
        yield Scenario(pre=(MALFORMED,), post=posts)
        yield Scenario(wrappers=(RAISE,), post=posts)


CROSS_WRAPPERS: tuple[tuple[str, ...], ...] = (
    (PASS,),
    (SCOPE,),
    (TIMEOUT,),
    (RETRY,),
    (SCOPE, TIMEOUT),
    (RETRY, TIMEOUT),
    (TIMEOUT, RETRY),
)


def cross() -> Iterator[Scenario]:
    for pre, wrappers, body in itertools.product(
        ((ALLOW,), (ASK,)), CROSS_WRAPPERS, (VALUE, COOPERATIVE, FLAKY)
    ):
        yield Scenario(
            pre=pre, approver=YES, guards=(PASS,), wrappers=wrappers, body=body, post=(KEEP,)
        )


FAMILIES: dict[str, Callable[[], Iterator[Scenario]]] = {
    "gate_pairs": lambda: with_cancellations(gate_pairs(), (CALLER,)),
    "approval": lambda: with_cancellations(approval(), (CALLER,)),
    "around": lambda: with_cancellations(around()),
    "post": lambda: with_cancellations(post(), (CALLER,)),
    "cross": lambda: with_cancellations(cross(), (CALLER, SCOPE_OWNER, DEADLINE, CLOSE)),
}


def enumeration() -> list[Scenario]:
    """Every scenario of every family, once each, in a stable order."""
    seen: dict[Scenario, None] = {}
    for family in FAMILIES.values():
        for scenario in family():
            seen.setdefault(scenario)
    return list(seen)


def sample(scenarios: list[Scenario], size: int, seed: str) -> list[Scenario]:
    """A deterministic sample: the same `seed` picks the same scenarios on every run."""
    if size >= len(scenarios):
        return list(scenarios)
    return random.Random(seed).sample(scenarios, size)
