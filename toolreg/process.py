"""Run a child process under a `CancelToken`, and leave nothing of it behind.

`run` is `subprocess.run` for tool bodies that must stop when their call is cancelled::

    from toolreg import CancelSource
    from toolreg.process import run

    source = CancelSource()
    result = run(["git", "status", "--short"], token=source.token, timeout=30, text=True)
    print(result.returncode, result.stdout)

In a tool body, pass the call's token: ``run(["make", "test"], token=ctx.token, check=True)``.

How one run ends (POSIX only; every step is load-bearing):

1. The child starts in a new session, so it leads its own process group (pgid == pid) and all
   it forks joins that group -- unless a descendant leaves on purpose (``setsid``, ``setpgid``,
   shells with job control); such escapees are beyond reach.
2. Nothing polls. The calling thread blocks in a selector over the child's pipes, a pidfd that
   turns readable when the leader exits (Linux; it does not reap), and a wake-up pipe that the
   token's ``on_cancel`` callback writes. Without pidfds a helper thread blocks in
   ``waitid(WNOWAIT)`` instead and writes the wake-up pipe when the leader exits.
3. When the leader exits, the token is cancelled or ``timeout`` expires, the group gets SIGTERM
   (after a normal exit that only reaches leftovers). `run` waits at most ``grace`` seconds for
   the leader to exit and the output pipes to close, then sends SIGKILL to the group -- always,
   even if the leader is gone, since a grandchild may ignore SIGTERM (``trap '' TERM`` is
   inherited across exec).
4. Only after that last signal is the leader reaped. Until then its zombie holds its pid, which
   is the group id, so no signal can reach an unrelated process that reused the number.
5. Pipes still open `_DRAIN_AFTER_KILL` seconds after SIGKILL (held by an escapee) are closed,
   so no straggler can block `run`. A helper thread, if any, is joined.

Killed grandchildren are reparented and reaped by init (or the nearest subreaper), not by `run`.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, AnyStr, Generic, Literal, TypeAlias, overload

from . import _validate
from ._cancel import CancelToken, checked_token
from ._process import _Supervision

__all__ = ["ProcessError", "ProcessResult", "run", "scrubbed_env"]

_logger = logging.getLogger("toolreg")

_Path: TypeAlias = str | bytes | os.PathLike[str] | os.PathLike[bytes]
_Command: TypeAlias = _Path | Sequence[_Path]

# A name that says "secret": containing one of these words, or ending with a common suffix
# for one (GITHUB_PAT, SMTP_PASS, DB_PWD, PROXY_AUTH), in any case.
_SECRET_NAME = re.compile(
    "KEY|SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|_(?:PAT|PASS|PWD|AUTH)$",
    re.IGNORECASE,
)
# A value that carries a password in a URL's user-info: scheme://user:secret@host
_SECRET_IN_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:[^\s/?#@]*@")


@dataclass(frozen=True, repr=False)
class ProcessResult(Generic[AnyStr]):
    """How a child run by `run` ended. `AnyStr` is `bytes`, or `str` with ``text=True``.

    - ``returncode``: the exit status, ``-N`` if signal N killed the leader; None if no process
      was started (the token was already cancelled).
    - ``signal``: N when ``returncode == -N``, else None (a shell's ``128+N`` is a plain status).
    - ``cancelled`` / ``timed_out``: `run` stopped the child because of the token or of
      ``timeout``. Only the first cause is reported; both are False if the leader exited on its
      own before `run` acted, even if a cancellation arrived meanwhile.
    - ``stdout`` / ``stderr``: captured output, None with ``capture_output=False``.
    - ``stdout_truncated`` / ``stderr_truncated``: output beyond ``max_output`` was dropped.
    - ``duration``: seconds from the call to `run` until it returned (the child was reaped).
    - ``pid``: the leader's pid, already reaped and possibly reused; None if never started.

    Example::

        result = run(["ls", "missing"], token=token)
        if not result.ok:
            print(result)       # <ProcessResult args=('ls', 'missing') returncode=2 ...>
    """

    args: _Command
    returncode: int | None
    signal: int | None
    cancelled: bool
    timed_out: bool
    stdout: AnyStr | None
    stderr: AnyStr | None
    duration: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    pid: int | None = None

    @property
    def ok(self) -> bool:
        """True if the child exited with status 0 and was neither cancelled nor timed out."""
        return self.returncode == 0 and not self.cancelled and not self.timed_out

    def check_returncode(self) -> None:
        """Raise `ProcessError` unless `ok` (what ``check=True`` does)."""
        if not self.ok:
            raise ProcessError(self)

    def __repr__(self) -> str:
        parts = [f"args={self.args!r}", f"returncode={self.returncode}"]
        if self.signal is not None:
            parts.append(f"signal={_signal_name(self.signal)}")
        parts += [flag for flag in ("cancelled", "timed_out") if getattr(self, flag)]
        for name in ("stdout", "stderr"):
            output = getattr(self, name)
            if output is not None:
                cut = "+" if getattr(self, f"{name}_truncated") else ""
                parts.append(f"{name}=<{len(output)}{cut} {type(output).__name__}>")
        parts.append(f"duration={self.duration:.3f}")
        return f"<ProcessResult {' '.join(parts)}>"


class ProcessError(Exception):
    """Raised by ``run(..., check=True)`` unless the result is `ok`; ``.result`` has it all.

    Cancellation and timeout raise it too (with ``result.cancelled`` / ``result.timed_out``),
    whatever status the child exited with.
    """

    def __init__(self, result: ProcessResult[Any]) -> None:
        super().__init__(_describe(result))
        self.result = result

    def __reduce__(self) -> tuple[type[ProcessError], tuple[ProcessResult[Any]]]:
        return type(self), (self.result,)


def scrubbed_env() -> dict[str, str]:
    """A copy of ``os.environ`` without the variables that look like they hold a secret.

    A variable is dropped if its *name*, in any case,

    - contains KEY, SECRET, TOKEN, PASSWORD, PASSWD, PASSPHRASE or CREDENTIAL
      (``OPENAI_API_KEY``, ``github_token``, but also ``KEYBOARD``), or
    - ends with ``_PAT``, ``_PASS``, ``_PWD`` or ``_AUTH`` (``GITHUB_PAT``, ``SMTP_PASS``;
      not ``PWD`` itself, the working directory);

    or if its *value* holds a URL with a password in its user-info, ``scheme://user:secret@``
    (``DATABASE_URL=postgres://app:hunter2@db/app``, ``PIP_INDEX_URL=https://u:p@host/simple``).
    A URL with a user name only (``ssh://git@host``) is kept. `run` gives a child this
    environment when ``env`` is None; extend it with ``env={**scrubbed_env(), "LANG": "C"}``.
    """
    return {
        name: value
        for name, value in os.environ.items()
        if not (_SECRET_NAME.search(name) or _SECRET_IN_URL.search(value))
    }


@overload
def run(
    args: _Command,
    *,
    token: CancelToken,
    timeout: float | None = None,
    grace: float = 2.0,
    input: bytes | None = None,
    cwd: _Path | None = None,
    env: Mapping[str, str] | None = None,
    capture_output: bool = True,
    text: Literal[False] = False,
    check: bool = False,
    max_output: int | None = None,
) -> ProcessResult[bytes]: ...


@overload
def run(
    args: _Command,
    *,
    token: CancelToken,
    timeout: float | None = None,
    grace: float = 2.0,
    input: str | None = None,
    cwd: _Path | None = None,
    env: Mapping[str, str] | None = None,
    capture_output: bool = True,
    text: Literal[True],
    check: bool = False,
    max_output: int | None = None,
) -> ProcessResult[str]: ...


@overload
def run(
    args: _Command,
    *,
    token: CancelToken,
    timeout: float | None = None,
    grace: float = 2.0,
    input: bytes | str | None = None,
    cwd: _Path | None = None,
    env: Mapping[str, str] | None = None,
    capture_output: bool = True,
    text: bool,
    check: bool = False,
    max_output: int | None = None,
) -> ProcessResult[Any]: ...


def run(
    args: _Command,
    *,
    token: CancelToken,
    timeout: float | None = None,
    grace: float = 2.0,
    input: bytes | str | None = None,
    cwd: _Path | None = None,
    env: Mapping[str, str] | None = None,
    capture_output: bool = True,
    text: bool = False,
    check: bool = False,
    max_output: int | None = None,
) -> ProcessResult[Any]:
    """Run ``args`` to completion, or until ``token`` is cancelled or ``timeout`` expires.

    Blocks the calling thread (any thread) and returns only once the child has exited and been
    reaped and every pipe is closed. Thread-safe; calls run concurrently. Linux needs no helper
    thread; elsewhere one per call is started and joined.

    - Stopping: on cancellation or timeout the child's process group gets SIGTERM; `run` waits
      until the leader exited and the output pipes closed, at most ``grace`` seconds (``0``:
      not at all), then sends SIGKILL to the group -- even if the leader already exited. After
      a normal exit the rest of the group gets the same treatment (usually nothing is left and
      it costs nothing), so nothing the child started outlives the call. `run` can thus take
      ``timeout + grace`` plus up to half a second of draining output after SIGKILL.
    - Races: a leader that exits on its own before `run` acts wins (``cancelled`` and
      ``timed_out`` stay False, ``check=True`` judges its status); between a cancellation and
      the timeout, the earlier one is the cause.
    - ``timeout``: seconds from this call, positive and finite; None waits forever.
    - ``args``: a program and its arguments (a sequence is kept as a tuple in the result), or a
      single program path; never a shell command line (no shell is involved).
    - Already cancelled ``token``: no process is started, the executable is not even looked
      up; the result has ``cancelled=True``, ``returncode=None`` and ``pid=None``. A token
      cancelled while the child starts still gets a started (then stopped) child.
    - ``input``: fed to the child's stdin, then stdin is closed; with None, stdin is
      ``/dev/null`` (never this process's stdin). Output pipes are read concurrently, so no
      amount of output deadlocks. ``max_output`` caps the bytes kept *per stream*; the rest is
      still read (the child never blocks) and dropped, setting ``stdout_truncated`` /
      ``stderr_truncated``. ``capture_output=False`` lets the child write to this process's
      stdout and stderr (never do that in a stdio server).
    - ``text=True``: ``input`` must be str (UTF-8 encoded) and output is decoded as UTF-8 with
      invalid bytes replaced by U+FFFD (a cut can split a character), and newlines normalized
      to ``\\n`` like subprocess's universal newlines. Otherwise bytes in, bytes out.
    - ``env=None``: the child inherits ``os.environ`` minus every variable that looks like a
      secret (see `scrubbed_env`): its name contains (any case) KEY, SECRET, TOKEN, PASSWORD,
      PASSWD, PASSPHRASE or CREDENTIAL or ends with ``_PAT``, ``_PASS``, ``_PWD`` or ``_AUTH``,
      or its value holds a URL with a password (``scheme://user:secret@``). An explicit ``env``
      is used exactly as given, secrets included.
    - ``check=True``: raise `ProcessError` (with ``.result``) unless the result is `ok`:
      non-zero status, killed by a signal, cancelled (even before starting) or timed out.

    Raises ``FileNotFoundError`` / ``PermissionError`` for a missing or non-executable program
    or ``cwd`` before anything runs; ``TypeError`` / ``ValueError`` for bad arguments (``token``
    must be a `CancelToken`; ``timeout`` positive and finite; ``grace`` zero or more and finite;
    a number too large for a float is a ``ValueError`` like infinity);
    ``NotImplementedError`` where the OS has no process groups or ``waitid`` (Windows, macOS).
    A ``KeyboardInterrupt`` while waiting kills the group with SIGKILL, reaps, then propagates.
    """
    started = time.monotonic()
    _check_platform()
    command, stdin_data, seconds = _check_arguments(args, token, timeout, grace, input, text)
    limit = _check_limit(max_output)
    if token.cancelled:
        result = _not_started(command, capture_output, text, started)
    else:
        spawn = _spawner(command, stdin_data, capture_output, cwd, env)
        until = None if seconds is None else started + seconds
        supervision = _Supervision(until, grace, stdin_data, limit)
        _supervise(supervision, spawn, token)
        result = _result_of(supervision, command, text, started)
    if check:
        result.check_returncode()
    return result


def _spawner(
    command: _Command,
    stdin_data: bytes | None,
    capture_output: bool,
    cwd: _Path | None,
    env: Mapping[str, str] | None,
) -> Callable[[], subprocess.Popen[bytes]]:
    output = subprocess.PIPE if capture_output else None
    return lambda: subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL if stdin_data is None else subprocess.PIPE,
        stdout=output,
        stderr=output,
        cwd=cwd,
        env=scrubbed_env() if env is None else env,
        bufsize=0,
        start_new_session=True,  # its own session, so its own process group: pgid == pid
    )


def _supervise(
    supervision: _Supervision, spawn: Callable[[], subprocess.Popen[bytes]], token: CancelToken
) -> None:
    try:
        supervision.start(spawn)
        supervision.supervise(token)
    except BaseException:
        supervision.abort()
        raise
    finally:
        supervision.release()


def _result_of(
    supervision: _Supervision, command: _Command, text: bool, started: float
) -> ProcessResult[Any]:
    child = supervision.child
    status = child.returncode
    return _build(
        text,
        supervision.stdout.value() if child.stdout is not None else None,
        supervision.stderr.value() if child.stderr is not None else None,
        args=command,
        returncode=status,
        signal=-status if status is not None and status < 0 else None,
        cancelled=supervision.cancelled,
        timed_out=supervision.timed_out,
        duration=time.monotonic() - started,
        stdout_truncated=supervision.stdout.truncated,
        stderr_truncated=supervision.stderr.truncated,
        pid=child.pid,
    )


def _check_platform() -> None:
    if not all(hasattr(os, name) for name in ("killpg", "waitid", "WNOWAIT")):
        raise NotImplementedError(
            "toolreg.process.run needs POSIX process groups and os.waitid(WNOWAIT) (Linux, "
            "FreeBSD...); without them a child's descendants cannot be stopped safely"
        )


def _check_arguments(
    args: _Command,
    token: object,
    timeout: object,
    grace: object,
    input: object,
    text: bool,
) -> tuple[_Command, bytes | None, float | None]:
    checked_token(token, "token")
    seconds = (
        None
        if timeout is None
        else _validate.seconds(timeout, "timeout", unlimited="pass None to wait forever")
    )
    _validate.seconds(grace, "grace", allow_zero=True)
    return _check_command(args), _encode_input(input, text), seconds


def _check_command(args: _Command) -> _Command:
    if isinstance(args, (str, bytes, os.PathLike)):
        return args
    command = tuple(args)
    if not command:
        raise ValueError("args is empty: pass the program and its arguments, e.g. ['ls', '-l']")
    return command


def _check_limit(max_output: object) -> int | None:
    if max_output is None:
        return None
    return _validate.count(max_output, "max_output", minimum=0, hint="bytes")


def _encode_input(input: object, text: bool) -> bytes | None:
    if input is None:
        return None
    if text:
        if not isinstance(input, str):
            raise TypeError(f"with text=True, input must be str, got {type(input).__name__}")
        return input.encode()
    if not isinstance(input, (bytes, bytearray, memoryview)):
        hint = " (or pass text=True)" if isinstance(input, str) else ""
        raise TypeError(f"input must be bytes, got {type(input).__name__}{hint}")
    return bytes(input)


def _not_started(
    command: _Command, capture_output: bool, text: bool, started: float
) -> ProcessResult[Any]:
    empty = b"" if capture_output else None
    return _build(
        text,
        empty,
        empty,
        args=command,
        returncode=None,
        signal=None,
        cancelled=True,
        timed_out=False,
        duration=time.monotonic() - started,
    )


def _build(
    text: bool, stdout: bytes | None, stderr: bytes | None, **fields: Any
) -> ProcessResult[Any]:
    if text:
        return ProcessResult(stdout=_decode(stdout), stderr=_decode(stderr), **fields)
    return ProcessResult(stdout=stdout, stderr=stderr, **fields)


def _decode(data: bytes | None) -> str | None:
    # UTF-8 whatever the locale; a cut stream or a stray byte must not raise after the child
    # ran. Newlines as in subprocess's text mode.
    if data is None:
        return None
    return data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _describe(result: ProcessResult[Any]) -> str:
    args = result.args
    program = args if isinstance(args, (str, bytes, os.PathLike)) else args[0]
    what = f"{os.fsdecode(program)!r}"
    if result.returncode is None:
        return f"{what} was not started: the token was already cancelled"
    if result.timed_out:
        what += " timed out and"
    elif result.cancelled:
        what += " was cancelled and"
    if result.signal is not None:
        return f"{what} was killed by {_signal_name(result.signal)}"
    return f"{what} exited with status {result.returncode}"
