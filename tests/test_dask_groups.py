"""Grouped messages of `toolreg.distributed`: submissions, cancels and claims, without a cluster.

One message of a kind is on its way at a time, and whatever arrives meanwhile goes together in
the next (`toolreg/distributed/_groups.py`, `_worker._WorkerSide.claim`). Each test holds the
first message at a handshake, lets the others queue behind it, and checks the messages sent and
that every member got its own answer. The board's side of a group is in `test_dask_board.py`.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

import pytest

pytest.importorskip("distributed")

from _registry_helpers import WAIT, wait_until

from toolreg.distributed._groups import Groups
from toolreg.distributed._worker import _WorkerSide


class Member:
    """An attempt as the groups see it (`_groups.Member`), recording what it is told."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.queued = False
        self.future: Any = None
        self.following = True
        self.posted: list[tuple[Any, ...]] = []
        self.answers: list[str | None] = []
        self.followed = False

    def post(self, message: tuple[Any, ...]) -> None:
        self.posted.append(message)

    def submitted(self, future: Any) -> None:
        self.future = future

    def interrupted(self, exc: BaseException, own: bool) -> None:
        self.posted.append(("interrupted", own))

    def follow(self) -> None:
        self.followed = True

    def follow_alone(self) -> None:
        raise AssertionError("not expected")

    def decide(self, message: tuple[Any, ...]) -> None:
        self.posted.append(message)

    def cancel_answered(self, phase: str | None) -> None:
        self.answers.append(phase)


class Loop:
    """`client.loop`: runs what it is given at once, on the calling thread."""

    def add_callback(self, fn: Any, *args: Any) -> None:
        fn(*args)


class MapClient:
    """A client whose `map` returns a future name per key; the first call waits to be released."""

    def __init__(self) -> None:
        self.loop = Loop()
        self.calls: list[list[str]] = []
        self.callers: list[str] = []  # the thread of each call
        self.first_entered = threading.Event()
        self.release_first = threading.Event()

    def map(self, fn: Any, *columns: Any, key: list[str], pure: bool, **options: Any) -> list[str]:
        assert pure is False and all(len(column) == len(key) for column in columns)
        self.calls.append(list(key))
        self.callers.append(threading.current_thread().name)
        if len(self.calls) == 1:
            self.first_entered.set()
            assert self.release_first.wait(WAIT)
        return [f"future-{name}" for name in key]


def _submitting(groups: Groups, members: list[Member]) -> list[threading.Thread]:
    """One thread per member, each submitting it (started)."""
    threads = [threading.Thread(target=groups.submit, args=(m, ("args",))) for m in members]
    for thread in threads:
        thread.start()
    return threads


def test_submissions_made_while_one_is_on_its_way_go_together_in_the_next() -> None:
    client = MapClient()
    groups = Groups(client, {})  # type: ignore[arg-type]
    members = [Member(f"toolreg-t-{n}") for n in range(4)]
    [first] = _submitting(groups, members[:1])
    assert client.first_entered.wait(WAIT)
    others = _submitting(groups, members[1:])  # they queue behind the first, and wait
    wait_until(lambda: all(member.queued for member in members[1:]), "the others to queue")
    assert all(member.future is None for member in members[1:])
    client.release_first.set()
    for thread in [first, *others]:
        thread.join(WAIT)
    assert client.calls == [["toolreg-t-0"], ["toolreg-t-1", "toolreg-t-2", "toolreg-t-3"]]
    assert [member.future for member in members] == [f"future-{m.key}" for m in members]
    assert all(member.followed and not member.posted for member in members)


def test_a_thread_submits_only_its_own_group() -> None:
    """The first thread does not go on submitting what queued behind it: one of those does."""
    client = MapClient()
    groups = Groups(client, {})  # type: ignore[arg-type]
    members = [Member(f"toolreg-t-{n}") for n in range(2)]
    first = threading.Thread(target=groups.submit, args=(members[0], ()), name="first")
    first.start()
    assert client.first_entered.wait(WAIT)
    second = threading.Thread(target=groups.submit, args=(members[1], ()), name="second")
    second.start()
    wait_until(lambda: members[1].queued, "the second to queue")
    client.release_first.set()
    first.join(WAIT)
    second.join(WAIT)
    assert client.calls == [["toolreg-t-0"], ["toolreg-t-1"]]
    assert client.callers == ["first", "second"]


