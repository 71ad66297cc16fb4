"""Tools and their arguments: `Tool`, the argument snapshot, and the JSON Schema check."""

from __future__ import annotations

import copy
import logging
import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, NoReturn

import fastjsonschema

from ._progress import ProgressSink, check_progress

__all__ = ["FrozenDict", "Tool", "ToolContext", "thaw"]

logger = logging.getLogger("toolreg")

MAX_DEPTH = 64  # deeper arguments are refused: no model needs them, and recursion must stay bounded

ConcurrencySafe = bool | Callable[[Mapping[str, Any]], bool]

# What every client accepts (MCP's tool-name rule); stricter provider rules apply per catalog.
NAME_RULE = re.compile(r"[A-Za-z0-9_.-]{1,128}")


@dataclass(frozen=True)
class Tool:
    """A named tool: its body `fn(args, ctx)` and what a model or the scheduler needs to know.

    Every field after `fn` is keyword-only:

    * `description`: what the model reads about the tool.
    * `parameters`: a JSON Schema the arguments must satisfy, with an object root (compiled
      once, at registration; a schema without a root `"type"` is treated as `"object"`).
    * `timeout`: seconds a call may take; enforced by `TimeoutPolicy`, never by the registry.
    * `concurrency_safe`: True, or `fn(args) -> bool`, lets batch calls overlap.
    * `render`: `render(value) -> str` makes the model-visible content of a success.
    * `title`: a human-readable name for catalogs that show one (MCP).
    * `annotations`: hints for clients (MCP's `readOnlyHint`, `destructiveHint`,
      `idempotentHint`, `openWorldHint`); copied and frozen here, JSON values only.
    * `output_schema`: a JSON Schema (object root) of the body's value, compiled at
      registration; with `validate_output=True` a value that does not match it is a
      `TOOL_ERROR`, and only then do catalogs advertise it.

    The name must match `[A-Za-z0-9_.-]{1,128}`. Bad definitions raise `TypeError` or
    `ValueError` here or at registration, never at call time.
    """

    name: str
    fn: Callable[..., Any]
    _: KW_ONLY
    description: str = ""
    parameters: Mapping[str, Any] | None = None
    timeout: float | None = None
    concurrency_safe: ConcurrencySafe = False
    render: Callable[[Any], str] | None = None
    title: str | None = None
    annotations: Mapping[str, Any] | None = None
    output_schema: Mapping[str, Any] | None = None
    validate_output: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_RULE.fullmatch(self.name):
            raise ValueError(
                f"a tool name must match [A-Za-z0-9_.-]{{1,128}} (what every client accepts), "
                f"got {self.name!r}"
            )
        if not callable(self.fn):
            raise TypeError(
                f"tool {self.name!r}: fn must be callable, got {type(self.fn).__name__}"
            )
        if not isinstance(self.description, str):
            raise TypeError(f"tool {self.name!r}: description must be a str")
        if self.parameters is not None and not isinstance(self.parameters, Mapping):
            raise TypeError(f"tool {self.name!r}: parameters must be a JSON Schema mapping")
        if self.timeout is not None:
            _check_timeout(self.name, self.timeout)
        if not (isinstance(self.concurrency_safe, bool) or callable(self.concurrency_safe)):
            raise TypeError(f"tool {self.name!r}: concurrency_safe must be a bool or a callable")
        if self.render is not None and not callable(self.render):
            raise TypeError(f"tool {self.name!r}: render must be callable")
        self._check_metadata()

    def _check_metadata(self) -> None:
        if self.title is not None and not isinstance(self.title, str):
            raise TypeError(f"tool {self.name!r}: title must be a str or None")
        if self.annotations is not None:
            if not isinstance(self.annotations, Mapping):
                raise TypeError(f"tool {self.name!r}: annotations must be a mapping")
            try:
                frozen = freeze_arguments(self.annotations)
            except InvalidArguments as exc:
                problem = str(exc).replace("arguments", "annotations", 1)
                raise ValueError(f"tool {self.name!r}: {problem}") from None
            object.__setattr__(self, "annotations", frozen)
        if self.output_schema is not None and not isinstance(self.output_schema, Mapping):
            raise TypeError(f"tool {self.name!r}: output_schema must be a JSON Schema mapping")
        if not isinstance(self.validate_output, bool):
            raise TypeError(f"tool {self.name!r}: validate_output must be a bool")
        if self.validate_output and self.output_schema is None:
            raise ValueError(f"tool {self.name!r}: validate_output=True needs an output_schema")

    def __repr__(self) -> str:
        return f"<Tool {self.name!r}>"


