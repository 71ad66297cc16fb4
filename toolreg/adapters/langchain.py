"""LangChain tools from a registry, and registry tools from LangChain (`toolreg[langchain]`).

`as_langchain_tools(registry)` gives one `BaseTool` per registry tool. Each runs its calls
through the registry's pipeline as model-driven calls (`start_if_cancelled=False`):

* `invoke` blocks on `registry.execute`; `ainvoke` awaits the asyncio facade, so the event loop
  is never blocked. Cancelling the task awaiting `ainvoke` cancels the call's token and waits
  until its body has settled before `CancelledError` propagates.
* A per-invocation token travels in the config: `config={"configurable": {"toolreg_token":
  token}}`. The call is cancelled by it, by the adapter's `token=`, and by the registry.
* Invoked with a model's tool call (`{"type": "tool_call", "id": ..., "args": ...}`) the tool
  returns a `ToolMessage` whose content is `result.content`, whose artifact is the `ToolResult`,
  and whose status is `"error"` for any failure. Invoked with plain arguments it returns
  `result.content`, as LangChain tools do. A call that could not run at all (the registry
  closed, its executor refusing the call) raises `RegistryClosedError` or
  `ExecutorRefusedError`, as `execute` does.
* The schema is the registry's, as a JSON Schema `args_schema`: LangChain hands it to the model
  unchanged (no strict-mode rewriting unless you ask `bind_tools(..., strict=True)`), and does
  not validate against it: the registry does, so bad arguments reach observers as
  `INVALID_ARGS`. Arguments may be a mapping or JSON text, plain or as a tool call's `args`
  (LangChain itself refuses text for a JSON Schema tool); text that is not JSON, or JSON that
  is not an object, is handed to the registry as it is and fails there as `INVALID_ARGS`.

`from_langchain(registry, lc_tool)` registers a LangChain tool as a registry tool: a tool with a
native async implementation becomes an `async def` body (cancelled when the call's token is);
any other runs its sync implementation on a worker, which cannot be interrupted: it is joined.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

try:
    from langchain_core.messages import ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, StructuredTool, ToolException
    from langchain_core.tools import Tool as SimpleTool
    from langchain_core.tools.base import _prep_run_args
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from pydantic import PrivateAttr
except ImportError as exc:  # the extra is not installed
    raise ImportError(
        "toolreg.adapters.langchain needs langchain-core: "
        "pip install 'toolreg-quiescent[langchain]'"
    ) from exc

from .. import (
    CancelToken,
    Registration,
    Tool,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResult,
    thaw,
)
from ..aio import AsyncToolRegistry
from ._common import (
    Selected,
    call_token,
    check_registry,
    check_token,
    parse_arguments,
    select_tools,
)

__all__ = ["TOKEN_KEY", "as_langchain_tools", "from_langchain"]

TOKEN_KEY = "toolreg_token"
"""The key of `config["configurable"]` that carries a per-invocation `CancelToken`."""


def as_langchain_tools(
    registry: ToolRegistry,
    names: Iterable[str] | None = None,
    token: CancelToken | None = None,
) -> list[BaseTool]:
    """One LangChain `BaseTool` per registry tool (all of them, sorted by name, for None).

    `token` cancels every call these tools make (e.g. the turn's token), besides each
    invocation's own `config["configurable"]["toolreg_token"]`. The tools are safe to use from
    many threads and tasks at once; unknown or repeated names raise `ValueError`.

    Example::

        tools = as_langchain_tools(registry, ["search"])
        message = tools[0].invoke({"type": "tool_call", "id": "c1", "name": "search",
                                   "args": {"q": "x"}})   # a ToolMessage
    """
    check_registry(registry)
    check_token(token)
    facade = AsyncToolRegistry(registry)
    selection = select_tools(registry, names)
    return [_RegistryTool.build(registry, facade, token, selected) for selected in selection]


@dataclass(frozen=True)
class _Invocation:
    """What `run`/`arun` know about one invocation and `_run`/`_arun` need."""

    tool_call_id: str | None
    token: CancelToken | None


# Set by `run`/`arun` for the `_run`/`_arun` they call (LangChain copies the context into them).
_INVOCATION: contextvars.ContextVar[_Invocation | None] = contextvars.ContextVar(
    "toolreg_langchain_invocation", default=None
)


class _RegistryTool(BaseTool):
    """A registry tool seen through LangChain's `BaseTool`."""

    _registry: ToolRegistry = PrivateAttr()
    _facade: AsyncToolRegistry = PrivateAttr()
    _token: CancelToken | None = PrivateAttr(default=None)

    @classmethod
    def build(
        cls,
        registry: ToolRegistry,
        facade: AsyncToolRegistry,
        token: CancelToken | None,
        selected: Selected,
    ) -> _RegistryTool:
        tool = cls(
            name=selected.tool.name,
            description=selected.tool.description,
            args_schema=selected.schema,
        )
        tool._registry = registry
        tool._facade = facade
        tool._token = token
        return tool

    # LangChain's own `invoke` cannot take a tool call whose `args` is JSON text (it copies
    # them as a dict): such a call goes to `run` with the text as its input, as LangChain does
    # for a plain string input.
    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """`BaseTool.invoke`, also for a tool call whose `args` is not a mapping."""
        tool_input, run_kwargs = _prepare(input, config, kwargs)
        return self.run(tool_input, **run_kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """`BaseTool.ainvoke`, also for a tool call whose `args` is not a mapping."""
        tool_input, run_kwargs = _prepare(input, config, kwargs)
        return await self.arun(tool_input, **run_kwargs)

    # `run` and `arun` are where LangChain still holds the tool call's id and the config; the
    # id decides whether a ToolMessage comes back, the config carries the invocation's token.
    def run(self, tool_input: str | dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """`BaseTool.run`, with the invocation's tool call id and token kept for the call."""
        reset = _INVOCATION.set(_invocation(kwargs))
        try:
            return super().run(tool_input, *args, **kwargs)
        finally:
            _INVOCATION.reset(reset)

    async def arun(self, tool_input: str | dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """`BaseTool.arun`, with the invocation's tool call id and token kept for the call."""
        reset = _INVOCATION.set(_invocation(kwargs))
        try:
            return await super().arun(tool_input, *args, **kwargs)
        finally:
            _INVOCATION.reset(reset)

    def _to_args_and_kwargs(
        self, tool_input: Any, tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A mapping's items as keywords (LangChain's own way); anything else is parsed here.

        LangChain refuses a string for a JSON Schema tool before the registry sees it, so text
        is parsed as the other adapters parse it (`parse_arguments`): a JSON object becomes the
        keywords, and whatever is not a mapping goes to `_run` as its one positional argument,
        for the registry to refuse (`INVALID_ARGS`) where observers see it.
        """
        arguments = parse_arguments(tool_input) if isinstance(tool_input, str) else tool_input
        if isinstance(arguments, dict):
            return (), dict(arguments)  # a copy: LangChain may add to the keywords
        return (arguments,), {}

    # `self` is positional-only: a model argument named "self" must not collide with it. A
    # positional argument is the whole of arguments that are not a mapping (see above).
    def _run(self, /, *raw: Any, **kwargs: Any) -> Any:
        invocation = _INVOCATION.get() or _Invocation(None, None)
        call = ToolCall(self.name, raw[0] if raw else kwargs, call_id=invocation.tool_call_id)
        with call_token(self._token, invocation.token) as token:
            result = self._registry.execute(call, token=token, start_if_cancelled=False)
        return _output(self.name, result, invocation.tool_call_id)

    async def _arun(self, /, *raw: Any, **kwargs: Any) -> Any:
        invocation = _INVOCATION.get() or _Invocation(None, None)
        call = ToolCall(self.name, raw[0] if raw else kwargs, call_id=invocation.tool_call_id)
        with call_token(self._token, invocation.token) as token:
            result = await self._facade.execute(call, token=token, start_if_cancelled=False)
        return _output(self.name, result, invocation.tool_call_id)


def _prepare(
    value: Any, config: RunnableConfig | None, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """LangChain's own split of an invocation into the tool input and `run`'s keywords.

    A tool call whose `args` is not a mapping (JSON text, say) keeps it as the tool input:
    LangChain would fail copying it, and no observer would see the call.
    """
    if isinstance(value, dict) and value.get("type") == "tool_call":
        raw = value.get("args")
        if not isinstance(raw, dict):
            _, run_kwargs = _prep_run_args({**value, "args": {}}, config, **kwargs)
            return raw, run_kwargs
    return _prep_run_args(value, config, **kwargs)


def _invocation(run_kwargs: Mapping[str, Any]) -> _Invocation:
    config = run_kwargs.get("config") or {}
    configurable = config.get("configurable") or {}
    token = check_token(configurable.get(TOKEN_KEY), f'config["configurable"][{TOKEN_KEY!r}]')
    tool_call_id = run_kwargs.get("tool_call_id")
    return _Invocation(tool_call_id if isinstance(tool_call_id, str) else None, token)


def _output(name: str, result: ToolResult[Any], tool_call_id: str | None) -> Any:
    """What the tool returns: a ToolMessage for a model's tool call, else the content."""
    if tool_call_id is None:
        return result.content
    return ToolMessage(
        content=result.content,
        artifact=result,
        tool_call_id=tool_call_id,
        name=name,
        status="success" if result.ok else "error",
    )


def from_langchain(registry: ToolRegistry, lc_tool: BaseTool, **tool_kwargs: Any) -> Registration:
    """Register a LangChain tool as a registry tool; returns the registration.

    The registry tool takes the LangChain tool's name, description and the parameters schema
    LangChain would send a model (`convert_to_openai_tool`); `tool_kwargs` reach `Tool` and
    override them (`name=` too, e.g. for a LangChain name the registry refuses), or add
    `timeout=`, `concurrency_safe=`, and so on.

    The body hands the arguments to the LangChain tool as plain Python (`thaw`), as a tool call
    whose id is the registry call's, with the call's token in
    `config["configurable"]["toolreg_token"]`. A LangChain tool with a native async
    implementation (a `coroutine`, or an overridden `_arun`) becomes an `async def` body,
    cancelled when the call's token is (`ABORTED`); any other runs its sync implementation on
    a worker and is joined, however long it takes. The value is the tool's message content; a
    `ToolMessage` with `status="error"` (a handled `ToolException`) or a raised exception is a
    `TOOL_ERROR` (the former reads `"Error: ToolException: <its content>"`).
    """
    check_registry(registry)
    if not isinstance(lc_tool, BaseTool):
        raise TypeError(f"from_langchain takes a LangChain BaseTool, got {type(lc_tool).__name__}")
    name = tool_kwargs.pop("name", lc_tool.name)
    options: dict[str, Any] = {
        "description": lc_tool.description,
        "parameters": convert_to_openai_tool(lc_tool)["function"]["parameters"],
    }
    options.update(tool_kwargs)
    if _is_async(lc_tool):

        async def run_async(args: Mapping[str, Any], ctx: ToolContext) -> Any:
            return _value(await lc_tool.ainvoke(_tool_call(lc_tool, args, ctx), _config(ctx)))

        return registry.register(Tool(name, run_async, **options))

    def run(args: Mapping[str, Any], ctx: ToolContext) -> Any:
        return _value(lc_tool.invoke(_tool_call(lc_tool, args, ctx), _config(ctx)))

    return registry.register(Tool(name, run, **options))


def _is_async(lc_tool: BaseTool) -> bool:
    if isinstance(lc_tool, (StructuredTool, SimpleTool)):
        return lc_tool.coroutine is not None
    return type(lc_tool)._arun is not BaseTool._arun


def _tool_call(lc_tool: BaseTool, args: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {
        "type": "tool_call",
        "id": ctx.call.call_id,
        "name": lc_tool.name,
        "args": thaw(args),
    }


def _config(ctx: ToolContext) -> Any:
    return {"configurable": {TOKEN_KEY: ctx.token}}


def _value(output: Any) -> Any:
    """The registry value of a LangChain tool's output."""
    if isinstance(output, ToolMessage):
        if output.status == "error":
            raise ToolException(_text(output.content))
        return output.content
    return output


def _text(content: Any) -> str:
    return content if isinstance(content, str) else str(cast(object, content))
