"""The `sft` and `kto` modes each run a few steps from Kafka and register a version."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from learner.loop import run_learner
from testkit.learner import learner_settings, make_transition, produce


@pytest.mark.integration
@pytest.mark.mlflow
@pytest.mark.parametrize("mode", ["sft", "kto"])
def test_offline_mode_trains_and_registers(mode, kafka_settings, mlflow_server, tiny_model_dir):
    base = kafka_settings.model_copy(update={"mlflow": mlflow_server})
    settings = learner_settings(base, tiny_model_dir, mode=mode, batch_size=4, lr=5e-3,
                                advantage="batch", checkpoint_every_steps=2, sft_min_reward=0.5)
    produce(settings, [make_transition(i, ret=float(i % 2)) for i in range(8)])
    model = f"{mode}-{settings.learner.group_id}"
    result = run_learner(settings, experiment=f"modes-{mode}", model_name=model, max_steps=2,
                         max_seconds=240)
    assert result.steps == 2 and result.policy.step == 2
    assert result.metrics["grad_norm"] > 0 and result.metrics["loss"] == result.metrics["loss"]
    if mode == "sft":
        assert result.metrics["sft_examples"] == 2.0  # only returns >= 0.5 are imitated
    else:
        assert result.metrics["desirable"] == 2.0  # labels from the advantage sign
    after = result.policy.trainable_state()
    # LoRA B starts at zero: non-zero B means the optimizer really stepped the adapter.
    assert any(float(v.abs().sum()) > 0 for k, v in after.items() if "lora_B" in k)
    version = MlflowClient(mlflow_server.uri).get_model_version_by_alias(model, "latest")
    assert version.tags["mode"] == mode and version.tags["step"] == "2"