def test_a_group_that_cannot_be_submitted_fails_each_member_and_the_next_goes_on() -> None:
    class Failing(MapClient):
        def map(self, fn: Any, *columns: Any, key: list[str], **options: Any) -> list[str]:
            calls = len(self.calls)
            names = super().map(fn, *columns, key=key, **options)
            if calls == 0:
                raise ValueError("cannot pickle")
            return names

    client = Failing()
    groups = Groups(client, {})  # type: ignore[arg-type]
    members = [Member(f"toolreg-t-{n}") for n in range(3)]
    [first] = _submitting(groups, members[:1])
    assert client.first_entered.wait(WAIT)
    others = _submitting(groups, members[1:])
    wait_until(lambda: all(member.queued for member in members[1:]), "the others to queue")
    client.release_first.set()
    for thread in [first, *others]:
        thread.join(WAIT)
    [(kind, failure)] = members[0].posted
    assert kind == "failed" and "could not submit the remote body to Dask" in str(failure)
    assert all(m.future == f"future-{m.key}" and not m.posted for m in members[1:])


def test_cancels_made_while_one_is_on_its_way_go_together_in_the_next() -> None:
    sent: list[tuple[list[str], list[bytes]]] = []

    async def scenario() -> None:
        first_sent = asyncio.Event()
        release = asyncio.Event()

        class Scheduler:
            async def toolreg_cancel(
                self, keys: list[str], reasons: list[bytes], client: str
            ) -> list[str]:
                sent.append((keys, reasons))
                if len(sent) == 1:
                    first_sent.set()
                    await release.wait()
                return ["refused" if key.endswith("0") else "started" for key in keys]

        class Client:
            scheduler = Scheduler()
            id = "client-1"

        groups = Groups(Client(), {})  # type: ignore[arg-type]
        members = [Member(f"toolreg-t-{n}") for n in range(3)]
        groups.cancel(members[0], b"r0")
        await asyncio.wait_for(first_sent.wait(), WAIT)
        groups.cancel(members[1], b"r1")
        groups.cancel(members[2], b"r2")
        release.set()
        while groups._cancelling is not None:
            await asyncio.sleep(0)
        assert [member.answers for member in members] == [["refused"], ["started"], ["started"]]

    asyncio.run(asyncio.wait_for(scenario(), WAIT))
    assert sent == [(["toolreg-t-0"], [b"r0"]), (["toolreg-t-1", "toolreg-t-2"], [b"r1", b"r2"])]


class WorkerLoop:
    """A worker's event loop on a thread of its own (`worker.loop.add_callback`)."""

    def __init__(self) -> None:
        self.asyncio_loop = asyncio.new_event_loop()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.thread = threading.Thread(target=self.asyncio_loop.run_forever, name="test-loop")
        self.thread.start()

    def add_callback(self, fn: Any) -> None:
        def start() -> None:
            task = asyncio.ensure_future(fn())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

        self.asyncio_loop.call_soon_threadsafe(start)

    def close(self) -> None:
        self.asyncio_loop.call_soon_threadsafe(self.asyncio_loop.stop)
        self.thread.join(WAIT)
        self.asyncio_loop.close()


def worker_side(loop: WorkerLoop, scheduler: object) -> _WorkerSide:
    """A worker's side of the claim board on `loop`, talking to a fake `scheduler`."""

    class Worker:
        address = "tcp://worker-1"

    worker = Worker()
    worker.scheduler = scheduler  # type: ignore[attr-defined]
    worker.loop = loop  # type: ignore[attr-defined]
    return _WorkerSide(worker)


