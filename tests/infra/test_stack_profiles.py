"""The stack's profiles (infra/profiles.py): what `tracetrain up --profile production` would start
and with which settings, checked without starting anything; the CLI's refusals."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from infra import profiles, services
from infra.kafka import broker
from tracetrain.errors import InfraError
from tracetrain.settings import load_settings, settings_env

PRODUCTION = profiles.PRODUCTION


@pytest.fixture
def started(tmp_path) -> dict:
    """Each production instance's settings, as `up_profile` passes them to its process."""
    base = load_settings(home=tmp_path)
    live = PRODUCTION.settings(base)
    return {i.name: (i, i.settings(live)) for i in PRODUCTION.instances}


def test_production_runs_the_topology_with_distinct_names_and_ports(started, tmp_path):
    assert list(started) == ["engine", "gateway-1", "gateway-2", "streams-1", "streams-2",
                             "learner", "reloader"]
    bound = [i.service.listen(s) for i, s in started.values()]
    assert len(set(bound)) == len(bound), bound
    base = load_settings(home=tmp_path)
    (_, g1), (_, g2) = started["gateway-1"], started["gateway-2"]
    assert (g1.gateway.port, g2.gateway.port) == (base.gateway.port, base.gateway.port + 1)
    assert g1.gateway.spool_name != g2.gateway.spool_name  # a spool is locked by one process
    engine = started["engine"][1].engine
    assert g1.gateway.upstream_url == g2.gateway.upstream_url == \
        f"http://{engine.host}:{engine.port}/v1"
    (_, s1), (_, s2) = started["streams-1"], started["streams-2"]
    assert s2.streams.web_port == s1.streams.web_port + 1
    assert s1.streams.app_id == s2.streams.app_id  # one consumer group
    for _, s in started.values():
        assert s.kafka.bootstrap_servers == broker.bootstrap(base.kafka, 3)
        assert (s.topics.replication, s.topics.min_insync_replicas) == (3, 2)
        assert s.mlflow.backend_store_uri == base.postgres.store_uri
    assert PRODUCTION.brokers == 3 and PRODUCTION.postgres


def test_the_learner_is_a_supervised_two_rank_torchrun_job(started):
    instance, settings = started["learner"]
    argv = instance.service.argv(settings)
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    assert argv[-2:] == ["tracetrain.cli", "learner"]
    assert instance.service.restart and started["streams-1"][0].service.restart
    assert instance.service.health_url(settings).endswith(f":{settings.learner.metrics_port}/healthz")


def test_a_set_backend_store_or_pool_is_kept(tmp_path):
    base = load_settings(home=tmp_path)
    pool = ["http://10.0.0.5:8100/v1", "http://10.0.0.6:8100/v1"]
    custom = profiles.override(base, {
        "mlflow": {"backend_store_uri": "postgresql+psycopg2://db.example/mlflow"},
        "gateway": {"upstream_urls": pool, "upstream_url": pool[0]}})
    live = PRODUCTION.settings(custom)
    assert live.mlflow.backend_store_uri == "postgresql+psycopg2://db.example/mlflow"
    gateway = dict((i.name, i.settings(live)) for i in PRODUCTION.instances)["gateway-2"].gateway
    assert gateway.engine_urls() == pool


def test_an_instance_passes_its_overrides_to_its_process(started):
    instance, settings = started["gateway-2"]
    env = services.child_env(settings, instance.service.env(settings))
    assert f'"port": {settings.gateway.port}' in env["TRACETRAIN_GATEWAY"]
    assert '"spool_name": "gateway-2"' in env["TRACETRAIN_GATEWAY"]
    assert env == {**env, **settings_env(settings)}


def test_unknown_profile_is_named(tmp_path):
    with pytest.raises(InfraError, match=r"unknown profile 'prod'; expected one of dev, production"):
        profiles.get("prod")


def _cli(tmp_path, *argv):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACETRAIN_")}
    env.update({"TRACETRAIN_HOME": str(tmp_path), "TRACETRAIN_CONFIG": "/nonexistent.toml"})
    return subprocess.run([sys.executable, "-m", "tracetrain.cli", *argv], env=env,
                          capture_output=True, text=True, cwd=services.ROOT)


def test_up_explains_the_profiles_and_refuses_services_with_production(tmp_path):
    help_text = _cli(tmp_path, "up", "--help").stdout
    assert "production" in help_text and "torchrun" in help_text and "dev" in help_text
    refused = _cli(tmp_path, "up", "--profile", "production", "--services", "kafka")
    assert refused.returncode == 2
    assert "--services and --brokers are for --profile dev" in refused.stderr
    assert _cli(tmp_path, "up", "--profile", "staging").returncode == 2
