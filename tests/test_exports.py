"""The public surface: `toolreg.__all__` pinned and sorted, each public module's too, and the
version. (The README's quickstart and every other snippet run in `test_docs`.)"""

from __future__ import annotations

import ast
import gc
import importlib
import importlib.metadata
import subprocess
import sys
import types
import typing
import weakref
from pathlib import Path

import pytest

import toolreg

PUBLIC = [
    "Allow",
    "Approver",
    "AroundWrapper",
    "Ask",
    "CallHook",
    "CallTimeline",
    "CallTrace",
    "CancelSource",
    "CancelToken",
    "Cancelled",
    "Catalog",
    "ContextSettledError",
    "Deny",
    "Dispatch",
    "ErrorCode",
    "ExecutorRefusedError",
    "FrozenDict",
    "Guard",
    "InFlightCall",
    "InsideCallError",
    "PostExecuteHook",
    "PreExecuteHook",
    "Registration",
    "RegistryClosedError",
    "ResultObserver",
    "RetryPolicy",
    "Stage",
    "TimeoutPolicy",
    "TimeoutReason",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolFunction",
    "ToolProgress",
    "ToolRegistry",
    "ToolResult",
    "WorkerPool",
    "deadline",
    "thaw",
    "timeout_of",
]


def test_all_names_are_pinned_without_duplicates() -> None:
    assert sorted(toolreg.__all__) == PUBLIC
    assert len(set(toolreg.__all__)) == len(toolreg.__all__)


