"""The catalog: registered tools and the definitions handed to models and clients.

A `Catalog` is an immutable snapshot of one registration state, so the tools it lists and the
schemas it renders always agree (`registry.catalog()`), however tools come and go meanwhile.
Each style has its provider's shape and rules: OpenAI and Anthropic refuse names longer than 64
characters or containing a `.`, so rendering those styles raises `ValueError` naming each such
tool rather than producing a catalog the provider rejects. Every rendering is a fresh, plain,
JSON-serializable copy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from ._cancel import Registration
from ._hooks import HookRegistration
from ._record import record
from ._tools import Tool, Validator, compile_output_schema, compile_schema, thaw

__all__ = ["RUNNER_ATTRIBUTE", "Catalog", "CatalogEntry", "Runner", "SchemaStyle", "ToolTable"]

# A body function carrying this attribute runs elsewhere: the attribute is its `Runner`.
RUNNER_ATTRIBUTE = "__toolreg_runner__"


class Runner(Protocol):
    """Runs a body somewhere else (a cluster worker) and joins it, on the stage thread.

    A tool body function carrying a runner (`RUNNER_ATTRIBUTE`) is not called by `_body`:
    `runner(ctx)` is, inline, and returns the body's value or raises what it raised, or raises
    `_body.NotStarted` if the body never started. An exception that lands while it waits
    (Ctrl-C) goes to `ctx._interrupt(exc)`, which cancels the call; the runner then keeps
    joining. Here, where the catalog finds runners at registration; `ctx` is the body's
    `ToolContext`, which `_body` defines on top of this module (so it is not named here).
    """

    def __call__(self, ctx: Any, /) -> Any: ...


SchemaStyle = Literal["openai", "anthropic", "mcp"]

_PROVIDER_NAME_LIMIT = 64  # OpenAI and Anthropic: [A-Za-z0-9_-]{1,64}


@record(frozen=True)
class CatalogEntry:
    """A registered tool with what was compiled for it at registration."""

    tool: Tool
    schema: dict[str, Any]  # a private, normalized copy of the parameters schema, as compiled
    validator: Validator | None
    output_schema: dict[str, Any] | None  # normalized copy, as compiled
    output_validator: Validator | None  # set only with validate_output=True
    is_async: bool  # an `async def` body: it runs on the registry's event loop thread
    runner: Runner | None = None  # runs the body elsewhere (a cluster); see `Runner`

    def __init__(
        self,
        tool: Tool,
        schema: dict[str, Any],
        validator: Validator | None,
        output_schema: dict[str, Any] | None,
        output_validator: Validator | None,
        is_async: bool,
        runner: Runner | None = None,
    ) -> None:
        self.__dict__.update(
            tool=tool,
            schema=schema,
            validator=validator,
            output_schema=output_schema,
            output_validator=output_validator,
            is_async=is_async,
            runner=runner,
        )

    @classmethod
    def build(cls, tool: Tool) -> CatalogEntry:
        """Compile the tool's schemas; `ValueError` for an invalid one."""
        schema, validator = compile_schema(tool)
        output_schema, output_validator = compile_output_schema(tool)
        runner = getattr(tool.fn, RUNNER_ATTRIBUTE, None)
        if runner is not None and not callable(runner):
            raise TypeError(f"tool {tool.name!r}: its body's runner is not callable")
        import inspect  # at the first registration: `import toolreg` does not pay for it

        return cls(
            tool,
            schema,
            validator,
            output_schema,
            output_validator if tool.validate_output else None,
            inspect.iscoroutinefunction(tool.fn) and runner is None,
            runner,
        )


