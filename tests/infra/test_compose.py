"""docker-compose.yml: no Docker engine runs here, so the file is read as YAML (anchors
resolved as compose resolves them) and checked against the contracts between its services;
where a compose CLI is installed, `docker compose config` (which needs no engine) renders it.

The contracts: every path one service hands another is on a named volume both mount at the
same place; every worker keeps its state folder on a volume of its own; every address a
service is given names a service it shares a network with, and a port that service listens
on; the Kafka settings fit the brokers defined; every TRACETRAIN_* variable is a setting, and
a valid one. A service's settings are read the way its process reads them: through
`load_settings`, from the environment its container starts with.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
import yaml
from pydantic import BaseModel

from infra.stack import SERVICES as STAGES
from serving.access import download_dir
from serving.service import engine_urls
from serving.vllm import vllm_argv
from tracetrain.base_model import model_dir
from tracetrain.settings import ENV_PREFIX, Settings, env_name, load_settings
from tracetrain.settings.producers import is_loopback

ROOT = Path(__file__).resolve().parents[2]
RAW = (ROOT / "docker-compose.yml").read_text()
COMPOSE = yaml.safe_load(RAW)
SERVICES = COMPOSE["services"]
VOLUMES = COMPOSE.get("volumes") or {}
NETWORKS = COMPOSE.get("networks") or {}
# What the image built from our Dockerfile sets (ENV lines) before compose's environment.
IMAGE_ENV = dict(re.findall(r"^ENV (\w+)=(\S+)", (ROOT / "Dockerfile").read_text(), re.M))
PLATFORM = ("kafka-1", "kafka-2", "kafka-3", "schema-registry", "postgres", "minio", "mlflow",
            "vllm")
# Every secret the file needs, each a required variable, with a value to read the file by.
GIVEN = {"MLFLOW_DB_PASSWORD": "db-secret", "S3_ACCESS_KEY": "s3-user",
         "S3_SECRET_KEY": "s3-secret-key", "GATEWAY_API_KEYS": '["gw-key"]'}
SECRETS = tuple(GIVEN)
# vLLM's dev-mode endpoints (VLLM_SERVER_DEV_MODE=1) and the adapter load: none has a key.
ENGINE_CONTROL = ("/collective_rpc", "/sleep", "/wake_up", "/is_sleeping",
                  "/reset_prefix_cache", "/v1/load_lora_adapter", "/v1/unload_lora_adapter")
# Ports an image listens on without being told (no flag or variable in the file says so).
IMAGE_PORTS = {"postgres": {5432}}
# Where an image keeps its data: the variable that moves it, and where it is without it.
IMAGE_DATA = {"postgres": ("PGDATA", "/var/lib/postgresql/data"),
              "apache/kafka": ("KAFKA_LOG_DIRS", "/tmp/kraft-combined-logs")}
URL_DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432}
# An s3:// URL names a bucket, reached through the endpoint variable beside it.
BUCKET_SCHEMES = {"s3"}
URL = re.compile(r"\b([a-z][\w+.-]*)://([^\s,\"';/]*)", re.I)
HOST_PORT = re.compile(r"(?<![\w.-])([a-z][\w.-]*):(\d+)\b", re.I)
# Addresses a stage takes from settings rather than from a variable holding a URL: every engine
# of a pool.
STAGE_ADDRESSES = {"gateway": lambda s: " ".join(s.gateway.engine_urls()),
                   "reloader": lambda s: " ".join(engine_urls(s))}


# ---- reading the file ------------------------------------------------------------------------
def _interpolate(text: str) -> str:
    return re.sub(r"\$\{(\w+)[^}]*\}", lambda m: GIVEN[m.group(1)], text)


def _image(name: str) -> str:
    return str(SERVICES[name].get("image", "")).split(":")[0]


def _is_ours(name: str) -> bool:
    return _image(name) == "tracetrain"


def _stage(name: str) -> str | None:
    """The `tracetrain STAGE` a service runs, if it runs one."""
    command = SERVICES[name].get("command")
    return command[1] if isinstance(command, list) and command[0] == "tracetrain" else None


def _compose_env(name: str) -> dict[str, str]:
    return {k: _interpolate(str(v)) for k, v in (SERVICES[name].get("environment") or {}).items()}


def _env(name: str) -> dict[str, str]:
    """The environment the service's container starts with."""
    return {**(IMAGE_ENV if _is_ours(name) else {}), **_compose_env(name)}


