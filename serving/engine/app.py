"""The embedded engine's HTTP API (FastAPI): OpenAI-compatible routes plus vLLM's reload route.

    tracetrain engine            # or: python -m serving.engine

Routes: /health, /v1/models, /v1/policy, /v1/chat/completions, /v1/completions (both with
`stream`), /v1/load_lora_adapter (vLLM's request shape), /v1/load_checkpoint (full weights);
/metrics (Prometheus, serving/engine/metrics.py), /state (JSON) and /healthz as every process.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from serving.engine import requests as shape
from serving.engine.batcher import Batcher
from serving.engine.decode import GenRequest, GenResult
from serving.engine.metrics import CountCalls, EngineMetrics
from serving.engine.policy import Policy
from serving.engine.prompts import chat_prompt_ids, parse_tool_calls
from serving.errors import LoadError
from tracetrain.errors import BadRequest
from tracetrain.observability import CONTENT_TYPE
from tracetrain.settings.serving import EngineSettings

HEADER = "X-Policy-Version"


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None,
                                   "code": status}}, status_code=status)


def build_app(policy: Policy, settings: EngineSettings, base_name: str) -> FastAPI:
    batcher = Batcher(policy, settings.max_batch, settings.batch_wait_s)
    app = FastAPI(title="tracetrain embedded engine")
    app.state.batcher = batcher
    app.state.loads = []
    metrics = app.state.metrics = EngineMetrics(policy, batcher)
    app.add_middleware(CountCalls, metrics=metrics)
    context = min(settings.max_context, policy.context_length)
    tokenizer = policy.tokenizer
    names = {settings.served_name, base_name}

    @app.on_event("startup")
    async def _start() -> None:
        batcher.start()

    @app.on_event("shutdown")
    async def _stop() -> None:
        await run_in_threadpool(batcher.stop)

    @app.exception_handler(BadRequest)
    async def _bad_request(_: Request, exc: BadRequest) -> JSONResponse:
        return _error(400, str(exc))

    def _check_model(body: dict) -> str:
        model = body.get("model") or settings.served_name
        if model not in names:
            raise BadRequest(f"model {model!r} is not served here; expected one of {sorted(names)}")
        return model

    def _policy_info() -> dict:
        return {"policy_version": policy.policy_version, "adapter_path": policy.adapter_path}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", **_policy_info()}

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"ok": True, "stage": "engine", **_policy_info()}

    @app.get("/metrics")
    async def metrics_page() -> Response:
        return Response(metrics.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/state")
    async def state() -> dict:
        return metrics.state()

    @app.get("/v1/policy")
    async def policy_info() -> dict:
        return {**_policy_info(), "loads": app.state.loads[-20:], "batches": batcher.batches,
                "largest_batch": max(batcher.batch_sizes, default=0)}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "tracetrain",
             "root": policy.adapter_path or str(policy.model_dir), "max_model_len": context,
             "policy_version": policy.policy_version} for name in sorted(names)]}

    async def _run(req: GenRequest) -> GenResult:
        result = await asyncio.wrap_future(batcher.submit(req))
        metrics.finished(req, result)
        return result

    def _stream(req: GenRequest, make_chunk, final_chunk) -> StreamingResponse:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        req.on_token = lambda tok, lp, tops: loop.call_soon_threadsafe(
            events.put_nowait, ("token", tok, lp))
        future = batcher.submit(req)
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(events.put_nowait, ("end",)))
        holdback = max((len(s) for s in req.stop), default=1) - 1

        async def body():
            ids: list[int] = []
            sent = ""
            while True:
                event = await events.get()
                if event[0] == "end":
                    break
                ids.append(event[1])
                text = tokenizer.decode(ids, skip_special_tokens=True)
                ready = text[: len(text) - holdback] if holdback else text
                if len(ready) > len(sent) and not ready.endswith("\ufffd"):
                    yield f"data: {json.dumps(make_chunk(ready[len(sent):], [event[1]]))}\n\n"
                    sent = ready
            result = future.result()
            metrics.finished(req, result)
            rest = result.text[len(sent):] if result.text.startswith(sent) else ""
            yield f"data: {json.dumps(final_chunk(result, rest))}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        model = _check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list of {role, content} objects")
        tools = body.get("tools") or None
        tool_choice = body.get("tool_choice")
        prompt_ids = chat_prompt_ids(tokenizer, messages, tools, tool_choice)
        req = shape.sampling(body, prompt_ids, context, settings.default_max_tokens)
        want_logprobs = body.get("logprobs") is not False
        if body.get("stream") and not tools:
            cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

            def chunk(delta: str, ids: list[int], finish=None, extra=None) -> dict:
                return {"id": cid, "object": "chat.completion.chunk", "created": created,
                        "model": model, "policy_version": req.policy_version,
                        "choices": [{"index": 0, "delta": {"role": "assistant", "content": delta},
                                     "finish_reason": finish, "token_ids": ids,
                                     "logprobs": None}], **(extra or {})}

            def final(result: GenResult, rest: str) -> dict:
                return chunk(rest, [], result.finish_reason,
                             {"usage": shape.usage(prompt_ids, result),
                              "prompt_token_ids": prompt_ids})

            return _stream(req, chunk, final)
        result = await _run(req)
        message: dict[str, Any] = {"role": "assistant", "content": result.text}
        finish = result.finish_reason
        if tools and tool_choice != "none":
            content, calls = parse_tool_calls(result.text)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                finish = "tool_calls"
        payload = shape.chat_response(tokenizer, model, prompt_ids, result, message, finish,
                                      want_logprobs)
        if body.get("stream"):  # tools + stream: the parsed answer as one chunk
            return _one_chunk_stream(payload)
        return JSONResponse(payload, headers={HEADER: str(result.policy_version)})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        model = _check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_ids = list(prompt)
        elif isinstance(prompt, str):
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        else:
            raise BadRequest("prompt must be one string or one list of token ids")
        req = shape.sampling(body, prompt_ids, context, settings.default_max_tokens)
        want_logprobs = body.get("logprobs") is not None and body.get("logprobs") is not False
        if body.get("stream"):
            cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

            def chunk(text: str, ids: list[int], finish=None) -> dict:
                return {"id": cid, "object": "text_completion", "created": created,
                        "model": model, "policy_version": req.policy_version,
                        "choices": [{"index": 0, "text": text, "finish_reason": finish,
                                     "token_ids": ids, "logprobs": None}]}

            return _stream(req, chunk, lambda res, rest: chunk(rest, [], res.finish_reason))
        result = await _run(req)
        payload = shape.completion_response(tokenizer, model, prompt_ids, result, want_logprobs)
        return JSONResponse(payload, headers={HEADER: str(result.policy_version)})

    async def _load(kind: str, name: str, path: str, version: int | None) -> JSONResponse:
        started = time.monotonic()
        prepare = policy.prepare_lora if kind == "lora" else policy.prepare_full
        try:
            swap = await run_in_threadpool(prepare, name, path, version)
            serving = await asyncio.wrap_future(batcher.submit_swap(swap))
        except LoadError as exc:
            app.state.loads.append({"path": path, "ok": False, "error": str(exc)})
            metrics.loads.labels(kind, "failed").inc()
            return _error(400, f"load of {name!r} failed; policy_version "
                               f"{policy.policy_version} keeps serving: {exc}")
        seconds = time.monotonic() - started
        app.state.loads.append({"path": path, "ok": True, "policy_version": serving,
                                "seconds": seconds})
        metrics.loads.labels(kind, "ok").inc()
        metrics.load_seconds.observe(seconds)
        return JSONResponse({"status": "ok", "lora_name": name, "policy_version": serving,
                             "load_seconds": seconds}, headers={HEADER: str(serving)})

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: Request) -> JSONResponse:
        body = await request.json()
        if not body.get("lora_name") or not body.get("lora_path"):
            raise BadRequest("expected {\"lora_name\": ..., \"lora_path\": ...}")
        return await _load("lora", body["lora_name"], body["lora_path"],
                           body.get("policy_version"))

    @app.post("/v1/load_checkpoint")
    async def load_checkpoint(request: Request) -> JSONResponse:
        body = await request.json()
        if not body.get("path"):
            raise BadRequest("expected {\"path\": <model dir>, \"policy_version\": <int>}")
        return await _load("full", body.get("name") or body["path"], body["path"],
                           body.get("policy_version"))

    return app


def _one_chunk_stream(payload: dict) -> StreamingResponse:
    choice = payload["choices"][0]
    chunk = {**payload, "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": choice["message"],
                          "finish_reason": choice["finish_reason"],
                          "token_ids": choice["token_ids"], "logprobs": None}]}
    for call_index, call in enumerate(chunk["choices"][0]["delta"].get("tool_calls") or []):
        call["index"] = call_index

    async def body():
        yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={HEADER: str(payload["policy_version"])})
