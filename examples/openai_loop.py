"""A tool-calling loop on the OpenAI SDK, with the tools run by a toolreg registry.

    pip install 'toolreg-quiescent[openai]'
    OPENAI_API_KEY=... python examples/openai_loop.py "What is 2 + 3, in words?"
    OPENAI_API_KEY=... python examples/openai_loop.py --api responses "How many words: a b c"

The SDK reads `OPENAI_API_KEY` and `OPENAI_BASE_URL` (any OpenAI-compatible server) from the
environment; `OPENAI_MODEL` picks the model. Each turn: ask the model, run every tool call it
made through the registry (one result per call, in order, whatever happened: an unknown tool or
malformed arguments come back as an error text the model reads), send the results back, until
the model answers. Each turn's tools run under a deadline, and Ctrl-C stops them (the bodies
that started are waited for) before it ends the program.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from example_tools import build_registry  # the tools: add, word_count
from openai import OpenAI

from toolreg import ToolRegistry, deadline
from toolreg.providers import openai as tp

MODEL = os.environ.get("OPENAI_MODEL", "gpt-5.5")
TURN_SECONDS = 60.0  # every tool call of one turn must be done by then
MAX_TURNS = 10


def chat_loop(client: OpenAI, registry: ToolRegistry, prompt: str) -> str:
    """Chat Completions: the assistant message and one `tool` message per call, each turn."""
    messages: list[Any] = [{"role": "user", "content": prompt}]
    tools = tp.tools(registry)
    for _ in range(MAX_TURNS):
        completion = client.chat.completions.create(model=MODEL, messages=messages, tools=tools)
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        with deadline(None, TURN_SECONDS) as turn:
            messages.extend(tp.run_tool_calls(registry, completion, token=turn.token))
    raise RuntimeError(f"no answer after {MAX_TURNS} turns")


def responses_loop(client: OpenAI, registry: ToolRegistry, prompt: str) -> str:
    """Responses: each turn sends the outputs, chained to the previous response by its id."""
    tools = tp.tools(registry, api="responses")
    response = client.responses.create(model=MODEL, input=prompt, tools=tools)
    for _ in range(MAX_TURNS):
        with deadline(None, TURN_SECONDS) as turn:
            outputs = tp.run_tool_calls(registry, response, token=turn.token)
        if not outputs:
            return response.output_text
        response = client.responses.create(
            model=MODEL, input=outputs, tools=tools, previous_response_id=response.id
        )
    raise RuntimeError(f"no answer after {MAX_TURNS} turns")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", default="What is 2 + 3, and how many words is that?")
    parser.add_argument("--api", choices=("chat", "responses"), default="chat")
    args = parser.parse_args()
    loop = chat_loop if args.api == "chat" else responses_loop
    with OpenAI() as client, build_registry() as registry:
        print(loop(client, registry, args.prompt))


if __name__ == "__main__":
    main()
