"""The exceptions toolreg raises for misuse, in one place.

A tool-level problem (an unknown tool, bad arguments, a denial, a body that raised, a timeout)
is never an exception: it is a failed `ToolResult`. Exceptions mean the caller used the library
wrongly, or a call was interrupted::

    BaseException
     ├── Cancelled                   token.raise_if_cancelled(): a body's way out
     └── Exception
          ├── TypeError              a value of the wrong type (the message says which)
          ├── ValueError             a value out of range, a duplicate name, a bad schema
          └── RuntimeError
               ├── RegistryClosedError    a call (execute, execute_batch, an awaited call)
               │                          entered a registry that is closed or closing
               ├── InsideCallError        close() or wait_idle() from inside one of the
               │                          registry's own calls: it would wait for itself
               ├── ContextSettledError    ctx.defer_context/execute/report_progress after the
               │                          tool body has returned
               └── ExecutorRefusedError   the executor passed in was shut down (or, after
                                          fork(), cannot run anything) and took no body

The same misuse gets the same exception wherever it happens (`execute` and `execute_batch`
alike: a call that is not a `ToolCall` is a `TypeError` in both). Ctrl-C (`KeyboardInterrupt`)
and anything a signal handler raises are re-raised as they are, once the call they landed in is
complete.
"""

from __future__ import annotations

__all__ = ["ContextSettledError", "ExecutorRefusedError", "InsideCallError", "RegistryClosedError"]


class RegistryClosedError(RuntimeError):
    """A call entered a registry that is closed (or closing): create a new registry."""


class InsideCallError(RuntimeError):
    """`close()` or `wait_idle()` from inside one of the registry's own calls (it would wait)."""


class ContextSettledError(RuntimeError):
    """A `ToolContext` method used after the tool body has returned."""


class ExecutorRefusedError(RuntimeError):
    """The executor passed to the registry took no body: it was shut down, or forked away."""
