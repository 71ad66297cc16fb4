"""Tools and their arguments: `Tool`, the argument snapshot, and the JSON Schema check."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from dataclasses import KW_ONLY

    from typing_extensions import Self

from . import _validate
from ._interrupts import INTERRUPTS
from ._record import record
from ._schema_refs import outside_ref, ref_loop
from ._text import safe_repr, safe_str, type_name
from ._validate import INFINITY

__all__ = ["FrozenDict", "Tool", "thaw"]


MAX_DEPTH = 64  # deeper arguments are refused: no model needs them, and recursion must stay bounded

ConcurrencySafe = bool | Callable[[Mapping[str, Any]], bool]

# A body as this module can type it: `fn(args, ctx)`, called with both positionally. The public
# `ToolFunction` (in `_registry`) types them: `ToolContext` is defined above this module (a
# context holds the call's state, which holds its `Tool`), so this module cannot name it.
Body = Callable[[Any, Any], Any]

# What every client accepts (MCP's tool-name rule); stricter provider rules apply per catalog.
NAME_RULE = re.compile(r"[A-Za-z0-9_.-]{1,128}")


@record(frozen=True)
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
    fn: Body
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

    def __init__(
        self,
        name: str,
        fn: Body,
        *,
        description: str = "",
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        concurrency_safe: ConcurrencySafe = False,
        render: Callable[[Any], str] | None = None,
        title: str | None = None,
        annotations: Mapping[str, Any] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        validate_output: bool = False,
    ) -> None:
        self.__dict__.update(
            name=name,
            fn=fn,
            description=description,
            parameters=parameters,
            timeout=timeout,
            concurrency_safe=concurrency_safe,
            render=render,
            title=title,
            annotations=annotations,
            output_schema=output_schema,
            validate_output=validate_output,
        )
        self.__post_init__()

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
            what = f"tool {self.name!r}: timeout"
            _validate.seconds(self.timeout, what, unlimited="pass None for no timeout")
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

    Schemas may come from untrusted places (a remote server's catalog, a plugin), so a `$ref`
    may only point inside the schema itself (``"#"`` or ``"#/..."``): any other `$ref` is a
    `ValueError` here, and nothing is ever fetched (no file is read, no request is made), even
    for a reference that a nested `$id` turned into a remote one. The advertised schema is
    therefore exactly the enforced one. References that loop back to the same value (`a` to
    `b` to `a`, with no property or item in between) are a `ValueError` too (`_schema_refs`).
    """
    if tool.parameters is None:
        return thaw(EMPTY_SCHEMA), None
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
        # Every catalog must stay JSON-serializable; the schema is read once, and the copy
        # holds plain builtins only (no subclass with a custom __eq__ reaches the validator).
        schema: dict[str, Any] = thaw(freeze_arguments(given))
    except InvalidArguments as exc:
        problem = str(exc).replace("arguments", "schema", 1)
        raise ValueError(f"tool {name!r}: the {what} schema is not JSON: {problem}") from None
    outside = outside_ref(schema)
    if outside is not None:
        raise ValueError(
            f"tool {name!r}: the {what} schema refers outside itself ($ref {outside!r});"
            " only references inside the schema ('#/...') are allowed"
        )
    loop = ref_loop(schema)
    if loop is not None:
        raise ValueError(
            f"tool {name!r}: the {what} schema's references loop without descending into the "
            f"value ({' -> '.join(loop)}), which no value could be checked against"
        )
    if "type" not in schema:
        schema = {"type": "object", **schema}
    elif schema["type"] != "object":
        raise ValueError(
            f"tool {name!r}: the {what} schema's root type must be 'object', got {schema['type']!r}"
        )
    # Imported when a schema is first compiled: it loads urllib and ssl, which `import
    # toolreg` should not pay for.
    import fastjsonschema

    try:
        validator: Validator = fastjsonschema.compile(
            thaw(schema), handlers=_NO_FETCHING, use_default=False
        )
    except Exception as exc:
        raise ValueError(f"tool {name!r}: invalid {what} schema: {exc}") from exc
    return schema, validator


def _refuse_fetch(uri: str) -> NoReturn:
    raise ValueError(f"refusing to fetch {uri!r}: a tool schema must be self-contained")


