"""What the gateway records of a call: the LLM part of a Span from request and response bodies.

Field names follow vLLM's OpenAI server: with `return_token_ids` a response carries
`choices[i].token_ids` and `prompt_token_ids` (top level for chat, per choice for completions);
logprobs are `choices[i].logprobs.content[j].logprob` (chat) or
`choices[i].logprobs.token_logprobs` (completions). The policy version comes from a
`policy_version` response field or the `X-Policy-Version` header (the embedded engine), or else
from the response's `model` when it is the versioned name of the requested one (`policy-v12`
for `policy`: vLLM, see producers/gateway/versions.py); the span's model is the requested name. A stream is assembled chunk
by chunk into the same shape as a non-streamed response, so one function records both; a
stream is complete once it sent `[DONE]` or every choice its finish reason, and an event that
is not an OpenAI chunk is an error of the span, never an exception in the relay.

A call with `n > 1` answers several choices of one prompt: each is recorded (one span each,
`llm_from_response(..., index=i)`), as a sampled answer the policy gave, trainable like any.
"""

from __future__ import annotations

import json
from typing import Any

from producers.records import llm_part
from tracetrain import served_names


def prepare_request(kind: str, body: dict, ask_token_ids: bool) -> dict:
    """The body sent upstream: asks for token ids and logprobs unless the client chose."""
    if not ask_token_ids:
        return body
    out = dict(body)
    out.setdefault("return_token_ids", True)
    if kind == "chat":
        out.setdefault("logprobs", True)
    else:
        out.setdefault("logprobs", 1)
    return out


def with_temperature(body: dict, forced: float | None, default: float) -> dict:
    """The body with the temperature the engine is to sample at: `forced` (a rollout mode's)
    over the client's, the client's, or `default` when it gives none (sent explicitly, so the
    span records what the engine used, whatever its own default)."""
    if forced is not None:
        return {**body, "temperature": forced}
    if body.get("temperature") is None:
        return {**body, "temperature": default}
    return body


def temperature_attribute(body: dict) -> str | None:
    """The span attribute of the body's temperature; None for a value that is not a number, or
    one past a float's range (the engine refuses such a call, and its span is an error span)."""
    value = body.get("temperature")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return repr(float(value))
    except OverflowError:  # an int past a float's range: no temperature an engine takes
        return None


def _sent(kind: str, request: dict):
    return request.get("messages", []) if kind == "chat" else request.get("prompt", "")


def request_bytes(kind: str, request: dict) -> int:
    """Bytes the span of a call holds of its request alone (messages or prompt, and tools, as
    JSON): a lower bound of the span's size, known before the upstream is called."""
    size = len(json.dumps(_sent(kind, request)))
    if request.get("tools"):
        size += len(json.dumps(request["tools"]))
    return size


def _policy_version(resp: dict, header: str | None, version_of_model: int | None) -> int | None:
    for value in (resp.get("policy_version"), header):
        if value is None:
            continue
        try:
            return int(value)
        except (TypeError, ValueError):
            continue
    return version_of_model


def _logprobs(kind: str, choice: dict) -> list[float]:
    lp = choice.get("logprobs") or {}
    if kind == "chat":
        return [float(t.get("logprob", 0.0)) for t in (lp.get("content") or [])]
    return [float(x) for x in (lp.get("token_logprobs") or []) if x is not None]


def choice_count(resp: dict) -> int:
    """How many choices the response holds (at least 1: an answer without any is recorded as
    one call, with what it has)."""
    choices = resp.get("choices")
    return max(1, len(choices)) if isinstance(choices, list) else 1


