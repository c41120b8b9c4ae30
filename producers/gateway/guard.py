"""The gateway's checks on what comes in: bearer keys, body size, JSON depth and the JSON shape
of a call.

Each failure is a `BadRequest` with an HTTP status and a message naming the bad value and what
was expected; the app turns it into an OpenAI-style error body. Nothing is recorded for them.
Every route that reads a body reads it through `read_body`, so the size limit holds for
chunked bodies too: it is enforced while reading, and a body that goes past it is never read
to its end.
"""

from __future__ import annotations

import hmac
import json

from fastapi import Request

from tracetrain.errors import BadRequest


def check_auth(request: Request, keys: list[bytes]) -> None:
    """401 unless the bearer token is one of `keys` (UTF-8 bytes).

    Compared as bytes: Starlette decodes header values as latin-1, so re-encoding gives the
    bytes the client sent; `hmac.compare_digest` on str refuses anything but ASCII (a 500 for
    a token like 'clé')."""
    if not keys:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    sent = token.encode("latin-1", errors="replace")
    if scheme.lower() != "bearer" or not any(hmac.compare_digest(sent, k) for k in keys):
        raise BadRequest("missing or wrong API key: expected 'Authorization: Bearer <key>' "
                         "with one of the gateway's keys", status=401)


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body; 413 as soon as it is known to exceed `limit` bytes (declared length, or
    counted while reading a chunked body)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"request body of {declared} bytes exceeds the limit of {limit}", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"request body exceeds the limit of {limit} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes, max_depth: int):
    """The parsed JSON; 400 if it is not JSON or nests deeper than `max_depth`."""
    try:
        value = json.loads(raw)
    except RecursionError as exc:  # thousands of levels: the C parser gives up
        raise _too_deep(max_depth) from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON ({exc}); expected a JSON object") from exc
    if _deeper_than(value, max_depth):
        raise _too_deep(max_depth)
    return value


async def read_json_body(request: Request, limit: int, max_depth: int):
    """The parsed JSON body within `limit` bytes and `max_depth` levels."""
    return parse_json(await read_body(request, limit), max_depth)


def _too_deep(max_depth: int) -> BadRequest:
    return BadRequest(f"request body nests objects and arrays more than {max_depth} levels "
                      f"deep; expected at most {max_depth}")


def _deeper_than(value, max_depth: int) -> bool:
    """Whether containers nest more than `max_depth` levels (iterative: no recursion limit)."""
    level = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            return True
        level = [child for node in level
                 for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, dict | list)]
    return False


def _expect(cond: bool, param: str, expected: str, got) -> None:
    if not cond:
        shown = type(got).__name__ if not isinstance(got, str | int | float | bool) else repr(got)
        raise BadRequest(f"'{param}' must be {expected}, got {shown}", status=422, param=param)


# Each choice of a call is a span of its own: OpenAI's own bound on `n`.
MAX_CHOICES = 128


def choices_asked(body: dict) -> int:
    """The choices a validated call asks for (`n`, 1 when absent)."""
    return body.get("n") or 1


def validate_call(kind: str, body) -> None:
    """Enough checking to record a call faithfully; the upstream checks the rest."""
    _expect(isinstance(body, dict), "body", "a JSON object", body)
    _expect(isinstance(body.get("model"), str) and body["model"] != "", "model",
            "a non-empty string", body.get("model"))
    if "stream" in body:
        _expect(isinstance(body["stream"], bool), "stream", "true or false", body["stream"])
    if body.get("n") is not None:
        n = body["n"]
        _expect(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_CHOICES, "n",
                f"an integer from 1 to {MAX_CHOICES}", n)
    if kind == "chat":
        msgs = body.get("messages")
        _expect(isinstance(msgs, list) and len(msgs) > 0, "messages", "a non-empty array", msgs)
        for i, msg in enumerate(msgs):
            _expect(isinstance(msg, dict) and isinstance(msg.get("role"), str),
                    f"messages[{i}]", "an object with a string 'role'", msg)
    else:
        prompt = body.get("prompt")
        _expect(isinstance(prompt, str | list), "prompt", "a string or an array", prompt)
