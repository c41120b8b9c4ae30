"""The OpenAI-compatible gateway: every LLM call that passes through becomes a Span on Kafka.

    tracetrain gateway            # uvicorn on settings.gateway.host:port

Reads: OpenAI-style requests from agents (`/v1/chat/completions`, `/v1/completions`,
`/v1/models`, also under `/rollouts/{rollout_id}/v1/...` and `/rollouts/{rollout_id}/{mode}/v1/...`),
rewards (`POST /v1/rewards`) and OTLP/HTTP traces (`POST /v1/traces`). Forwards calls to the
engines of `settings.gateway.upstream_urls` (or the one `upstream_url`: vLLM, the embedded
engine, any OpenAI-compatible server) asking for token ids and logprobs: a rollout stays on one
engine while it is healthy, a new one goes to the least-loaded (producers/gateway/pool.py), and
a call whose engine fails before answering is sent once more to another
(producers/gateway/upstreams.py); with every engine out, calls get 503 with Retry-After.
Writes: one Span per call (errors included) and Rewards, through the publisher. The span
records the sampling temperature the engine used (attribute `gen_ai.request.temperature`) and
the rollout's mode (`tracetrain.rollout_mode`): `train` calls are sent at
`gateway.train_temperature`, `val` calls greedy (temperature 0), others as sent, at
`gateway.default_temperature` when they give none.
Serves `/metrics` (Prometheus: the gateway's, its pool's per engine and its publisher's),
`/healthz` and `/state` (JSON: calls per route and status, the publisher's records per outcome,
held spans, each engine of the pool). Each span names the engine that answered
(`gateway.upstream`) and carries that engine's policy version.

Keys: every call route needs `Authorization: Bearer <key>` with one of `gateway.api_keys`
whenever the gateway binds a non-loopback address (`gateway.auth`); such a gateway without
keys refuses to start. Once the upstream has answered, the agent gets the answer: a span the
publisher refuses is held and published later (`producers/gateway/recording.py`). A stream
that the upstream breaks off is recorded as an error span and ended with an error event; one
whose client goes away is recorded with status `cancelled`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from producers.errors import RecordTooLarge
from producers.gateway import capture, upstreams
from producers.gateway.guard import check_auth, choices_asked, read_json_body, validate_call
from producers.gateway.ids import BadIdHeader, CallIds, call_ids
from producers.gateway.otlp import add_otlp_routes
from producers.gateway.pool import Pool
from producers.gateway.recording import SpanRecorder
from producers.gateway.rewards import add_reward_routes
from producers.publisher import Publisher
from producers.records import llm_part, new_id, new_span
from tracetrain.errors import Backpressure, BadRequest, ConfigError
from tracetrain.observability import CONTENT_TYPE, Metrics
from tracetrain.records import MODE_ATTRIBUTE, TEMPERATURE_ATTRIBUTE
from tracetrain.settings import Settings

log = logging.getLogger(__name__)

# Hop-by-hop and length headers are recomputed by our server.
_DROP = {"content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}


class SizeLimit:
    """413 for a declared Content-Length over the limit, before anything reads the body.
    (A pure ASGI middleware: Starlette's BaseHTTPMiddleware costs about a millisecond a call.)
    Chunked bodies without a length are measured while the call routes read them."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                    resp = JSONResponse({"error": {
                        "message": f"request body of {value.decode()} bytes exceeds the limit "
                                   f"of {self.limit}", "type": "invalid_request_error"}},
                        status_code=413)
                    return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


class _Relay(StreamingResponse):
    """A streamed answer whose generator is always closed and whose `on_close` always runs,
    even when the client went away while the generator waited at a `yield` or before it ever
    started (Starlette then cancels the send and leaves the generator as it was)."""

    def __init__(self, content, on_close: Callable[[], Awaitable[None]], **kwargs):
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
                await self.on_close()


