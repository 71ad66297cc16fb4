"""What crosses between a remote body and its caller, pickled the same way in every cluster.

A Dask cluster of threads hands a task's result over as the object itself, and one of processes
pickles it, so a value that cannot be pickled would work in one and fail in the other (with an
error that names Dask's internals). The worker therefore pickles the outcome itself, piece by
piece, and returns bytes: a value, an exception or a deferred context that cannot be pickled
becomes a `RemoteToolError` naming its type, in both kinds of cluster. Reasons travel the same
way, with their `str()` as the fallback.

This module imports no Dask: the worker and the client side both use it.
"""

from __future__ import annotations

import traceback
from typing import Any, NamedTuple

import cloudpickle

from .._cancel import Cancelled
from .._text import describe, safe_str

__all__ = [
    "ERROR",
    "LOST",
    "REFUSED",
    "VALUE",
    "Outcome",
    "RemoteToolError",
    "RemoteTraceback",
    "RemoteWorkerLost",
    "dump_reason",
    "encode_error",
    "encode_value",
    "load_contexts",
    "load_error",
    "load_reason",
    "load_value",
    "type_name",
]

VALUE, ERROR, REFUSED, LOST = "value", "error", "refused", "lost"


class RemoteToolError(Exception):
    """A remote body's outcome that could not reach the caller as it was.

    Raised (and reported as `TOOL_ERROR`) when a value, an exception or a deferred context of
    a remote body cannot be pickled, when an outcome cannot be unpickled on the caller, or when
    the body could not be handed to the cluster. The message names the type involved.
    """


class RemoteWorkerLost(RemoteToolError):
    """The worker running a remote body was lost: its outcome is unknown, and it is not rerun.

    Dask reruns a task whose worker died; the claim board refuses the rerun, so a body starts
    at most once. The result is `TOOL_ERROR` with "remote worker lost" in its message.
    """


class RemoteTraceback(Exception):
    """The traceback of an exception raised by a remote body (its `__cause__`), as text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


class Outcome(NamedTuple):
    """What a remote attempt returns: `kind`, the pickled payload and contexts, a traceback."""

    kind: str  # VALUE, ERROR, REFUSED or LOST
    payload: bytes | None = None
    contexts: bytes | None = None
    traceback: str | None = None


def type_name(value: object) -> str:
    """`module.QualName` of the value's type (`builtins` left out)."""
    kind = type(value)
    module = kind.__module__
    name = kind.__qualname__
    return name if module == "builtins" else f"{module}.{name}"


def encode_value(value: Any, contexts: list[Any]) -> Outcome:
    """The worker's outcome for a body that returned `value`."""
    problem, pickled = _pickle_contexts(contexts)
    if problem is not None:
        return encode_error(problem, [], pickled_contexts=pickled)
    try:
        payload = cloudpickle.dumps(value)
    except Exception as exc:
        error = RemoteToolError(
            f"the tool body returned a value of type {type_name(value)} that cannot be "
            f"pickled: {describe(exc)}"
        )
        return encode_error(error, [], pickled_contexts=pickled)
    return Outcome(VALUE, payload, pickled)


def encode_error(
    exc: BaseException, contexts: list[Any], pickled_contexts: bytes | None = None
) -> Outcome:
    """The worker's outcome for a body that raised `exc` (with its traceback as text)."""
    if pickled_contexts is None:
        problem, pickled_contexts = _pickle_contexts(contexts)
        if problem is not None:
            exc = problem
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        payload = cloudpickle.dumps(exc)
        cloudpickle.loads(payload)  # an exception often pickles but cannot be rebuilt
    except Exception as failure:
        payload = cloudpickle.dumps(_stand_in(exc, failure))
    return Outcome(ERROR, payload, pickled_contexts, text)


def _stand_in(exc: BaseException, failure: Exception) -> BaseException:
    if isinstance(exc, Cancelled):  # keep it a cancellation: only its reason would not cross
        return Cancelled(safe_str(exc.reason))
    return RemoteToolError(
        f"the tool body raised {type_name(exc)}: {safe_str(exc)} (it cannot be pickled: "
        f"{describe(failure)})"
    )


def _pickle_contexts(contexts: list[Any]) -> tuple[RemoteToolError | None, bytes | None]:
    """The contexts pickled; a problem naming the first that cannot be (the others are kept)."""
    if not contexts:
        return None, None
    kept: list[Any] = []
    problem: RemoteToolError | None = None
    for item in contexts:
        try:
            cloudpickle.dumps(item)
        except Exception as exc:
            if problem is None:
                problem = RemoteToolError(
                    f"the tool body deferred a context of type {type_name(item)} that cannot "
                    f"be pickled: {describe(exc)}"
                )
            continue
        kept.append(item)
    return problem, cloudpickle.dumps(kept) if kept else None


def load_value(outcome: Outcome) -> Any:
    """The value of a `VALUE` outcome, on the caller; `RemoteToolError` if it cannot load."""
    try:
        return cloudpickle.loads(outcome.payload or b"")
    except Exception as exc:
        raise RemoteToolError(
            f"the tool body's value could not be unpickled on the caller: {describe(exc)}"
        ) from exc


def load_error(outcome: Outcome) -> BaseException:
    """The exception of an `ERROR` outcome, its remote traceback as `__cause__`."""
    try:
        exc: BaseException = cloudpickle.loads(outcome.payload or b"")
    except Exception as failure:
        exc = RemoteToolError(
            f"the tool body's exception could not be unpickled on the caller: {describe(failure)}"
        )
    if outcome.traceback:
        exc.__cause__ = RemoteTraceback(outcome.traceback)
    return exc


def load_contexts(outcome: Outcome) -> list[Any]:
    """The deferred contexts of an outcome; `RemoteToolError` if they cannot load."""
    if outcome.contexts is None:
        return []
    try:
        contexts: list[Any] = cloudpickle.loads(outcome.contexts)
    except Exception as exc:
        raise RemoteToolError(
            f"the tool body's deferred contexts could not be unpickled on the caller: "
            f"{describe(exc)}"
        ) from exc
    return contexts


def dump_reason(reason: object) -> bytes:
    """A cancellation reason pickled for the worker; its `str()` if it cannot be."""
    try:
        blob: bytes = cloudpickle.dumps(reason)
    except Exception:
        blob = cloudpickle.dumps(safe_str(reason))
    return blob


def load_reason(blob: bytes | None) -> object:
    """The reason `dump_reason` pickled (a reason that cannot load becomes a str saying so)."""
    if blob is None:
        return None
    try:
        return cloudpickle.loads(blob)
    except Exception as exc:
        return f"<a cancellation reason that could not be unpickled: {describe(exc)}>"
