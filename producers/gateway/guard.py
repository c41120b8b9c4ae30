"""The gateway's checks on what comes in: bearer keys, body size, JSON shape of a call.

Each failure is a `BadRequest` with an HTTP status and a message naming the bad value and what
was expected; the app turns it into an OpenAI-style error body. Nothing is recorded for them.
"""

from __future__ import annotations

import hmac
import json

from fastapi import Request

from tracetrain.errors import BadRequest


def check_auth(request: Request, keys: set[str]) -> None:
    if not keys:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not any(hmac.compare_digest(token, k) for k in keys):
        raise BadRequest("missing or wrong API key: expected 'Authorization: Bearer <key>' "
                         "with one of the gateway's keys", status=401)


async def read_json_body(request: Request, limit: int):
    """The parsed JSON body; 413 beyond `limit` bytes (checked while reading), 400 if not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"request body of {declared} bytes exceeds the limit of {limit}", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"request body exceeds the limit of {limit} bytes", status=413)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON ({exc}); expected a JSON object") from exc


def _expect(cond: bool, param: str, expected: str, got) -> None:
    if not cond:
        shown = type(got).__name__ if not isinstance(got, str | int | float | bool) else repr(got)
        raise BadRequest(f"'{param}' must be {expected}, got {shown}", status=422, param=param)


def validate_call(kind: str, body) -> None:
    """Enough checking to record a call faithfully; the upstream checks the rest."""
    _expect(isinstance(body, dict), "body", "a JSON object", body)
    _expect(isinstance(body.get("model"), str) and body["model"] != "", "model",
            "a non-empty string", body.get("model"))
    if "stream" in body:
        _expect(isinstance(body["stream"], bool), "stream", "true or false", body["stream"])
    if kind == "chat":
        msgs = body.get("messages")
        _expect(isinstance(msgs, list) and len(msgs) > 0, "messages", "a non-empty array", msgs)
        for i, msg in enumerate(msgs):
            _expect(isinstance(msg, dict) and isinstance(msg.get("role"), str),
                    f"messages[{i}]", "an object with a string 'role'", msg)
    else:
        prompt = body.get("prompt")
        _expect(isinstance(prompt, str | list), "prompt", "a string or an array", prompt)
