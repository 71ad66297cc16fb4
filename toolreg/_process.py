"""The supervision of one child process for `toolreg.process.run` (see its docstring).

`_Supervision` pumps the child's pipes, notices its exit without reaping it, stops and sweeps
its process group, and reaps it last; `_interrupts_held` keeps a Ctrl-C from landing between
`fork()` and the moment the child is tracked.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import IO

from ._cancel import CancelToken
from ._interrupts import MAX_WAIT

_logger = logging.getLogger("toolreg")

_READ_SIZE = 65536
_READS_PAST_DEADLINE = 64  # rounds of reads at a deadline: several full pipes' worth
# After SIGKILL every group member dies within milliseconds; a pipe still open after this long
# is held by a process outside the group, and waiting for it could take forever.
_DRAIN_AFTER_KILL = 0.5
# poll(2) needs no file descriptor of its own, unlike epoll: one fewer fd to leak or exhaust.
_Selector: type[selectors.BaseSelector] = (
    selectors.PollSelector if hasattr(selectors, "PollSelector") else selectors.SelectSelector
)


class _Capture:
    """The bytes read from one output pipe, kept up to a limit; the rest is dropped."""

    def __init__(self, limit: int | None) -> None:
        self._chunks: list[bytes] = []
        self._room = limit  # bytes we may still keep; None: no limit
        self.truncated = False

    def keep(self, data: bytes) -> None:
        if self._room is not None:
            if len(data) > self._room:
                self.truncated = True
                data = data[: self._room]
            self._room -= len(data)
        if data:
            self._chunks.append(data)

    def value(self) -> bytes:
        return b"".join(self._chunks)


class _Supervision:
    """One child after its start: pump its pipes, stop it, sweep its group, reap it.

    Driven by the calling thread. At most two other threads touch it: the watcher thread of the
    no-pidfd fallback (sets `_exited`) and whichever thread cancels the token (sets
    `_cancelled_at`). Each sets its flag, then writes the wake-up pipe; the driver reads flags
    only between selects, so a flag set after a read still ends the next select at once. The
    flags need no lock.
    """

    def __init__(
        self, until: float | None, grace: float, stdin_data: bytes | None, limit: int | None
    ) -> None:
        self._child: subprocess.Popen[bytes] | None = None
        self.cancelled = False
        self.timed_out = False
        self.stdout = _Capture(limit)
        self.stderr = _Capture(limit)
        self._until = until
        self._grace = grace
        self._stdin_data = memoryview(stdin_data or b"")
        self._written = 0
        self._readers: set[IO[bytes]] = set()  # output pipes not at EOF yet
        self._exited = False
        self._lost = False  # someone else reaped the leader: its pgid may name another group
        self._cancelled_at: float | None = None
        self._selector = _Selector()
        self._pidfd = -1  # readable once the leader exited (Linux); else a watcher thread
        self._watcher: threading.Thread | None = None
        self._wake_r = -1
        # Guards _wake_w: the watcher and canceller never write it after it was closed, when
        # its number may already belong to an unrelated file.
        self._wake_lock = threading.Lock()
        self._wake_w: int | None = None

    @property
    def child(self) -> subprocess.Popen[bytes]:
        assert self._child is not None, "start() first"
        return self._child

    def start(self, spawn: Callable[[], subprocess.Popen[bytes]]) -> None:
        """Start the child; from the moment it exists, `abort` can kill and reap it."""
        with _interrupts_held():
            self._child = spawn()

    def supervise(self, token: CancelToken) -> None:
        """Run the child to its end and reap it; sets `cancelled` / `timed_out`."""
        self._open_wake_pipe()
        self._watch_pipes()
        self._watch_exit()
        with token.on_cancel(self._note_cancel):
            self._wait_for_exit_or_stop()
        self._close_stdin()
        self._signal_group(signal.SIGTERM)
        self._pump(self._finished, time.monotonic() + self._grace)
        self._signal_group(signal.SIGKILL)
        # Pipes still open after this are held outside the group; `release` closes them, and
        # whatever that holder writes later is lost.
        self._pump(self._finished, time.monotonic() + _DRAIN_AFTER_KILL)
        self._pump(lambda: self._exited, None)  # it got SIGKILL: this cannot take long
        if self._watcher is not None:
            self._watcher.join()  # it set _exited as its last act
        self.child.wait()

    def abort(self) -> None:
        """After an error or KeyboardInterrupt: kill the group and reap the leader, if any."""
        if self._child is not None and self._child.returncode is None:
            self._signal_group(signal.SIGKILL)
            if self._watcher is not None:
                # If the interrupt hit inside `start()`, join() raises; a watcher that begins
                # later finds the leader reaped (ECHILD) and ends by itself.
                with contextlib.suppress(RuntimeError):
                    self._watcher.join()
            self.child.wait()

    def release(self) -> None:
        """Close the pipes, the selector and the wake-up pipe. Idempotent."""
        self._selector.close()
        child = self._child
        for pipe in (child.stdin, child.stdout, child.stderr) if child is not None else ():
            if pipe is not None:
                pipe.close()
        with self._wake_lock:
            wake_w, self._wake_w = self._wake_w, None
        for fd in (self._wake_r, wake_w, self._pidfd):
            if fd is not None and fd >= 0:
                os.close(fd)
        self._wake_r = self._pidfd = -1

    def _wait_for_exit_or_stop(self) -> None:
        self._pump(lambda: self._exited or self._cancelled_at is not None, self._until)
        if self._exited:
            return  # it ended on its own before we acted: its status is its own
        cancelled_at = self._cancelled_at
        # Both may have happened by now; the earlier one is the cause.
        self.cancelled = cancelled_at is not None and (
            self._until is None or cancelled_at <= self._until
        )
        self.timed_out = not self.cancelled

    def _finished(self) -> bool:
        return self._exited and not self._readers

    def _pump(self, done: Callable[[], bool], until: float | None) -> bool:
        """Serve the pipes until ``done()`` or monotonic time ``until``; return ``done()``."""
        while not done():
            wait = None if until is None else until - time.monotonic()
            expired = wait is not None and wait <= 0
            if wait is not None and wait > MAX_WAIT:
                wait = MAX_WAIT  # poll() overflows on a timeout of centuries: re-check
            if expired:
                self._take_ready()
                return done()
            for key, _ in self._selector.select(wait):
                key.data()
        return True

    def _take_ready(self) -> None:
        """Past a deadline, still take what the pipes hold: this thread may have been
        descheduled past it with output waiting, more than one read's worth (a writer that
        filled the pipe). Bounded, as a holder outside the group may write without end."""
        for _ in range(_READS_PAST_DEADLINE):
            ready = self._selector.select(0)
            if not ready:
                return
            for key, _ in ready:
                key.data()

    def _open_wake_pipe(self) -> None:
        self._wake_r, wake_w = os.pipe()
        with self._wake_lock:
            self._wake_w = wake_w
        os.set_blocking(self._wake_r, False)
        os.set_blocking(wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._drain_wake)

    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_w is not None:
                # A full pipe already holds plenty of wake-ups.
                with contextlib.suppress(BlockingIOError):
                    os.write(self._wake_w, b"\0")

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)

    def _note_cancel(self) -> None:
        self._cancelled_at = time.monotonic()
        self._wake()

    def _watch_exit(self) -> None:
        # Both ways see the exit but leave the leader a zombie: its pid, which is the pgid,
        # stays reserved until the driver reaps it after the last killpg. A pidfd needs no
        # thread, so no Thread.start() that Ctrl-C could interrupt halfway.
        try:
            self._pidfd = os.pidfd_open(self.child.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3, or a sandbox forbids it
            self._watcher = threading.Thread(
                target=self._wait_for_exit,
                name=f"toolreg-process-{self.child.pid}",
                daemon=True,  # a leader stuck in the kernel must not block interpreter exit
            )
            self._watcher.start()
        else:
            self._selector.register(self._pidfd, selectors.EVENT_READ, self._note_exit)

    def _note_exit(self) -> None:
        self._exited = True
        self._selector.unregister(self._pidfd)
        try:
            os.waitid(os.P_PID, self.child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            self._lost = True  # SIGCHLD ignored, or a waitpid(-1) elsewhere reaped it

    def _wait_for_exit(self) -> None:
        try:
            os.waitid(os.P_PID, self.child.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            self._lost = True  # SIGCHLD ignored, or a waitpid(-1) elsewhere reaped it
        finally:
            self._exited = True
            self._wake()

    def _signal_group(self, signum: int) -> None:
        if self._lost or self.child.returncode is not None:
            return  # the group id may be reused by now: signalling it could hit a stranger
        try:
            os.killpg(self.child.pid, signum)
        except ProcessLookupError:
            pass
        except PermissionError as error:  # e.g. a setuid member we may not signal
            _logger.warning("toolreg: cannot signal process group %d: %s", self.child.pid, error)

    def _watch_pipes(self) -> None:
        stdin = self.child.stdin
        if stdin is not None:
            os.set_blocking(stdin.fileno(), False)
            self._selector.register(stdin, selectors.EVENT_WRITE, self._write_stdin)
        for pipe, capture in ((self.child.stdout, self.stdout), (self.child.stderr, self.stderr)):
            if pipe is not None:
                os.set_blocking(pipe.fileno(), False)
                handler = functools.partial(self._read, pipe, capture)
                self._selector.register(pipe, selectors.EVENT_READ, handler)
                self._readers.add(pipe)

    def _read(self, pipe: IO[bytes], capture: _Capture) -> None:
        try:
            data = os.read(pipe.fileno(), _READ_SIZE)
        except BlockingIOError:
            return
        if data:
            capture.keep(data)
        else:
            self._readers.discard(pipe)
            self._selector.unregister(pipe)
            pipe.close()

    def _write_stdin(self) -> None:
        stdin = self.child.stdin
        assert stdin is not None
        try:
            self._written += os.write(stdin.fileno(), self._stdin_data[self._written :])
        except BlockingIOError:
            return
        except BrokenPipeError:
            self._written = len(self._stdin_data)  # the child stopped reading: drop the rest
        if self._written >= len(self._stdin_data):
            self._close_stdin()

    def _close_stdin(self) -> None:
        stdin = self.child.stdin
        if stdin is not None and not stdin.closed:
            self._selector.unregister(stdin)
            stdin.close()


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    # A KeyboardInterrupt between fork() and the moment we hold the Popen would lose the child:
    # nobody would kill or reap it (Popen.__init__ only closes its pipes). Python raises it on
    # the main thread only, so there, hold SIGINT back for that instant and deliver it after.
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # SIG_IGN, SIG_DFL or a handler installed outside Python
        yield
        return
    held: list[tuple[int, FrameType | None]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            previous(*held[0])