def _settings(name: str) -> Settings:
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update(_env(name))
    env[f"{ENV_PREFIX}CONFIG"] = "/nonexistent/tracetrain.toml"  # the image holds no file
    with mock.patch.dict(os.environ, env, clear=True):
        return load_settings()


def _argv(name: str) -> list[str]:
    """Entrypoint and command; a command given as one string stays one item."""
    argv = []
    for key in ("entrypoint", "command"):
        value = SERVICES[name].get(key) or []
        argv += [_interpolate(str(p)) for p in (value if isinstance(value, list) else [value])]
    return argv


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool

    @property
    def named(self) -> bool:
        return self.source in VOLUMES


def _mounts(service: dict) -> list[Mount]:
    mounts = []
    for spec in service.get("volumes") or []:
        if isinstance(spec, dict):  # the long syntax, as `docker compose config` renders it
            mounts.append(Mount(spec["source"], spec["target"], bool(spec.get("read_only"))))
            continue
        source, target, *options = spec.split(":")
        mounts.append(Mount(source, target, "ro" in options))
    return mounts


def _mount_holding(name: str, path: str) -> Mount | None:
    """The mount `path` lies on in the service's container (the deepest, as mounts nest)."""
    holding = [m for m in _mounts(SERVICES[name])
               if path == m.target or path.startswith(m.target.rstrip("/") + "/")]
    return max(holding, key=lambda m: len(m.target), default=None)


def _mounted_files(name: str) -> str:
    """The repository files bind-mounted into the service (an nginx config, say)."""
    files = [ROOT / m.source for m in _mounts(SERVICES[name]) if m.source.startswith("./")]
    return "\n".join(f.read_text() for f in files if f.is_file())


def _networks(name: str) -> set[str]:
    service = SERVICES[name]
    if service.get("network_mode") == "none":
        return set()
    return set(service.get("networks") or ["default"])


def _reaches(name: str) -> set[str]:
    """The services sharing a network with `name`."""
    return {other for other in SERVICES if other != name and _networks(other) & _networks(name)}


# ---- addresses -------------------------------------------------------------------------------
def _addresses(text: str) -> set[tuple[str, int]]:
    """The (host, port) pairs a text names: URLs, then bare host:port lists (bootstrap servers,
    quorum voters). A URL without host (`PLAINTEXT://:9092`) or on 0.0.0.0 is a bind."""
    found = set()
    for scheme, netloc in URL.findall(text):
        host, _, port = netloc.rpartition("@")[2].partition(":")
        if scheme.lower() in BUCKET_SCHEMES or host in ("", "0.0.0.0"):
            continue
        found.add((host, int(port) if port else URL_DEFAULT_PORTS[scheme.lower()]))
    return found | {(host, int(port)) for host, port in HOST_PORT.findall(URL.sub(" ", text))}


def _addresses_of(name: str) -> set[tuple[str, int]]:
    """Every address the service is given: in its variables, its command and mounted files,
    and, for a stage, the ones its settings make (e.g. the engine from engine.host and .port)."""
    texts = [*_env(name).values(), " ".join(_argv(name)), _mounted_files(name)]
    stage = _stage(name)
    if stage:
        settings = _settings(name)
        texts += [settings.kafka.bootstrap_servers, settings.mlflow.uri,
                  settings.schema_registry.url or ""]
        if stage in STAGE_ADDRESSES:
            texts.append(STAGE_ADDRESSES[stage](settings))
    return set().union(*map(_addresses, texts))


