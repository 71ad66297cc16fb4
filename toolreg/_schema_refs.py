"""The `$ref`s of a tool's JSON Schema, checked at registration.

Two ways a reference breaks a schema that still compiles. It may point outside the schema
(`outside_ref`): schemas may come from untrusted places, and the validator would fetch it. Or it
may loop back to where it started without the value getting any smaller (`ref_loop`): `a` says
"see `b`", `b` says "see `a`". The validator then recurses on the same value until Python's
recursion limit, and every call passing that property fails with "maximum recursion depth
exceeded". A loop that descends into the value (a tree's `children` items referring to the
tree) ends with the value, and is fine.

Keywords are read as draft 4 to 7 do (the drafts the validator implements): a `$ref` replaces
its siblings; `allOf`, `anyOf`, `oneOf`, `not`, `if`, `then`, `else` and schema-valued
`dependencies` apply to the same value; `properties`, `patternProperties`,
`additionalProperties`, `items`, `additionalItems`, `contains` and `propertyNames` to a part.
"""

from __future__ import annotations

from typing import Any

__all__ = ["outside_ref", "ref_loop"]

_SAME_VALUE_LISTS = ("allOf", "anyOf", "oneOf")
_SAME_VALUE = ("not", "if", "then", "else")
_PART_MAPS = ("properties", "patternProperties")
_PARTS = ("additionalProperties", "items", "additionalItems", "contains", "propertyNames")


def outside_ref(schema: object) -> str | None:
    """A `$ref` that does not point inside the schema, if there is one (no recursion).

    Data keywords (`enum`, `const`, ...) are searched too: fastjsonschema resolves a `$ref`
    wherever it appears.
    """
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and not ref.startswith("#"):
                return ref
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return None


def ref_loop(schema: dict[str, Any]) -> list[str] | None:
    """The pointers of a loop of references that never descends into the value (the first
    pointer repeated at the end), or None. Only what validation can reach is looked at."""
    reachable = _reachable(schema)
    done: set[int] = set()
    for start in reachable.values():
        if id(start[1]) in done:
            continue
        # Depth first over same-value edges only, without recursion; `path` is the current
        # chain, `on_path` its members.
        path: list[tuple[str, dict[str, Any]]] = [start]
        on_path = {id(start[1])}
        pending = [iter(_same_value(schema, *start))]
        while pending:
            step = next(pending[-1], None)
            if step is None:
                pending.pop()
                _, left = path.pop()
                on_path.discard(id(left))
                done.add(id(left))
                continue
            if id(step[1]) in on_path:
                first = next(i for i, (_, node) in enumerate(path) if node is step[1])
                return [pointer for pointer, _ in path[first:]] + [step[0]]
            if id(step[1]) in done:
                continue
            path.append(step)
            on_path.add(id(step[1]))
            pending.append(iter(_same_value(schema, *step)))
    return None


def _reachable(schema: dict[str, Any]) -> dict[int, tuple[str, dict[str, Any]]]:
    """Every subschema validation can reach from the root, by id: (its pointer, itself)."""
    found: dict[int, tuple[str, dict[str, Any]]] = {}
    pending: list[tuple[str, dict[str, Any]]] = [("#", schema)]
    while pending:
        pointer, node = pending.pop()
        if id(node) in found:
            continue
        found[id(node)] = (pointer, node)
        pending.extend(_same_value(schema, pointer, node))
        pending.extend(_parts(pointer, node))
    return found


def _same_value(
    root: dict[str, Any], pointer: str, node: dict[str, Any]
) -> list[tuple[str, dict[str, Any]]]:
    """The subschemas `node` applies to the same value: its `$ref`'s target, or its
    applicators."""
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = _resolve(root, ref)
        return [] if target is None else [(ref, target)]
    found = [
        (f"{pointer}/{key}/{index}", item)
        for key in _SAME_VALUE_LISTS
        if isinstance(node.get(key), list)
        for index, item in enumerate(node[key])
        if isinstance(item, dict)
    ]
    found.extend(
        (f"{pointer}/{key}", node[key]) for key in _SAME_VALUE if isinstance(node.get(key), dict)
    )
    dependencies = node.get("dependencies")
    if isinstance(dependencies, dict):
        found.extend(
            (f"{pointer}/dependencies/{_escape(name)}", item)
            for name, item in dependencies.items()
            if isinstance(item, dict)
        )
    return found


def _parts(pointer: str, node: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The subschemas `node` applies to parts of the value (a property, an item, ...)."""
    if "$ref" in node:
        return []
    found = [
        (f"{pointer}/{key}/{_escape(name)}", item)
        for key in _PART_MAPS
        if isinstance(node.get(key), dict)
        for name, item in node[key].items()
        if isinstance(item, dict)
    ]
    for key in _PARTS:
        value = node.get(key)
        if isinstance(value, dict):
            found.append((f"{pointer}/{key}", value))
        elif isinstance(value, list):
            found.extend(
                (f"{pointer}/{key}/{index}", item)
                for index, item in enumerate(value)
                if isinstance(item, dict)
            )
    return found


def _resolve(root: dict[str, Any], ref: str) -> dict[str, Any] | None:
    """The subschema a local `$ref` (`#` or `#/...`) points at, or None."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    # Loaded here: urllib.parse costs import time (and pulls math in on 3.13) for every
    # `import toolreg`, and only a `$ref` with a pointer needs it.
    from urllib.parse import unquote

    node: Any = root
    for token in ref[2:].split("/"):
        token = unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node if isinstance(node, dict) else None


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
