"""What every adapter needs: argument checks, the tool selection, token fusion, a settled wait.

Nothing here imports a framework. The MCP bridge uses `wait_settled` too, and the provider SDK
loops (`toolreg.providers`) the selection and the argument parsing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .. import CancelSource, CancelToken, Tool, ToolRegistry
from .._catalog import _PROVIDER_NAME_LIMIT, _provider_accepts

__all__ = [
    "Selected",
    "call_token",
    "check_registry",
    "check_token",
    "parse_arguments",
    "select_provider_tools",
    "select_tools",
    "wait_settled",
]


@dataclass(frozen=True)
class Selected:
    """A tool handed to a framework, with the parameters schema its catalog advertises."""

    tool: Tool
    schema: dict[str, Any]  # a plain, private copy: the framework may keep or mutate it


def check_registry(registry: object) -> ToolRegistry:
    if not isinstance(registry, ToolRegistry):
        raise TypeError(f"expected a toolreg.ToolRegistry, got {type(registry).__name__}")
    return registry


def check_token(token: object, what: str = "token") -> CancelToken | None:
    if token is not None and not isinstance(token, CancelToken):
        raise TypeError(f"{what} must be a toolreg.CancelToken or None, got {type(token).__name__}")
    return token


def select_tools(registry: ToolRegistry, names: Iterable[str] | None) -> list[Selected]:
    """The named tools (all of them, sorted by name, for None), from one catalog snapshot.

    Each schema is the one the registry advertises (`registry.catalog()`: an object root
    always), untouched otherwise. Unknown or repeated names raise `ValueError`; a bare string
    raises `TypeError` (it would be read as a list of one-letter names).
    """
    catalog = registry.catalog()
    available = {
        tool.name: Selected(tool, shape["inputSchema"])
        for tool, shape in zip(catalog.tools, catalog.schemas("mcp"), strict=True)
    }
    if names is None:
        return list(available.values())
    if isinstance(names, (str, bytes)):
        raise TypeError("names must be an iterable of tool names, not a single string")
    wanted = list(names)
    for name in wanted:
        if not isinstance(name, str):
            raise TypeError(f"tool names are str, got {type(name).__name__}")
    repeated = sorted({name for name in wanted if wanted.count(name) > 1})
    if repeated:
        raise ValueError(f"tool names given more than once: {', '.join(map(repr, repeated))}")
    unknown = [name for name in wanted if name not in available]
    if unknown:
        raise ValueError(
            f"no tool named {', '.join(map(repr, unknown))} in the registry; "
            f"registered: {', '.join(map(repr, available)) or 'none'}"
        )
    return [available[name] for name in wanted]


def select_provider_tools(
    registry: ToolRegistry, names: Iterable[str] | None, provider: str
) -> list[Selected]:
    """`select_tools`, refusing (`ValueError`) the names OpenAI and Anthropic refuse.

    Those providers take `[A-Za-z0-9_-]{1,64}`: a tool named longer, or with a `.`, is named
    in the error (`provider` says whose rule it is) instead of failing the model request.
    """
    selection = select_tools(registry, names)
    refused = [s.tool.name for s in selection if not _provider_accepts(s.tool.name)]
    if refused:
        raise ValueError(
            f"{provider} refuses tool names longer than {_PROVIDER_NAME_LIMIT} characters or "
            f"containing '.': {', '.join(map(repr, refused))}; rename these tools"
        )
    return selection


@contextlib.contextmanager
def call_token(*tokens: CancelToken | None) -> Iterator[CancelToken | None]:
    """One token cancelled when any of `tokens` is (None when there is none).

    A fused source is made only when two or more are given, and closed on exit, so a
    long-lived adapter token holds no registration from a call that has returned.
    """
    given = [token for token in tokens if token is not None]
    if not given:
        yield None
    elif len(given) == 1:
        yield given[0]
    else:
        with CancelSource(*given) as fused:
            yield fused.token


def parse_arguments(raw: str) -> Any:
    """A model's JSON arguments as Python; text that is not JSON is handed on as it is.

    The registry's entry check then refuses what is not a mapping (`INVALID_ARGS`), so a
    malformed call still reaches the hooks' observers and the result log like any other.
    An empty string means no arguments; JSON `null` is handed on as its text, because a call
    whose arguments are None would run with `{}`.
    """
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return raw if value is None else value


async def wait_settled(task: asyncio.Future[Any]) -> None:
    """Wait until `task` is done, absorbing any cancellation of the waiter meanwhile.

    Shared by the adapters and the MCP bridge. Under anyio, which cancels again at every await
    of a cancelled scope, the wait runs in a shielded scope so it sleeps instead of spinning; a
    raw `Task.cancel()` (a server tearing its tasks down) ends one `asyncio.wait`, and the loop
    waits again. `asyncio.wait` never cancels `task` nor raises its exception: the task's
    outcome is left to the caller, who re-raises its own cancellation.
    """
    anyio = sys.modules.get("anyio")
    while not task.done():
        try:
            if anyio is not None:
                with anyio.CancelScope(shield=True):
                    await asyncio.wait((task,))
            else:
                await asyncio.wait((task,))
        except asyncio.CancelledError:
            continue