def _listens(name: str) -> set[int]:
    """The ports the service listens on, as its variables, command, config or settings say."""
    ports = set(IMAGE_PORTS.get(_image(name), ()))
    for key, value in _env(name).items():
        if key.endswith("LISTENERS") and "ADVERTISED" not in key:
            ports |= {int(p) for p in re.findall(r"://[^:,\s]*:(\d+)", value)}
    ports |= {int(p) for p in re.findall(r"--(?:port|address|console-address)[= ](?:\S*:)?(\d+)",
                                         " ".join(_argv(name)))}
    ports |= {int(p) for p in re.findall(r"^\s*listen\s+(\d+);", _mounted_files(name), re.M)}
    stage = _stage(name)
    if stage in STAGES:
        bound = STAGES[stage].listen(_settings(name))
        # a loopback bind is unreachable from any other container
        if bound and not is_loopback(bound[0]):
            ports.add(bound[1])
    return ports


def _hosts() -> dict[str, str]:
    """Host name -> service: each service's name, and its `hostname`."""
    return {**{n: n for n in SERVICES},
            **{s["hostname"]: n for n, s in SERVICES.items() if "hostname" in s}}


# ---- the checks ------------------------------------------------------------------------------
def _handed_over(path: str, writer: str, readers: tuple[str, ...]) -> None:
    """`path`, which `writer` writes and hands to each of `readers`, is on one named volume
    that all of them mount at the same place, writable by the writer."""
    held = _mount_holding(writer, path)
    assert held is not None and held.named, f"{writer} writes {path} on no named volume"
    assert not held.read_only, f"{writer} mounts {held.source} read-only but writes {path}"
    for reader in readers:
        theirs = _mount_holding(reader, path)
        assert theirs is not None and (theirs.source, theirs.target) == (held.source, held.target), (
            f"{writer} hands {reader} {path}, on volume {held.source} at {held.target} in "
            f"{writer}; in {reader} that path is on {theirs}")


def test_vllm_loads_adapters_from_where_the_reloader_downloads_them():
    settings = _settings("reloader")
    assert settings.engine.backend == "vllm"
    assert _hosts().get(settings.engine.host) == "vllm"
    _handed_over(str(download_dir(settings)), "reloader", ("vllm",))


def _vllm_served_model() -> str:
    argv = _argv("vllm")
    return argv[argv.index("serve") + 1]


def test_vllm_serves_the_folder_the_learner_trains_on_and_the_workers_tokenise_with():
    learner = _settings("learner")
    trained = str(model_dir(learner.base_model, learner.home_dir))
    assert _vllm_served_model() == trained
    # the one-shot that converts the shipped GGUF writes that very folder, before either starts
    maker = _settings("base-model")
    assert str(model_dir(maker.base_model, maker.home_dir)) == trained
    assert SERVICES["base-model"]["command"] == ["python", "-m", "tracetrain.base_model"]
    # the streams workers tokenise OpenTelemetry calls with its tokenizer (streams.retokenize)
    workers = tuple(name for name in SERVICES if name.startswith("streams-"))
    assert workers and all(str(model_dir(_settings(w).base_model, _settings(w).home_dir))
                           == trained for w in workers)
    _handed_over(trained, "base-model", ("learner", "vllm", *workers))
    for name in ("learner", "vllm", *workers):
        assert SERVICES[name]["depends_on"]["base-model"] == {
            "condition": "service_completed_successfully"}, name


def _without_option(argv: list[str], option: str) -> list[str]:
    at = argv.index(option)
    return argv[:at] + argv[at + 2:]


def test_vllm_runs_what_the_vllm_launcher_runs_for_the_reloaders_engine_settings():
    settings = _settings("reloader")
    # the folder's path, without converting the model here
    with mock.patch("serving.vllm.resolve_base_model", model_dir):
        launched = vllm_argv(settings)
    # vLLM listens on every address of its container; the reloader reaches it as engine.host
    assert _argv("vllm") == ["vllm", *_without_option(launched[1:], "--host")]
    argv = _argv("vllm")
    assert int(argv[argv.index("--max-lora-rank") + 1]) >= _settings("learner").learner.lora_r
    # `policy`, `policy-v<N>` and `policy-v<N-1>` at once (README, "Staleness with vLLM")
    assert argv[argv.index("--max-loras") + 1] == "3"


