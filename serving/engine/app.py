"""The embedded engine's HTTP API (FastAPI): OpenAI-compatible routes plus vLLM's reload route,
served through llama-server (serving/engine/upstream.py) with continuous batching.

    tracetrain engine            # or: python -m serving.engine

This layer owns what llama-server does not do the way the pipeline needs: the policy's own
chat template and tokenizer (the prompt goes down as token ids), Hermes tool calls, vLLM's
response fields (token ids, prompt token ids, logprobs), and `policy_version` on every answer.

Routes: /health, /v1/models, /v1/policy, /v1/chat/completions, /v1/completions (both with
`stream`), /v1/load_lora_adapter (vLLM's request shape), /v1/load_checkpoint (full weights);
/metrics (Prometheus, serving/engine/metrics.py), /state (JSON) and /healthz as every process.
What it refuses before any work (the load key and folder, more requests than slots x
max_requests_per_slot, clients that left) is in serving/engine/guards.py; each request field is
checked in serving/engine/requests.py, so llama-server never sees an invalid one.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from serving.engine import requests as shape
from serving.engine.generation import GenRequest, GenResult
from serving.engine.guards import (
    Admission,
    ClientGone,
    Gate,
    Refused,
    check_key,
    error_response,
    loadable,
    unless_disconnected,
)
from serving.engine.metrics import CountCalls, EngineMetrics
from serving.engine.policy import Policy
from serving.engine.prompts import chat_prompt_ids, parse_tool_calls
from serving.engine.upstream import UpstreamError, Upstreams
from serving.errors import LoadError
from tracetrain.errors import BadRequest
from tracetrain.observability import CONTENT_TYPE
from tracetrain.settings.serving import EngineSettings

HEADER = "X-Policy-Version"


async def _json(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest(f"the body is a JSON {type(body).__name__}; expected an object")
    return body


def build_app(policy: Policy, settings: EngineSettings, base_name: str, *, load_key: str,
              key_source: str, downloads: Path) -> FastAPI:
    """`load_key` guards the load routes (`key_source` says where it comes from, for the 401);
    they load only from under `downloads`, the reloader's download folder."""
    app = FastAPI(title="tracetrain embedded engine")
    app.state.loads = []
    app.state.policy = policy
    context = min(settings.max_context, policy.context_length)
    tokenizer = policy.tokenizer
    names = {settings.served_name, base_name}
    # The first llama-server starts before the port answers (see make_server).
    upstreams = app.state.upstreams = Upstreams(policy.base_upstream(), settings.drain_timeout_s)
    gate = app.state.gate = Gate(settings.slots * settings.max_requests_per_slot)
    metrics = app.state.metrics = EngineMetrics(upstreams, gate)
    app.add_middleware(Admission, gate=gate)
    app.add_middleware(CountCalls, metrics=metrics)  # outermost: 429s are counted too

    @app.on_event("shutdown")
    async def _stop() -> None:
        await upstreams.close()

    @app.exception_handler(BadRequest)
    async def _bad_request(_: Request, exc: BadRequest) -> JSONResponse:
        return error_response(400, str(exc))

    @app.exception_handler(Refused)
    async def _refused(_: Request, exc: Refused) -> JSONResponse:
        return error_response(exc.status, str(exc), headers=exc.headers)

    @app.exception_handler(ClientGone)
    async def _gone(_: Request, exc: ClientGone) -> JSONResponse:
        return error_response(499, str(exc), "client_closed_request")  # nginx's code; nobody reads it

    @app.exception_handler(UpstreamError)
    async def _upstream_failed(_: Request, exc: UpstreamError) -> JSONResponse:
        return error_response(502, str(exc), "upstream_error")

    def _check_model(body: dict) -> str:
        model = body.get("model") or settings.served_name
        if model not in names:
            raise BadRequest(f"model {model!r} is not served here; expected one of {sorted(names)}")
        return model

    def _policy_info() -> dict:
        current = upstreams.current
        return {"policy_version": current.policy_version, "adapter_path": current.path}

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
        return {**_policy_info(), "loads": app.state.loads[-20:], "slots": settings.slots,
                "weights": settings.weights, "requests": upstreams.requests,
                "resent": upstreams.resent,
                "most_in_flight": upstreams.most_in_flight, "admitted": gate.admitted,
                "admit_limit": gate.limit,
                "draining": [u.policy_version for u in upstreams.retiring]}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "tracetrain",
             "root": upstreams.current.path or str(policy.model_dir), "max_model_len": context,
             "policy_version": upstreams.current.policy_version} for name in sorted(names)]}

    async def _run(request: Request, reqs: list[GenRequest]) -> list[GenResult]:
        results = await unless_disconnected(request, upstreams.generate_all(reqs))
        for req, result in zip(reqs, results, strict=True):
            metrics.finished(req, result)
        return results

    def _stream(reqs: list[GenRequest], make_chunk, final_chunk) -> StreamingResponse:
        """Chunks of every choice as they come, each with its new tokens and their logprobs
        (`make_chunk(i, text, piece, result)`, `piece` a GenResult of those tokens alone); a
        choice's last chunk carries its finish reason, and the one that ends the call also the
        usage of all (`final_chunk(i, result, all)`)."""
        async def body():
            ended: dict[int, GenResult] = {}
            sent = [0] * len(reqs)  # logprobs of each choice already sent
            try:
                async for index, text, ids, result in upstreams.stream_all(reqs):
                    piece = GenResult(token_ids=ids)
                    fresh = result.logprobs[sent[index]:]
                    # llama-server streams each token with its probability; a chunk whose
                    # counts differ (none seen) is sent without logprobs rather than misaligned
                    if ids and len(fresh) == len(ids):
                        piece.logprobs = fresh
                        piece.top_logprobs = result.top_logprobs[sent[index]:]
                    sent[index] = len(result.logprobs)
                    if text is None:
                        ended[index] = result
                        metrics.finished(reqs[index], result)
                        every = [ended[i] for i in sorted(ended)] if len(ended) == len(reqs) \
                            else None
                        yield f"data: {json.dumps(final_chunk(index, result, every))}\n\n"
                    elif text or ids:
                        yield f"data: {json.dumps(make_chunk(index, text, piece, result))}\n\n"
            except UpstreamError as exc:
                error = {"error": {"message": str(exc), "type": "upstream_error", "code": 502}}
                yield f"data: {json.dumps(error)}\n\n"
                return
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await _json(request)
        model = _check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list of {role, content} objects")
        tools = body.get("tools") or None
        tool_choice = body.get("tool_choice")
        prompt_ids = chat_prompt_ids(tokenizer, messages, tools, tool_choice)
        reqs = shape.choices(
            body, shape.sampling(body, prompt_ids, context, settings.default_max_tokens),
            gate.limit)
        want_logprobs = body.get("logprobs") is not False
        if body.get("stream") and not tools:
            cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

            def chunk(index: int, delta: str, piece: GenResult, result: GenResult,
                      finish=None, extra=None) -> dict:
                logprobs = shape.chat_logprobs(tokenizer, piece) \
                    if want_logprobs and piece.logprobs else None
                return {"id": cid, "object": "chat.completion.chunk", "created": created,
                        "model": model, "policy_version": result.policy_version,
                        "choices": [{"index": index,
                                     "delta": {"role": "assistant", "content": delta},
                                     "finish_reason": finish, "token_ids": piece.token_ids,
                                     "logprobs": logprobs}], **(extra or {})}

            def final(index: int, result: GenResult, every: list[GenResult] | None) -> dict:
                extra = {"usage": shape.usage(prompt_ids, every),
                         "prompt_token_ids": prompt_ids} if every else None
                return chunk(index, "", GenResult(), result, result.finish_reason, extra)

            return _stream(reqs, chunk, final)
        answers = []
        for result in await _run(request, reqs):
            message: dict[str, Any] = {"role": "assistant", "content": result.text}
            finish = result.finish_reason
            if tools and tool_choice != "none":
                content, calls = parse_tool_calls(result.text)
                if calls:
                    message = {"role": "assistant", "content": content, "tool_calls": calls}
                    finish = "tool_calls"
            answers.append((result, message, finish))
        payload = shape.chat_response(tokenizer, model, prompt_ids, answers, want_logprobs)
        if body.get("stream"):  # tools + stream: the parsed answers as one chunk each
            return _one_chunk_stream(payload)
        return JSONResponse(payload, headers={HEADER: str(payload["policy_version"])})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await _json(request)
        model = _check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not any(isinstance(t, str) for t in prompt):
            prompt_ids = shape.prompt_token_ids(prompt, policy.vocab_size)
        elif isinstance(prompt, str):
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        else:
            raise BadRequest("prompt must be one string or one list of token ids")
        reqs = shape.choices(
            body, shape.sampling(body, prompt_ids, context, settings.default_max_tokens),
            gate.limit)
        want_logprobs = body.get("logprobs") is not None and body.get("logprobs") is not False
        if body.get("stream"):
            cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

            def chunk(index: int, text: str, piece: GenResult, result: GenResult,
                      finish=None) -> dict:
                logprobs = shape.completion_logprobs(tokenizer, piece) \
                    if want_logprobs and piece.logprobs else None
                return {"id": cid, "object": "text_completion", "created": created,
                        "model": model, "policy_version": result.policy_version,
                        "choices": [{"index": index, "text": text, "finish_reason": finish,
                                     "token_ids": piece.token_ids, "logprobs": logprobs}]}

            return _stream(reqs, chunk, lambda index, res, _: chunk(
                index, "", GenResult(), res, res.finish_reason))
        results = await _run(request, reqs)
        payload = shape.completion_response(tokenizer, model, prompt_ids, results, want_logprobs)
        return JSONResponse(payload, headers={HEADER: str(payload["policy_version"])})

    async def _load(kind: str, name: str, path: str, version: int | None) -> JSONResponse:
        if version is not None and not shape.is_int(version):
            raise BadRequest(f"policy_version={version!r}; expected an integer")
        started = time.monotonic()
        old = upstreams.current.policy_version
        version = policy.next_version(name, version, old)
        make = policy.lora_upstream if kind == "lora" else policy.full_upstream
        try:
            new = await upstreams.swap(lambda: make(name, path, version))
        except LoadError as exc:
            app.state.loads.append({"path": path, "ok": False, "error": str(exc)})
            metrics.loads.labels(kind, "failed").inc()
            return error_response(400, f"load of {name!r} failed; policy_version "
                               f"{upstreams.current.policy_version} keeps serving: {exc}")
        seconds = time.monotonic() - started
        app.state.loads.append({"path": path, "ok": True, "policy_version": new.policy_version,
                                "seconds": seconds})
        metrics.loads.labels(kind, "ok").inc()
        metrics.load_seconds.observe(seconds)
        return JSONResponse({"status": "ok", "lora_name": name,
                             "policy_version": new.policy_version, "load_seconds": seconds},
                            headers={HEADER: str(new.policy_version)})

    async def _load_body(request: Request, path_field: str, expected: str) -> tuple[dict, str]:
        check_key(request, load_key, key_source)  # before the body: nothing is read for nobody
        body = await _json(request)
        if not isinstance(body.get(path_field), str) or not body[path_field]:
            raise BadRequest(f"expected {expected}")
        return body, loadable(body[path_field], downloads, path_field)

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: Request) -> JSONResponse:
        body, path = await _load_body(request, "lora_path",
                                      "{\"lora_name\": ..., \"lora_path\": ...}")
        if not body.get("lora_name"):
            raise BadRequest("expected {\"lora_name\": ..., \"lora_path\": ...}")
        return await _load("lora", str(body["lora_name"]), path, body.get("policy_version"))

    @app.post("/v1/load_checkpoint")
    async def load_checkpoint(request: Request) -> JSONResponse:
        body, path = await _load_body(request, "path",
                                      "{\"path\": <model dir>, \"policy_version\": <int>}")
        return await _load("full", str(body.get("name") or path), path,
                           body.get("policy_version"))

    return app


def _one_chunk_stream(payload: dict) -> StreamingResponse:
    chunks = []
    for choice in payload["choices"]:
        delta = choice["message"]
        for call_index, call in enumerate(delta.get("tool_calls") or []):
            call["index"] = call_index
        chunks.append({**payload, "object": "chat.completion.chunk",
                       "choices": [{"index": choice["index"], "delta": delta,
                                    "finish_reason": choice["finish_reason"],
                                    "token_ids": choice["token_ids"], "logprobs": None}]})

    async def body():
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={HEADER: str(payload["policy_version"])})
