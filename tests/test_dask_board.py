"""The claim board (`toolreg.distributed._board`), handler by handler, without a cluster.

On the scheduler every handler runs on the one event loop, so calling them one after the other
here is exactly the interleaving a scheduler produces (docs/contract.md A.11).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("distributed")

from toolreg.distributed._board import ClaimBoard

KEY = "toolreg-crunch-0001"


class FakeScheduler:
    """The parts of a scheduler the board touches: its handlers and `client_send`."""

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def client_send(self, client: str, message: dict[str, Any]) -> None:
        self.sent.append((client, message))


def board_with(*keys: str, client: str = "client-1") -> tuple[ClaimBoard, FakeScheduler]:
    board = ClaimBoard()
    scheduler = FakeScheduler()
    asyncio.run(board.start(scheduler))
    board.update_graph(scheduler, client=client, keys=set(keys), tasks=list(keys))
    return board, scheduler


def forget(board: ClaimBoard, key: str = KEY) -> None:
    board.transition(key, "released", "forgotten", stimulus_id="test")


def test_the_board_adds_its_handlers_to_the_scheduler() -> None:
    _, scheduler = board_with()
    assert {"toolreg_claim", "toolreg_cancel", "toolreg_watch", "toolreg_progress"} <= set(
        scheduler.handlers
    )


def test_only_toolreg_keys_get_records() -> None:
    board, _ = board_with(KEY, "add-123", ("tuple", 1))  # type: ignore[arg-type]
    assert board.describe() == {"records": 1, "watches": 0}


def test_a_pending_attempt_is_claimed_once_then_a_rerun_is_refused() -> None:
    board, _ = board_with(KEY)
    assert board.claim(KEY, "w1") == "started"
    assert board.claim(KEY, "w2") == "rerun"  # Dask runs it again after losing w1


def test_a_cancel_while_pending_refuses_for_good() -> None:
    board, _ = board_with(KEY)
    assert board.cancel(KEY, b"r", "client-1") == "refused"
    assert board.claim(KEY, "w1") == "refused"
    assert board.cancel(KEY, b"r", "client-1") == "refused"


def test_a_cancel_that_overtakes_the_task_refuses_it_when_it_comes() -> None:
    board, scheduler = board_with()
    assert board.cancel(KEY, b"r", "client-1") == "refused"
    board.update_graph(scheduler, client="client-1", keys={KEY}, tasks=[KEY])
    assert board.claim(KEY, "w1") == "refused"


def test_a_refusal_outlives_the_task() -> None:
    board, _ = board_with(KEY)
    board.cancel(KEY, b"r", "client-1")
    forget(board)
    assert board.describe()["records"] == 0
    assert board.claim(KEY, "w1") == "refused"  # a worker's late copy of the task
    assert board.describe()["records"] == 0


def test_a_cancel_of_a_started_body_leaves_one_notice_for_its_worker() -> None:
    board, _ = board_with(KEY)
    board.claim(KEY, "w1")
    assert board.cancel(KEY, b"reason", "client-1") == "started"
    assert board.cancel(KEY, b"again", "client-1") == "started"
    assert asyncio.run(board.watch("w1", 0.0)) == [[KEY, b"reason"]]
    assert board.describe() == {"records": 1, "watches": 0}


def test_a_long_poll_wakes_on_a_notice() -> None:
    board, _ = board_with(KEY)
    board.claim(KEY, "w1")

    async def scenario() -> list[list[Any]]:
        poll = asyncio.ensure_future(board.watch("w1", 30.0))
        await asyncio.sleep(0)  # one loop turn: the poll runs to its wait
        assert board.describe()["watches"] == 1  # it is waiting, with no notice yet
        board.cancel(KEY, b"stop", "client-1")
        return await asyncio.wait_for(poll, 10.0)

    assert asyncio.run(scenario()) == [[KEY, b"stop"]]
    assert board.describe()["watches"] == 0


def test_forgetting_a_record_drops_its_undelivered_notice() -> None:
    board, _ = board_with(KEY)
    board.claim(KEY, "w1")
    board.cancel(KEY, b"r", "client-1")
    assert board.describe() == {"records": 1, "watches": 1}
    forget(board)
    assert board.describe() == {"records": 0, "watches": 0}


def test_a_client_that_goes_takes_its_records_with_it() -> None:
    board, scheduler = board_with(KEY, client="client-1")
    board.update_graph(scheduler, client="client-2", keys={"toolreg-x-2"}, tasks=["toolreg-x-2"])
    board.cancel("toolreg-x-3", b"r", "client-1")  # one that overtook a task never sent
    board.remove_client(scheduler, "client-1")
    assert board.describe() == {"records": 1, "watches": 0}


def test_progress_goes_to_the_owning_client_while_the_record_lives() -> None:
    board, scheduler = board_with(KEY, client="client-7")
    board.progress(KEY, "topic-1", [1, 3, "one"])
    forget(board)
    board.progress(KEY, "topic-1", [2, 3, "two"])  # the call is gone: dropped
    assert scheduler.sent == [
        ("client-7", {"op": "event", "topic": "topic-1", "event": [KEY, 1, 3, "one"]})
    ]


def test_a_group_of_claims_or_cancels_decides_each_key_by_the_one_rule() -> None:
    keys = [f"toolreg-t-{n}" for n in range(4)]
    board, _ = board_with(*keys[:3])
    board.cancel(keys[1], b"r", "client-1")  # refused while pending
    board.claim(keys[2], "w0")  # started already: a rerun
    assert board.claim_all(keys, "w1") == ["started", "refused", "rerun", "refused"]
    assert board.cancel_all(keys, [b"a", b"b", b"c", b"d"], "client-1") == [
        "started",
        "refused",
        "started",
        "refused",
    ]
    assert asyncio.run(board.watch("w1", 0.0)) == [[keys[0], b"a"]]
    assert asyncio.run(board.watch("w0", 0.0)) == [[keys[2], b"c"]]
