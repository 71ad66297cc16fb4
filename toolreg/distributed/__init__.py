"""Run tool bodies on a Dask cluster under toolreg's contract (extra `toolreg[dask]`).

    backend = DaskBackend(client)                  # a distributed.Client it does not own

    @registry.tool(description="Crunch numbers", timeout=60)
    @backend.remote                                # this body runs on a Dask worker
    def crunch(args, ctx): ...

The whole pipeline (hooks, approval, guards, wrappers, policies, post hooks, observers) stays on
the caller: only the body runs on a worker, and `registry.execute` joins it as it joins a local
body. Dask's own `Future.cancel()` does not stop a running task (the body keeps running while
the slot counts as free), and Dask reruns a task whose worker died; so toolreg does not borrow
either. A scheduler plugin, the claim board, decides once per attempt, atomically on the
scheduler's event loop, whether the body starts; the worker gives the body a token of its own
that the caller's cancellation reaches, with its reason.

What holds (docs/contract.md, section 14):

* A call cancelled before its body started never starts on any worker, and `execute` returns
  at once with `ABORTED_BEFORE_DISPATCH`, even while every worker thread is busy. The refusal
  outlives the Dask task: a task that a worker already held starts later and is refused.
* A started body sees the cancellation through `ctx.token` (`timeout_of(ctx.token)` tells a
  `TimeoutPolicy` deadline) and is joined: `execute` returns after the remote body returned
  or raised. A success overtaken by cancellation is `ABORTED`; a deadline is `TOOL_TIMEOUT`.
* Each attempt of a retried call is a Dask task with a key of its own. After calls settle
  (their futures released), nothing of theirs stays on the scheduler: no task, no record.
* Values, exceptions and deferred contexts are pickled by the worker itself: one that cannot
  be pickled is `TOOL_ERROR` (`RemoteToolError`) naming its type, in thread and process
  clusters alike. A remote exception carries its traceback as a `RemoteTraceback` cause.
* Progress (`ctx.report_progress`) reaches the caller's `progress=` callback on the thread
  that joins the call, coalesced to the latest update while one is on its way.

When a worker or the scheduler dies:

* A worker lost mid-body: the call is `TOOL_ERROR` with "remote worker lost"
  (`RemoteWorkerLost`), reported once; Dask's rerun of the task is refused by the board, so
  the body starts at most once. A worker lost after its claim but before the body ran reads
  the same (the board cannot tell them apart). A task lost before its claim runs elsewhere.
* Quiescence rests on the scheduler seeing the worker as dead only when it is: a worker cut
  off from the scheduler but still running (a network partition) may finish its body after
  the caller was told the worker was lost.
* The scheduler lost: the board and every future go with it. Calls in flight end as
  `TOOL_ERROR` (their bodies' fate is unknown, and they can no longer be cancelled); the board
  of a restarted scheduler knows no call, so a task that still reaches a worker is refused.
* The client closed during a call: the call ends as `TOOL_ERROR`; its body's fate is unknown.

Requirements and limits: toolreg must be installed on the scheduler and the workers (the
plugin and the worker function are pickled by reference), the body must pickle (importable on
the workers, or by value with cloudpickle), `async def` bodies are refused, and `ctx.execute`
raises `RuntimeError` in a remote body. Importing `toolreg` never imports this module or Dask.
"""

from .._public import report_public
from ._client import DaskBackend as DaskBackend
from ._outcome import RemoteToolError as RemoteToolError
from ._outcome import RemoteTraceback as RemoteTraceback
from ._outcome import RemoteWorkerLost as RemoteWorkerLost
from ._worker import RemoteContext as RemoteContext

__all__ = [
    "DaskBackend",
    "RemoteContext",
    "RemoteToolError",
    "RemoteTraceback",
    "RemoteWorkerLost",
]

for _name in __all__:
    report_public(globals()[_name], __name__)
del _name
