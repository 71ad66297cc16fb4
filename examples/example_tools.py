"""The tools the provider loop examples give the model: a registry with two small tools."""

from __future__ import annotations

from typing import Any

from toolreg import ToolRegistry, ToolResult


def build_registry() -> ToolRegistry:
    """A registry with `add` and `word_count`, printing each result as it comes."""
    registry = ToolRegistry(max_workers=4)

    @registry.tool(
        description="Add two integers.",
        parameters={
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
        concurrency_safe=True,
    )
    def add(args: Any, ctx: Any) -> int:
        return int(args["a"]) + int(args["b"])

    @registry.tool(
        description="Count the words in a text.",
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
        concurrency_safe=True,
    )
    def word_count(args: Any, ctx: Any) -> int:
        return len(str(args["text"]).split())

    registry.on_result(show)
    return registry


def show(result: ToolResult[Any]) -> None:
    """Print what the model will read for one call."""
    print(f"  [{result.call.name}] {result.content}", flush=True)