def test_claims_made_while_one_is_on_its_way_go_together_in_the_next() -> None:
    loop = WorkerLoop()
    sent: list[list[str]] = []
    first_sent = threading.Event()
    release = threading.Event()

    class Scheduler:
        async def toolreg_claim(self, keys: list[str], worker: str) -> list[str]:
            sent.append(keys)
            if len(sent) == 1:
                first_sent.set()
                await asyncio.get_running_loop().run_in_executor(None, release.wait, WAIT)
            return ["started" if key.endswith(("0", "2")) else "refused" for key in keys]

    side = worker_side(loop, Scheduler())
    verdicts: dict[str, str] = {}

    def claim(key: str) -> None:
        verdicts[key] = side.claim(key)

    try:
        threads = [threading.Thread(target=claim, args=(f"toolreg-t-{n}",)) for n in range(4)]
        threads[0].start()
        assert first_sent.wait(WAIT)
        for thread in threads[1:]:
            thread.start()
        wait_until(lambda: len(side._claims) == 3, "the other claims to queue")
        release.set()
        for thread in threads:
            thread.join(WAIT)
    finally:
        release.set()
        loop.close()
    assert sent[0] == ["toolreg-t-0"] and sorted(sent[1]) == [
        "toolreg-t-1",
        "toolreg-t-2",
        "toolreg-t-3",
    ]
    assert verdicts == {
        "toolreg-t-0": "started",
        "toolreg-t-1": "refused",
        "toolreg-t-2": "started",
        "toolreg-t-3": "refused",
    }


def test_a_claim_message_that_fails_fails_each_claim_it_carried() -> None:
    loop = WorkerLoop()

    class Scheduler:
        async def toolreg_claim(self, keys: list[str], worker: str) -> list[str]:
            raise OSError("scheduler unreachable")

    side = worker_side(loop, Scheduler())
    try:
        with pytest.raises(OSError, match="unreachable"):
            side.claim("toolreg-t-0")
        waiter: Future[str] = Future()  # the next claim still gets a message of its own
        threading.Thread(target=lambda: _answer(side, waiter)).start()
        with pytest.raises(OSError):
            waiter.result(WAIT)
    finally:
        loop.close()


def _answer(side: _WorkerSide, waiter: Future[str]) -> None:
    try:
        waiter.set_result(side.claim("toolreg-t-1"))
    except OSError as exc:
        waiter.set_exception(exc)


class Interrupt(BaseException):
    """What an application's own signal handler might raise in the submitting thread."""


def test_an_interrupted_submission_tells_each_member_and_the_next_group_still_goes() -> None:
    class Interrupted(MapClient):
        def map(self, fn: Any, *columns: Any, key: list[str], **options: Any) -> list[str]:
            calls = len(self.calls)
            names = super().map(fn, *columns, key=key, **options)
            if calls == 0:
                raise Interrupt
            return names

    client = Interrupted()
    groups = Groups(client, {})  # type: ignore[arg-type]
    members = [Member(f"toolreg-t-{n}") for n in range(3)]
    raised: list[BaseException] = []

    def lead() -> None:
        try:
            groups.submit(members[0], ("args",))
        except Interrupt as exc:
            raised.append(exc)

    first = threading.Thread(target=lead)
    first.start()
    assert client.first_entered.wait(WAIT)
    [second] = _submitting(groups, members[1:2])
    wait_until(lambda: members[1].queued, "the second to queue")
    client.release_first.set()
    first.join(WAIT)
    second.join(WAIT)
    assert len(raised) == 1  # re-raised in the interrupted thread
    assert members[0].posted == [("interrupted", True)] and members[0].future is None
    assert members[1].future == "future-toolreg-t-1" and members[1].followed
    groups.submit(members[2], ("args",))  # nothing is left stuck: the next one goes at once
    assert members[2].future == "future-toolreg-t-2"


def test_a_claim_message_cut_short_by_the_loop_going_away_fails_its_claims() -> None:
    loop = WorkerLoop()

    class Scheduler:
        async def toolreg_claim(self, keys: list[str], worker: str) -> list[str]:
            raise asyncio.CancelledError  # what a worker's loop shutting down delivers

    side = worker_side(loop, Scheduler())
    try:
        with pytest.raises(RuntimeError, match="stopped while claiming"):
            side.claim("toolreg-t-0")
        assert not side._claiming and not side._claims  # a later claim sends again
    finally:
        loop.close()
