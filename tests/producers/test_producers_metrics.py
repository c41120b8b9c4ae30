"""A tracer or exporter process's publisher metrics (publisher.metrics_port): one status server
for the process, each publisher's own registry on it, no broker needed to read them."""

from __future__ import annotations

from producers import publisher as publisher_module
from producers.publisher import Publisher
from testkit.metrics import check_metrics, get_state
from tracetrain.settings import Settings


def test_publishers_of_a_process_share_one_metrics_port(tmp_path, monkeypatch):
    monkeypatch.setattr(publisher_module, "_status", [])
    monkeypatch.setattr(publisher_module, "_served", [])
    # port 0: a free one; nothing listens on the broker address, nothing is published
    settings = Settings(home=tmp_path, kafka={"bootstrap_servers": "127.0.0.1:1"},
                        publisher={"metrics_port": 0})
    one = Publisher(settings, name="tracer", spool_dir=tmp_path / "one")
    two = Publisher(settings, name="otel", spool_dir=tmp_path / "two")
    [server] = publisher_module._status
    try:
        one._count("spooled", 2)
        assert check_metrics(server.url, "publisher") == {
            "tracetrain_publisher_output_records_total",
            "tracetrain_publisher_output_records_created",
            "tracetrain_publisher_quarantined_bytes_total",
            "tracetrain_publisher_quarantined_bytes_created",
            "tracetrain_publisher_delivery_state_value",
            "tracetrain_publisher_spool_bytes", "tracetrain_publisher_spool_limit_bytes"}
        state = get_state(server.url)["publishers"]
        assert state["tracer"]["spooled"] == 2 and state["otel"]["sent"] == 0
        assert state["tracer"]["delivery"]["state"] == "running"
        assert state["tracer"]["spool"]["limit_bytes"] == 1024 * 1024 * 1024
        one.close(timeout_s=0.1)
        assert set(get_state(server.url)["publishers"]) == {"otel"}
    finally:
        two.close(timeout_s=0.1)
        server.close()
