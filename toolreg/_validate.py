"""One check per kind of value, so the same mistake gets the same exception everywhere.

* `seconds(value, what)`: a duration (``CancelSource(timeout=)``, `deadline`, ``Tool(timeout=)``,
  `TimeoutPolicy`, `RetryPolicy`, ``process.run``, ``overdue_after``, ``ResultLog(linger=)``,
  ``mount``). `TypeError` unless it is
  an `int` or `float` (a `bool` is not a duration); `ValueError` if it is not positive (or, with
  ``allow_zero``, negative), NaN, infinite, or too large to be a `float` at all (``10**400``):
  never `OverflowError`. Finite floats are accepted however large; whoever waits on one caps
  each wait. With `maximum`, more than `maximum` is a `ValueError` too.
* `real(value, what)`: a finite real number (a progress value). `TypeError` unless it is an
  `int` or `float` (not a `bool`); `ValueError` if it is NaN, infinite, or too large to be a
  `float`. The message shows a huge int by its size, never by its digits.
* `count(value, what)`: a whole number of things (``WorkerPool(max_workers=)``,
  ``execute_batch(max_parallel=)``, ``RetryPolicy(attempts=)``, ``ResultLog(max_bytes=,
  backup_count=)``, ``process.run(max_output=)``, ``build_server(max_concurrent_calls=)``, a
  port). `TypeError` unless it is an `int` (a `bool` is not a count, nor is ``2.0``);
  `ValueError` if it is below `minimum` (1 unless told) or above `maximum`.
* `wait_timeout(value)`: a wait's ``timeout=`` (``wait_idle``): None, or seconds >= 0, where
  a wait longer than about 31 years means forever (None).

A token argument is checked beside its class, by `_cancel.checked_token` (`_cancel` uses this
module, so this module imports nothing of toolreg).
"""

from __future__ import annotations

__all__ = ["INFINITY", "count", "real", "seconds", "wait_timeout"]

# Finite means `-INFINITY < x < INFINITY` for a float (NaN compares false): `math.isfinite`
# without loading `math`, an extension module, at `import toolreg`.
INFINITY = float("inf")


def seconds(
    value: object,
    what: str,
    *,
    allow_zero: bool = False,
    unlimited: str = "",
    maximum: float | None = None,
) -> float:
    """`value` as float seconds, or the `TypeError`/`ValueError` that says what is wrong.

    `unlimited` tells how to ask for no limit at all (say ``"pass None for no timeout"``); it
    is added to the message for an infinite value, which is never accepted as "no limit".
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    number = _float(value)
    if -INFINITY < number < INFINITY and (number > 0 or (allow_zero and number == 0)):
        if maximum is None or number <= maximum:
            return number
        raise ValueError(f"{what} must be at most {maximum} seconds, got {_shown(value)}")
    least = "zero or more" if allow_zero else "more than zero"
    hint = f" ({unlimited})" if unlimited and number == INFINITY else ""
    raise ValueError(
        f"{what} must be a finite number of seconds, {least}; got {_shown(value)}{hint}"
    )


def count(
    value: object, what: str, *, minimum: int = 1, maximum: int | None = None, hint: str = ""
) -> int:
    """`value` as an int count, or the `TypeError`/`ValueError` that says what is wrong.

    `hint` is added to both messages (say ``"bytes"`` or ``"0: any free port"``).
    """
    note = f" ({hint})" if hint else ""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int{note}, got {type(value).__name__}")
    if minimum <= value and (maximum is None or value <= maximum):
        return value
    bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
    raise ValueError(f"{what} must be an int {bound}{note}, got {_shown(value)}")


def real(value: object, what: str) -> None:
    """Nothing if `value` is a finite real number, else the `TypeError`/`ValueError` saying why."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a real number, got {type(value).__name__}")
    if not -INFINITY < _float(value) < INFINITY:
        raise ValueError(f"{what} must be finite, got {_shown(value)}")


def wait_timeout(value: object) -> float | None:
    """A wait's `timeout`: None, or seconds >= 0 (capped at the platform's longest wait)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"timeout must be seconds or None, got {type(value).__name__}")
    if value != value:
        raise ValueError("timeout must be a number of seconds, got NaN")
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond float: as good as forever
        return None
    return max(0.0, seconds) if seconds < _LONGEST_WAIT else None


_LONGEST_WAIT = 1e9  # seconds (~31 years): longer waits mean "forever"


def _float(value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond the float range: as unusable as infinity
        return INFINITY


def _shown(value: float) -> str:
    # repr() of a huge int is slow, long, and beyond 4300 digits raises ValueError itself.
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    return repr(value)
