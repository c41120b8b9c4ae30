"""The embedded engine's Prometheus metrics (`GET /metrics` beside its API) and typed state
(`GET /state`, the same JSON as /v1/policy plus the counts).

Calls and their latency are counted by a pure ASGI wrapper (`CountCalls`), so every answer,
errors from any handler included, is counted once without touching each route."""

from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from serving.engine.batcher import Batcher
from serving.engine.decode import GenRequest, GenResult
from serving.engine.policy import Policy
from tracetrain.observability import Metrics, metric_name, values

# API path -> route label; other paths (/health, /metrics, /state) are not counted
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion",
          "/v1/models": "models", "/v1/policy": "policy", "/v1/load_lora_adapter": "load_lora",
          "/v1/load_checkpoint": "load_checkpoint"}


class EngineMetrics:
    def __init__(self, policy: Policy, batcher: Batcher):
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
        m.register(_BatcherCollector(policy, batcher))
        self.policy, self.batcher = policy, batcher

    def finished(self, req: GenRequest, result: GenResult) -> None:
        self.prompt_tokens.inc(len(req.prompt_ids))
        self.generated_tokens.inc(len(result.token_ids))

    def state(self) -> dict:
        return {"policy_version": self.policy.policy_version,
                "adapter_path": self.policy.adapter_path,
                "decoded_batches": self.batcher.batches,
                "largest_batch": max(self.batcher.batch_sizes, default=0),
                "handled_calls": values(self.calls, "route"),
                "prompt_tokens": int(values(self.prompt_tokens)),
                "generated_tokens": int(values(self.generated_tokens)),
                "checkpoint_loads": values(self.loads, "outcome")}


class _BatcherCollector:
    """Figures the batcher and policy already keep, read at scrape time."""

    def __init__(self, policy: Policy, batcher: Batcher):
        self.policy, self.batcher = policy, batcher

    def collect(self):
        yield CounterMetricFamily(metric_name("engine", "decoded", "batches"),
                                  "Decode batches run.", value=self.batcher.batches)
        yield GaugeMetricFamily(metric_name("engine", "largest_batch", "calls"),
                                "Most requests decoded in one batch so far.",
                                value=max(self.batcher.batch_sizes, default=0))
        yield GaugeMetricFamily(metric_name("engine", "policy", "version"),
                                "policy_version served now.", value=self.policy.policy_version)


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