def test_every_worker_keeps_its_state_folder_on_a_volume_of_its_own():
    workers = [n for n in SERVICES if _is_ours(n) and SERVICES[n].get("restart") != "no"]
    assert {_stage(n) for n in workers} == {"gateway", "streams", "learner", "reloader"}
    for name in workers:
        home = str(_settings(name).home_dir)
        held = _mount_holding(name, home)
        assert held is not None and held.named and held.target == home, (name, home, held)
        assert not held.read_only, name
        # a spool or a Faust data folder is one process's: replicas would share it
        sharing = [o for o in SERVICES if o != name
                   and any(m.source == held.source for m in _mounts(SERVICES[o]))]
        assert not sharing, f"{name}'s home volume {held.source} is mounted by {sharing} too"
        assert (SERVICES[name].get("deploy") or {}).get("replicas", 1) == 1, name


def _data_dirs(name: str) -> list[str]:
    """Where a store keeps its data: as its image's variable says, or MinIO's `server DIR`."""
    if _image(name) in IMAGE_DATA:
        variable, default = IMAGE_DATA[_image(name)]
        return _env(name).get(variable, default).split(",")
    return re.findall(r"\bserver\s+(/\S+)", " ".join(_argv(name)))


def test_every_store_keeps_its_data_on_a_named_volume():
    stores = {n: _data_dirs(n) for n in SERVICES if _data_dirs(n)}
    assert {"kafka-1", "kafka-2", "kafka-3", "postgres", "minio"} <= set(stores)
    for name, folders in stores.items():
        for folder in folders:
            held = _mount_holding(name, folder)
            assert held is not None and held.named and not held.read_only, (name, folder, held)


def test_every_address_names_a_service_on_a_shared_network_and_a_port_it_listens_on():
    hosts, problems, checked = _hosts(), [], 0
    for name in SERVICES:
        for host, port in sorted(_addresses_of(name)):
            checked += 1
            target = hosts.get(host)
            if target is None:
                problems.append(f"{name}: {host}:{port} is no service of the file")
                continue
            if port not in _listens(target):
                problems.append(f"{name}: {host}:{port}, but {target} listens on "
                                f"{sorted(_listens(target))}")
            if target != name and not _networks(name) & _networks(target):
                problems.append(f"{name}: {host}:{port}, but {target} shares no network with it")
    assert checked > 20  # the scan found the file's addresses at all
    assert not problems, "\n".join(problems)


def test_published_ports_reach_a_port_the_service_listens_on():
    for name, service in SERVICES.items():
        for spec in service.get("ports") or []:
            assert int(spec.split(":")[-1]) in _listens(name), (name, spec)


