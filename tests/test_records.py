"""Records (`toolreg._record`): frozen dataclasses to everyone, built without `dataclasses`.

`import toolreg` does not import `dataclasses` (nor `inspect`, `json`, `datetime`); every
public record class still is a frozen dataclass to `dataclasses` (fields, replace, asdict), and a
record behaves like the dataclass declared the same way (repr, eq, hash, frozen-ness, pickling).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import subprocess
import sys
from typing import Any, cast

import pytest

import toolreg
from toolreg import (
    Allow,
    Ask,
    Deny,
    ErrorCode,
    InFlightCall,
    Stage,
    TimeoutReason,
    Tool,
    ToolCall,
    ToolError,
    ToolProgress,
    ToolResult,
)
from toolreg._record import record

# Loaded only by what needs them (a misuse, a JSON value, `entered_at`, a registration, a batch).
NOT_LOADED = (
    "dataclasses",
    "inspect",
    "json",
    "datetime",
    "copy",
    "ast",
    "dis",
    "signal",
    "logging",
    "concurrent.futures",
    "toolreg._pool",
    "toolreg._dispatch",  # with the pipeline: loaded by the first ToolRegistry
    "toolreg._pipeline",
    "toolreg._batch",  # loaded by the first batch
    "heapq",  # with the first deadline armed
    "math",  # finite checks compare with infinity instead
    "urllib.parse",  # only a schema `$ref` with a pointer needs it
    "weakref",  # `_weakref.ref` serves the tokens, the timer and the after-fork hooks
)


def test_import_toolreg_loads_neither_dataclasses_nor_what_only_some_paths_need() -> None:
    script = (
        "import sys; before = set(sys.modules); import toolreg; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "toolreg" in loaded
    assert [name for name in NOT_LOADED if name in loaded] == []


def test_what_import_toolreg_leaves_out_loads_with_the_first_registry_or_log_line() -> None:
    script = """
