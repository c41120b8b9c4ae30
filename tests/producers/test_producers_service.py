"""The gateway as a stack service: `tracetrain up --services gateway` spawns `tracetrain
gateway` detached; it records calls, serves /metrics and /state, and a SIGTERM
(`tracetrain down`) shuts it down with nothing left in its spool."""

from __future__ import annotations

import httpx
import openai
import pytest

from infra import processes, stack
from testkit.metrics import check_metrics, get_state
from testkit.producers import consume

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_gateway_service_process_records_and_stops_clean(kafka_settings, upstream, tmp_path):
    gw = kafka_settings.gateway.model_copy(update={
        "port": processes.free_port(), "upstream_url": upstream.url + "/v1"})
    settings = kafka_settings.model_copy(update={"gateway": gw, "home": tmp_path})
    [record] = stack.up(settings, ["gateway"])
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key="none",
                               max_retries=0, default_headers={"X-Rollout-Id": "ro-svc"})
        for _ in range(3):
            client.chat.completions.create(model="fixed-model",
                                           messages=[{"role": "user", "content": "hi"}])
        base = f"http://127.0.0.1:{gw.port}"
        names = check_metrics(base, "gateway", "publisher")
        assert {"tracetrain_gateway_handled_calls_total",
                "tracetrain_gateway_upstream_latency_seconds_bucket"} <= names
        # the publisher's figures, from its own registry, on the gateway's page
        metrics = httpx.get(f"{base}/metrics").text
        assert 'tracetrain_gateway_handled_calls_total{route="chat",status="2xx"} 3.0' in metrics
        assert 'tracetrain_publisher_output_records_total{outcome="sent",publisher="gateway"}' \
            in metrics
        state = get_state(base)
        assert state["handled_calls"] == {"chat": {"2xx": 3}}
        assert state["publisher"] == "gateway" and state["published_records"]["spooled"] == 0
    finally:
        assert processes.stop(tmp_path, "gateway")
    assert not processes.pid_alive(record.pid)
    spans = consume(settings.kafka.bootstrap_servers, settings.topics.spans, 3, settle_s=0.5)
    assert [k for k, _ in spans] == ["ro-svc"] * 3
    assert not list((tmp_path / "spool" / "gateway").glob("seg-*.log"))