class Catalog:
    """The registered tools and their definitions, from one registration state.

    `.tools` is sorted by name; `.schemas(style)` renders them for `"openai"` (function
    calling), `"anthropic"` (tool use) or `"mcp"` (`tools/list`). Immutable and thread-safe.
    """

    __slots__ = ("_entries",)

    def __init__(self, entries: Mapping[str, CatalogEntry]) -> None:
        self._entries = tuple(entry for _, entry in sorted(entries.items()))

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The tools, sorted by name."""
        return tuple(entry.tool for entry in self._entries)

    def schemas(self, style: SchemaStyle = "openai") -> list[dict[str, Any]]:
        """Tool definitions in the shape a model or client expects, sorted by name.

        A tool without `parameters` gets `{"type": "object", "properties": {}}`. `"mcp"` adds
        `title` and `annotations` when set, and `outputSchema` when it is enforced
        (`validate_output=True`). `"openai"` and `"anthropic"` raise `ValueError` naming every
        tool whose name that provider refuses (over 64 characters, or a `.`).
        """
        shape = _SHAPES.get(style)
        if shape is None:
            raise ValueError(f"unknown schema style {style!r}; use one of {sorted(_SHAPES)}")
        if style != "mcp":
            refused = [e.tool.name for e in self._entries if not _provider_accepts(e.tool.name)]
            if refused:
                raise ValueError(
                    f"{style} refuses tool names longer than {_PROVIDER_NAME_LIMIT} characters "
                    f"or containing '.': {', '.join(map(repr, refused))}; rename these tools "
                    "or use the 'mcp' style"
                )
        return [shape(entry) for entry in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<Catalog tools={[entry.tool.name for entry in self._entries]!r}>"


def _provider_accepts(name: str) -> bool:
    return len(name) <= _PROVIDER_NAME_LIMIT and "." not in name


def _openai(entry: CatalogEntry) -> dict[str, Any]:
    tool = entry.tool
    function = {"name": tool.name, "description": tool.description}
    return {"type": "function", "function": {**function, "parameters": thaw(entry.schema)}}


def _anthropic(entry: CatalogEntry) -> dict[str, Any]:
    tool = entry.tool
    return {"name": tool.name, "description": tool.description, "input_schema": thaw(entry.schema)}


def _mcp(entry: CatalogEntry) -> dict[str, Any]:
    tool = entry.tool
    shape: dict[str, Any] = {"name": tool.name}
    if tool.title is not None:
        shape["title"] = tool.title
    shape["description"] = tool.description
    shape["inputSchema"] = thaw(entry.schema)
    if entry.output_validator is not None:
        shape["outputSchema"] = thaw(entry.output_schema)
    if tool.annotations is not None:
        shape["annotations"] = thaw(tool.annotations)
    return shape


_SHAPES: dict[str, Callable[[CatalogEntry], dict[str, Any]]] = {
    "openai": _openai,
    "anthropic": _anthropic,
    "mcp": _mcp,
}


class ToolTable:
    """The registered tools: a name -> `CatalogEntry` dict, replaced copy-on-write.

    A call looks its tool up once, without a lock. Registering builds the new dict outside the
    lock (schemas are compiled before anything changes) and swaps it in only if nobody changed
    the table meanwhile. `changed()` runs after every change, on the changing thread, outside
    any lock.
    """

    def __init__(self, changed: Callable[[], None]) -> None:
        self.entries: dict[str, CatalogEntry] = {}
        self._changed = changed
        self._lock = threading.Lock()  # guards the swap of `entries`

    def lookup(self, name: str) -> CatalogEntry | None:
        """The entry registered under `name` now, or None."""
        return self.entries.get(name)

    def catalog(self) -> Catalog:
        """The tools and their schemas as they are now (one snapshot)."""
        return Catalog(self.entries)

    def register(self, tool: Tool) -> Registration:
        """Add a tool; `ValueError` for a duplicate name or an invalid schema."""
        entry = CatalogEntry.build(tool)
        while True:
            current = self.entries
            if tool.name in current:
                raise ValueError(f"a tool named {tool.name!r} is already registered")
            tools = {**current, tool.name: entry}
            with self._lock:
                if self.entries is current:
                    self.entries = tools
                    break
        self._changed()
        return HookRegistration(lambda: self._unregister(entry))

    def _unregister(self, entry: CatalogEntry) -> bool:
        while True:
            current = self.entries
            if current.get(entry.tool.name) is not entry:
                return False
            tools = {name: kept for name, kept in current.items() if kept is not entry}
            with self._lock:
                if self.entries is current:
                    self.entries = tools
                    break
        self._changed()
        return True
