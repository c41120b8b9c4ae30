"""The embedded engine's Prometheus metrics (`GET /metrics` beside its API) and typed state
(`GET /state`, the same JSON as /v1/policy plus the counts). llama-server's own metrics stay on
its loopback port; these are the engine's, under the pipeline's naming scheme.

Calls and their latency are counted by a pure ASGI wrapper (`CountCalls`), so every answer,
errors from any handler included, is counted once without touching each route."""

from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from serving.engine.generation import GenRequest, GenResult
from serving.engine.guards import Gate
from serving.engine.upstream import Upstreams
from tracetrain.observability import Metrics, metric_name, values

# API path -> route label; other paths (/health, /metrics, /state) are not counted
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion",
          "/v1/models": "models", "/v1/policy": "policy", "/v1/load_lora_adapter": "load_lora",
          "/v1/load_checkpoint": "load_checkpoint"}


class EngineMetrics:
    def __init__(self, upstreams: Upstreams, gate: Gate):
        m = self.metrics = Metrics("engine")
        self.calls = m.counter("handled", "calls", "API calls by route and status class.",
                               ["route", "status"])
        self.latency = m.histogram("request_latency", "seconds",
                                   "From request to the last byte of the answer, per route.",
                                   ["route"])
        self.prompt_tokens = m.counter("prompt", "tokens", "Prompt tokens of finished requests.")
        self.generated_tokens = m.counter("generated", "tokens", "Tokens generated.")
        self.loads = m.counter("checkpoint", "loads", "Adapter or weight loads by kind "
                               "(lora, full) and outcome (ok, failed).", ["kind", "outcome"])
        self.load_seconds = m.histogram("load_duration", "seconds", "Successful loads.",
                                        buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60))
        m.register(_UpstreamCollector(upstreams, gate))
        self.upstreams, self.gate = upstreams, gate

    def finished(self, req: GenRequest, result: GenResult) -> None:
        self.prompt_tokens.inc(len(req.prompt_ids))
        self.generated_tokens.inc(len(result.token_ids))

    def state(self) -> dict:
        current = self.upstreams.current
        return {"policy_version": current.policy_version,
                "adapter_path": current.path,
                "in_flight": current.in_flight,
                "most_in_flight": self.upstreams.most_in_flight,
                "draining_versions": [u.policy_version for u in self.upstreams.retiring],
                "admitted": self.gate.admitted, "admit_limit": self.gate.limit,
                "refused_full": self.gate.refused,
                "handled_calls": values(self.calls, "route"),
                "prompt_tokens": int(values(self.prompt_tokens)),
                "generated_tokens": int(values(self.generated_tokens)),
                "checkpoint_loads": values(self.loads, "outcome")}


class _UpstreamCollector:
    """Figures the upstreams already keep, read at scrape time."""

    def __init__(self, upstreams: Upstreams, gate: Gate):
        self.upstreams, self.gate = upstreams, gate

    def collect(self):
        upstreams = self.upstreams
        yield GaugeMetricFamily(metric_name("engine", "admitted", "calls"),
                                "Generation requests inside the engine (waiting or running); "
                                "at engine.slots x engine.max_requests_per_slot more get 429.",
                                value=self.gate.admitted)
        yield CounterMetricFamily(metric_name("engine", "refused_full", "calls"),
                                  "Generation requests answered 429: the engine was full.",
                                  value=self.gate.refused)
        yield GaugeMetricFamily(metric_name("engine", "in_flight", "calls"),
                                "Generations running in llama-server now (all versions).",
                                value=sum(u.in_flight for u in [upstreams.current,
                                                                *upstreams.retiring]))
        yield GaugeMetricFamily(metric_name("engine", "most_in_flight", "calls"),
                                "Most generations running at once so far (continuous batching).",
                                value=upstreams.most_in_flight)
        yield GaugeMetricFamily(metric_name("engine", "draining", "versions"),
                                "Old versions' llama-servers finishing their requests.",
                                value=len(upstreams.retiring))
        yield GaugeMetricFamily(metric_name("engine", "policy", "version"),
                                "policy_version served now.",
                                value=upstreams.current.policy_version)


class CountCalls:
    """ASGI wrapper: counts each API answer by route and status class, and its latency."""

    def __init__(self, app, metrics: EngineMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        route = ROUTES.get(scope.get("path", "")) if scope["type"] == "http" else None
        if route is None:
            return await self.app(scope, receive, send)
        started, status = time.monotonic(), [500]

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.calls.labels(route, f"{status[0] // 100}xx").inc()
            self.metrics.latency.labels(route).observe(time.monotonic() - started)