def llm_from_response(kind: str, request: dict, resp: dict, policy_header: str | None,
                      index: int = 0) -> tuple[dict, dict[str, str]]:
    """The Span's LLM part and extra attributes of one upstream response's choice `index`."""
    choices = resp.get("choices") or [{}]
    choice = choices[index] if isinstance(choices[index], dict) else {}
    attrs: dict[str, str] = {}
    if kind == "chat":
        message = choice.get("message") or {}
        text = message.get("content") or ""
        if message.get("tool_calls"):
            attrs["tool_calls"] = json.dumps(message["tool_calls"])
    else:
        text = choice.get("text") or ""
    sent = _sent(kind, request)
    if request.get("tools"):
        attrs["tools"] = json.dumps(request["tools"])
    if len(choices) > 1:
        attrs["choices"] = str(len(choices))
        attrs["choice_index"] = str(index)
    prompt_ids = resp.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
    usage = resp.get("usage") or {}
    model = str(resp.get("model") or request.get("model") or "")
    version_of_model = served_names.version_of(str(request.get("model")), model)
    if version_of_model is not None:
        model = str(request["model"])
    llm = llm_part(
        model=model,
        policy_version=_policy_version(resp, policy_header, version_of_model),
        request_messages=json.dumps(sent),
        response_text=text,
        prompt_token_ids=prompt_ids,
        response_token_ids=choice.get("token_ids") or [],
        response_logprobs=_logprobs(kind, choice),
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=usage.get("prompt_tokens") if usage else None,
        completion_tokens=usage.get("completion_tokens") if usage else None,
    )
    return llm, attrs


class _ChoiceStream:
    """One choice's pieces as its chunks arrive."""

    def __init__(self):
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list[dict] = []
        self.token_logprobs: list[float] = []
        self.tool_calls: dict[int, dict] = {}
        self.prompt_token_ids: list[int] | None = None
        self.finish_reason: str | None = None

    def add(self, kind: str, choice: dict) -> None:
        if kind == "chat":
            delta = choice.get("delta") or {}
            self.text.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(call.get("index", 0), {
                    "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = call.get("id") or slot["id"]
                fn = call.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            self.logprobs += (choice.get("logprobs") or {}).get("content") or []
        else:
            self.text.append(choice.get("text") or "")
            self.token_logprobs += (choice.get("logprobs") or {}).get("token_logprobs") or []
        if choice.get("prompt_token_ids"):
            self.prompt_token_ids = choice["prompt_token_ids"]
        self.token_ids += choice.get("token_ids") or []
        self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def response(self, kind: str, index: int) -> dict:
        choice: dict[str, Any] = {"index": index, "token_ids": self.token_ids,
                                  "finish_reason": self.finish_reason}
        if self.prompt_token_ids is not None:
            choice["prompt_token_ids"] = self.prompt_token_ids
        if kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text)}
            if self.tool_calls:
                message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
            choice["message"] = message
            choice["logprobs"] = {"content": self.logprobs}
        else:
            choice["text"] = "".join(self.text)
            choice["logprobs"] = {"token_logprobs": self.token_logprobs}
        return choice


class StreamAssembler:
    """Collects an SSE stream (`data: {...}` lines) into one non-streamed-shaped response,
    every choice of it (`n` is how many the request asked for)."""

    def __init__(self, kind: str, n: int = 1):
        self.kind = kind
        self.n = n
        self._buf = b""
        self.resp: dict[str, Any] = {}
        self.choices: dict[int, _ChoiceStream] = {}
        self.error: str | None = None
        self.done = False  # `data: [DONE]` seen
        self.bytes = 0

    @property
    def complete(self) -> bool:
        """The upstream said the stream is over: [DONE], or a finish reason for each choice
        asked for."""
        finished = sum(c.finish_reason is not None for c in self.choices.values())
        return self.done or finished >= self.n

    def feed(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                self.done = True
                continue
            try:
                self._event(json.loads(data))
            except ValueError:
                self.error = f"upstream sent a stream line that is not JSON: {data[:80]!r}"
            except (TypeError, AttributeError, KeyError):
                self.error = f"upstream sent an event that is not an OpenAI chunk: {data[:80]!r}"

    def _event(self, event: dict) -> None:
        if "error" in event:
            self.error = json.dumps(event["error"])[:2000]
        for key in ("model", "policy_version", "prompt_token_ids", "usage", "id"):
            if event.get(key) is not None:
                self.resp[key] = event[key]
        for choice in event.get("choices") or []:
            index = choice.get("index", 0)
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise TypeError(f"choice index {index!r}")
            self.choices.setdefault(index, _ChoiceStream()).add(self.kind, choice)

    def response(self) -> dict:
        indexes = sorted(self.choices) or [0]
        return {**self.resp, "choices": [self.choices.get(i, _ChoiceStream()).response(
            self.kind, i) for i in indexes]}


def error_event(message: str) -> bytes:
    """An SSE event that ends a broken stream: OpenAI's clients raise an APIError on it."""
    return b"data: " + json.dumps({"error": {"message": message, "type": "upstream_error",
                                             "code": 502}}).encode() + b"\n\n"