def _check_timeout(name: str, timeout: object) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"tool {name!r}: timeout must be a number of seconds")
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"tool {name!r}: timeout must be positive and finite, got {timeout!r}")


Validator = Callable[[Any], Any]


EMPTY_SCHEMA: Mapping[str, Any] = {"type": "object", "properties": {}}


def compile_schema(tool: Tool) -> tuple[dict[str, Any], Validator | None]:
    """A private copy of the tool's parameters schema and its validator, compiled once.

    The copy is what the catalog shows, so a caller mutating its dict after registration
    cannot advertise a schema other than the one enforced. A schema without a root `"type"`
    gets `"type": "object"` (arguments are always an object, so this changes nothing that is
    accepted, and every client requires it); another root type, or an invalid schema, is a
    `ValueError`. fastjsonschema generates Python code per schema, so a check costs a few
    function calls instead of a walk of the schema per call.
    """
    if tool.parameters is None:
        return _plain(EMPTY_SCHEMA), None
    return _compile_object_schema(tool.name, "parameters", tool.parameters)


def compile_output_schema(tool: Tool) -> tuple[dict[str, Any] | None, Validator | None]:
    """The tool's output schema (normalized like `parameters`) and its validator, or Nones."""
    if tool.output_schema is None:
        return None, None
    return _compile_object_schema(tool.name, "output_schema", tool.output_schema)


def _compile_object_schema(
    name: str, what: str, given: Mapping[str, Any]
) -> tuple[dict[str, Any], Validator]:
    try:
        freeze_arguments(given)  # every catalog must stay JSON-serializable
    except InvalidArguments as exc:
        problem = str(exc).replace("arguments", "schema", 1)
        raise ValueError(f"tool {name!r}: the {what} schema is not JSON: {problem}") from None
    schema = _plain(given)
    if "type" not in schema:
        schema = {"type": "object", **schema}
    elif schema["type"] != "object":
        raise ValueError(
            f"tool {name!r}: the {what} schema's root type must be 'object', "
            f"got {schema['type']!r}"
        )
    try:
        validator: Validator = fastjsonschema.compile(_plain(schema), use_default=False)
    except Exception as exc:
        raise ValueError(f"tool {name!r}: invalid {what} schema: {exc}") from exc
    return schema, validator


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return copy.copy(value)


class FrozenDict(dict[str, Any]):
    """A read-only dict: the arguments every hook, wrapper, body and observer sees.

    It is a real `dict` (JSON encoders and schema validators accept it) whose mutating methods
    raise `TypeError`.
    """

    __slots__ = ()

    def _readonly(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("tool arguments are read-only; copy them with dict(args) to change them")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly
    __ior__ = _readonly

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))


def thaw(value: Any) -> Any:
    """A deep mutable copy of the containers in `value`: plain Python to hand to other code.

    `FrozenDict` and `dict` become new `dict`s, tuples and lists new `list`s, recursively;
    other values are returned as they are.
    """
    if isinstance(value, dict):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(item) for item in value]
    return value