import sys
import toolreg
assert "logging" not in sys.modules and "concurrent.futures" not in sys.modules
assert "WorkerPool" in dir(toolreg) and "WorkerPool" in toolreg.__all__
registry = toolreg.ToolRegistry()
assert isinstance(registry._dispatcher._executor, toolreg.WorkerPool)
assert "toolreg._batch" not in sys.modules
registry.execute_batch([])
assert "toolreg._batch" in sys.modules
assert toolreg.WorkerPool.__module__ == "toolreg"
import concurrent.futures
assert isinstance(toolreg.WorkerPool(1), concurrent.futures.Executor)
from toolreg._logger import logger
import logging
real = logging.getLogger("toolreg")
assert logger.isEnabledFor(logging.ERROR) is real.isEnabledFor(logging.ERROR)
records = []
handler = logging.Handler()
handler.emit = records.append
real.addHandler(handler)
logger.warning("through the lazy logger: %s", 1)
assert [r.getMessage() for r in records] == ["through the lazy logger: 1"], records
assert records[0].name == "toolreg"
registry.close()
print("ok")
"""
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok"]


def _body(args: Any, ctx: Any) -> int:
    return 1


CALL = ToolCall("t", {"a": 1}, call_id="c1")

# Each public record: an instance, and its fields (name, keyword-only) in declaration order.
PUBLIC = [
    (ToolCall("t", {"a": 1}, call_id="c1"), ["name", "arguments", "call_id"], ()),
    (ToolError(ErrorCode.DENIED, "no"), ["code", "message", "exception"], ()),
    (
        ToolResult.success(CALL, [1, 2]),
        [
            "call",
            "ok",
            "content",
            "value",
            "error",
            "contexts",
            "dispatched",
            "duration",
            "timeline",
        ],
        (),
    ),
    (
        Tool("t", _body, timeout=2.0),
        [
            "name",
            "fn",
            "description",
            "parameters",
            "timeout",
            "concurrency_safe",
            "render",
            "title",
            "annotations",
            "output_schema",
            "validate_output",
        ],
        (
            "description",
            "parameters",
            "timeout",
            "concurrency_safe",
            "render",
            "title",
            "annotations",
            "output_schema",
            "validate_output",
        ),
    ),
    (ToolProgress(CALL, 1.0, 2.0, "half"), ["call", "progress", "total", "message"], ()),
    (TimeoutReason("TIMEOUT", 1.5), ["code", "seconds"], ()),
    (
        InFlightCall(CALL, Stage.BODY, 1.0, False, None, True),
        ["call", "stage", "started", "cancelled", "cancelled_at", "dispatched"],
        (),
    ),
    (Allow(), [], ()),
    (Deny("no"), ["reason"], ()),
    (Ask("sure?"), ["reason"], ()),
]


@pytest.mark.parametrize("instance, names, keyword_only", PUBLIC, ids=lambda v: type(v).__name__)
def test_public_records_are_frozen_dataclasses_to_dataclasses(
    instance: Any, names: list[str], keyword_only: tuple[str, ...]
) -> None:
    cls = type(instance)
    assert dataclasses.is_dataclass(cls) and dataclasses.is_dataclass(instance)
    assert not isinstance(instance, type)  # a record, not a class: narrowed for replace()
    fields = dataclasses.fields(instance)
    assert [field.name for field in fields] == names
    assert tuple(field.name for field in fields if field.kw_only) == keyword_only
    # Neither dunder is declared by typeshed's DataclassInstance (what is_dataclass narrows to).
    dataclass = cast(Any, cls)
    assert dataclass.__dataclass_params__.frozen and dataclass.__dataclass_params__.eq
    assert dataclass.__match_args__ == tuple(name for name in names if name not in keyword_only)
    assert dataclasses.replace(instance) == instance
    assert pickle.loads(pickle.dumps(instance)) == instance
    assert copy.copy(instance) == instance and copy.deepcopy(instance) == instance
    for name in names or ["anything"]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(instance, name, None)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(instance, name)


def test_replace_and_asdict_work_on_results_and_tools() -> None:
    result = ToolResult.failure(CALL, "DENIED", "no")
    changed = dataclasses.replace(result, content="other")
    assert type(changed) is ToolResult and changed.content == "other"
    assert changed.error == result.error and changed.call is result.call
    assert dataclasses.asdict(ToolError(ErrorCode.DENIED, "no")) == {
        "code": ErrorCode.DENIED,
        "message": "no",
        "exception": None,
    }
    tool = dataclasses.replace(Tool("t", _body), timeout=3.0)
    assert tool.timeout == 3.0 and tool.fn is _body
    with pytest.raises(ValueError, match="must match"):
        dataclasses.replace(tool, name="not a name")  # __post_init__ checks it again


# -- a record and the dataclass declared the same way ----------------------------------------


@record(frozen=True)
class Point:
    """A record with a dict."""

    x: int
    y: object = None

    def __init__(self, x: int, y: object = None) -> None:
        self.__dict__.update(x=x, y=y)


@record(frozen=True, slots=True)
class SlotPoint:
    """A record with slots."""

    x: int
    y: object = None

    def __init__(self, x: int, y: object = None) -> None:
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "y", y)


class Reference:
    """The same declarations, as dataclasses."""

    @dataclasses.dataclass(frozen=True)
    class Point:
        x: int
        y: object = None

    @dataclasses.dataclass(frozen=True, slots=True)
    class SlotPoint:
        x: int
        y: object = None


PAIRS = [(Point, Reference.Point), (SlotPoint, Reference.SlotPoint)]


def _without_class(text: str) -> str:
    return text.partition("(")[2]


@pytest.mark.parametrize("made, real", PAIRS, ids=["dict", "slots"])
def test_a_record_behaves_like_the_same_dataclass(made: Any, real: Any) -> None:
    one, same, other = made(1, "a"), made(1, "a"), made(2)
    reference = real(1, "a")
    assert repr(one) == f"{made.__qualname__}(x=1, y='a')"
    assert _without_class(repr(one)) == _without_class(repr(reference))
    assert one == same and one != other and hash(one) == hash(same) == hash(reference)
    assert one != reference and one.__eq__(reference) is NotImplemented
    assert made.__match_args__ == real.__match_args__
    assert [(f.name, f.type, f.default, f.kw_only) for f in dataclasses.fields(made)] == [
        (f.name, f.type, f.default, f.kw_only) for f in dataclasses.fields(real)
    ]
    assert repr(made.__dataclass_params__) == repr(real.__dataclass_params__)
    assert hasattr(one, "__dict__") == hasattr(reference, "__dict__")
    assert getattr(made, "__slots__", None) == getattr(real, "__slots__", None)
    for target in (one, reference):
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'x'"):
            target.x = 5
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'y'"):
            del target.y
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'z'"):
        one.z = 5  # not a field: still refused on the class itself (a slots dataclass of
        # Python 3.10 and 3.11 raises TypeError from its __setattr__ here instead)
    assert pickle.loads(pickle.dumps(one)) == one
    assert copy.deepcopy(one) == one
    assert dataclasses.replace(one, y="b") == made(1, "b")
    assert dataclasses.asdict(one) == dataclasses.asdict(reference)


@pytest.mark.parametrize("made, real", PAIRS, ids=["dict", "slots"])
def test_a_record_shows_itself_as_dots_when_it_contains_itself(made: Any, real: Any) -> None:
    holder: list[Any] = []
    one, reference = made(1, holder), real(1, holder)
    holder.append(one)
    assert repr(one) == f"{made.__qualname__}(x=1, y=[...])"
    holder[0] = reference
    assert _without_class(repr(reference)) == "x=1, y=[...])"


def test_a_plain_subclass_may_set_attributes_that_are_not_fields() -> None:
    class Marked(Point):
        pass

    marked = Marked(1)
    marked.note = "fine"  # type: ignore[attr-defined]
    assert marked.note == "fine"  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        marked.x = 2  # type: ignore[misc]  # the frozen field, assigned on purpose
    assert dataclasses.fields(Marked) == dataclasses.fields(Point)


def test_a_dataclass_may_derive_from_a_record() -> None:
    @dataclasses.dataclass(frozen=True)
    class Labelled(Point):
        label: str = ""

    labelled = Labelled(1, "a", "b")
    assert [f.name for f in dataclasses.fields(labelled)] == ["x", "y", "label"]
    assert labelled.label == "b" and labelled.x == 1


def test_a_record_needs_its_own_init_and_must_be_frozen() -> None:
    with pytest.raises(TypeError, match="hand-written __init__"):

        @record(frozen=True)
        class NoInit:
            x: int

    with pytest.raises(TypeError, match="frozen=True"):
        record()

    with pytest.raises(TypeError, match="from __future__ import annotations"):
        namespace = {"__annotations__": {"x": int}, "__init__": lambda self: None}
        record(frozen=True)(type("Evaluated", (), namespace))


def test_records_are_public_under_toolreg() -> None:
    # The rebuilt slots classes are the ones exported (and renamed to their public module).
    assert toolreg.ToolProgress is ToolProgress and ToolProgress.__module__ == "toolreg"
    assert json.loads(ToolResult.success(CALL, {"k": [1]}).content) == {"k": [1]}


@pytest.mark.parametrize(
    ("before", "setup", "imported"),
    [
        ("gc.enable()", "", True),
        ("gc.disable()", "", True),
        ("gc.enable()", "sys.modules['toolreg._body'] = None", False),  # the import fails
    ],
)
def test_import_toolreg_leaves_the_collector_as_it_found_it(
    before: str, setup: str, imported: bool
) -> None:
    script = f"""
import gc, sys
{before}
was = gc.isenabled()
{setup}
try:
    import toolreg
    print("imported", gc.isenabled() is was)
except ImportError:
    print("failed", gc.isenabled() is was)
"""
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["imported" if imported else "failed", "True"]
