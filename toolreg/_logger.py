"""The `toolreg` logger, with `logging` imported the first time something is logged.

`logging` (with the `traceback`, `linecache`, `tokenize`, `string` and `textwrap` modules it
imports) is about a third of what `import toolreg` would cost otherwise, and a call that goes
well logs nothing. `logger` stands for `logging.getLogger("toolreg")`: the first use of each of
its methods imports `logging` and keeps that method of the real logger, so later uses are
plain bound-method calls (no extra Python frame; `isEnabledFor` runs on every call).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from logging import Logger

__all__ = ["DEBUG", "logger"]

DEBUG = 10  # logging.DEBUG, without importing logging


class _Logger:
    """`logging.getLogger("toolreg")`, looked up when first used."""

    def __getattr__(self, name: str) -> Any:
        import logging

        value = getattr(logging.getLogger("toolreg"), name)
        if callable(value):  # a method: kept (the real logger is one object for good)
            self.__dict__[name] = value
        return value

    def __repr__(self) -> str:
        return "<the 'toolreg' logger, imported when first used>"


logger = cast("Logger", _Logger())
