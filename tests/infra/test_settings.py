"""The settings object: env and TOML sources, and every bad value reported at once."""

from __future__ import annotations

import pytest

from tracetrain.errors import ConfigError
from tracetrain.settings import load_settings


def test_defaults_and_topic_names():
    settings = load_settings()
    assert settings.topics.spans == "tracetrain.spans"
    assert settings.topics.dlq == "tracetrain.dlq"
    assert settings.kafka.bootstrap_servers == "127.0.0.1:9092"


def test_environment_overrides_nested_values(monkeypatch):
    monkeypatch.setenv("TRACETRAIN_TOPICS__PREFIX", "exp7")
    monkeypatch.setenv("TRACETRAIN_TOPICS__PARTITIONS", "8")
    settings = load_settings()
    assert settings.topics.transitions == "exp7.transitions"
    assert settings.topics.partitions == 8


def test_toml_file_is_read_and_env_wins(monkeypatch, tmp_path):
    config = tmp_path / "tt.toml"
    config.write_text('[kafka]\nport = 19092\n[learner]\nmode = "sft"\n')
    monkeypatch.setenv("TRACETRAIN_CONFIG", str(config))
    monkeypatch.setenv("TRACETRAIN_LEARNER__MODE", "kto")
    settings = load_settings()
    assert settings.kafka.port == 19092
    assert settings.learner.mode == "kto"


def test_all_invalid_values_are_reported_with_their_variable(monkeypatch):
    monkeypatch.setenv("TRACETRAIN_KAFKA__PORT", "abc")
    monkeypatch.setenv("TRACETRAIN_LEARNER__MODE", "ppo")
    monkeypatch.setenv("TRACETRAIN_TOPICS__PREFIX", "bad prefix!")
    with pytest.raises(ConfigError) as info:
        load_settings()
    text = str(info.value)
    assert "TRACETRAIN_KAFKA__PORT" in text and "'abc'" in text
    assert "TRACETRAIN_LEARNER__MODE" in text and "'rl', 'sft' or 'kto'" in text
    assert "TRACETRAIN_TOPICS__PREFIX" in text
    assert len(info.value.problems) == 3


def test_settings_are_frozen():
    settings = load_settings()
    with pytest.raises(ValueError):
        settings.home = "elsewhere"


def test_the_publishers_ordering_properties_cannot_be_switched_off(monkeypatch):
    """Per-rollout order rests on idempotence and on `enable.gapless.guarantee` (a refused
    batch stops the producer before a later one overtakes it): extra librdkafka properties
    may not turn either off, and the producer gets both."""
    from producers.publisher import producer_config

    monkeypatch.setenv("TRACETRAIN_PUBLISHER__LIBRDKAFKA",
                       '{"enable.gapless.guarantee": false, "socket.timeout.ms": 5000}')
    with pytest.raises(ConfigError, match="enable.gapless.guarantee: set by tracetrain"):
        load_settings()
    monkeypatch.setenv("TRACETRAIN_PUBLISHER__LIBRDKAFKA", '{"socket.timeout.ms": 5000}')
    config = producer_config(load_settings())
    assert config["enable.gapless.guarantee"] is True and config["enable.idempotence"] is True
    assert config["max.in.flight.requests.per.connection"] == 1  # no implicit acks (publisher)
    assert config["socket.timeout.ms"] == 5000


def test_a_variable_that_names_no_setting_is_refused_with_a_suggestion(monkeypatch):
    """pydantic-settings skips unknown variables: a typo would leave the default in force."""
    monkeypatch.setenv("TRACETRAIN_GATWAY__PORT", "9000")
    monkeypatch.setenv("TRACETRAIN_LEARNER__LEARNING_RATE", "0.1")
    monkeypatch.setenv("tracetrain_gatway__host", "0.0.0.0")  # read whatever its case
    monkeypatch.setenv("TRACETRAIN_KAFKA__PORT", "abc")  # reported in the same error
    with pytest.raises(ConfigError) as err:
        load_settings()
    problems = "\n".join(err.value.problems)
    assert "tracetrain_gatway__host: names no setting" in problems
    assert "TRACETRAIN_GATWAY__PORT: names no setting" in problems
    assert "did you mean 'gateway'" in problems
    assert "TRACETRAIN_LEARNER__LEARNING_RATE: names no setting" in problems
    assert "TRACETRAIN_KAFKA__PORT" in problems and len(err.value.problems) == 4


def test_variables_that_are_settings_or_read_before_them_are_accepted(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACETRAIN_CACHE", str(tmp_path))  # the llama.cpp build cache
    monkeypatch.setenv("TRACETRAIN_HOME", str(tmp_path))
    monkeypatch.setenv("TRACETRAIN_PUBLISHER__LIBRDKAFKA", '{"socket.timeout.ms": 7000}')
    monkeypatch.setenv("TRACETRAIN_STREAMS__AIR_RULES__TOOL_RAISED", "-0.5")
    settings = load_settings()
    assert settings.home == tmp_path and settings.publisher.librdkafka["socket.timeout.ms"] == 7000


def test_a_stage_process_gets_the_parents_settings_not_its_nested_variables(monkeypatch,
                                                                             tmp_path):
    """An eval engine is started on a free port while the user's shell says
    TRACETRAIN_ENGINE__PORT=18080: the child must listen where the parent chose, so the
    shell's nested variables do not reach it (they would override the section it is given)."""
    import subprocess
    import sys

    from infra import processes
    from infra.services import child_env
    from tracetrain.settings.serving import EngineSettings

    monkeypatch.setenv("TRACETRAIN_ENGINE__PORT", "18080")
    monkeypatch.setenv("TRACETRAIN_LEARNER__MODE", "kto")
    parent = load_settings(home=tmp_path)
    chosen = parent.model_copy(update={"engine": EngineSettings(port=23456)})
    read = subprocess.run(
        [sys.executable, "-c", "from tracetrain.settings import load_settings as l; "
         "s = l(); print(s.engine.port, s.learner.mode)"],
        env=processes.environ_with(child_env(chosen)), capture_output=True, text=True,
        timeout=60)
    assert read.returncode == 0, read.stderr
    # the port the parent chose; the learner mode the parent read from the shell
    assert read.stdout.split() == ["23456", "kto"]
