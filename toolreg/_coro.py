"""`async def` tool bodies: run on one event loop thread the registry owns.

The thread that dispatched the body (a pool worker, dedicated to it) blocks until the coroutine
has finished: the registry joins async bodies like any other. Cancelling the body's token cancels
its task; a `CancelledError` that ends the task because of that is reported as `Cancelled`, so the
registry classifies it as `ABORTED`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ._cancel import Cancelled, CancelToken

if TYPE_CHECKING:
    import asyncio

# asyncio is imported where it is first needed (an `async def` body): `import toolreg` does not
# pay for it.


class CoroutineRunner:
    """A lazily started event loop on one daemon thread, closed by `close()`."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()  # guards _loop, _thread, _closed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.loop_ident: int | None = None  # the loop thread's ident once it runs (a plain read)
        self._closed = False

    def run(self, make: Callable[[], Coroutine[Any, Any, Any]], token: CancelToken) -> Any:
        """Run `make()` on the loop thread; block until it finished; return its value."""
        import asyncio

        loop = self._ensure_loop()
        if threading.current_thread() is self._thread:
            # A nested async body from an async body: the loop is busy running our caller.
            return _run_in_fresh_loop(make, token)
        settled = threading.Event()
        outcome: list[Any] = []

        async def body() -> None:
            task = asyncio.current_task()
            assert task is not None
            # A pre-aborted body runs under a cancelled token to clean up: it is not cancelled.
            cancel = None if token.cancelled else token.on_cancel(lambda: _cancel_soon(loop, task))
            try:
                outcome.append((True, await make()))
            except asyncio.CancelledError:
                outcome.append((False, Cancelled(token.reason)))
            except BaseException as exc:
                outcome.append((False, exc))
            finally:
                if cancel is not None:
                    cancel.remove()
                settled.set()

        asyncio.run_coroutine_threadsafe(body(), loop)
        settled.wait()
        ok, value = outcome[0]
        if ok:
            return value
        raise value

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        import asyncio

        with self._lock:
            if self._closed:
                raise RuntimeError("the registry's event loop for async tool bodies is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=_serve, args=(loop,), name=f"{self._name}-async", daemon=True
                )
                self._loop, self._thread = loop, thread
                thread.start()
                self.loop_ident = thread.ident
            return self._loop

    def after_fork(self) -> CoroutineRunner:
        """In a forked child: a new runner (the loop's thread did not survive the fork)."""
        return CoroutineRunner(self._name)

    def close(self) -> None:
        """Stop the loop and join its thread (after every async body has settled). Idempotent."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            self.loop_ident = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    import asyncio

    asyncio.set_event_loop(loop)
    loop.run_forever()


def _cancel_soon(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    with contextlib.suppress(RuntimeError):  # a closing loop tears its tasks down anyway
        loop.call_soon_threadsafe(task.cancel)


def _run_in_fresh_loop(make: Callable[[], Coroutine[Any, Any, Any]], token: CancelToken) -> Any:
    """On the registry's loop thread, busy running our caller: a loop of our own, for one body.

    This thread blocks until the body has settled, as any joiner does. The caller's context
    variables go along (a tracing span, a request id): the task is made in a copy of this
    thread's current context, as it would be on the registry's own loop.
    """
    runner = CoroutineRunner("toolreg-nested")
    try:
        return runner.run(make, token)
    finally:
        runner.close()
