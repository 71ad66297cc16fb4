"""Tracing: what `toolreg.otel.instrument` adds to `execute`, and that removing it costs nothing.

Every variant calls `registry.execute("t")`, a trivial tool (the worst case: a real tool's own
work dwarfs a span), on a registry with two workers.

* execute, never instrumented: the baseline, seconds per call.
* + instrument(), SDK: an OpenTelemetry SDK `TracerProvider` whose `SimpleSpanProcessor` hands
  each span to an exporter that does nothing, so the span is built, filled, ended and
  processed on the call's own threads (target <= 1.15x).
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

TARGET = 1.15  # execute instrumented with an SDK tracer, as a multiple of execute without
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
    bare = m["execute"]
    rows = [Row("execute, never instrumented (baseline)", format_time(bare), "1.00x")]
    labels = {
        "SDK": "execute + instrument(), SDK tracer, no-op exporter, paired",
        "API only": "execute + instrument(), API only (non-recording spans), paired",
    }
    for name, label in labels.items():
        factor = m[f"{name} / bare"]
        target = f"<= {TARGET:.2f}x" if name == "SDK" else ""
        result = verdict(factor, TARGET) if name == "SDK" else ""
        added = bare * (factor - 1)
        sign = "+" if added >= 0 else "-"
        figure = f"{format_time(m[f'execute + {name}'])} ({sign}{format_time(abs(added))})"
        rows.append(Row(label, figure, f"{factor:.2f}x", target, result))
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


if __name__ == "__main__":
    import sys

    from ._harness import format_table

    print(format_table("bench_otel", run(quick="--quick" in sys.argv)))
