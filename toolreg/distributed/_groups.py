"""The messages of one backend's attempts, sent in groups (`Groups`).

Every remote attempt costs the scheduler a few messages: its task (an update-graph message),
the fetch of its outcome (a gather, which the scheduler forwards to the worker), and, when its
caller cancels, a cancel for the claim board. Sent one per attempt, they made a batch of calls
cost the scheduler several times what one `client.map` of the same calls costs, and the
scheduler's one event loop is what a busy cluster waits on. So each kind travels in groups, by
one rule: one message of a kind on its way at a time, and whatever arrived meanwhile goes
together in the next. A lone attempt's message leaves at once, so nothing waits for a group to
fill; under load, groups form by themselves.

* Submissions (`submit`, on the stage threads): the thread that finds no submission on its
  way submits its attempt at once, with one `client.map` (one update-graph message); the
  threads that come meanwhile form the next group and wait, and the first of them to wake
  submits it. Each thread submits at most one group, its own attempt's, so no caller is kept
  submitting other callers' work.
* Outcomes (`finished`, on the client's event loop): an attempt whose task finished waits for
  the next gather, which fetches the outcomes of every attempt waiting in one message.
* Cancels (`cancel`, on the client's event loop): one `toolreg_cancel` carries every cancel
  waiting; the board decides each key on its own (`_board`).

Each attempt still has its own Dask task and key, and its own record on the board: grouping
changes how many messages carry them, never what is decided for one of them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from distributed import Client

from ._outcome import RemoteToolError
from ._worker import run_remote

__all__ = ["Groups", "Member"]

logger = logging.getLogger("toolreg")

Arguments = tuple[Any, ...]  # run_remote's arguments: body, call, key, topic, reason


class Member(Protocol):
    """What the groups need from an attempt (`_attempt.Attempt`)."""

    key: str  # its Dask key
    queued: bool  # set by `Groups.submit`: the groups own its submission from then on

    @property
    def future(self) -> Any: ...  # its distributed.Future (None before submission, or released)

    @property
    def following(self) -> bool: ...  # its end is still to be decided

    def post(self, message: tuple[Any, ...]) -> None: ...  # any thread: to its joiner

    def submitted(self, future: Any) -> None: ...  # the stage thread that submitted it

    def interrupted(self, exc: BaseException, own: bool) -> None: ...  # likewise

    # On the client's event loop:
    def follow(self) -> None: ...

    def follow_alone(self) -> None: ...

    def decide(self, message: tuple[Any, ...]) -> None: ...

    def cancel_answered(self, phase: str | None) -> None: ...


class _Group:
    """Attempts submitted together (one `client.map`)."""

    __slots__ = ("done", "members", "taken")

    def __init__(self) -> None:
        self.members: list[tuple[Member, Arguments]] = []
        self.taken = False  # a thread is submitting it: no attempt joins or leaves it now
        self.done = False  # submitted, or each member told why not


class Groups:
    """One backend's submissions, outcome fetches and cancels, each sent in groups."""

    def __init__(self, client: Client, options: Mapping[str, Any]) -> None:
        self._client: Any = client  # distributed is only partly typed
        self._options = dict(options)
        # Guards _next, _submitting and every group's fields; notified when a group is done.
        self._changed = threading.Condition(threading.Lock())
        self._next = _Group()  # the group that attempts join now
        self._submitting = False  # a stage thread is submitting a group
        # Touched on the client's event loop only:
        self._finished: list[Member] = []  # outcomes waiting for the next gather
        self._gathering: asyncio.Future[None] | None = None
        self._cancels: list[tuple[Member, bytes]] = []  # cancels waiting for the next message
        self._cancelling: asyncio.Future[None] | None = None

    # -- submissions (stage threads) ---------------------------------------------------------

    def submit(self, attempt: Member, arguments: Arguments) -> None:
        """Hand `attempt` to Dask, in a group: returns once its group was submitted (or told
        why not). The thread that finds no submission on its way submits its group at once;
        one that comes while a submission is on its way joins the next group and waits, and
        the first of those to wake submits that group. So a thread submits at most one group,
        the one with its own attempt in it. From the moment it is queued (`attempt.queued`)
        the groups own the attempt: it is submitted and followed, or told why not.

        An exception raised in this thread while it waits, before its group was taken, takes
        its attempt out again (`queued` false: nothing reached Dask); raised while it submits
        (an application's signal handler), it is re-raised once the group was dealt with.
        """
        with self._changed:
            group = self._next
            group.members.append((attempt, arguments))
            attempt.queued = True
            try:
                while self._submitting and not group.done:
                    self._changed.wait()
            except BaseException:
                if not group.taken:
                    group.members.remove((attempt, arguments))
                    attempt.queued = False
                raise
            if group.done:
                return
            group.taken = True
            self._next = _Group()
            self._submitting = True
        members = [member for member, _ in group.members]
        try:
            self._submit_group(group.members)
        except BaseException as exc:  # an interrupt (an application's signal handler)
            self._interrupted(members, exc, attempt)
            raise
        finally:
            with self._changed:
                group.done = True
                self._submitting = False
                self._changed.notify_all()

    def _submit_group(self, group: list[tuple[Member, Arguments]]) -> None:
        columns = list(zip(*(arguments for _, arguments in group), strict=True))
        keys = [member.key for member, _ in group]
        try:
            futures = self._client.map(run_remote, *columns, key=keys, pure=False, **self._options)
        except Exception as exc:
            failure = RemoteToolError(f"could not submit the remote body to Dask: {exc!r}")
            failure.__cause__ = exc
            for member, _ in group:
                member.post(("failed", failure))
            return
        attempts = [member for member, _ in group]
        for member, future in zip(attempts, futures, strict=True):
            member.submitted(future)
        self._client.loop.add_callback(_follow_all, attempts)

    def _interrupted(self, group: list[Member], exc: BaseException, own: Member) -> None:
        """Submitting `group` was cut short by `exc`: an attempt whose future came back is
        followed as usual (following twice is harmless); for the others, whether their task
        reached Dask is unknown (`Member.interrupted`)."""
        followed = [member for member in group if member.future is not None]
        if followed:
            self._client.loop.add_callback(_follow_all, followed)
        for member in group:
            if member.future is None:
                member.interrupted(exc, own=member is own)

    # -- outcomes (the client's event loop) --------------------------------------------------

    def finished(self, attempt: Member) -> None:
        """`attempt`'s task finished: fetch its outcome with the next gather."""
        self._finished.append(attempt)
        if self._gathering is None:
            # Kept: the loop holds tasks only weakly.
            self._gathering = asyncio.ensure_future(self._gather_finished())

    async def _gather_finished(self) -> None:
        try:
            while self._finished:
                group = [member for member in self._finished if member.following]
                self._finished = []
                if not group:
                    continue
                try:
                    outcomes = await self._client.gather(
                        [member.future for member in group], asynchronous=True
                    )
                except Exception:  # one of them could not be fetched: each on its own
                    for member in group:
                        member.follow_alone()
                    continue
                for member, outcome in zip(group, outcomes, strict=True):
                    member.decide(("outcome", outcome))
        finally:
            self._gathering = None

    # -- cancels (the client's event loop) ---------------------------------------------------

    def cancel(self, attempt: Member, reason: bytes) -> None:
        """Tell the board that `attempt` was cancelled, with the next cancel message."""
        self._cancels.append((attempt, reason))
        if self._cancelling is None:
            # Kept: the loop holds tasks only weakly.
            self._cancelling = asyncio.ensure_future(self._send_cancels())

    async def _send_cancels(self) -> None:
        client = self._client
        try:
            while self._cancels:
                group, self._cancels = self._cancels, []
                phases: list[str | None]
                try:
                    phases = await client.scheduler.toolreg_cancel(
                        keys=[member.key for member, _ in group],
                        reasons=[reason for _, reason in group],
                        client=client.id,
                    )
                except Exception:  # unreachable: each join learns the rest from Dask
                    logger.warning("toolreg: could not cancel %d remote calls", len(group))
                    logger.debug("toolreg: the cancel failed", exc_info=True)
                    phases = [None] * len(group)
                for (member, _), phase in zip(group, phases, strict=True):
                    member.cancel_answered(phase)
        finally:
            self._cancelling = None


def _follow_all(attempts: list[Member]) -> None:
    """On the client's event loop: follow each attempt of a submitted group."""
    for attempt in attempts:
        attempt.follow()
