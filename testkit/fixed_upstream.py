"""A fixed-response OpenAI-compatible server: the test double for an engine (vLLM cannot run on
a CPU machine), used by the gateway tests and `bench.gateway`. Not an engine: it returns the
same completion with vLLM-style token ids and logprobs for every call.

    python -m testkit.fixed_upstream PORT   (from the repository root)

Behaviour: model "fail-503" gets a 503 error body; model "strict-model" refuses
`return_token_ids` with a 400 (as OpenAI does); a chat request with `tools` and no tool
result yet gets a call of its first tool with {"a": 2, "b": 3}; after a tool result it answers
"The answer is <result>". Model "slow-stream" streams its first chunk, then waits a minute
before the rest (time for a test to kill the server or drop the client mid-stream); model
"lingering-stream" sends its whole stream, `[DONE]` included, then holds the connection open a
minute (a client that leaves on `[DONE]` leaves before the upstream ends); model
"lone-surrogate" answers a text holding an unpaired UTF-16 surrogate (valid JSON, which no
UTF-8 encoder takes). Every request body it got is kept, in order, in `app.state.received`
(what the gateway really sent). Also `ServerThread`, to run any ASGI app on a port in a thread.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

PROMPT_IDS = [1, 9906, 11, 1917, 2]
POLICY_VERSION = 7


def _answer(body: dict) -> tuple[str, list | None]:
    msgs = body.get("messages") or []
    tool_results = [m for m in msgs if m.get("role") == "tool"]
    if body.get("tools") and not tool_results:
        name = body["tools"][0]["function"]["name"]
        return "", [{"id": "call_1", "type": "function",
                     "function": {"name": name, "arguments": json.dumps({"a": 2, "b": 3})}}]
    if tool_results:
        return f"The answer is {tool_results[-1].get('content')}.", None
    if body.get("model") == "lone-surrogate":
        return "Broken emoji: \ud83d", None
    return "Hello from the fixed upstream.", None


def _pieces(text: str) -> list[str]:
    words = text.split(" ") if text else [""]
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def app() -> FastAPI:
    api = FastAPI()
    api.state.received = []

    @api.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "fixed-model", "object": "model",
                                            "owned_by": "tests"}]}

    async def respond(request: Request, kind: str):
        body = await request.json()
        api.state.received.append(body)
        if body.get("model") == "strict-model" and "return_token_ids" in body:
            return JSONResponse({"error": {"message": "Unrecognized request argument supplied: "
                                           "return_token_ids", "type": "invalid_request_error"}},
                                status_code=400)
        if body.get("model") == "fail-503":
            return JSONResponse({"error": {"message": "engine overloaded", "type": "overloaded",
                                           "code": 503}}, status_code=503)
        text, tool_calls = _answer(body) if kind == "chat" else ("Paris is the capital.", None)
        pieces = _pieces(text)
        ids = [100 + i for i in range(len(pieces))]
        lps = [-0.1 * (i + 1) for i in range(len(pieces))]
        with_ids = bool(body.get("return_token_ids"))
        finish = "tool_calls" if tool_calls else "stop"
        usage = {"prompt_tokens": len(PROMPT_IDS), "completion_tokens": len(ids),
                 "total_tokens": len(PROMPT_IDS) + len(ids)}
        base = {"id": "cmpl-fixed", "created": int(time.time()), "model": body["model"],
                "policy_version": POLICY_VERSION}
        headers = {"x-policy-version": str(POLICY_VERSION)}
        if not body.get("stream"):
            choice: dict = {"index": 0, "finish_reason": finish}
            if kind == "chat":
                choice["message"] = {"role": "assistant", "content": text or None,
                                     "tool_calls": tool_calls}
                choice["logprobs"] = {"content": [{"token": p, "logprob": lp, "bytes": None,
                                                   "top_logprobs": []}
                                                  for p, lp in zip(pieces, lps, strict=True)]}
            else:
                choice["text"] = text
                choice["logprobs"] = {"tokens": pieces, "token_logprobs": lps}
            if with_ids:
                choice["token_ids"] = ids
            out = {**base, "object": "chat.completion" if kind == "chat" else "text_completion",
                   "choices": [choice], "usage": usage}
            if with_ids:
                out["prompt_token_ids"] = PROMPT_IDS
            # json.dumps escapes a lone surrogate as \\ud83d (JSONResponse would fail on it)
            return Response(json.dumps(out), media_type="application/json", headers=headers)

        def events():
            obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
            for i, (piece, tid, lp) in enumerate(zip(pieces, ids, lps, strict=True)):
                choice: dict = {"index": 0, "finish_reason": None}
                if kind == "chat":
                    delta: dict = {"content": piece}
                    if i == 0:
                        delta["role"] = "assistant"
                        if tool_calls:
                            delta["tool_calls"] = [{"index": 0, **tool_calls[0]}]
                    choice["delta"] = delta
                    choice["logprobs"] = {"content": [{"token": piece, "logprob": lp,
                                                       "bytes": None, "top_logprobs": []}]}
                else:
                    choice["text"] = piece
                    choice["logprobs"] = {"tokens": [piece], "token_logprobs": [lp]}
                if with_ids:
                    choice["token_ids"] = [tid]
                if i == len(pieces) - 1:
                    choice["finish_reason"] = finish
                chunk = {**base, "object": obj, "choices": [choice]}
                if i == 0 and with_ids:
                    chunk["prompt_token_ids"] = PROMPT_IDS
                yield f"data: {json.dumps(chunk)}\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({**base, 'object': obj, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        async def slowly():
            for i, event in enumerate(events()):
                yield event
                if i == 0:
                    await asyncio.sleep(60)

        async def lingering():
            for event in events():
                yield event
            await asyncio.sleep(60)

        stream = {"slow-stream": slowly, "lingering-stream": lingering}.get(
            body.get("model"), events)()
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)

    @api.post("/v1/chat/completions")
    async def chat(request: Request):
        return await respond(request, "chat")

    @api.post("/v1/completions")
    async def completions(request: Request):
        return await respond(request, "completion")

    return api


class ServerThread:
    """Run an ASGI app with uvicorn in a daemon thread; `stop()` ends it."""

    def __init__(self, asgi_app, port: int, host: str = "127.0.0.1"):
        self.url = f"http://{host}:{port}"
        self.app = asgi_app
        config = uvicorn.Config(asgi_app, host=host, port=port, log_level="warning",
                                access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout_s: float = 20.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"server at {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


if __name__ == "__main__":
    uvicorn.run(app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
