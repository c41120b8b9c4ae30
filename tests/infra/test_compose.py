"""docker-compose.yml: no Docker engine runs here, so its structure is checked as YAML
(anchors resolved as compose resolves them), and its interpolation by the compose CLI where
one is installed (`docker compose config` needs no engine)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
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


ROOT = Path(__file__).resolve().parents[2]
RAW = (ROOT / "docker-compose.yml").read_text()
NETWORKS = COMPOSE.get("networks") or {}
PLATFORM = ("kafka-1", "kafka-2", "kafka-3", "schema-registry", "postgres", "minio", "mlflow",
            "vllm")
# Every secret the file needs, each a required variable.
SECRETS = ("MLFLOW_DB_PASSWORD", "S3_ACCESS_KEY", "S3_SECRET_KEY", "GATEWAY_API_KEYS")
# vLLM's dev-mode endpoints (VLLM_SERVER_DEV_MODE=1) and the adapter load: none has a key.
ENGINE_CONTROL = ("/collective_rpc", "/sleep", "/wake_up", "/is_sleeping",
                  "/reset_prefix_cache", "/v1/load_lora_adapter", "/v1/unload_lora_adapter")


def _networks(name: str) -> set[str]:
    return set(SERVICES[name].get("networks") or ["default"])


def _reaches(name: str) -> set[str]:
    """The services sharing a network with `name`."""
    return {other for other in SERVICES if other != name and _networks(other) & _networks(name)}


def test_only_the_gateway_publishes_a_port():
    assert [name for name, service in SERVICES.items() if service.get("ports")] == ["gateway"]


def test_the_platform_stays_on_internal_networks():
    assert NETWORKS.get("internal") == {"internal": True}
    assert NETWORKS.get("engine") == {"internal": True}
    for name in PLATFORM:
        outside = {n for n in _networks(name) if not (NETWORKS.get(n) or {}).get("internal")}
        # `NAME-egress` lets what fetches at start out, and holds nothing else to reach it by
        assert outside <= {f"{name}-egress"}, (name, outside)
    for network in NETWORKS:
        members = {n for n in SERVICES if network in _networks(n)}
        if network.endswith("-egress"):
            assert members == {network.removesuffix("-egress")}, network
    assert {n for n in SERVICES if "edge" in _networks(n)} == {"gateway"}


def test_vllm_dev_mode_endpoints_are_reachable_only_from_the_reloader():
    assert SERVICES["vllm"]["environment"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert _reaches("vllm") == {"reloader", "vllm-proxy"}
    gateway = SERVICES["gateway"]["environment"]
    assert gateway["TRACETRAIN_GATEWAY__UPSTREAM_URL"] == "http://vllm-proxy:8100/v1"
    # The proxy passes only the locations its config names; everything else is a 403.
    [mount] = SERVICES["vllm-proxy"]["volumes"]
    source, target, _ = mount.split(":")
    assert target == "/etc/nginx/conf.d/default.conf"
    conf = (ROOT / source).read_text()
    passed = [re.compile(p) for p in re.findall(r"location ~ (\S+) \{", conf)]
    assert passed and "location / {\n        return 403" in conf
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health"):
        assert any(p.match(path) for p in passed), path
    for path in ENGINE_CONTROL:
        assert not any(p.match(path) for p in passed), path


def test_no_default_passwords_every_secret_is_required():
    # ${VAR:-default} or ${VAR-default} would start with a password anyone can read here;
    # ${VAR:?message} makes compose refuse to start without it.
    assert set(re.findall(r"\$\{(\w+)(:\?|\?|:-|-|\})", RAW)) == {(s, ":?") for s in SECRETS}
    secret_settings = {
        "postgres": ("POSTGRES_PASSWORD",), "minio": ("MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD"),
        "mlflow": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
        "gateway": ("TRACETRAIN_GATEWAY__API_KEYS",)}
    for service, keys in secret_settings.items():
        for key in keys:
            assert SERVICES[service]["environment"][key].startswith("${"), (service, key)


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


@pytest.mark.skipif(_compose_cli() is None,
                    reason="no compose CLI here (`docker compose` plugin or docker-compose)")
def test_compose_config_fails_naming_each_unset_secret():
    cli = [*_compose_cli(), "-f", str(ROOT / "docker-compose.yml"), "config"]
    given = {"MLFLOW_DB_PASSWORD": "db-secret", "S3_ACCESS_KEY": "s3-user",
             "S3_SECRET_KEY": "s3-secret-key", "GATEWAY_API_KEYS": '["gw-key"]'}
    base = {k: v for k, v in os.environ.items() if k not in given}
    for missing in SECRETS:
        env = {**base, **{k: v for k, v in given.items() if k != missing}}
        result = subprocess.run(cli, env=env, capture_output=True, text=True, cwd=ROOT)
        assert result.returncode != 0, missing
        assert f"set {missing}" in result.stderr, result.stderr
    result = subprocess.run(cli, env={**base, **given}, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    rendered = yaml.safe_load(result.stdout)
    assert [n for n, s in rendered["services"].items() if s.get("ports")] == ["gateway"]
    assert rendered["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"] == "db-secret"
