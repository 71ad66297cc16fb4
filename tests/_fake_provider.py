"""A scripted model API on 127.0.0.1 for the provider SDK tests: OpenAI (Chat Completions,
Responses) and Anthropic (Messages) in their own wire formats.

`serving(api, replies)` starts a `FakeProvider` on a free port and stops it (server shut down,
its threads joined) when the block ends; point the real SDK's `base_url` at `provider.base_url`
(or `provider.openai_base_url`), or run an example against it (`run_example`). Each request
gets the next scripted reply, either a canned body (`chat_reply`, `responses_reply`,
`message_reply` build them) or a function of the request body.

Every request is checked as the real API checks a conversation, and more strictly: each tool
call the model made must be answered exactly once, in order, before the conversation goes on
(OpenAI: one `tool` message per `tool_calls` id, right after them; Responses: one
`function_call_output` per `function_call`, in order, the calls of `previous_response_id`
included; Anthropic: the next user message opens with one `tool_result` per `tool_use`, in
order, the previous message of a thread included). A request that fails the check is answered
400 in the API's error format and recorded in `problems`, so a test asserts `problems == []`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

Api = Literal["chat", "responses", "anthropic"]
Body = dict[str, Any]
Reply = Body | Callable[[Body], Body]
Call = tuple[str, str, Any]  # (provider id, tool name, arguments: JSON text, or Anthropic input)

PATHS: dict[Api, str] = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "anthropic": "/v1/messages",
}


class FakeProvider:
    """The server: scripted replies, every request recorded and checked (see the module)."""

    def __init__(self, api: Api, replies: Sequence[Reply]) -> None:
        self.api = api
        self._lock = threading.Lock()  # guards requests, problems, _replies and _sent
        self.requests: list[Body] = []  # every request body, in arrival order
        self.problems: list[str] = []  # what the checks found wrong, one line each
        self._replies: deque[Reply] = deque(replies)
        self._sent: dict[str, Body] = {}  # replies by id: what a later request may refer to
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fake-provider", daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def pending(self) -> int:
        """Scripted replies not yet sent."""
        with self._lock:
            return len(self._replies)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()  # joins the request threads (block_on_close)
        self._thread.join()

    def answer(self, path: str, body: Body) -> tuple[int, Body]:
        """The status and body for one request (called on the server's request thread)."""
        with self._lock:
            self.requests.append(body)
            problem = _check(self.api, path, body, self._sent)
            if problem is None and not self._replies:
                problem = f"request {len(self.requests)}: no reply scripted"
            if problem is not None:
                self.problems.append(problem)
                return 400, _error(self.api, problem)
            reply = self._replies.popleft()
        body_out = reply(body) if callable(reply) else reply
        with self._lock:
            self._sent[str(body_out.get("id"))] = body_out
        return 200, body_out


@contextlib.contextmanager
def serving(api: Api, replies: Sequence[Reply]) -> Iterator[FakeProvider]:
    """A started `FakeProvider`, stopped and joined when the block ends."""
    provider = FakeProvider(api, replies)
    provider.start()
    try:
        yield provider
    finally:
        provider.stop()


def run_example(script: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run an example script in a fresh interpreter with `env` instead of the caller's own
    provider settings (every `OPENAI_*` and `ANTHROPIC_*` variable is dropped)."""
    inherited = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OPENAI_", "ANTHROPIC_"))
    }
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**inherited, **env},
        check=False,
    )


def _handler_for(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, so no request thread outlives its request.
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            try:
                body = json.loads(self.rfile.read(length))
            except ValueError:
                status, reply = 400, _error(provider.api, "the request body is not JSON")
            else:
                status, reply = provider.answer(self.path.split("?")[0], body)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the tests read `requests` and `problems`

    return Handler


def _error(api: Api, message: str) -> Body:
    if api == "anthropic":
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return {"error": {"message": message, "type": "invalid_request_error", "code": None}}


# -- the checks: each tool call answered exactly once, in order ----------------------------------


def _check(api: Api, path: str, body: Body, sent: dict[str, Body]) -> str | None:
    if path != PATHS[api]:
        return f"unexpected path {path}"
    if api == "chat":
        return _check_chat(body.get("messages"))
    if api == "responses":
        return _check_responses(body, sent)
    return _check_messages(body, sent)


def _check_chat(messages: object) -> str | None:
    if not isinstance(messages, list):
        return "messages is not a list"
    expected: list[str] = []  # ids still to be answered, in order
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            if not expected:
                return f"message {index}: a tool message answers no pending tool call"
            answered = message.get("tool_call_id")
            if answered != expected[0]:
                return f"message {index}: result for {answered!r}, expected {expected[0]!r}"
            if not isinstance(message.get("content"), str):
                return f"message {index}: tool content is not a string"
            expected.pop(0)
            continue
        if expected:
            return f"message {index}: tool calls {expected} were not answered"
        if role == "assistant":
            expected = [call["id"] for call in message.get("tool_calls") or ()]
    if expected:
        return f"tool calls {expected} were not answered"
    return None


def _check_responses(body: Body, sent: dict[str, Body]) -> str | None:
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        return "input is not a list"
    previous = body.get("previous_response_id")
    if previous is not None:
        if previous not in sent:
            return f"previous_response_id {previous!r} was never sent"
        items = [*sent[previous]["output"], *items]
    calls: list[str] = []  # the function calls met so far, in order
    outputs: list[str] = []  # the outputs met so far, in order
    for index, item in enumerate(items):
        if item.get("type") == "function_call":
            calls.append(item["call_id"])
        elif item.get("type") == "function_call_output":
            if not isinstance(item.get("output"), str):
                return f"item {index}: function_call_output's output is not a string"
            due = calls[len(outputs)] if len(outputs) < len(calls) else None
            if item.get("call_id") != due:
                return f"item {index}: output for {item.get('call_id')!r}, expected {due!r}"
            outputs.append(item["call_id"])
    if outputs != calls:
        return f"function calls {calls} answered by outputs {outputs}"
    return None


def _check_messages(body: Body, sent: dict[str, Body]) -> str | None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return "messages is not a list"
    thread = body.get("thread") or {}
    if thread.get("type") == "continue":
        previous = thread.get("previous_message_id")
        if previous not in sent:
            return f"previous_message_id {previous!r} was never sent"
        messages = [{"role": "assistant", "content": sent[previous]["content"]}, *messages]
    for index, message in enumerate(messages):
        if message.get("role") != "assistant" or isinstance(message.get("content"), str):
            continue
        ids = [b["id"] for b in message["content"] if b.get("type") == "tool_use"]
        if not ids:
            continue
        following = messages[index + 1] if index + 1 < len(messages) else None
        if following is None:
            return f"message {index}: tool uses {ids} were not answered"
        problem = _check_tool_results(index + 1, following, ids)
        if problem is not None:
            return problem
    return None


def _check_tool_results(index: int, message: Body, ids: list[str]) -> str | None:
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, list):
        return f"message {index}: tool uses {ids} need a user message of tool_result blocks"
    results = [b for b in content if b.get("type") == "tool_result"]
    if [b.get("type") for b in content[: len(results)]] != ["tool_result"] * len(results):
        return f"message {index}: tool_result blocks must come first"
    answered = [b.get("tool_use_id") for b in results]
    if answered != ids:
        return f"message {index}: tool uses {ids} answered by {answered}"
    for block in results:
        if not isinstance(block.get("is_error", False), bool):
            return f"message {index}: is_error is not a bool"
        if block.get("is_error") and not block.get("content"):
            return f"message {index}: an is_error result without content"
    return None


# -- canned replies ----------------------------------------------------------------------------

_ids = itertools.count(1)


def chat_reply(calls: Sequence[Call] = (), text: str | None = None) -> Body:
    """A `ChatCompletion` asking for `calls` ((id, name, arguments JSON text)), or answering."""
    message: Body = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}
            for cid, name, arguments in calls
        ]
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": 0,
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def responses_reply(calls: Sequence[Call] = (), text: str | None = None) -> Body:
    """A `Response` whose output asks for `calls` ((call_id, name, arguments JSON text))."""
    output: list[Body] = [
        {
            "type": "function_call",
            "id": f"fc_{cid}",
            "call_id": cid,
            "name": name,
            "arguments": arguments,
            "status": "completed",
        }
        for cid, name, arguments in calls
    ]
    if text is not None:
        output.append(
            {
                "type": "message",
                "id": f"msg_{next(_ids)}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    return {
        "id": f"resp_{next(_ids)}",
        "object": "response",
        "created_at": 0,
        "model": "fake-model",
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "temperature": 1.0,
        "top_p": 1.0,
    }


def message_reply(calls: Sequence[Call] = (), text: str | None = None) -> Body:
    """An Anthropic `Message` with `text` and `tool_use` blocks for `calls` ((id, name, input))."""
    content: list[Body] = [] if text is None else [{"type": "text", "text": text}]
    content += [
        {"type": "tool_use", "id": cid, "name": name, "input": tool_input}
        for cid, name, tool_input in calls
    ]
    return {
        "id": f"msg_{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": "fake-model",
        "content": content,
        "stop_reason": "tool_use" if calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