def test_all_is_sorted() -> None:
    assert toolreg.__all__ == sorted(toolreg.__all__)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_is_importable(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from toolreg import {name}", namespace)
    assert namespace[name] is getattr(toolreg, name)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from toolreg import *", namespace)
    assert sorted(name for name in namespace if name != "__builtins__") == PUBLIC


def test_every_public_attribute_is_in_all() -> None:
    public = [  # dir(), not vars(): a name loaded on first use is public before it is loaded
        name
        for name in dir(toolreg)
        if not name.startswith("_") and not isinstance(getattr(toolreg, name), types.ModuleType)
    ]
    assert sorted(public) == PUBLIC


def test_public_names_report_the_module_they_are_imported_from() -> None:
    # toolreg.ToolRegistry, not toolreg._registry.ToolRegistry: in reprs, tracebacks, pickles.
    for name in PUBLIC:
        value = getattr(toolreg, name)
        if isinstance(value, (type, types.FunctionType)):
            assert value.__module__ == "toolreg", name


# Every other public module's surface, pinned the same way (a new name is a decision).
MODULES = {
    "toolreg.aio": ["AsyncToolRegistry"],
    "toolreg.log": [
        "DEFAULT_BACKUP_COUNT",
        "DEFAULT_LINGER",
        "DEFAULT_MAX_BYTES",
        "REDACTION_FAILED",
        "Redactor",
        "ResultLog",
    ],
    "toolreg.process": ["ProcessError", "ProcessResult", "run", "scrubbed_env"],
    "toolreg.mcp": [
        "Mount",
        "RequestCancelled",
        "UpstreamError",
        "UpstreamToolError",
        "UpstreamUnavailable",
        "build_server",
        "mount",
        "serve",
    ],
    "toolreg.adapters": [],
    "toolreg.providers": [],
    "toolreg.providers.anthropic": [
        "RegistryToolset",
        "arun_tool_calls",
        "run_tool_calls",
        "tool_calls",
        "tools",
    ],
    "toolreg.providers.openai": ["arun_tool_calls", "run_tool_calls", "tool_calls", "tools"],
    "toolreg.report": [],  # the stats and report commands; no public name yet
}
# A module whose names need an extra (toolreg.mcp loads its SDK when a name is first looked up):
# without it, its pin is skipped (with why).
NEEDS_EXTRA = {"toolreg.mcp": ("mcp", "mcp")}  # module -> (what it imports, the extra)


@pytest.mark.parametrize("module_name", sorted(MODULES))
def test_each_public_module_pins_its_all(module_name: str) -> None:
    if module_name in NEEDS_EXTRA:
        needed, extra = NEEDS_EXTRA[module_name]
        pytest.importorskip(needed, reason=f"{module_name} needs the {extra} extra")
    module = importlib.import_module(module_name)
    assert sorted(module.__all__) == MODULES[module_name]
    for name in module.__all__:
        value = getattr(module, name)
        alias = isinstance(value, types.GenericAlias) or hasattr(value, "__origin__")
        if isinstance(value, (type, types.FunctionType)) and not alias:
            assert value.__module__ == module_name, name


def test_version_is_the_installed_distributions() -> None:
    assert toolreg.__version__ == importlib.metadata.version("toolreg-quiescent")
    assert "__version__" in dir(toolreg) and "__version__" not in toolreg.__all__


EVERY_PUBLIC_MODULE = [
    "toolreg",
    *sorted(MODULES),
    "toolreg.adapters.langchain",
    "toolreg.adapters.openai_agents",
    "toolreg.adapters.pydantic_ai",
    "toolreg.distributed",
    "toolreg.otel",
]


@pytest.mark.parametrize("module_name", EVERY_PUBLIC_MODULE)
def test_the_annotations_of_every_public_class_resolve(module_name: str) -> None:
    """`typing.get_type_hints` on a public class (documentation tools and validators call it)
    resolves, although its `__module__` names the public module, not the one defining it."""
    try:
        module = importlib.import_module(module_name)
        classes = [getattr(module, name) for name in module.__all__]
    except ImportError as exc:  # an integration whose extra is not installed
        pytest.skip(f"{module_name} needs its extra: {exc}")
    classes = [value for value in classes if isinstance(value, type)]
    for cls in classes:
        hints = typing.get_type_hints(cls)
        assert all(not isinstance(hint, (str, typing.ForwardRef)) for hint in hints.values())
    if module_name == "toolreg":
        assert typing.get_type_hints(toolreg.ToolContext)["call"] is toolreg.ToolCall


def test_import_toolreg_reads_no_metadata_until_the_version_is_asked_for() -> None:
    # `import toolreg` is timed by the benchmarks; importlib.metadata would cost more than it.
    script = (
        "import sys, toolreg; loaded = 'importlib.metadata' in sys.modules; "
        "version = toolreg.__version__; print(loaded, 'importlib.metadata' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["False", "True"]


# -- the seam: who may reach the registry's module ------------------------------------------------


def _runtime_imports_of_registry(path: Path) -> list[int]:
    """Lines of `path` that import `toolreg._registry` at run time (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    lines = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""  # `from . import x`: no module, names only
            names = {alias.name for alias in node.names}
            if module.split(".")[-1] == "_registry" or "_registry" in names:
                lines.append(node.lineno)
    return lines


def test_nothing_but_the_package_init_imports_the_registry_module_at_run_time() -> None:
    package = Path(toolreg.__file__).parent
    found = {
        str(path.relative_to(package)): lines
        for path in sorted(package.rglob("*.py"))
        if path.name != "__init__.py" or path.parent != package
        for lines in [_runtime_imports_of_registry(path)]
        if lines
    }
    assert found == {}  # they reach the dispatcher through `_dispatch`, the class via `toolreg`
    assert _runtime_imports_of_registry(package / "__init__.py")  # the check sees imports


def test_the_facade_finds_a_registrys_dispatcher_without_keeping_the_registry_alive() -> None:
    from toolreg._dispatch import dispatcher_of

    registry = toolreg.ToolRegistry(max_workers=1)
    dispatcher = dispatcher_of(registry)
    assert dispatcher is not None and dispatcher is registry._dispatcher  # white-box
    assert dispatcher_of(object()) is None and dispatcher_of([]) is None  # not one: no error
    registry.close()
    gone = weakref.ref(registry)
    del registry, dispatcher
    gc.collect()
    assert gone() is None  # the lookup holds the registry weakly
