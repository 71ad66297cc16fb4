"""Public names report the module users import them from, and their annotations still resolve.

`report_public(value, module)` sets `value.__module__` to the public module (`toolreg`, not
`toolreg._registry`): reprs, tracebacks, pickles and documentation name it as users import it.
That alone breaks `typing.get_type_hints(cls)`: a class's annotations are strings (every module
uses `from __future__ import annotations`), which it evaluates in the namespace of the module
`__module__` names, where `Any` or `Mapping` are not. So the class's `__annotations__` becomes
an `_Annotations` dict: the same strings, evaluated in the module that defined the class the
first time `get_type_hints` reads them (it iterates `.items()`), not at import, which most
programs would pay for without ever asking.

Some names are imported by their module only for type checkers: a module `import toolreg`
should not load (`weakref`, `dataclasses`, `typing_extensions`), or a public class. `LATE_NAMES`
and the public names of `toolreg` supply them when annotations are evaluated; the test that
resolves every public class's annotations says when a name is missing here.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["LATE_NAMES", "report_public"]

LATE_NAMES = {  # name -> (module, attribute, or "" for the module itself)
    "KW_ONLY": ("dataclasses", "KW_ONLY"),
    "Self": ("typing_extensions", "Self"),
    "weakref": ("weakref", ""),
}


def report_public(value: object, module: str) -> None:
    """Make `value` (a class or function of a private module) report `module` as its own."""
    defined_in = getattr(value, "__module__", None)
    if not isinstance(defined_in, str) or defined_in == module:
        return
    try:
        setattr(value, "__module__", module)  # noqa: B010 - any object, not only a type
    except (AttributeError, TypeError):  # an alias or a builtin: nothing to rename
        return
    if isinstance(value, type):
        annotations = vars(value).get("__annotations__")
        if isinstance(annotations, dict) and annotations:
            value.__annotations__ = _Annotations(annotations, defined_in)


class _Annotations(dict[str, Any]):
    """A class's annotations; the strings are evaluated in `module` when first iterated."""

    __slots__ = ("_module",)

    def __init__(self, annotations: dict[str, Any], module: str) -> None:
        super().__init__(annotations)
        self._module: str | None = module  # None once evaluated

    def items(self) -> Any:
        if self._module is not None:
            public = vars(sys.modules["toolreg"])  # the public classes, whatever imports them
            namespace = {**_late_names(), **public, **vars(sys.modules[self._module])}
            for name, value in list(super().items()):
                if isinstance(value, str):
                    self[name] = eval(value, namespace)  # our own annotations
            self._module = None
        return super().items()


def _late_names() -> dict[str, Any]:
    names: dict[str, Any] = {}
    for name, (module, attribute) in LATE_NAMES.items():
        imported = importlib.import_module(module)
        names[name] = getattr(imported, attribute) if attribute else imported
    return names
