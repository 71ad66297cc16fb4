"""`Claim`: the one step that decides which of several parties starts a piece of work.

A body handed to a worker, a batch runner queued in the pool, an awaited call waiting for a
worker: each may be started by the thread that picks it up, or given up by a canceller (the
call's cancellation, an interrupted joiner, a pool that drops it). Exactly one of them wins, by
a single `list.pop()` on a one-item list: the worker then runs it, or the canceller settles it as
never started and wakes whoever waits. There is no third outcome and no window between the
check and the act, which is what "no body starts after its caller cancelled" rests on (the
worker still checks the token after winning; a cancellation after that check reaches the body
through its token).
"""

from __future__ import annotations

__all__ = ["Claim", "claim"]


class Claim:
    """A base for work that is started by exactly one party: whoever claims it first."""

    __slots__ = ("_claim",)

    def __init__(self) -> None:
        # One token to take: `list.pop()` is a single step (under the GIL, and under the list's
        # own lock in a free-threaded build), and cheaper than a lock's `acquire(False)`, whose
        # arguments are parsed by keyword on every call; work is made and claimed per call.
        self._claim = [True]


def claim(work: Claim) -> bool:
    """True for the first party to claim `work` (it owns the start); False after."""
    try:
        work._claim.pop()
    except IndexError:
        return False
    return True
