"""Cancellation tokens against threading.Event and the PyPI peers cancelscope and cantok.

Every figure is a median over interleaved repeats; ratios are against a baseline measured in the
same run. Rows:

* create+close: `CancelSource(parent)` then `close()`, against `threading.Event()` construction
  (target <= 1.00x). Peers' equivalent of a linked child: cancelscope enters and exits a
  `CancelScope` inside an entered parent scope (scopes link to the current one); cantok builds
  `SimpleToken(parent)` (it polls its parents, so there is nothing to unlink or close).
* on_cancel+remove: register a callback and remove it, against the same baseline; cancelscope's
  `on_cancel(cb)` and the unregister function it returns. cantok has no callbacks.
* fan-out: one `cancel()` reaching 10,000 linked children, per child, against `Event.set()` on
  10,000 Events. cantok is pull-based: its cancel is O(1) and each child pays when read, so its row
  times the cancel plus one `.cancelled` read of every child.
* memory: traced bytes of an idle `CancelSource()` (with its token), against a `threading.Event()`
  (target <= 35%); cancelscope's `CancelScope()` and cantok's `SimpleToken()`.
"""

from __future__ import annotations

import contextvars
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from toolreg import CancelSource

from ._harness import (
    Row,
    bytes_per_object,
    format_time,
    interleaved,
    ratio,
    timed_once,
    verdict,
)

REGIME_INDEPENDENT = True  # one thread: measured once, in the first regime
CREATE_TARGET = 1.0  # child create+close, as a multiple of Event() construction
MEMORY_TARGET = 0.35  # idle token memory, as a fraction of an Event's
PEERS = ("cancelscope", "cantok")


@dataclass(frozen=True)
class Sizes:
    ops: int  # operations per timed run of a micro-benchmark
    children: int  # fan-out width
    objects: int  # objects averaged over for memory
    repeats: int


QUICK = Sizes(ops=10_000, children=2_000, objects=1_000, repeats=5)
FULL = Sizes(ops=20_000, children=10_000, objects=10_000, repeats=25)


def _noop() -> None:
    pass


def _peers() -> dict[str, ModuleType]:
    """The peer packages that import here; the others are reported as skipped."""
    found: dict[str, ModuleType] = {}
    for name in PEERS:
        try:
            found[name] = importlib.import_module(name)
        except ImportError:
            continue
    return found


# -- micro-benchmarks: callables performing n operations ---------------------------------------


def _event_construction(n: int) -> None:
    make = threading.Event
    for _ in range(n):
        make()


def _toolreg_child(n: int) -> None:
    parent = CancelSource().token
    for _ in range(n):
        CancelSource(parent).close()


def _toolreg_on_cancel(n: int) -> None:
    token = CancelSource().token
    for _ in range(n):
        token.on_cancel(_noop).remove()


def _cancelscope_child(cancelscope: ModuleType) -> Callable[[int], None]:
    scope = cancelscope.CancelScope

    def run(n: int) -> None:
        with scope():  # the parent: a scope links to the one current when it is entered
            for _ in range(n):
                with scope():
                    pass

    return run


def _cancelscope_on_cancel(cancelscope: ModuleType) -> Callable[[int], None]:
    def run(n: int) -> None:
        scope = cancelscope.CancelScope()
        for _ in range(n):
            scope.on_cancel(_noop)()  # register, then call the returned unregister

    return run


def _cantok_child(cantok: ModuleType) -> Callable[[int], None]:
    def run(n: int) -> None:
        parent = cantok.SimpleToken()
        make = cantok.SimpleToken
        for _ in range(n):
            make(parent)

    return run


def _per_op(workload: Callable[[int], object], n: int) -> Callable[[], float]:
    return lambda: timed_once(workload, n) / n


# -- fan-out: build the tree untimed, time the one cancel, return seconds per child ------------


def _events_set(children: int) -> float:
    events = [threading.Event() for _ in range(children)]

    def set_all(_: int) -> None:
        for event in events:
            event.set()

    return timed_once(set_all, 1) / children


def _toolreg_fanout(children: int, callbacks: bool) -> float:
    root = CancelSource()
    kids = [CancelSource(root.token) for _ in range(children)]
    if callbacks:
        for kid in kids:
            kid.token.on_cancel(_noop)
    return timed_once(lambda _: root.cancel("stop"), 1) / children


def _cancelscope_fanout(cancelscope: ModuleType, children: int) -> float:
    parent = cancelscope.CancelScope()
    with parent:
        for _ in range(children):
            # Each child entered in a copy of this context: siblings under `parent`, not a chain.
            contextvars.copy_context().run(cancelscope.CancelScope().__enter__)
        return timed_once(lambda _: parent.cancel("stop"), 1) / children


