"""Adapters that hand a registry's tools to the agent frameworks people already use.

One module per framework, each behind its own extra, and none of them imported here, so
`import toolreg.adapters` never imports a framework:

* `toolreg.adapters.langchain` (extra `langchain`): `as_langchain_tools`, `from_langchain`;
* `toolreg.adapters.openai_agents` (extra `openai-agents`): `AgentToolset`;
* `toolreg.adapters.pydantic_ai` (extra `pydantic-ai`): `RegistryToolset`.

Install one with `pip install 'toolreg-quiescent[langchain]'` (the distribution's name; the
import name is `toolreg`).

Every adapter runs each call through the registry's pipeline as a model-driven call
(`start_if_cancelled=False`), so hooks, approval, policies, observers and the result log see
framework calls like any other; maps the framework's cancellation onto the call's token; and
returns control for a cancelled call only once its body has settled. Where a framework abandons
the task running a tool (the OpenAI Agents SDK does, on cancellation), the adapter offers the
wait instead (`AgentToolset.drain()`). What the model sees is `result.content`. The README
has a section per adapter.
"""

__all__: list[str] = []
