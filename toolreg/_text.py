"""Text of values that may be hostile: an exception whose `str()` raises, a key whose `repr()`
raises, a metaclass that makes even a type's name misbehave. A failed result must never turn
into an exception because its message could not be written.
"""

from __future__ import annotations

import re

__all__ = ["SURROGATE", "describe", "escape_surrogates", "safe_repr", "safe_str", "type_name"]

SURROGATE = re.compile("[\ud800-\udfff]")
"""A surrogate code point: UTF-8 cannot carry one (`os.fsdecode` makes one of each byte of a
file name that is not UTF-8), so text holding one cannot be written or sent as UTF-8."""


def type_name(value: object) -> str:
    """The name of the value's type, as a plain `str` (or "object" if even that fails)."""
    try:
        return str.__str__(type(value).__name__)
    except Exception:  # a metaclass may make even the name hostile
        return "object"


def safe_str(value: object) -> str:
    """`str(value)`, or a placeholder naming its type if that raises."""
    try:
        text = str(value)
    except BaseException:
        return f"<{type_name(value)} whose str() raised>"
    return str.__str__(text) if isinstance(text, str) else f"<{type_name(value)}>"


def safe_repr(value: object, limit: int | None = None) -> str:
    """`repr(value)` (cut to `limit` characters), or a placeholder if that raises."""
    try:
        shown: object = repr(value)
    except BaseException:
        return f"<{type_name(value)} whose repr() raised>"
    if not isinstance(shown, str):  # a C extension's __repr__ can return anything
        return f"<{type_name(value)}>"
    text = str.__str__(shown)
    return text if limit is None or len(text) <= limit else f"{text[: limit - 3]}..."


def describe(exc: BaseException) -> str:
    """`Type: message` for an exception, even one whose `str()` raises."""
    return f"{type_name(exc)}: {safe_str(exc)}"


def escape_surrogates(text: str) -> str:
    """`text` with each surrogate code point replaced by the six characters of its escape
    (a backslash, `u`, four hex digits), so it can be written as UTF-8."""
    if text.isascii():
        return text
    return SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)
