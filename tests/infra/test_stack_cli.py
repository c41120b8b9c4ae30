"""The `tracetrain` command as a user runs it: smoke (up, status, spans, down), clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra import processes

TRACETRAIN = str(Path(sys.executable).with_name("tracetrain"))


def _env(home: Path, **extra: str) -> dict[str, str]:
    kafka_port = processes.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACETRAIN_")}
    env.update({
        "TRACETRAIN_HOME": str(home),
        "TRACETRAIN_KAFKA__PORT": str(kafka_port),
        "TRACETRAIN_KAFKA__CONTROLLER_PORT": str(processes.free_port()),
        "TRACETRAIN_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{kafka_port}",
        "TRACETRAIN_MLFLOW__PORT": str(processes.free_port()),
        "TRACETRAIN_CONFIG": "/nonexistent.toml",
        **extra,
    })
    return env


def test_every_command_has_help():
    out = subprocess.run([TRACETRAIN, "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("up", "down", "status", "kafka", "topics", "smoke", "demo", "eval"):
        assert command in out
    for sub in (["kafka", "start"], ["topics", "create"], ["up"], ["smoke"], ["demo"], ["eval"]):
        help_text = subprocess.run([TRACETRAIN, *sub, "--help"], capture_output=True, text=True,
                                   check=True).stdout
        assert "Usage" in help_text


def test_invalid_setting_fails_before_anything_runs(tmp_path):
    env = _env(tmp_path, TRACETRAIN_TOPICS__PARTITIONS="many")
    result = subprocess.run([TRACETRAIN, "status"], env=env, capture_output=True, text=True)
    assert result.returncode == 2
    assert "TRACETRAIN_TOPICS__PARTITIONS" in result.stderr and "'many'" in result.stderr


def test_missing_java_is_a_clear_error(tmp_path):
    env = _env(tmp_path, PATH=str(Path(sys.executable).parent))
    result = subprocess.run([TRACETRAIN, "kafka", "start", "--detach"], env=env,
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "Java 17+ is needed" in result.stderr


def test_status_with_nothing_running(tmp_path):
    out = subprocess.run([TRACETRAIN, "status"], env=_env(tmp_path), capture_output=True,
                         text=True, check=True).stdout
    assert "nothing is running" in out


@pytest.mark.integration
@pytest.mark.mlflow
def test_smoke_brings_the_stack_up_round_trips_spans_and_stops(stack_home):
    result = subprocess.run([TRACETRAIN, "smoke", "--spans", "5"], env=_env(stack_home),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "kafka-1" in out and "mlflow" in out and "healthy" in out
    assert "read back 5/5 spans" in out
    assert "stopped mlflow, kafka-1" in out
    assert processes.records(stack_home) == []  # no pid file left: everything stopped
