"""Tracing: `toolreg.otel.instrument` against a span written by hand, and what removing it leaves.

Every variant calls `registry.execute("t")`, a trivial tool (the worst case: a real tool's own
work dwarfs a span), on a registry with two workers.

* execute in a hand-written span: what a user who wants a span per call writes without
  toolreg.otel: `with tracer.start_as_current_span("execute_tool t", attributes=...)` around
  `execute`, setting the result's attributes (and an error status) on the span, on an
  OpenTelemetry SDK `TracerProvider` whose `SimpleSpanProcessor` hands each span to an
  exporter that does nothing. The baseline of the target row.
* + instrument(), same SDK provider: the instrumented call against that hand-written span,
  paired (target <= 1.10x). The instrumented span does more: it is current inside the body
  (on the pool's thread), and carries the call's cancellation and deadline as events.
* execute, never instrumented: seconds per call, no span at all; against it (no target: a span
  costs what it costs, whoever writes it):
* + instrument(), SDK: the same provider, so the span is built, filled, ended and processed on
  the call's own threads.
* + instrument(), API only: the API's default provider (no SDK installed or configured): spans
  are non-recording, so this is toolreg's own share (the hook, the body scope, the end).
* an SDK span alone: `start_span` with the call's attributes, `set_attributes`, `end`, with the
  same provider and no toolreg at all: the share of the SDK itself.
* execute after instrument().remove(), against a registry never instrumented: what is left once
  tracing is off (target <= 1.05x: nothing but noise).

The instrumented ratios are paired: each run times the bare registry and the instrumented one
back to back (ABBA, instrumenting and removing on the same registry), and the table shows the
median of those ratios. The removed-vs-never ratio is paired the same way between two
registries. Absolute figures are medians over interleaved repeats (`_harness.interleaved`).
Needs `opentelemetry-sdk` (`pip install -e '.[otel-test]'` or `.[bench]`); without it the table
says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from toolreg import ToolRegistry

from ._harness import Rounds, Row, format_time, interleaved, timed_once, verdict

TARGET = 1.10  # execute instrumented, as a multiple of execute in a hand-written span
TARGET_REMOVED = 1.05  # execute after remove(), as a multiple of a never-instrumented registry


@dataclass(frozen=True)
class Sizes:
    calls: int  # calls per timed run
    repeats: int


QUICK = Sizes(calls=400, repeats=5)
FULL = Sizes(calls=2_000, repeats=15)


def _sdk_provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Discard(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Discard()))
    return provider


def _api_provider() -> Any:
    from opentelemetry.trace import NoOpTracerProvider

    return NoOpTracerProvider()


PROVIDERS: dict[str, Callable[[], Any]] = {"SDK": _sdk_provider, "API only": _api_provider}


def _registry() -> ToolRegistry:
    registry = ToolRegistry(max_workers=2)
    registry.tool(name="t", description="A trivial tool")(lambda args, ctx: "ok")
    _calls(registry, 100)  # start the pool's threads, warm the caches
    return registry


def _calls(registry: ToolRegistry, n: int) -> None:
    for _ in range(n):
        registry.execute("t")


def _per_call(count: int, provider: str | None) -> float:
    """Seconds per call, in a fresh registry, instrumented with `provider` (or not)."""
    import toolreg.otel

    with _registry() as registry:
        if provider is not None:
            toolreg.otel.instrument(registry, tracer_provider=PROVIDERS[provider]())
            _calls(registry, 50)
        return timed_once(partial(_calls, registry), count) / count


def _paired(count: int, provider: str) -> float:
    """Seconds per call instrumented over not, one registry, ABBA order."""
    import toolreg.otel

    tracer_provider = PROVIDERS[provider]()
    with _registry() as registry:
        run = partial(_calls, registry)
        bare = timed_once(run, count)
        added = toolreg.otel.instrument(registry, tracer_provider=tracer_provider)
        traced = timed_once(run, count)
        traced += timed_once(run, count)
        added.remove()
        bare += timed_once(run, count)
    return traced / bare


def _removed_over_never(count: int) -> float:
    """Seconds per call on a registry whose instrumentation was removed, over a fresh one."""
    import toolreg.otel

    with _registry() as never, _registry() as removed:
        registration = toolreg.otel.instrument(removed, tracer_provider=_sdk_provider())
        _calls(removed, 50)
        registration.remove()
        return _abba(partial(_calls, never), partial(_calls, removed), count)


def _abba(a: Callable[[int], None], b: Callable[[int], None], count: int) -> float:
    first = timed_once(a, count)
    second = timed_once(b, count) + timed_once(b, count)
    first += timed_once(a, count)
    return second / first


def _hand_written(tracer: Any, registry: ToolRegistry, n: int) -> None:
    """`n` calls, each in a span written the way a user would write it without toolreg.otel."""
    from opentelemetry.trace import Status, StatusCode

    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "t",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.description": "A trivial tool",
    }
    for _ in range(n):
        with tracer.start_as_current_span("execute_tool t", attributes=attributes) as span:
            result = registry.execute("t")
            span.set_attributes(
                {
                    "gen_ai.tool.call.id": result.call.call_id,
                    "toolreg.dispatched": result.dispatched,
                }
            )
            if result.error is not None:
                span.set_status(Status(StatusCode.ERROR, result.error.message))


def _over_hand_written(count: int) -> float:
    """Seconds per call instrumented over the same call in a hand-written span: one registry,
    one SDK provider, ABBA order."""
    import toolreg.otel

    provider = _sdk_provider()
    tracer = provider.get_tracer("bench")
    try:
        with _registry() as registry:
            hand = partial(_hand_written, tracer, registry)
            written = timed_once(hand, count)
            added = toolreg.otel.instrument(registry, tracer_provider=provider)
            run = partial(_calls, registry)
            traced = timed_once(run, count) + timed_once(run, count)
            added.remove()
            written += timed_once(hand, count)
        return traced / written
    finally:
        provider.shutdown()


def _per_hand_written(count: int) -> float:
    """Seconds per call in a hand-written span (SDK provider, no-op exporter)."""
    provider = _sdk_provider()
    try:
        with _registry() as registry:
            hand = partial(_hand_written, provider.get_tracer("bench"), registry)
            hand(50)
            return timed_once(hand, count) / count
    finally:
        provider.shutdown()


def _span_alone(count: int) -> float:
    """Seconds per SDK span shaped like a call's, without toolreg."""
    provider = _sdk_provider()
    tracer = provider.get_tracer("bench")
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "t",
        "gen_ai.tool.call.id": "call_0",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.description": "A trivial tool",
    }

    def spans(n: int) -> None:
        for _ in range(n):
            span = tracer.start_span("execute_tool t", attributes=attributes)
            span.set_attributes({"toolreg.dispatched": True})
            span.end()

    try:
        return timed_once(spans, count) / count
    finally:
        provider.shutdown()


