"""Frozen dataclasses without importing `dataclasses`: `@record(frozen=True, slots=...)`.

Importing `dataclasses` (and `inspect`, which it imports) and letting it generate and compile
each class's methods was a third of the time `import toolreg` took. A class decorated with
`record` is written like a frozen dataclass, plus a hand-written `__init__` (whose parameters,
defaults and `__post_init__` call are those the dataclass would generate); the other methods a
frozen dataclass has (`__repr__` unless the class defines one, `__eq__`, `__hash__`, the frozen
`__setattr__` and `__delattr__`, `__match_args__`, the pickling methods of a slots class,
`__replace__` on Python 3.13+) are plain functions here, so nothing is compiled at import. To
`dataclasses` (`fields`, `replace`, `asdict`, `is_dataclass`) such a class is the frozen
dataclass it was written as: its `__dataclass_fields__` and `__dataclass_params__` are built,
by `dataclasses` itself from the same declaration, the first time something reads them.
Assigning to an instance raises `dataclasses.FrozenInstanceError`, as a frozen dataclass does.

Type checkers see `dataclasses.dataclass` itself. Supported: fields with or without a plain
default, and one `_: KW_ONLY` marker; not supported (nothing here needs them): `field()`,
`ClassVar`, `InitVar`, and fields inherited from a base class.
"""

from __future__ import annotations

import _thread
import operator
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

__all__ = ["record"]

C = TypeVar("C", bound=type)

_KW_ONLY = "KW_ONLY"  # the marker's annotation, a string under `from __future__ import annotations`


class _Declaration:
    """What a record class declares, and its dataclass introspection once something asks."""

    __slots__ = ("annotations", "cls", "defaults", "introspection", "keyword_only", "slots")

    def __init__(self, cls: type, slots: bool) -> None:
        self.cls = cls
        self.slots = slots
        self.annotations: dict[str, Any] = {}  # field name -> annotation, in declaration order
        self.keyword_only: set[str] = set()
        keyword_only = False
        # A class's own annotations (Python 3.10+; `inspect.get_annotations` would load inspect).
        for name, annotation in cls.__annotations__.items():
            if not isinstance(annotation, str):  # the KW_ONLY marker is recognized by its text
                need = "`from __future__ import annotations`"
                raise TypeError(f"record {cls.__qualname__} needs {need} in its module")
            if annotation == _KW_ONLY:
                keyword_only = True
                continue
            self.annotations[name] = annotation
            if keyword_only:
                self.keyword_only.add(name)
        own = cls.__dict__
        self.defaults = {name: own[name] for name in self.annotations if name in own}
        self.introspection: dict[str, Any] | None = None

    def introspect(self) -> dict[str, Any]:
        """`__dataclass_fields__` and `__dataclass_params__`, as `dataclasses` builds them."""
        if self.introspection is None:
            # Two threads racing here each build the same dicts; either result is the answer.
            self.introspection = self._build()
        return self.introspection

    def _build(self) -> dict[str, Any]:
        import dataclasses

        namespace: dict[str, Any] = {
            "__module__": self.cls.__module__,
            "__qualname__": self.cls.__qualname__,
            "__annotations__": dict(self.annotations),
        }
        for name in self.annotations:
            default = self.defaults.get(name, dataclasses.MISSING)
            if name in self.keyword_only:
                namespace[name] = dataclasses.field(default=default, kw_only=True)
            elif default is not dataclasses.MISSING:
                namespace[name] = default
        shadow: Any = dataclasses.dataclass(frozen=True, slots=self.slots)(
            type(self.cls.__name__, (), namespace)
        )
        return {
            "__dataclass_fields__": shadow.__dataclass_fields__,
            "__dataclass_params__": shadow.__dataclass_params__,
        }


class _Introspected:
    """A class attribute that `dataclasses` reads; its value is built on first read."""

    __slots__ = ("_declaration", "_name")

    def __init__(self, declaration: _Declaration, name: str) -> None:
        self._declaration = declaration
        self._name = name

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        return self._declaration.introspect()[self._name]


def _frozen(message: str) -> NoReturn:
    from dataclasses import FrozenInstanceError  # only a misuse pays for the import

    raise FrozenInstanceError(message)


