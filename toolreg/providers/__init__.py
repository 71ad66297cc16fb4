"""Provider SDK loops: run the tool calls of an OpenAI or Anthropic response through a registry.

For code that calls a model through the provider's own SDK and runs the tools itself. One
module per provider, the same four names in each, and neither imported here:

* `toolreg.providers.openai` (`pip install 'toolreg-quiescent[openai]'`): Chat Completions and
  Responses;
* `toolreg.providers.anthropic` (`pip install 'toolreg-quiescent[anthropic]'`): Messages, and
  `RegistryToolset` for the SDK's tool runner.

`tools(registry)` gives the tool definitions in the API's own shape, `tool_calls(response)` the
calls a response asked for, and `run_tool_calls(registry, response, token=turn.token)` runs them
as one model-driven batch and returns exactly one result item per tool call, in order, whatever
happened (an unknown tool, bad arguments, a denial, a timeout, a cancelled turn), so the next
request to the provider is always valid; `arun_tool_calls` is the same for asyncio.

Neither module imports its SDK: they read the SDK's objects and plain dicts of the same shape
alike, so conversations stored as JSON work too, with or without the SDK installed. Only
`toolreg.providers.anthropic.RegistryToolset`, which hands tools to the SDK's tool runner, needs
the SDK; without it, constructing one raises `ImportError` naming the extra.
"""

__all__: list[str] = []
