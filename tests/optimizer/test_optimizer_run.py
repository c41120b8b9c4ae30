"""`tracetrain optimize-prompt` end to end: calc rollouts through the real gateway onto the real
broker, then the command (a process, as a user runs it) reads them back, asks the real engine
to critique and rewrite, scores the prompts through the real agent, and registers them in the
real MLflow server's prompt registry; the agent then loads the prompt by alias."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import mlflow
import pytest
from pydantic import SecretStr

from examples.calc.agent import SYSTEM_PROMPT, CalcAgent
from examples.calc.problems import generate
from producers.tracer import Tracer
from testkit.producers import running_gateway
from tracetrain.settings import load_settings, settings_env
from tracetrain.settings.optimizer import OptimizerSettings

TRACETRAIN = shutil.which("tracetrain") or str(Path(sys.executable).parent / "tracetrain")


@pytest.fixture
def rollouts(kafka_settings, optimizer_engine, tmp_path):
    """Four calc rollouts (sampled) through a real gateway in front of the engine; their
    rollout ids."""
    with running_gateway(kafka_settings, optimizer_engine + "/v1", tmp_path / "spool",
                         "optimizer-traffic", api_keys=[SecretStr("k")]) as (url, _, publisher):
        agent = CalcAgent(url + "/v1", tracer=Tracer(publisher, agent="calc"),
                          temperature=1.0, max_tokens=32, api_key="k")
        ids = [agent.solve(p, task_id=f"opt-{i}", seed=i).rollout_id
               for i, p in enumerate(generate(4, seed=11, split="train"))]
        publisher.flush()
    return ids


def _run(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([TRACETRAIN, "optimize-prompt", "--rounds", "1", "--candidates", "2",
                           "--n-val", "4"], env=env, capture_output=True, text=True, timeout=600)


def test_one_round_registers_scored_versions_with_lineage_and_moves_the_alias(
        kafka_settings, mlflow_server, optimizer_engine, rollouts, tmp_path):
    name = f"calc-system-{uuid.uuid4().hex[:8]}"
    opts = OptimizerSettings(engine_url=optimizer_engine + "/v1", prompt_name=name, threads=4,
                             group_id=f"optimizer-{name}")
    settings = kafka_settings.model_copy(update={"mlflow": mlflow_server, "optimizer": opts,
                                                 "home": tmp_path})
    env = {**os.environ, **settings_env(settings)}
    done = _run(env)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["rollouts_read"] == 4 and summary["learned_from"] == 4
    assert summary["prompt"] == f"prompts:/{name}@production" and summary["n_val"] == 4
    assert summary["candidates"], summary  # the engine's rewrites were scored

    mlflow.set_tracking_uri(mlflow_server.uri)
    versions = [summary["seed_version"], *(c["version"] for c in summary["candidates"])]
    registered = {v: mlflow.genai.load_prompt(name, version=v, link_to_model=False)
                  for v in versions}
    seed = registered[summary["seed_version"]]
    assert seed.template == SYSTEM_PROMPT and seed.tags["role"] == "seed"
    scores = {v: float(p.tags["score"]) for v, p in registered.items()}
    assert scores[summary["seed_version"]] == summary["seed_score"]
    for candidate in summary["candidates"]:
        tags = registered[candidate["version"]].tags
        assert float(tags["score"]) == candidate["score"] and tags["n_val"] == "4"
        assert tags["parent_version"] == str(summary["seed_version"])
        assert sorted(tags["rollout_ids"].split(",")) == sorted(rollouts)
        assert f"{settings.topics.spans}:" in tags["topic_offsets"]
        assert f"{settings.topics.rewards}:" in tags["topic_offsets"]
        assert tags["reward_offsets"].count(settings.topics.rewards) == 4
    # the alias names the best-scoring version (the seed keeps it on a tie)
    best = mlflow.genai.load_prompt(f"prompts:/{name}@production", link_to_model=False)
    assert int(best.version) == summary["best_version"]
    assert scores[int(best.version)] == max(scores.values())
    # the agent fetches its system prompt by alias
    agent = CalcAgent(optimizer_engine + "/v1", prompt_uri=f"prompts:/{name}@production")
    assert agent.system_prompt == best.template

    # The group's position was committed: the same rollouts are not learned from twice.
    again = _run(env)
    assert again.returncode == 2 and "no rollouts of agent 'calc'" in again.stderr, again.stderr


def test_eval_names_a_prompt_the_registry_does_not_hold(mlflow_server, tmp_path):
    settings = load_settings(home=tmp_path, mlflow=mlflow_server)
    done = subprocess.run([TRACETRAIN, "eval", "--task", "calc", "--n", "2",
                           "--prompt", "prompts:/no-such-prompt@production"],
                          env={**os.environ, **settings_env(settings)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "prompts:/no-such-prompt@production" in done.stderr
    assert "is not in MLflow's prompt registry" in done.stderr
    assert "Traceback" not in done.stderr
