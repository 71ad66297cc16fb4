"""toolreg: run tool calls with cooperative, quiescent cancellation.

The public API, re-exported from the private modules that implement it:

* tokens (`_cancel`): `CancelSource`, `CancelToken`, `Registration`, `Cancelled`,
  `TimeoutReason`, `deadline`, `timeout_of`;
* calls and results (`_results`): `ToolCall`, `ToolResult`, `ToolError`, `ErrorCode`;
* tools (`_tools`): `Tool`, `ToolContext`, `FrozenDict`, `thaw`; the catalog (`_catalog`):
  `Catalog`; progress (`_progress`): `ToolProgress`;
* hooks (`_hooks`): `Allow`, `Deny`, `Ask`, `Dispatch` and the `Protocol` of each hook kind;
* the registry (`_registry`): `ToolRegistry`, `InFlightCall`, and `ToolFunction`, the type of a
  tool's body;
* policies (`_policies`): `TimeoutPolicy`, `RetryPolicy`;
* the thread pool (`_pool`): `WorkerPool`, loaded when first named (it is a
  `concurrent.futures.Executor`, and `import toolreg` does not load `concurrent.futures`).

`toolreg.__version__` is the installed distribution's version (`toolreg-quiescent` on the
package index), read from its metadata when first looked up.

Every module, what it owns and who may call it, and the path of one call: docs/contract.md,
A.12 (the module map).
"""

import gc as _gc

# The import makes a few thousand objects that live as long as the interpreter: a cyclic
# collection during it (there would be several at the default thresholds) only walks them, so
# the import skips them. The collector's state is restored however this ends.
_collecting = _gc.isenabled()
_gc.disable()
try:
    from typing import TYPE_CHECKING as _TYPE_CHECKING
    from typing import Any as _Any

    from ._body import ToolContext as ToolContext
    from ._call import Stage as Stage
    from ._cancel import Cancelled as Cancelled
    from ._cancel import CancelSource as CancelSource
    from ._cancel import CancelToken as CancelToken
    from ._cancel import Registration as Registration
    from ._cancel import TimeoutReason as TimeoutReason
    from ._cancel import deadline as deadline
    from ._cancel import timeout_of as timeout_of
    from ._catalog import Catalog as Catalog
    from ._errors import ContextSettledError as ContextSettledError
    from ._errors import ExecutorRefusedError as ExecutorRefusedError
    from ._errors import InsideCallError as InsideCallError
    from ._errors import RegistryClosedError as RegistryClosedError
    from ._hooks import Allow as Allow
    from ._hooks import Approver as Approver
    from ._hooks import AroundWrapper as AroundWrapper
    from ._hooks import Ask as Ask
    from ._hooks import CallHook as CallHook
    from ._hooks import CallTrace as CallTrace
    from ._hooks import Deny as Deny
    from ._hooks import Dispatch as Dispatch
    from ._hooks import Guard as Guard
    from ._hooks import PostExecuteHook as PostExecuteHook
    from ._hooks import PreExecuteHook as PreExecuteHook
    from ._hooks import ResultObserver as ResultObserver
    from ._policies import RetryPolicy as RetryPolicy
    from ._policies import TimeoutPolicy as TimeoutPolicy
    from ._progress import ToolProgress as ToolProgress
    from ._public import report_public as _report_public
    from ._registry import InFlightCall as InFlightCall
    from ._registry import ToolFunction as ToolFunction
    from ._registry import ToolRegistry as ToolRegistry
    from ._results import CallTimeline as CallTimeline
    from ._results import ErrorCode as ErrorCode
    from ._results import ToolCall as ToolCall
    from ._results import ToolError as ToolError
    from ._results import ToolResult as ToolResult
    from ._tools import FrozenDict as FrozenDict
    from ._tools import Tool as Tool
    from ._tools import thaw as thaw
finally:
    if _collecting:
        _gc.enable()

__all__ = [
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


if _TYPE_CHECKING:
    from ._pool import WorkerPool as WorkerPool

    __version__: str

_LAZY = ("WorkerPool", "__version__")  # names whose value is loaded when first looked up
_DISTRIBUTION = "toolreg-quiescent"  # the name on the package index; "toolreg" is someone else's


def _report_public_module(value: object) -> None:
    # Public names report the module users import them from (`toolreg.ToolRegistry`, not
    # `toolreg._registry.ToolRegistry`): in reprs, tracebacks, pickles and documentation.
    if getattr(value, "__module__", "").startswith("toolreg._"):
        _report_public(value, __name__)


if not _TYPE_CHECKING:  # hidden from type checkers, so `from toolreg import Typo` is an error

    def __getattr__(name: str) -> _Any:
        if name == "WorkerPool":
            from ._pool import WorkerPool

            _report_public_module(WorkerPool)
            globals()[name] = WorkerPool  # found directly from now on
            return WorkerPool
        if name == "__version__":
            globals()[name] = version = _installed_version()
            return version
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _installed_version() -> str:
    # importlib.metadata costs more to import than all of toolreg: only when asked.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(_DISTRIBUTION)
    except PackageNotFoundError:  # a source tree on sys.path, never installed
        return "0+unknown"


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


for _name in __all__:
    if _name not in _LAZY:
        _report_public_module(globals()[_name])
del _name