def measure(quick: bool) -> Rounds:
    """Per-round samples: seconds per call or span, and the paired ratios."""
    sizes = QUICK if quick else FULL
    n = sizes.calls
    variants: dict[str, Callable[[], float]] = {"execute": partial(_per_call, n, None)}
    for name in PROVIDERS:
        variants[f"execute + {name}"] = partial(_per_call, n, name)
        variants[f"{name} / bare"] = partial(_paired, n // 2, name)
    variants["hand-written"] = partial(_per_hand_written, n)
    variants["SDK / hand-written"] = partial(_over_hand_written, n // 2)
    variants["span"] = partial(_span_alone, n)
    variants["removed / never"] = partial(_removed_over_never, n // 2)
    return interleaved(variants, sizes.repeats)


def run(quick: bool) -> list[Row]:
    """Measure and return the table's rows (one row saying why, without the SDK)."""
    try:
        import opentelemetry.sdk.trace  # noqa: F401

        import toolreg.otel  # noqa: F401
    except ImportError:
        return [Row("toolreg.otel (skipped: pip install -e '.[otel-test]')", "-")]
    m = measure(quick)
    written = m["hand-written"]
    factor = m["SDK / hand-written"]
    traced = written * factor
    rows = [
        Row(
            "execute in a hand-written span, SDK tracer, no-op exporter (baseline)",
            format_time(written),
            "1.00x",
        ),
        Row(
            "execute + instrument(), the same SDK provider, paired",
            f"{format_time(traced)} ({_signed(traced - written)})",
            f"{factor:.2f}x",
            f"<= {TARGET:.2f}x",
            verdict(factor, TARGET),
        ),
    ]
    bare = m["execute"]
    rows.append(Row("execute, never instrumented (baseline)", format_time(bare), "1.00x"))
    labels = {
        "SDK": "execute + instrument(), SDK tracer, no-op exporter, paired",
        "API only": "execute + instrument(), API only (non-recording spans), paired",
    }
    for name, label in labels.items():
        factor = m[f"{name} / bare"]
        figure = f"{format_time(m[f'execute + {name}'])} ({_signed(bare * (factor - 1))})"
        rows.append(Row(label, figure, f"{factor:.2f}x"))
    rows.append(Row("an SDK span alone, shaped like a call's (no toolreg)", format_time(m["span"])))
    removed = m["removed / never"]
    rows.append(
        Row(
            "execute after instrument().remove() vs never instrumented, paired",
            "",
            f"{removed:.2f}x",
            f"<= {TARGET_REMOVED:.2f}x",
            verdict(removed, TARGET_REMOVED),
        )
    )
    return rows


def _signed(seconds: float) -> str:
    return f"{'+' if seconds >= 0 else '-'}{format_time(abs(seconds))}"


if __name__ == "__main__":
    import sys

    from ._harness import format_table

    print(format_table("bench_otel", run(quick="--quick" in sys.argv)))