def create_app(settings: Settings, publisher: Publisher | None = None) -> FastAPI:
    gw = settings.gateway
    problem = gw.auth_problem()  # also checked when settings load; settings built in code
    if problem:                  # (model_copy) skip that check
        raise ConfigError([problem])
    pool = Pool(gw.engine_urls(), gw.sticky_ttl_s, gw.sticky_max)
    keys = [] if gw.auth == "off" else [k.get_secret_value().encode() for k in gw.api_keys]
    state: dict = {}
    metrics = Metrics("gateway")  # this app's own: two apps in one process never share counts
    calls = metrics.counter("handled", "calls", "Calls by route and status class (2xx, 4xx, "
                            "5xx; broken: the upstream broke off a stream; cancelled: the "
                            "client went away mid-stream).", ["route", "status"])
    latency = metrics.histogram("upstream_latency", "seconds", "Upstream latency.", ["route"])
    recorder = state["recorder"] = SpanRecorder(metrics, gw.held_spans_max)
    # The temperature each mode forces on the forwarded request (none: as sent).
    forced = {"train": gw.train_temperature, "val": 0.0}
    metrics.register(upstreams.PoolCollector(pool))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state["pub"] = publisher or Publisher(settings, name=settings.gateway.spool_name)
        metrics.register(state["pub"].metrics.registry)
        headers = {"authorization": f"Bearer {gw.upstream_api_key.get_secret_value()}"} \
            if gw.upstream_api_key else {}
        # A dead host fails the connect in probe_timeout_s, not in a generation's time. Idle
        # connections go after 2 s, before the engine's uvicorn (and vLLM's) closes them at
        # 5 s: with both at 5 s, a call sent just as the engine closed its connection would
        # fail unanswered and take a healthy engine out of the pool.
        state["http"] = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(
            gw.upstream_timeout_s, connect=gw.probe_timeout_s),
            limits=httpx.Limits(keepalive_expiry=2.0))
        probes = httpx.AsyncClient(timeout=gw.probe_timeout_s, headers=headers)
        held_task = recorder.start(state["pub"])
        watch_task = asyncio.create_task(upstreams.watch(pool, probes, gw.versions_refresh_s))
        yield
        watch_task.cancel()
        held_task.cancel()
        await state["http"].aclose()
        await probes.aclose()
        recorder.close()
        if publisher is None:
            state["pub"].close()

    app = FastAPI(title="tracetrain gateway", lifespan=lifespan)
    app.state.settings = settings
    app.state.shared = state
    app.state.metrics = metrics

    app.add_middleware(SizeLimit, limit=gw.max_body_bytes)

    @app.exception_handler(BadRequest)
    async def _bad_request(request: Request, exc: BadRequest):
        calls.labels(request.url.path.rsplit("/", 1)[-1], f"{exc.status // 100}xx").inc()
        return JSONResponse({"error": {"message": exc.message, "type": "invalid_request_error",
                                       "param": exc.param}}, status_code=exc.status)

    @app.exception_handler(BadIdHeader)
    async def _bad_id(request: Request, exc: BadIdHeader):
        return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}},
                            status_code=400)

    @app.exception_handler(RecordTooLarge)
    async def _too_large(request: Request, exc: RecordTooLarge):
        calls.labels(request.url.path.rsplit("/", 1)[-1], "4xx").inc()
        return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error",
                                       "limit_bytes": exc.limit}}, status_code=413)

    @app.exception_handler(Backpressure)
    async def _backpressure(request: Request, exc: Backpressure):
        # The one 503 of every route: the spool or its disk is full, the publisher is busy,
        # `gateway.held_spans_max` spans wait for it, or every engine of the pool is out.
        # Nothing was recorded for this call.
        calls.labels(request.url.path.rsplit("/", 1)[-1], "5xx").inc()
        return JSONResponse({"error": {"message": str(exc), "type": "overloaded_error"}},
                            status_code=503,
                            headers={"Retry-After": str(max(1, math.ceil(exc.retry_after)))})

    @app.get("/healthz")
    async def healthz():
        # 200 while the gateway answers; `ok`, `delivery` and `spool` say whether its spans
        # reach Kafka and whether it has room for more; `held_spans` wait for the publisher.
        pub = state["pub"]
        return {**pub.health(), "pending": pub.pending(), "counts": pub.counts,
                "held_spans": recorder.held, "engines_healthy": pool.state()["healthy"]}

    @app.get("/metrics")
    async def metrics_page():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/state")
    async def state_page():
        handled: dict[str, dict[str, int]] = {}
        for family in calls.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    handled.setdefault(sample.labels["route"], {})[sample.labels["status"]] = \
                        int(sample.value)
        return {"handled_calls": handled, "publisher": state["pub"].name,
                "published_records": dict(state["pub"].counts),
                "pending_records": state["pub"].pending(), "held_spans": recorder.held,
                "upstream_refuses_token_ids": any(e.refuses_token_ids for e in pool.engines),
                # model -> the newest versioned name an engine serves (vLLM; see versions.py)
                "served_versions": pool.newest_versions(), "pool": pool.state()}

    async def models(request: Request, rollout_id: str | None = None, mode: str | None = None):
        check_auth(request, keys)

        async def attempt(engine):
            return await state["http"].get(f"{engine.url}/models")

        try:
            sent = await upstreams.send(pool, None, attempt, gw.versions_refresh_s)
        except upstreams.Unreachable as exc:
            raise BadRequest(str(exc), status=502) from exc
        sent.lease.release()
        resp = sent.response
        return Response(resp.content, status_code=resp.status_code,
                        media_type=resp.headers.get("content-type"))

    async def chat(request: Request, rollout_id: str | None = None, mode: str | None = None):
        return await _call(request, "chat", "/chat/completions", rollout_id, mode)

    async def completions(request: Request, rollout_id: str | None = None,
                          mode: str | None = None):
        return await _call(request, "completion", "/completions", rollout_id, mode)

    for prefix in ("", "/rollouts/{rollout_id}", "/rollouts/{rollout_id}/{mode}"):
        app.add_api_route(f"{prefix}/v1/models", models, methods=["GET"])
        app.add_api_route(f"{prefix}/v1/chat/completions", chat, methods=["POST"])
        app.add_api_route(f"{prefix}/v1/completions", completions, methods=["POST"])

    async def _call(request: Request, kind: str, path: str, path_rollout: str | None,
                    path_mode: str | None):
        check_auth(request, keys)
        ids = call_ids(request.headers, path_rollout, path_mode)
        recorder.check_room()  # before the upstream: its answer could not be recorded now
        body = await read_json_body(request, gw.max_body_bytes, gw.max_json_depth)
        validate_call(kind, body)
        body = capture.with_temperature(body, forced.get(ids.mode), gw.default_temperature)
        # Refuse now (413, 503) what could not be recorded, not after the upstream worked.
        state["pub"].admit(settings.topics.spans, capture.request_bytes(kind, body))
        stream = bool(body.get("stream"))
        # One span per choice; the client learns their ids (to reward a choice) before any byte
        # of a stream, so they are drawn now.
        span_ids, start = [new_id(8) for _ in range(choices_asked(body))], time.time_ns()
        out_headers = {"x-rollout-id": ids.rollout_id, "x-span-id": span_ids[0]}
        if len(span_ids) > 1:
            out_headers["x-span-ids"] = ",".join(span_ids)
        attempt = upstreams.call_attempt(state["http"], kind, path, body, gw.request_token_ids,
                                         stream)
        try:
            # NoHealthyEngine (every engine out) is a Backpressure: 503, nothing recorded.
            sent = await upstreams.send(pool, ids.rollout_id, attempt, gw.versions_refresh_s)
        except upstreams.Unreachable as exc:
            _record(ids, span_ids, start, kind, body, None, None, 502, str(exc),
                    exc.engine.url)
            calls.labels(kind, "5xx").inc()
            return JSONResponse({"error": {"message": str(exc), "type": "upstream_error"}},
                                status_code=502, headers=out_headers)
        resp, engine = sent.response, sent.engine
        headers = {k: v for k, v in resp.headers.items() if k.lower() not in _DROP}
        headers.update(out_headers)
        # The version of the engine that answered (embedded engine; vLLM's is in the model).
        policy_header = resp.headers.get("x-policy-version")
        if not stream or resp.status_code >= 400:
            try:
                if stream:
                    await resp.aread()
                    await resp.aclose()
            finally:
                sent.lease.release()
            latency.labels(kind).observe((time.time_ns() - start) / 1e9)
            calls.labels(kind, f"{resp.status_code // 100}xx").inc()
            try:
                parsed = resp.json() if resp.status_code < 400 else None
            except (ValueError, RecursionError):
                parsed = None
            error = None if resp.status_code < 400 else resp.text[:2000]
            if resp.status_code < 400 and not isinstance(parsed, dict):
                error = f"upstream returned a non-JSON body: {resp.text[:200]!r}"
            _record(ids, span_ids, start, kind, body, parsed, policy_header, resp.status_code,
                    error, engine.url)
            return Response(resp.content, status_code=resp.status_code, headers=headers)

        assembler = capture.StreamAssembler(kind, len(span_ids))
        outcome = ["cancelled"]  # until the upstream's stream ends ("ok") or breaks ("broken")
        recorded: list[str] = []

        def finish() -> None:
            if not recorded:
                # The client may close as soon as it read the last event, before the relay
                # resumes to see the upstream's end: it had the whole answer, so the call is ok.
                if outcome[0] == "cancelled" and assembler.complete:
                    outcome[0] = "ok"
                recorded.append(outcome[0])
                _stream_ended(ids, span_ids, start, kind, body, assembler, policy_header,
                              resp.status_code, outcome[0], engine.url)

        async def close() -> None:
            finish()  # a relay that never started (the client left at once) records here
            sent.lease.release()
            with anyio.CancelScope(shield=True):
                await resp.aclose()

        async def relay():
            try:
                try:
                    async for chunk in resp.aiter_raw():
                        assembler.feed(chunk)
                        yield chunk
                    outcome[0] = "ok" if assembler.complete else "broken"
                    if not assembler.complete:
                        assembler.error = (f"upstream {engine.url} ended the stream after "
                                           f"{assembler.bytes} bytes without [DONE] or a finish "
                                           "reason")
                except httpx.HTTPError as exc:
                    outcome[0] = "broken"
                    assembler.error = (f"upstream {engine.url} broke off the stream after "
                                       f"{assembler.bytes} bytes: {exc!r}")
                    # Not sent again (the agent has part of the answer); the engine is out.
                    upstreams.take_out(pool, engine, f"broke off a stream: {exc!r}")
                if outcome[0] == "broken":
                    yield capture.error_event(assembler.error)
            finally:
                # Recorded before anything here awaits: when the client went away this task is
                # cancelled, and an await would end the generator before the span is recorded.
                finish()
                await close()

        return _Relay(relay(), close, status_code=resp.status_code, headers=headers)

    def _stream_ended(ids: CallIds, span_ids: list[str], start: int, kind: str, body: dict,
                      assembler: capture.StreamAssembler, policy_header: str | None,
                      status: int, outcome: str, upstream: str) -> None:
        latency.labels(kind).observe((time.time_ns() - start) / 1e9)
        calls.labels(kind, "2xx" if outcome == "ok" else outcome).inc()
        if outcome == "cancelled":
            _record(ids, span_ids, start, kind, body, assembler.response(), policy_header, status,
                    "the client went away before the stream ended "
                    f"(after {assembler.bytes} bytes)", upstream, span_status="cancelled")
        else:
            _record(ids, span_ids, start, kind, body, assembler.response(), policy_header, status,
                    assembler.error, upstream)

    def _record(ids: CallIds, span_ids: list[str], start: int, kind: str, body: dict,
                resp, policy_header: str | None, status: int, error: str | None,
                upstream: str, span_status: str | None = None) -> None:
        """Record the call's spans, one per choice; never raises (the agent gets the upstream's
        answer)."""
        resp = resp if isinstance(resp, dict) else {}
        count = capture.choice_count(resp)
        span_ids = span_ids + [new_id(8) for _ in range(count - len(span_ids))]
        for index in range(count):
            _record_choice(ids, span_ids[index], start, kind, body, resp, index, policy_header,
                           status, error, upstream, span_status)

    def _record_choice(ids: CallIds, span_id: str, start: int, kind: str, body: dict,
                       resp: dict, index: int, policy_header: str | None, status: int,
                       error: str | None, upstream: str, span_status: str | None) -> None:
        try:
            llm, attrs = capture.llm_from_response(kind, body, resp, policy_header, index)
        # An answer shaped unlike OpenAI's (usage a list, logprobs that are not numbers):
        # the call is still recorded, as an error naming what could not be read.
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            llm, attrs = llm_part(model=str(body.get("model") or "")), {}
            error = error or f"the upstream's answer could not be read as a {kind} response: " \
                             f"{exc!r}"
        attrs.update({"http.status_code": str(status), "gateway.endpoint": kind,
                      "gateway.upstream": upstream, "stream": str(bool(body.get("stream"))).lower()})
        temperature = capture.temperature_attribute(body)
        if temperature is not None:
            attrs[TEMPERATURE_ATTRIBUTE] = temperature
        if ids.mode is not None:
            attrs[MODE_ATTRIBUTE] = ids.mode
        if ids.generated:
            attrs["rollout_id_generated"] = "true"
        span = new_span(
            "llm", ids.rollout_id, trace_id=ids.trace_id, span_id=span_id,
            parent_id=ids.parent_id, attempt_id=ids.attempt_id, task_id=ids.task_id,
            agent_name=ids.agent_name, policy_name=ids.policy_name, start_time_ns=start,
            end_time_ns=time.time_ns(), status=span_status or ("error" if error else "ok"),
            error_message=error, service="tracetrain-gateway", attributes=attrs, llm=llm)
        recorder.record(span)

    add_reward_routes(app, state, keys, gw.max_body_bytes, gw.max_json_depth)
    add_otlp_routes(app, state, keys, gw.max_body_bytes, gw.max_json_depth)
    return app