class _NoFetching(Mapping[str, Callable[[str], Any]]):
    """fastjsonschema's URI handlers: every scheme is handled, by refusing (no urlopen)."""

    def __getitem__(self, scheme: str) -> Callable[[str], Any]:
        return _refuse_fetch

    def __contains__(self, scheme: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


_NO_FETCHING = _NoFetching()


class FrozenDict(dict[str, Any]):
    """A read-only dict: the arguments every hook, wrapper, body and observer sees.

    It is a real `dict` (JSON encoders and schema validators accept it) whose mutating methods
    raise `TypeError`, and frozen means frozen: calling `__init__` again changes nothing, and
    `__class__` cannot be reassigned. `copy.copy` and `copy.deepcopy` return it as is; it pickles
    as a `FrozenDict`. (Python cannot stop the unbound base methods, such as
    `dict.__setitem__(frozen, key, value)`; the registry never calls them.)
    """

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        self = _new_dict(cls)
        _fill_dict(self, *args, **kwargs)
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # __new__ filled it. Ignoring the arguments here is what makes `frozen.__init__(...)`,
        # called again later, harmless.
        pass

    def _readonly(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("tool arguments are read-only; copy them with dict(args) to change them")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly
    __ior__ = __setattr__ = __delattr__ = _readonly

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


_new_dict = dict.__new__
_fill_dict = dict.update


def _frozen(items: dict[str, Any]) -> FrozenDict:
    frozen: FrozenDict = _new_dict(FrozenDict)  # C-level: neither __new__ nor __init__ runs
    _fill_dict(frozen, items)
    return frozen


_EMPTY = _frozen({})  # read-only, so one instance serves every call without arguments
_PLAIN = frozenset({str, int, bool, type(None)})  # values a flat dict is copied with as they are


class InvalidArguments(ValueError):
    """Arguments that are not a JSON-compatible mapping; `where` locates the bad value."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.where: list[str] = []  # path segments, innermost last; filled in while unwinding

    def __str__(self) -> str:
        return f"arguments{''.join(self.where)}: {self.problem}"


def freeze_arguments(arguments: object) -> FrozenDict:
    """A deep, read-only copy of JSON-compatible arguments, or `InvalidArguments` saying why.

    The copy holds only plain values: `str`, `int`, `float` subclasses (an `IntEnum`, a `str`
    with a custom `__eq__`) become the builtin value they hold (`bool` stays `bool`), mappings
    become `FrozenDict`, lists and tuples become tuples. Arguments that raise while they are
    read (a mapping whose `items()` raises, a key whose `repr()` raises) are `InvalidArguments`
    too; only `KeyboardInterrupt` and `SystemExit` propagate.
    """
    try:
        if type(arguments) is dict:  # the common case: flat, plain values
            if not arguments:
                return _EMPTY
            for key, value in arguments.items():
                if type(key) is not str or type(value) not in _PLAIN:
                    break
            else:
                return _frozen(arguments)
        if not isinstance(arguments, Mapping):
            raise InvalidArguments(_not_a_mapping(arguments))
        return _freeze_mapping(arguments, 0, set())
    except (InvalidArguments, *INTERRUPTS):
        raise
    except BaseException as exc:
        raise _unreadable(arguments, exc) from None


def _not_a_mapping(arguments: object) -> str:
    """Why `arguments` are refused; for text (what a model or an adapter hands on), whether it
    is JSON at all."""
    if not isinstance(arguments, str):
        return f"must be a mapping, got {type_name(arguments)}"
    import json  # only here: a failed call, and `import toolreg` does not load json

    try:
        decoded = json.loads(arguments)
    except (ValueError, RecursionError) as exc:
        return f"not valid JSON ({safe_str(exc)}); a JSON object is expected"
    if isinstance(decoded, dict):
        return "must be a mapping, got str (JSON text: decode it first)"
    return f"a JSON object is expected, got JSON {_JSON_KINDS.get(type(decoded), 'text')}"


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "true/false"}
_JSON_KINDS[type(None)] = "null"


def _freeze(value: object, depth: int, active: set[int]) -> object:
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:  # the common case first
        return value
    if kind is float:
        if -INFINITY < value < INFINITY:  # type: ignore[operator]  # finite (NaN compares false)
            return value
        raise InvalidArguments(f"{value!r} is not JSON (no NaN or infinity)")
    # Subclasses: the plain value they hold, so no custom __eq__, __hash__ or __str__ reaches
    # a hook or the body. The base-class slots (not the subclass's overrides) make the copy.
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        plain = float.__float__(value)
        if -INFINITY < plain < INFINITY:
            return plain
        raise InvalidArguments(f"{plain!r} is not JSON (no NaN or infinity)")
    if isinstance(value, Mapping):
        return _freeze_mapping(value, depth + 1, active)
    if isinstance(value, (list, tuple)):
        return _freeze_sequence(value, depth + 1, active)
    raise InvalidArguments(f"a {type_name(value)} is not JSON")


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
    try:
        for key, item in value.items():
            if type(key) is not str:
                key = _plain_key(key, items)
            try:
                items[key] = _freeze(item, depth, active)
            except InvalidArguments as exc:
                exc.where.insert(0, f"[{key!r}]")
                raise
    except (InvalidArguments, *INTERRUPTS):
        raise
    except BaseException as exc:
        raise _unreadable(value, exc) from None
    active.discard(marker)
    return _frozen(items)


def _plain_key(key: object, items: dict[str, Any]) -> str:
    if not isinstance(key, str):
        shown = safe_repr(key, 80)
        raise InvalidArguments(f"has a {type_name(key)} key {shown}; JSON keys are str")
    plain = str.__str__(key)
    if plain in items:  # two keys the mapping kept apart are one key once plain
        raise InvalidArguments(f"has two keys equal to {plain!r}")
    return plain


def _freeze_sequence(
    value: list[Any] | tuple[Any, ...], depth: int, active: set[int]
) -> tuple[Any, ...]:
    marker = _enter(value, depth, active)
    frozen = []
    try:
        for index, item in enumerate(value):
            try:
                frozen.append(_freeze(item, depth, active))
            except InvalidArguments as exc:
                exc.where.insert(0, f"[{index}]")
                raise
    except (InvalidArguments, *INTERRUPTS):
        raise
    except BaseException as exc:
        raise _unreadable(value, exc) from None
    active.discard(marker)
    return tuple(frozen)


def _unreadable(value: object, exc: BaseException) -> InvalidArguments:
    return InvalidArguments(f"a {type_name(value)} raised {type_name(exc)} when read")
