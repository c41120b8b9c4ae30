"""docker-compose.yml: no Docker engine runs here, so its structure is checked as YAML
(anchors resolved as compose resolves them)."""

from __future__ import annotations

from pathlib import Path

import yaml

COMPOSE = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def test_three_kraft_brokers_with_replication_three():
    brokers = [s for s in SERVICES if s.startswith("kafka-")]
    assert brokers == ["kafka-1", "kafka-2", "kafka-3"]
    ids = {SERVICES[b]["environment"]["KAFKA_NODE_ID"] for b in brokers}
    assert ids == {1, 2, 3}
    for b in brokers:
        env = SERVICES[b]["environment"]
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 3
        assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == 2
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{b}:9092"
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].count("@") == 3


def test_registry_mlflow_postgres_s3_and_vllm_on_gpu():
    assert "schema-registry" in SERVICES
    mlflow = SERVICES["mlflow"]["command"]
    assert "postgresql://" in mlflow and "s3://" in mlflow
    assert {"postgres", "minio"} <= set(SERVICES["mlflow"]["depends_on"])
    vllm = SERVICES["vllm"]
    assert "--enable-lora" in vllm["command"]
    assert vllm["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    gpu = vllm["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"]


def test_workers_have_replicas_and_point_at_the_cluster():
    for name in ("gateway", "streams"):
        assert SERVICES[name]["deploy"]["replicas"] >= 2
    for name in ("gateway", "streams", "learner", "reloader", "topics"):
        env = SERVICES[name]["environment"]
        assert env["TRACETRAIN_KAFKA__BOOTSTRAP_SERVERS"].count("kafka-") == 3
        assert env["TRACETRAIN_SCHEMA_REGISTRY__URL"].startswith("http://schema-registry")
        assert SERVICES[name]["command"][0] == "tracetrain"


def test_published_ports_do_not_collide():
    published = []
    for service in SERVICES.values():
        for port in service.get("ports", []):
            host = port.split(":")[0]
            first, _, last = host.partition("-")
            published += list(range(int(first), int(last or first) + 1))
    assert len(published) == len(set(published))
