"""The claim board: a Dask scheduler plugin that decides, once, whether a remote body starts.

Every remote attempt is a Dask task whose key starts with `KEY_PREFIX`. The board keeps one
record per such key, and every operation on it runs on the scheduler's event loop, one at a
time, so each is atomic:

* `update_graph` (the task arrives from the client): a `PENDING` record, owned by that client.
  This runs before the scheduler can hand the task to any worker.
* `toolreg_claim(keys, worker)` (the worker, right before each body): `PENDING` becomes
  `STARTED` and the body may start. A record that is `REFUSED`, or missing, refuses: the body
  never starts. A record already `STARTED` answers `rerun`: Dask is running the task again
  after losing the worker that started it, and the body must not start a second time.
* `toolreg_cancel(keys, reasons, client)` (the callers' tokens were cancelled): `PENDING`
  becomes `REFUSED` for good; a `STARTED` body gets a notice for its worker's watcher, carrying
  the reason. A cancel that overtook the task itself (the client's graph message is batched,
  the cancel is not) leaves a `REFUSED` record that the task then finds.

Claims and cancels travel in groups: a worker's claims made while its previous claim message
was on its way go together in the next one, and so do a client's cancels (`_worker`,
`_attempt`). Each key of a group is decided on its own by the same rule (`claim`, `cancel`),
all in one turn of the loop, so a group is atomic too and a key's verdict never depends on
the others in its group.
* `toolreg_watch(worker, timeout)`: a worker's one long poll for notices (see `_worker`).
* `toolreg_progress(key, topic, update)`: relays a body's progress to the client that owns it.

A record is deleted when its task is forgotten by the scheduler (the client released its
future after the join), or with its client. That is also how a refusal outlives the Dask task:
`client.cancel` does not stop a task a worker already holds, and such a task may start later,
but its claim then finds no record, which refuses. Nothing else stays behind: a worker's watch
entry lives only while it is polled or holds notices for records that still exist.

The plugin is pickled by reference: toolreg must be importable on the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["BOARD_NAME", "KEY_PREFIX", "ClaimBoard"]

BOARD_NAME = "toolreg-claim-board-2"  # the plugin's name on the scheduler (versioned)
KEY_PREFIX = "toolreg-"  # the Dask key of every remote attempt starts with this

PENDING, STARTED, REFUSED = "pending", "started", "refused"


class _Record:
    """One remote attempt as the board sees it."""

    __slots__ = ("cancelled", "client", "phase", "worker")

    def __init__(self, client: str | None, phase: str) -> None:
        self.client = client  # the submitting client's id (where progress goes)
        self.phase = phase
        self.worker: str | None = None  # the worker that claimed it
        self.cancelled = False  # a notice was sent to that worker


class _Watch:
    """A worker's mailbox of cancellation notices, and its long poll's wake-up."""

    __slots__ = ("event", "notices", "polls")

    def __init__(self) -> None:
        self.notices: dict[str, bytes | None] = {}  # key -> pickled reason
        self.event = asyncio.Event()
        self.polls = 0  # long polls waiting right now


class ClaimBoard(SchedulerPlugin):
    """The scheduler side of `toolreg.distributed`; see the module docstring."""

    idempotent = True  # several backends (and clients) share one board

    def __init__(self) -> None:
        self._records: dict[str, _Record] = {}
        self._watches: dict[str, _Watch] = {}
        self._scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self._scheduler = scheduler
        scheduler.handlers.update(
            {
                "toolreg_claim": self.claim_all,
                "toolreg_cancel": self.cancel_all,
                "toolreg_watch": self.watch,
                "toolreg_progress": self.progress,
                "toolreg_board": self.describe,
            }
        )

    # -- the task's life on the scheduler -----------------------------------------------------

    def update_graph(
        self, scheduler: Any, *, client: str, tasks: Iterable[Any], **kwargs: Any
    ) -> None:
        records = self._records
        for key in tasks:
            if isinstance(key, str) and key.startswith(KEY_PREFIX):
                record = records.get(key)
                if record is None:
                    records[key] = _Record(client, PENDING)
                elif record.client is None:
                    record.client = client

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish == "forgotten" and self._records:
            record = self._records.pop(key, None)
            if record is not None and record.cancelled and record.worker is not None:
                self._drop_notice(record.worker, key)

    def remove_client(self, scheduler: Any, client: str) -> None:
        gone = [key for key, record in self._records.items() if record.client == client]
        for key in gone:
            record = self._records.pop(key)
            if record.cancelled and record.worker is not None:
                self._drop_notice(record.worker, key)

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        watch = self._watches.get(worker)
        if watch is not None:
            watch.notices.clear()
            watch.event.set()  # a poll still waiting returns (its connection is gone anyway)
            if not watch.polls:
                del self._watches[worker]

    # -- handlers (RPCs) ----------------------------------------------------------------------

    def claim_all(self, keys: list[str], worker: str) -> list[str]:
        """The verdict of `claim` for each key, in order (one message from a worker)."""
        return [self.claim(key, worker) for key in keys]

    def cancel_all(
        self, keys: list[str], reasons: list[bytes | None], client: str | None = None
    ) -> list[str]:
        """The phase `cancel` returns for each key, in order (one message from a client)."""
        return [self.cancel(key, reason, client) for key, reason in zip(keys, reasons, strict=True)]

    def claim(self, key: str, worker: str) -> str:
        """`started` (the body may start), `refused`, or `rerun` (it started once already)."""
        record = self._records.get(key)
        if record is None or record.phase == REFUSED:
            return REFUSED
        if record.phase == STARTED:
            return "rerun"
        record.phase = STARTED
        record.worker = worker
        return STARTED

    def cancel(self, key: str, reason: bytes | None, client: str | None = None) -> str:
        """Refuse a body that has not started; notify a started one. Returns the phase."""
        record = self._records.get(key)
        if record is None:  # the cancel overtook the task: refuse it when it comes
            self._records[key] = _Record(client, REFUSED)
            return REFUSED
        if record.phase == PENDING:
            record.phase = REFUSED
        elif record.phase == STARTED and not record.cancelled and record.worker is not None:
            record.cancelled = True
            watch = self._watches.get(record.worker)
            if watch is None:
                watch = self._watches[record.worker] = _Watch()
            watch.notices[key] = reason
            watch.event.set()
        return record.phase

    async def watch(self, worker: str, timeout: float) -> list[list[Any]]:
        """The notices for `worker`'s bodies: at once if any, else when one comes or at timeout."""
        watch = self._watches.get(worker)
        if watch is None:
            watch = self._watches[worker] = _Watch()
        if not watch.notices:
            watch.polls += 1
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(watch.event.wait(), timeout)
            finally:
                watch.polls -= 1
        notices = [[key, reason] for key, reason in watch.notices.items()]
        watch.notices.clear()
        watch.event.clear()
        if not watch.polls and self._watches.get(worker) is watch:
            del self._watches[worker]
        return notices

    def progress(self, key: str, topic: str, update: list[Any]) -> None:
        """Hand a body's progress to the client that owns the call (dropped once it is gone)."""
        record = self._records.get(key)
        scheduler = self._scheduler
        if record is None or record.client is None or scheduler is None:
            return
        scheduler.client_send(
            record.client, {"op": "event", "topic": topic, "event": [key, *update]}
        )

    def describe(self) -> dict[str, int]:
        """How much the board holds (records, watch entries): 0 and 0 when nothing runs."""
        return {"records": len(self._records), "watches": len(self._watches)}

    def _drop_notice(self, worker: str, key: str) -> None:
        watch = self._watches.get(worker)
        if watch is None:
            return
        watch.notices.pop(key, None)
        if not watch.notices and not watch.polls:
            del self._watches[worker]
