"""The closed loop on the real stack (real broker, Faust worker, MLflow server, embedded
engine, gateway, learner, reloader), and `tracetrain eval` as a user runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from mlflow import MlflowClient
from rich.console import Console

from demo.run import DemoOptions, DemoRun
from examples.calc.problems import generate, write_jsonl
from infra import processes
from schemas import Codec
from tracetrain.settings import load_settings

pytestmark = [pytest.mark.integration, pytest.mark.mlflow, pytest.mark.slow]
TRACETRAIN = str(Path(sys.executable).parent / "tracetrain")


def _spans(settings) -> list[dict]:
    codec = Codec()
    topic = settings.topics.name("spans")
    consumer = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                         "group.id": f"check-{os.getpid()}", "enable.auto.commit": False})
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    out, empty = [], 0
    while empty < 3:
        batch = consumer.consume(500, timeout=1.0)
        empty = 0 if batch else empty + 1
        out += [codec.decode(m.value(), "Span") for m in batch if m.error() is None]
    consumer.close()
    return out


def test_short_loop_registers_reloads_and_serves_the_new_version(kafka_broker, mlflow_server,
                                                                  tmp_path, base_model_dir):
    settings = load_settings(home=tmp_path, base_model=str(base_model_dir), kafka=kafka_broker,
                             mlflow=mlflow_server)
    free = {section: getattr(settings, section).model_copy(update={key: processes.free_port()})
            for section, key in (("engine", "port"), ("gateway", "port"), ("streams", "web_port"),
                                 ("learner", "metrics_port"), ("reloader", "metrics_port"))}
    settings = settings.model_copy(update=free)
    # a warm start of 16 worked problems: a demonstration per call, each problem's calls one
    # sequence (learner/warm_start.py), so 2 steps of 8, then the traffic
    opts = DemoOptions(task="calc", minutes=3.0, workers=4, mode="rl", n_eval=8,
                       version_eval_n=0, checkpoint_every=1, warm_start=16)
    run = DemoRun(settings, opts, Console(file=open(os.devnull, "w")))
    summary = run.run()

    assert summary["warm_start_problems"] == 16 and summary["warm_start_minutes"] > 0, summary
    assert summary["versions"] >= 2, summary
    assert summary["final_policy_version"] >= 2, "the engine never served a traffic-trained version"
    assert summary["mean_reload_s"] is not None and summary["mean_reload_s"] > 0
    assert summary["rollouts"] > 0 and summary["transitions"] > 0
    llm = [s["llm"] for s in _spans(run.settings) if s["kind"] == "llm"]
    versions = {x["policy_version"] for x in llm}
    # no traffic before the warm start was served; spans of a traffic-trained policy arrived
    assert min(versions) >= 1 and max(versions) >= 2, versions
    warm = MlflowClient(mlflow_server.uri).get_model_version(run.settings.mlflow.registered_model, "1")
    assert warm.tags["step"] == "2", warm.tags  # version 1 is the warm start alone
    # every traffic step also trained the calc demo's 4 rehearsed worked problems
    client = MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment_by_name(run.settings.mlflow.experiment)
    rehearsed = [m.value for r in client.search_runs([experiment.experiment_id])
                 for m in client.get_metric_history(r.info.run_id, "rehearsed")]
    assert summary["rehearsal_per_step"] == 4 and rehearsed and set(rehearsed) == {4.0}, rehearsed
    saved = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert {"task", "base_accuracy", "final_accuracy", "n", "minutes", "versions",
            "mean_reload_s"} <= set(saved)
    assert (tmp_path / "demo" / "reward_curve.png").stat().st_size > 10_000
    # everything the run started is stopped; the session broker and MLflow still run
    assert all(not processes.pid_alive(r.pid) for r in processes.records(tmp_path))


def test_eval_with_one_thread_gives_the_same_accuracy_twice_greedy(tmp_path, base_model_dir):
    # One problem at a time: with 16, llama.cpp's batches differ from run to run and so does
    # its rounding; these 8 problems scored 0.125 and 0.25 in CI that way.
    problems = tmp_path / "problems.jsonl"
    write_jsonl(generate(8, seed=5, difficulties=(1,)), problems)
    env = {**os.environ, "TRACETRAIN_HOME": str(tmp_path), "TRACETRAIN_BASE_MODEL": str(base_model_dir),
           "TRACETRAIN_CONFIG": "/nonexistent.toml"}
    results = []
    for _ in range(2):
        done = subprocess.run([TRACETRAIN, "eval", "--task", "calc", "--problems", str(problems),
                               "--version", "base", "--threads", "1"], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert results[0] == results[1]
    assert results[0]["task"] == "calc" and results[0]["version"] == "base" and results[0]["n"] == 8
    assert processes.records(tmp_path) == [] or all(
        not processes.pid_alive(r.pid) for r in processes.records(tmp_path))


def test_eval_runs_the_rag_task_and_says_its_metric(tmp_path, base_model_dir):
    env = {**os.environ, "TRACETRAIN_HOME": str(tmp_path), "TRACETRAIN_BASE_MODEL": str(base_model_dir),
           "TRACETRAIN_CONFIG": "/nonexistent.toml"}
    done = subprocess.run([TRACETRAIN, "eval", "--task", "rag", "--n", "4", "--version", "base",
                           "--threads", "4"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {k: result[k] for k in ("task", "version", "n", "metric")} == {
        "task": "rag", "version": "base", "n": 4, "metric": "f1"}
    assert 0.0 <= result["accuracy"] <= 1.0


def test_ctrl_c_stops_eval_at_once_and_its_engine_with_it(tmp_path, base_model_dir):
    """2,000 problems take many minutes; Ctrl-C must not wait for the queued ones."""
    env = {**os.environ, "TRACETRAIN_HOME": str(tmp_path), "TRACETRAIN_BASE_MODEL": str(base_model_dir),
           "TRACETRAIN_CONFIG": "/nonexistent.toml"}
    # As from a terminal: SIGINT at its default. A test run started in the background by a
    # non-interactive shell (`make test &`) inherits it ignored, and Python then never raises
    # KeyboardInterrupt.
    run = subprocess.Popen([TRACETRAIN, "eval", "--task", "calc", "--n", "2000", "--version", "base"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 180
        while not (engines := [r for r in processes.records(tmp_path) if processes.healthy(r)]):
            assert run.poll() is None and time.monotonic() < deadline, run.stderr.read()
            time.sleep(0.5)
        time.sleep(5)  # solving now
        run.send_signal(signal.SIGINT)
        stopped = time.monotonic()
        out, err = run.communicate(timeout=60)
        assert time.monotonic() - stopped < 30, "eval kept solving after Ctrl-C"
        assert run.returncode != 0 and '"accuracy"' not in out
    finally:
        run.kill()
    assert not any(processes.pid_alive(r.pid) for r in engines), "the eval engine was left running"


def test_eval_rejects_a_bad_version_and_a_missing_file(tmp_path):
    env = {**os.environ, "TRACETRAIN_HOME": str(tmp_path), "TRACETRAIN_CONFIG": "/nonexistent.toml"}
    bad = subprocess.run([TRACETRAIN, "eval", "--version", "newest"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "'newest'" in _text(bad.stderr)
    assert "version number" in _text(bad.stderr)
    missing = subprocess.run([TRACETRAIN, "eval", "--problems", str(tmp_path / "none.jsonl")],
                             env=env, capture_output=True, text=True)
    assert missing.returncode == 2 and "does not exist" in _text(missing.stderr)
    split = subprocess.run([TRACETRAIN, "eval", "--split", "test"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert split.returncode == 2 and "'test'" in _text(split.stderr), split.stderr
    assert "--split" in _text(split.stderr) and "heldout" in _text(split.stderr)
    for command in ("eval", "demo"):  # AutoGen is a calc front end only; named before any work
        wrong = subprocess.run([TRACETRAIN, command, "--task", "sql", "--front-end", "autogen"],
                               env=env, capture_output=True, text=True, timeout=60)
        assert wrong.returncode == 2 and "'autogen'" in _text(wrong.stderr), wrong.stderr
        assert "--front-end" in _text(wrong.stderr) and "openai" in _text(wrong.stderr)


def _text(stderr: str) -> str:
    """typer's error box without its frame and line breaks."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", stderr).split())