def _cantok_fanout(cantok: ModuleType, children: int) -> float:
    parent = cantok.SimpleToken()
    kids = [cantok.SimpleToken(parent) for _ in range(children)]

    def cancel_and_observe(_: int) -> None:
        parent.cancel()
        for kid in kids:
            kid.cancelled  # noqa: B018 - the read is where a pull-based token does the work

    return timed_once(cancel_and_observe, 1) / children


# -- measuring and reporting ---------------------------------------------------------------------


def _speed_rows(sizes: Sizes, peers: dict[str, ModuleType]) -> list[Row]:
    n = sizes.ops
    variants: dict[str, Callable[[], float]] = {
        "Event()": _per_op(_event_construction, n),
        "toolreg child": _per_op(_toolreg_child, n),
        "toolreg on_cancel": _per_op(_toolreg_on_cancel, n),
    }
    if "cancelscope" in peers:
        variants["cancelscope child"] = _per_op(_cancelscope_child(peers["cancelscope"]), n)
        variants["cancelscope on_cancel"] = _per_op(_cancelscope_on_cancel(peers["cancelscope"]), n)
    if "cantok" in peers:
        variants["cantok child"] = _per_op(_cantok_child(peers["cantok"]), n)
    m = interleaved(variants, sizes.repeats)
    base = m["Event()"]
    child = m["toolreg child"] / base
    rows = [
        Row("threading.Event() construction (baseline)", format_time(base), "1.00x"),
        Row(
            "toolreg CancelSource(parent) + close()",
            format_time(m["toolreg child"]),
            f"{child:.2f}x",
            f"<= {CREATE_TARGET:.2f}x",
            verdict(child, CREATE_TARGET),
        ),
        Row(
            "toolreg on_cancel(cb) + remove()",
            format_time(m["toolreg on_cancel"]),
            ratio(m["toolreg on_cancel"], base),
        ),
    ]
    peer_rows = [
        ("cancelscope child", "cancelscope nested CancelScope enter + exit"),
        ("cancelscope on_cancel", "cancelscope on_cancel(cb) + unregister()"),
        ("cantok child", "cantok SimpleToken(parent) (nothing to close)"),
    ]
    for key, label in peer_rows:
        if key in m:
            rows.append(Row(label, format_time(m[key]), ratio(m[key], base)))
    return rows


def _fanout_rows(sizes: Sizes, peers: dict[str, ModuleType]) -> list[Row]:
    width = sizes.children
    variants: dict[str, Callable[[], float]] = {
        "Event.set()": lambda: _events_set(width),
        "toolreg": lambda: _toolreg_fanout(width, callbacks=False),
        "toolreg callbacks": lambda: _toolreg_fanout(width, callbacks=True),
    }
    if "cancelscope" in peers:
        variants["cancelscope"] = lambda: _cancelscope_fanout(peers["cancelscope"], width)
    if "cantok" in peers:
        variants["cantok"] = lambda: _cantok_fanout(peers["cantok"], width)
    m = interleaved(variants, sizes.repeats)
    base = m["Event.set()"]
    labels = {
        "Event.set()": f"Event.set() on {width:,} Events, per Event (baseline)",
        "toolreg": f"toolreg cancel() to {width:,} children, per child",
        "toolreg callbacks": "toolreg fan-out, one callback per child, per child",
        "cancelscope": "cancelscope cancel() to sibling scopes, per child",
        "cantok": "cantok cancel() + read each child, per child",
    }
    return [Row(labels[key], format_time(value), ratio(value, base)) for key, value in m.items()]


def _memory_rows(sizes: Sizes, peers: dict[str, ModuleType]) -> list[Row]:
    count = sizes.objects
    event = bytes_per_object(threading.Event, count)
    token = bytes_per_object(CancelSource, count)
    rows = [
        Row("threading.Event() memory (baseline)", f"{event:.0f} B", "100%"),
        Row(
            "toolreg idle CancelSource() + its token",
            f"{token:.0f} B",
            f"{token / event:.0%}",
            f"<= {MEMORY_TARGET:.0%}",
            verdict(token / event, MEMORY_TARGET),
        ),
    ]
    makers: list[tuple[str, str, str]] = [
        ("cancelscope", "CancelScope", "cancelscope idle CancelScope()"),
        ("cantok", "SimpleToken", "cantok idle SimpleToken()"),
    ]
    for package, cls, label in makers:
        if package in peers:
            size = bytes_per_object(getattr(peers[package], cls), count)
            rows.append(Row(label, f"{size:.0f} B", f"{size / event:.0%}"))
    return rows


def run(quick: bool) -> list[Row]:
    """Measure everything; return the rows (peers that do not import are listed as skipped)."""
    sizes = QUICK if quick else FULL
    peers = _peers()
    rows = _speed_rows(sizes, peers) + _fanout_rows(sizes, peers) + _memory_rows(sizes, peers)
    rows += [Row(f"{name}: not installed, skipped", "-") for name in PEERS if name not in peers]
    return rows


if __name__ == "__main__":
    import sys

    from .__main__ import main

    sys.exit(main(["--only", "cancel", *sys.argv[1:]]))