def test_kafka_settings_fit_the_brokers_defined():
    brokers = {n: _env(n) for n in SERVICES if "KAFKA_NODE_ID" in _env(n)}
    count = len(brokers)
    # one broker down must leave min.insync.replicas copies to write to
    assert count >= 3
    node_ids = {int(env["KAFKA_NODE_ID"]): name for name, env in brokers.items()}
    assert len(node_ids) == count
    hosts = _hosts()
    for name, env in brokers.items():
        voters = dict(v.split("@") for v in env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(","))
        assert {int(i): hosts[a.split(":")[0]] for i, a in voters.items()} == node_ids, name
        assert len(voters) % 2 == 1, name  # a majority survives one voter down
        for key in ("DEFAULT_REPLICATION_FACTOR", "OFFSETS_TOPIC_REPLICATION_FACTOR",
                    "TRANSACTION_STATE_LOG_REPLICATION_FACTOR"):
            assert 1 < int(env[f"KAFKA_{key}"]) <= count, (name, key)
        assert 1 < int(env["KAFKA_MIN_INSYNC_REPLICAS"]) < int(env["KAFKA_DEFAULT_REPLICATION_FACTOR"])
        assert 1 < int(env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]) < int(
            env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"])
        assert env["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false", name
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false", name
    [cluster_id] = {env["CLUSTER_ID"] for env in brokers.values()}
    # Kafka's cluster ids are UUIDs in base64, as `kafka-storage random-uuid` prints them
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
    for name in SERVICES:
        if _stage(name):
            topics = _settings(name).topics
            assert 1 < topics.min_insync_replicas < topics.replication <= count, name
    registry = int(_env("schema-registry").get(
        "SCHEMA_REGISTRY_KAFKASTORE_TOPIC_REPLICATION_FACTOR", 3))
    assert registry <= count


def _setting_variables() -> set[str]:
    """Every variable `Settings` reads: one per field, sections included (a section may come
    as one JSON variable), and the config file's."""
    names = {f"{ENV_PREFIX}CONFIG"}

    def walk(model: type[BaseModel], path: tuple[str, ...]) -> None:
        for field, info in model.model_fields.items():
            names.add(env_name(".".join((*path, field))))
            if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
                walk(info.annotation, (*path, field))

    walk(Settings, ())
    return names


def test_every_tracetrain_variable_is_a_setting_with_a_valid_value():
    # The loader ignores a variable that names no setting, so a misspelt one would leave its
    # default in force without a word: each is looked up here.
    known = _setting_variables()
    for name in SERVICES:
        unknown = {k for k in _env(name) if k.startswith(ENV_PREFIX)} - known
        assert not unknown, f"{name} sets {sorted(unknown)}, which name no setting"
        if any(k.startswith(ENV_PREFIX) for k in _env(name)):
            _settings(name)  # ConfigError names every invalid value


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


def test_workers_scale_out_and_each_knows_every_broker():
    stages = [_stage(n) for n in SERVICES]
    assert stages.count("gateway") >= 2 and stages.count("streams") >= 2
    brokers = {n for n in SERVICES if "KAFKA_NODE_ID" in _env(n)}
    for name in SERVICES:
        if _stage(name):
            bootstrap = _settings(name).kafka.bootstrap_servers.split(",")
            assert {_hosts()[b.split(":")[0]] for b in bootstrap} == brokers, name


def test_published_ports_do_not_collide():
    published = []
    for service in SERVICES.values():
        for port in service.get("ports", []):
            host = port.split(":")[0]
            first, _, last = host.partition("-")
            published += list(range(int(first), int(last or first) + 1))
    assert len(published) == len(set(published))


def test_only_the_gateways_publish_a_port():
    assert {_stage(n) for n, s in SERVICES.items() if s.get("ports")} == {"gateway"}


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
    assert {_stage(n) for n in SERVICES if "edge" in _networks(n)} == {"gateway"}


def test_vllm_dev_mode_endpoints_are_reachable_only_from_the_reloader():
    assert SERVICES["vllm"]["environment"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert _reaches("vllm") == {"reloader", "vllm-proxy"}
    for name in SERVICES:
        if _stage(name) == "gateway":
            assert _settings(name).gateway.upstream_url == "http://vllm-proxy:8100/v1", name
    # The proxy passes only the locations its config names; everything else is a 403.
    [mount] = _mounts(SERVICES["vllm-proxy"])
    assert mount.target == "/etc/nginx/conf.d/default.conf"
    conf = (ROOT / mount.source).read_text()
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
        **{n: ("TRACETRAIN_GATEWAY__API_KEYS",) for n in SERVICES if _stage(n) == "gateway"}}
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
def test_compose_config_renders_what_these_tests_read_and_names_each_unset_secret():
    cli = [*_compose_cli(), "-f", str(ROOT / "docker-compose.yml"), "config"]
    base = {k: v for k, v in os.environ.items() if k not in GIVEN}
    for missing in SECRETS:
        env = {**base, **{k: v for k, v in GIVEN.items() if k != missing}}
        result = subprocess.run(cli, env=env, capture_output=True, text=True, cwd=ROOT)
        assert result.returncode != 0, missing
        assert f"set {missing}" in result.stderr, result.stderr
    result = subprocess.run(cli, env={**base, **GIVEN}, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    rendered = yaml.safe_load(result.stdout)["services"]
    assert rendered.keys() == SERVICES.keys()
    # compose resolves anchors and variables as this file's reading does
    for name, service in rendered.items():
        environment = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        assert environment == _compose_env(name), name
        named = {(m.source, m.target, m.read_only) for m in _mounts(service) if m.named}
        assert named == {(m.source, m.target, m.read_only)
                         for m in _mounts(SERVICES[name]) if m.named}, name
