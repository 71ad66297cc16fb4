"""The registry tools of one mount, kept in step with the upstream's listings.

Registering runs the registry's `on_tools_changed` callbacks (user code), so listings are
applied on an ordinary thread, never on the mount's event loop, and on one thread at a time:
a thread that offers a listing while another is applying leaves it as the pending listing, and
the applying thread applies the latest one before it leaves. No lock is held while a tool is
registered or unregistered.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import mcp_types as types

from .. import Registration, Tool, ToolRegistry  # the public classes, through the package

__all__ = ["Body", "Registrations"]

logger = logging.getLogger("toolreg")

Body = Callable[[str], Callable[..., Any]]
"""`body(upstream_name)` -> the body `fn(args, ctx)` of the registry tool that mounts it."""


class _Definition(NamedTuple):
    """What a registered tool was made from: compared to tell whether the upstream changed it."""

    upstream_name: str
    description: str
    schema: str  # JSON text: comparable, and a private copy
    title: str | None
    annotations: str | None  # JSON text, or None


class Registrations:
    """The tools one mount registered: `prefix + name` for each upstream tool `names` keeps."""

    def __init__(
        self,
        registry: ToolRegistry,
        label: str,
        prefix: str,
        names: frozenset[str] | None,
        body: Body,
    ) -> None:
        self._registry = registry
        self._label = label
        self._prefix = prefix
        self._names = names
        self._body = body
        # Guards _closed, _pending, _applying and _names_now; never held around user code.
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)  # _applying went back to 0
        self._closed = False
        self._pending: list[types.Tool] | None = None  # a listing not applied yet
        self._applying = 0  # ident of the thread applying listings; 0 for none
        self._names_now: tuple[str, ...] = ()
        # Written only by the thread applying listings, or by close() once none is.
        self._registered: dict[str, tuple[_Definition, Registration]] = {}

    @property
    def names(self) -> tuple[str, ...]:
        """The registry names registered now, sorted."""
        with self._lock:
            return self._names_now

    def offer(self, tools: list[types.Tool], strict: bool = False) -> None:
        """Apply `tools` now, or leave them to the thread that is applying listings.

        `strict` (the first listing, in `mount()`): a name registered by someone else is a
        `ValueError`; otherwise it is left out with a warning, as is a definition the
        registry refuses.
        """
        me = threading.get_ident()
        with self._lock:
            if self._closed:
                return
            self._pending = tools
            if self._applying:
                return  # that thread applies the latest listing before it leaves
            self._applying = me
        try:
            while True:
                with self._lock:
                    listing, self._pending = self._pending, None
                    if listing is None or self._closed:
                        break
                self._apply(listing, strict)
        finally:
            with self._lock:
                self._applying = 0
                self._settled.notify_all()

    def close(self) -> None:
        """Apply no more listings and unregister every tool (after a thread applying one has
        finished, unless it is this thread: a callback of its own)."""
        me = threading.get_ident()
        with self._lock:
            self._closed = True
            while self._applying not in (0, me):
                self._settled.wait()
            self._names_now = ()
        registered, self._registered = self._registered, {}
        for _, registration in registered.values():
            registration.remove()

    def warn_missing(self, tools: list[types.Tool]) -> None:
        """Log the kept names that `tools` lacks (mounted when they appear)."""
        if self._names is None:
            return
        missing = sorted(self._names - {tool.name for tool in tools})
        if missing:
            logger.warning(
                "toolreg: MCP upstream %s has no tool %s (yet): mounted when it appears",
                self._label,
                ", ".join(map(repr, missing)),
            )

    def _apply(self, tools: list[types.Tool], strict: bool) -> None:
        wanted = self._wanted(tools)
        for name, (definition, registration) in list(self._registered.items()):
            if wanted.get(name) != definition:
                del self._registered[name]
                self._publish()
                registration.remove()
        for name, definition in wanted.items():
            if name in self._registered:
                continue
            with self._lock:
                if self._closed:
                    return
            try:
                registration = self._registry.register(self._tool(name, definition))
            except ValueError as exc:
                if strict and self._registry.get(name) is not None:
                    raise ValueError(
                        f"cannot mount {definition.upstream_name!r} from MCP upstream "
                        f"{self._label}: a tool named {name!r} is already registered (give "
                        "mount() a prefix)"
                    ) from None
                logger.warning("toolreg: MCP mount leaves out %r: %s", name, exc)
                continue
            self._registered[name] = (definition, registration)
            self._publish()

    def _publish(self) -> None:
        with self._lock:
            if not self._closed:
                self._names_now = tuple(sorted(self._registered))

    def _wanted(self, tools: list[types.Tool]) -> dict[str, _Definition]:
        wanted: dict[str, _Definition] = {}
        for tool in tools:
            if self._names is not None and tool.name not in self._names:
                continue
            annotations = None
            if tool.annotations is not None:
                dumped = tool.annotations.model_dump(by_alias=True, exclude_none=True, mode="json")
                annotations = json.dumps(dumped, sort_keys=True)
            wanted[self._prefix + tool.name] = _Definition(
                tool.name,
                tool.description or "",
                json.dumps(tool.input_schema, sort_keys=True),
                tool.title,
                annotations,
            )
        return wanted

    def _tool(self, name: str, definition: _Definition) -> Tool:
        annotations: Mapping[str, Any] | None = None
        if definition.annotations is not None:
            annotations = json.loads(definition.annotations)
        return Tool(
            name,
            self._body(definition.upstream_name),
            description=definition.description,
            parameters=json.loads(definition.schema),
            title=definition.title,
            annotations=annotations,
        )
