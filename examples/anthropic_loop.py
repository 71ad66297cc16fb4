"""A tool-calling loop on the Anthropic SDK, with the tools run by a toolreg registry.

    pip install 'toolreg-quiescent[anthropic]'
    ANTHROPIC_API_KEY=... python examples/anthropic_loop.py "What is 2 + 3, in words?"
    ANTHROPIC_API_KEY=... python examples/anthropic_loop.py --runner "How many words: a b c"

The SDK reads `ANTHROPIC_API_KEY` and `ANTHROPIC_BASE_URL` from the environment;
`ANTHROPIC_MODEL` picks the model. By default the loop is written out: ask the model, run every
`tool_use` through the registry (one `tool_result` per call, in order, whatever happened: an
unknown tool or malformed input comes back as an `is_error` result the model reads), send them
back in one user message, until the model answers; each turn's tools run under a deadline.
With `--runner`, the SDK's own tool runner drives the same loop over `RegistryToolset`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from typing import Any

from anthropic import Anthropic
from example_tools import build_registry  # the tools: add, word_count

from toolreg import ToolRegistry, deadline
from toolreg.providers import anthropic as tp

MODEL = os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-5-5")
MAX_TOKENS = 1024
TURN_SECONDS = 60.0  # every tool call of one turn must be done by then
MAX_TURNS = 10


def messages_loop(client: Anthropic, registry: ToolRegistry, prompt: str) -> str:
    """The loop written out: the reply, then all of its tool results in one user message."""
    messages: list[Any] = [{"role": "user", "content": prompt}]
    tools = tp.tools(registry)
    for _ in range(MAX_TURNS):
        message = client.messages.create(
            model=MODEL, max_tokens=MAX_TOKENS, messages=messages, tools=tools
        )
        messages.append({"role": "assistant", "content": message.content})
        with deadline(None, TURN_SECONDS) as turn:
            results = tp.run_tool_calls(registry, message, token=turn.token)
        if not results:
            return text_of(message.content)
        messages.append({"role": "user", "content": results})
    raise RuntimeError(f"no answer after {MAX_TURNS} turns")


def runner_loop(client: Anthropic, registry: ToolRegistry, prompt: str) -> str:
    """The SDK's tool runner, handed the registry's tools."""
    runner = client.beta.messages.tool_runner(
        model=MODEL,
        max_tokens=MAX_TOKENS,
        messages=[{"role": "user", "content": prompt}],
        tools=[*tp.RegistryToolset(registry)],
        max_iterations=MAX_TURNS,
    )
    return text_of(runner.until_done().content)


def text_of(content: Iterable[Any]) -> str:
    return "".join(block.text for block in content if block.type == "text")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", default="What is 2 + 3, and how many words is that?")
    parser.add_argument("--runner", action="store_true", help="use the SDK's tool runner")
    args = parser.parse_args()
    loop = runner_loop if args.runner else messages_loop
    with Anthropic() as client, build_registry() as registry:
        print(loop(client, registry, args.prompt))


if __name__ == "__main__":
    main()