class InvalidArguments(ValueError):
    """Arguments that are not a JSON-compatible mapping; `where` locates the bad value."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.where: list[str] = []  # path segments, innermost last; filled in while unwinding

    def __str__(self) -> str:
        return f"arguments{''.join(self.where)}: {self.problem}"


def freeze_arguments(arguments: object) -> FrozenDict:
    """A deep, read-only copy of JSON-compatible arguments, or `InvalidArguments` saying why."""
    if not isinstance(arguments, Mapping):
        raise InvalidArguments(f"must be a mapping, got {type(arguments).__name__}")
    return _freeze_mapping(arguments, 0, set())


def _freeze(value: object, depth: int, active: set[int]) -> object:
    if isinstance(value, (str, int)) or value is None:  # bool is an int
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise InvalidArguments(f"{value!r} is not JSON (no NaN or infinity)")
    if isinstance(value, Mapping):
        return _freeze_mapping(value, depth + 1, active)
    if isinstance(value, (list, tuple)):
        return _freeze_sequence(value, depth + 1, active)
    raise InvalidArguments(f"a {type(value).__name__} is not JSON")


def _enter(value: object, depth: int, active: set[int]) -> int:
    if depth >= MAX_DEPTH:
        raise InvalidArguments(f"nested deeper than {MAX_DEPTH} levels")
    marker = id(value)
    if marker in active:
        raise InvalidArguments("contains itself (a cycle)")
    active.add(marker)
    return marker


def _freeze_mapping(value: Mapping[Any, Any], depth: int, active: set[int]) -> FrozenDict:
    marker = _enter(value, depth, active)
    items: dict[str, Any] = {}
    for key, item in value.items():
        if type(key) is not str:
            raise InvalidArguments(f"has a {type(key).__name__} key {key!r}; JSON keys are str")
        try:
            items[key] = _freeze(item, depth, active)
        except InvalidArguments as exc:
            exc.where.insert(0, f"[{key!r}]")
            raise
    active.discard(marker)
    return FrozenDict(items)


def _freeze_sequence(
    value: list[Any] | tuple[Any, ...], depth: int, active: set[int]
) -> tuple[Any, ...]:
    marker = _enter(value, depth, active)
    frozen = []
    for index, item in enumerate(value):
        try:
            frozen.append(_freeze(item, depth, active))
        except InvalidArguments as exc:
            exc.where.insert(0, f"[{index}]")
            raise
    active.discard(marker)
    return tuple(frozen)


class ToolContext:
    """What a running body gets besides its arguments.

    * `call`: the call being executed (frozen arguments).
    * `token`: the fused caller + wrapper token the body must observe.
    * `defer_context(item)`: keep `item` in the result's `contexts` (kept through cancellation).
    * `execute(call_or_name, arguments=None)`: a nested call, run inline on this thread with this
      call's token as its caller token, so it cannot deadlock on a busy pool; like
      `start_if_cancelled=False`, it starts no body once this call is cancelled.
    * `report_progress(progress, total=None, message=None)`: tell the caller how far along the
      body is (see the method).

    After the body has settled, `defer_context`, `execute` and `report_progress` raise
    `RuntimeError`.
    """

    __slots__ = ("_contexts", "_lock", "_nested", "_progress", "_settled", "call", "token")

    def __init__(
        self,
        call: Any,
        token: Any,
        nested: Callable[[object, Mapping[str, Any] | None, Any], Any],
        progress: ProgressSink | None = None,
    ) -> None:
        self.call = call
        self.token = token
        self._nested = nested
        self._progress = progress
        self._contexts: list[Any] = []
        self._settled = False
        self._lock = threading.Lock()  # guards _contexts and _settled

    def defer_context(self, item: object) -> None:
        """Keep `item` for the result's `contexts` (in call order)."""
        with self._lock:
            if self._settled:
                raise RuntimeError("defer_context() after the tool body has returned")
            self._contexts.append(item)

    def execute(self, call_or_name: object, arguments: Mapping[str, Any] | None = None) -> Any:
        """Run a nested tool call inline, under this call's token; returns its `ToolResult`."""
        if self._settled:
            raise RuntimeError("ctx.execute() after the tool body has returned")
        return self._nested(call_or_name, arguments, self.token)

    def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Report progress to the `progress=` callback of the `execute` that runs this call.

        `progress` and `total` are real numbers (`TypeError` for a bool or a non-number,
        `ValueError` for NaN or an infinity), `message` a str or None. A value not greater
        than the last one reported for this call (across retry attempts) is dropped, so the
        callback only ever sees increasing values. The sync callback runs on this thread; an
        awaited call's callback is scheduled on its event loop. Progress of a nested call's
        body is dropped. Raises `RuntimeError` after the body has settled.
        """
        check_progress(progress, total, message)
        if self._settled:
            raise RuntimeError("report_progress() after the tool body has returned")
        sink = self._progress
        if sink is not None:
            sink.report(self.call, progress, total, message)

    def settle(self) -> tuple[Any, ...]:
        """Close the context when the body settled; return the deferred items."""
        with self._lock:
            self._settled = True
            return tuple(self._contexts)

    def __repr__(self) -> str:
        return f"<ToolContext {self.call.name!r} call_id={self.call.call_id!r}>"