def test_a_killed_demo_stops_everything_it_started(kafka_broker, mlflow_server, tmp_path,
                                                   base_model_dir):
    """`kill <pid>` (SIGTERM: a job's time limit, a supervisor) stops the engine and stages as
    Ctrl-C does; they used to stay up, their ports taken for the next demo."""
    from tracetrain.settings import settings_env

    settings = load_settings(home=tmp_path, base_model=str(base_model_dir), kafka=kafka_broker,
                             mlflow=mlflow_server)
    free = {section: getattr(settings, section).model_copy(update={key: processes.free_port()})
            for section, key in (("engine", "port"), ("gateway", "port"), ("streams", "web_port"),
                                 ("learner", "metrics_port"), ("reloader", "metrics_port"))}
    env = {**os.environ, **settings_env(settings.model_copy(update=free))}
    run = subprocess.Popen([TRACETRAIN, "demo", "--minutes", "1", "--n-eval", "4",
                            "--warm-start", "0"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not any(r.name == "learner" for r in processes.records(tmp_path)):
            assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()
            time.sleep(0.5)
        started = processes.records(tmp_path)
        assert {"engine", "learner"} <= {r.name for r in started}, started
        run.terminate()
        out, _ = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 128 + signal.SIGTERM, out
    assert "stopping what the demo started" in out
    assert not any(processes.pid_alive(r.pid) for r in started), [
        r.name for r in started if processes.pid_alive(r.pid)]