def _values_of(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function returning an instance's field values as a tuple (what eq and hash compare)."""
    if len(names) == 1:
        get = operator.attrgetter(names[0])
        return lambda self: (get(self),)
    if names:
        many: Callable[[Any], tuple[Any, ...]] = operator.attrgetter(*names)
        return many
    return lambda self: ()


_repr_running: set[tuple[int, int]] = set()  # (id, thread) of the reprs in progress


def _repr_of(names: tuple[str, ...]) -> Callable[[Any], str]:
    def __repr__(self: Any) -> str:
        key = (id(self), _thread.get_ident())
        if key in _repr_running:  # a field that contains the record itself, as dataclasses does
            return "..."
        _repr_running.add(key)
        try:
            shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
            return f"{self.__class__.__qualname__}({shown})"
        finally:
            _repr_running.discard(key)

    return __repr__


def _eq_of(values: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any, object], Any]:
    def __eq__(self: Any, other: object) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    return __eq__


def _hash_of(values: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return hash(values(self))

    return __hash__


def _frozen_methods(cls: type[Any], names: frozenset[str]) -> dict[str, Callable[..., Any]]:
    def __setattr__(self: Any, name: str, value: object) -> None:
        if type(self) is cls or name in names:
            _frozen(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            _frozen(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return {"__setattr__": __setattr__, "__delattr__": __delattr__}


def _pickling_methods(names: tuple[str, ...]) -> dict[str, Callable[..., Any]]:
    # A slots class has no __dict__ for pickle to fill, and its frozen __setattr__ refuses the
    # fields one by one: the state is the list of field values, as for a slots dataclass.
    def __getstate__(self: Any) -> list[Any]:
        return [getattr(self, name) for name in names]

    def __setstate__(self: Any, state: list[Any]) -> None:
        for name, value in zip(names, state, strict=False):
            object.__setattr__(self, name, value)

    return {"__getstate__": __getstate__, "__setstate__": __setstate__}


def _replace(self: Any, /, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(self, **changes)


def _with_slots(cls: type, declaration: _Declaration) -> type:
    """The class rebuilt with `__slots__` for its fields (what `dataclass(slots=True)` does)."""
    namespace = dict(cls.__dict__)
    for name in declaration.annotations:
        namespace.pop(name, None)  # a default: the slot's descriptor takes its name
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)
    namespace["__slots__"] = tuple(declaration.annotations)
    rebuilt = type(cls)(cls.__name__, cls.__bases__, namespace)
    rebuilt.__qualname__ = cls.__qualname__
    return rebuilt


def _make_record(cls: C, slots: bool) -> C:
    if "__init__" not in cls.__dict__ and cls.__annotations__:
        raise TypeError(f"record {cls.__qualname__} needs a hand-written __init__")
    declaration = _Declaration(cls, slots)
    if slots:
        cls = _with_slots(cls, declaration)  # type: ignore[assignment]
        declaration.cls = cls
    names = tuple(declaration.annotations)
    values = _values_of(names)
    methods: dict[str, Any] = {
        "__repr__": _repr_of(names),
        "__eq__": _eq_of(values),
        "__match_args__": tuple(name for name in names if name not in declaration.keyword_only),
    }
    own = cls.__dict__
    # Python sets __hash__ to None in a class that defines __eq__: that one is not explicit.
    if "__hash__" not in own or (own["__hash__"] is None and "__eq__" in own):
        methods["__hash__"] = _hash_of(values)
    if slots:
        methods.update(_pickling_methods(names))
    if sys.version_info >= (3, 13):
        methods["__replace__"] = _replace
    for name, method in methods.items():
        if name not in own:  # what the class defines itself wins, as with dataclasses
            setattr(cls, name, method)
    for name, method in _frozen_methods(cls, frozenset(names)).items():
        if name in own:
            raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
        setattr(cls, name, method)
    for name in ("__dataclass_fields__", "__dataclass_params__"):
        setattr(cls, name, _Introspected(declaration, name))
    return cls


def _record(*, frozen: bool = False, slots: bool = False) -> Callable[[C], C]:
    if not frozen:
        raise TypeError("record() makes frozen classes only: pass frozen=True")
    return lambda cls: _make_record(cls, slots)


if TYPE_CHECKING:
    from dataclasses import dataclass as record
else:
    record = _record
