"""The process-wide helper threads: small jobs handed over from threads that must not block.

An event loop must never start a thread (`Thread.start()` waits until the new thread runs) nor
run token callbacks (user code); the worker pool must be able to start a thread for a caller on
an event loop. Both hand such jobs to `HELPER`, a `JobThreads` (`_jobs`): a job that blocks (a
slow cancel callback) never holds up the others, its threads are daemons that never keep the
interpreter alive, and a forked child starts afresh. `toolreg.aio` and the MCP bridge call
`HELPER.start()` when they are set up, so that no event loop waits for a thread to start
(`Thread.start()` waits until the thread runs). In a forked child the threads start again at
the first hand-off, which waits for them once if it comes from an event loop (contract A.5).
"""

from __future__ import annotations

from ._jobs import JobThreads

__all__ = ["HELPER"]

HELPER = JobThreads("toolreg-helper")
