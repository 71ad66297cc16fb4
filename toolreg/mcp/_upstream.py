"""Where a mounted MCP server lives (a command line, or a URL), and what can go wrong with it.

`parse_upstream(value)` accepts what `toolreg.mcp.mount` documents: a command line (a `str`,
split like a shell would, or a list of arguments), an ``http(s)://`` URL, or one entry of the
usual client configuration (`{"command", "args", "env", "cwd"}` or `{"url", "headers"}`, with
an optional `"type"` that must agree). Everything is checked here, before anything starts, so a
typo is a `TypeError` or `ValueError` naming the key, never a failed connection later.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

__all__ = [
    "Upstream",
    "UpstreamError",
    "UpstreamToolError",
    "UpstreamUnavailable",
    "parse_upstream",
]

_STDIO_KEYS = frozenset({"command", "args", "env", "cwd", "type"})
_HTTP_KEYS = frozenset({"url", "headers", "type"})
_STDIO_TYPES = frozenset({"stdio"})
_HTTP_TYPES = frozenset({"http", "streamable-http", "streamableHttp", "streamable_http"})
_LABEL_LIMIT = 120


class UpstreamError(Exception):
    """A mounted call that the upstream MCP server did not answer with a result.

    Raised by a mounted tool's body, so the call is a `TOOL_ERROR` whose message names the
    upstream. This class itself is a protocol error answer (`code` is its JSON-RPC code, e.g.
    -32602 for a tool the upstream does not know) or an answer that could not be read (`code`
    None). The hierarchy::

        UpstreamError               a protocol error, or an unreadable answer
        +-- UpstreamToolError       the upstream answered isError: true
        +-- UpstreamUnavailable     it could not be started, died, or disconnected
    """

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class UpstreamToolError(UpstreamError):
    """The upstream answered the call with `isError: true`; `str()` is its text."""


class UpstreamUnavailable(UpstreamError, ConnectionError):
    """The upstream could not be started or initialized, or it died or disconnected.

    `mount()` raises it when the upstream does not start within its `timeout`; a mounted call
    fails with it when the connection is lost while the call is in flight (the mount
    reconnects on a later call), or when the mount was closed or its token cancelled.
    """


@dataclass(frozen=True)
class Upstream:
    """A parsed upstream: either `command` (+ `args`, `env`, `cwd`) or `url` (+ `headers`)."""

    label: str  # how messages name it: the command line, or the URL without credentials
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[tuple[Any, Any]]:
        """The transport's streams; leaving stops the process (or ends the HTTP session)."""
        if self.command is not None:
            params = StdioServerParameters(
                command=self.command,
                args=list(self.args),
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
            )
            # Today's stderr, not the one bound when the SDK was imported.
            async with stdio_client(params, errlog=sys.stderr) as streams:
                yield streams
            return
        assert self.url is not None
        if self.headers is None:
            async with streamable_http_client(self.url) as streams:
                yield streams
            return
        import httpx2  # the SDK's HTTP client; only a mount with headers builds its own

        timeout = httpx2.Timeout(30.0, read=300.0)  # the SDK's own defaults for MCP
        headers = dict(self.headers)
        async with (
            httpx2.AsyncClient(headers=headers, timeout=timeout) as client,
            streamable_http_client(self.url, http_client=client) as streams,
        ):
            yield streams


def parse_upstream(value: object) -> Upstream:
    """The `Upstream` that `value` describes; `TypeError`/`ValueError` saying what is wrong."""
    if isinstance(value, str):
        if _is_url(value):
            return _http(value, None)
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"upstream command line {value!r} cannot be split: {exc}") from None
        return _stdio(words, None, None)
    if isinstance(value, Mapping):
        return _from_entry(value)
    if isinstance(value, Sequence):
        return _stdio(_strings(value, "upstream command line"), None, None)
    raise TypeError(
        "upstream must be a command line (str or list), an http(s) URL, or a configuration "
        f"entry such as {{'command': ..., 'args': [...]}} or {{'url': ...}}; got "
        f"{type(value).__name__}"
    )


def _from_entry(entry: Mapping[Any, Any]) -> Upstream:
    if "command" in entry and "url" in entry:
        raise ValueError("an upstream entry has 'command' (stdio) or 'url' (HTTP), not both")
    if "url" in entry:
        _refuse_unknown(entry, _HTTP_KEYS, _HTTP_TYPES, "an HTTP")
        url = entry["url"]
        if not isinstance(url, str) or not _is_url(url):
            raise ValueError(f"upstream 'url' must be an http:// or https:// URL, got {url!r}")
        headers = entry.get("headers")
        return _http(url, None if headers is None else _string_map(headers, "'headers'"))
    if "command" not in entry:
        raise ValueError("an upstream entry needs 'command' (stdio) or 'url' (streamable HTTP)")
    _refuse_unknown(entry, _STDIO_KEYS, _STDIO_TYPES, "a stdio")
    command = entry["command"]
    if not isinstance(command, str) or not command:
        raise TypeError(f"upstream 'command' must be a non-empty str, got {command!r}")
    args = _strings(entry.get("args", ()), "upstream 'args'")
    env = entry.get("env")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise TypeError(f"upstream 'cwd' must be a str, got {type(cwd).__name__}")
    return _stdio([command, *args], None if env is None else _string_map(env, "'env'"), cwd)


def _refuse_unknown(
    entry: Mapping[Any, Any], keys: frozenset[str], types: frozenset[str], kind: str
) -> None:
    unknown = sorted(repr(key) for key in entry if key not in keys)
    if unknown:
        raise ValueError(
            f"{kind} upstream entry takes {sorted(keys)}; unknown: {', '.join(unknown)}"
        )
    if "type" in entry and entry["type"] not in types:
        raise ValueError(f"{kind} upstream entry cannot have 'type' {entry['type']!r}")


def _stdio(words: list[str], env: Mapping[str, str] | None, cwd: str | None) -> Upstream:
    if not words or not words[0]:
        raise ValueError("upstream command line is empty")
    return Upstream(
        label=_cut(shlex.join(words)), command=words[0], args=tuple(words[1:]), env=env, cwd=cwd
    )


def _http(url: str, headers: Mapping[str, str] | None) -> Upstream:
    return Upstream(label=_cut(_without_credentials(url)), url=url, headers=headers)


def _is_url(text: str) -> bool:
    return text.startswith(("http://", "https://")) and len(text) > len("https://")


def _strings(value: object, what: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f"{what} must be a list of str, got {type(value).__name__}")
    words = list(value)
    for word in words:
        if not isinstance(word, str):
            raise TypeError(f"{what} must be a list of str, got an item {word!r}")
    return words


def _string_map(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise TypeError(f"upstream {what} must be a mapping of str to str")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise TypeError(f"upstream {what} must map str to str, got {key!r}: {item!r}")
    return dict(value)


def _without_credentials(url: str) -> str:
    """The URL without `user:password@` and without its query (tokens live there too)."""
    scheme, _, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    host = authority.rpartition("@")[2]
    return f"{scheme}://{host}{slash}{path.partition('?')[0]}"


def _cut(text: str) -> str:
    return text if len(text) <= _LABEL_LIMIT else f"{text[: _LABEL_LIMIT - 3]}..."
