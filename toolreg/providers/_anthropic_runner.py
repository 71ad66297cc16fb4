"""Registry tools as the Anthropic SDK's runnable tools; `RegistryToolset` imports this module.

The SDK's tool runner recognises the tools it runs by class: a `BetaBuiltinFunctionTool` (sync
runner) or a `BetaAsyncBuiltinFunctionTool` (async runner), each with `to_dict()` (its
definition), `name` and `call(input)`. A failure raises the SDK's `ToolError`, which the runner
turns into an `is_error` result carrying its text.
"""

from __future__ import annotations

import copy
from typing import Any, cast

try:
    from anthropic.lib.tools import (
        BetaAsyncBuiltinFunctionTool,
        BetaBuiltinFunctionTool,
        BetaFunctionToolResultType,
        ToolError,
    )
    from anthropic.types.beta import BetaToolUnionParam
except ImportError as exc:  # the extra is not installed
    raise ImportError(
        "toolreg.providers.anthropic.RegistryToolset needs the Anthropic SDK: "
        "pip install 'toolreg-quiescent[anthropic]'"
    ) from exc

from .. import CancelToken, ToolCall, ToolRegistry, ToolResult
from ..aio import AsyncToolRegistry
from ._common import object_arguments

__all__ = ["AsyncRegistryTool", "RegistryTool"]


class _Definition:
    """What both flavours share: the definition, the name, and the registry's tools' repr."""

    def __init__(self, definition: dict[str, Any], token: CancelToken | None) -> None:
        self._definition = definition
        self._name: str = definition["name"]
        self._token = token

    @property
    def name(self) -> str:
        return self._name

    def to_dict(self) -> BetaToolUnionParam:
        return cast("BetaToolUnionParam", copy.deepcopy(self._definition))  # the SDK may keep it

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name!r}>"


class RegistryTool(_Definition, BetaBuiltinFunctionTool):
    """One registry tool for a sync client's tool runner: `call` blocks on `registry.execute`."""

    def __init__(
        self, definition: dict[str, Any], registry: ToolRegistry, token: CancelToken | None
    ) -> None:
        super().__init__(definition, token)
        self._registry = registry

    def call(self, input: object) -> BetaFunctionToolResultType:
        call = ToolCall(self._name, object_arguments(input))
        return _content(self._registry.execute(call, token=self._token, start_if_cancelled=False))


class AsyncRegistryTool(_Definition, BetaAsyncBuiltinFunctionTool):
    """One registry tool for an async client's tool runner: `call` awaits the asyncio facade."""

    def __init__(
        self, definition: dict[str, Any], facade: AsyncToolRegistry, token: CancelToken | None
    ) -> None:
        super().__init__(definition, token)
        self._facade = facade

    async def call(self, input: object) -> BetaFunctionToolResultType:
        call = ToolCall(self._name, object_arguments(input))
        result = await self._facade.execute(call, token=self._token, start_if_cancelled=False)
        return _content(result)


def _content(result: ToolResult[Any]) -> str:
    if result.ok:
        return result.content
    raise ToolError(result.content)  # the runner sends it as an is_error result
