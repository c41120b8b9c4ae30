"""Helpers of the serving tests and bench.reload: engine settings on a free port, a pool of
engine processes, the engine's policy endpoint, loading an adapter as the reloader does, real
PEFT LoRA adapters of the default model and registering them in MLflow."""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from pathlib import Path

import httpx

from infra import processes, services
from serving.access import download_dir, load_key
from serving.service import ENGINE, engine_url
from tracetrain.settings import load_settings
from tracetrain.settings.learner import LORA_ATTENTION
from tracetrain.settings.serving import EngineSettings


def engine_settings(home: Path, model_dir: Path, **engine):
    return load_settings(home=home, base_model=str(model_dir),
                         engine=EngineSettings(port=processes.free_port(), **engine))


class EnginePool:
    """`size` embedded engine processes on free ports of one home (so they share the load key
    and the download folder, as a reloader driving them all needs), each its own instance
    (`engine-0`, ...), which a test may kill and start again on the same port."""

    def __init__(self, home: Path, model_dir: Path, size: int = 2, **engine):
        first = engine_settings(home, model_dir, **engine)
        self.settings = [first] + [first.model_copy(update={"engine": first.engine.model_copy(
            update={"port": processes.free_port()})}) for _ in range(size - 1)]
        self.urls = [engine_url(s) for s in self.settings]

    def start(self, index: int) -> None:
        services.start(self.settings[index], ENGINE, instance=f"engine-{index}")

    def kill(self, index: int) -> None:
        """SIGKILL the engine and its llama-servers (its process group): a machine lost."""
        record = processes.read_record(self.settings[index].home_dir, f"engine-{index}")
        os.killpg(record.pid, signal.SIGKILL)
        processes.wait_until(lambda: not processes.is_ours(record), 10, f"engine-{index} to die")

    def stop(self, index: int) -> None:
        services.stop(self.settings[index], f"engine-{index}")


def policy_info(url: str) -> dict:
    return httpx.get(f"{url}/v1/policy", timeout=10).json()


def load_adapter(settings, folder: Path, **body) -> httpx.Response:
    """POST /v1/load_lora_adapter as the reloader does: `folder` copied under the download
    folder, the load key sent."""
    placed = download_dir(settings) / "by-test" / f"{folder.name}-{uuid.uuid4().hex[:6]}"
    shutil.copytree(folder, placed)
    return httpx.post(f"{engine_url(settings)}/v1/load_lora_adapter", timeout=120,
                      headers={"authorization": f"Bearer {load_key(settings)}"},
                      json={"lora_name": "policy", "lora_path": str(placed), **body})


def make_adapters(model_dir: Path, out: Path, seeds: list[int], scale: float = 0.5,
                  targets: tuple[str, ...] = LORA_ATTENTION) -> list[Path]:
    """Real PEFT LoRA adapters of the default model on the `targets` layers, with random B
    weights so that each one changes what the model says (a fresh LoRA has B = 0 and changes
    nothing)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16,
                                                  target_modules=list(targets)))
    folders = []
    for seed in seeds:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                # Seeded A and B: the same seed gives the same adapter in every run.
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * scale)
                elif "lora_A" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
        folder = out / f"adapter-{seed}"
        peft_model.save_pretrained(folder)
        folders.append(folder)
    return folders


def register_version(tracking_uri: str, model_name: str, folder: Path,
                     alias: str | None = "production") -> int:
    """Log `folder` to a run, register it as a new version of `model_name`, point `alias` at it
    (None: only register; the reloader's `latest` follows the highest version)."""
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    experiment = mlflow.set_experiment("serving-tests")
    with mlflow.start_run(experiment_id=experiment.experiment_id) as run:
        mlflow.log_artifacts(str(folder), artifact_path="adapter")
    try:
        client.create_registered_model(model_name)
    except mlflow.exceptions.MlflowException:
        pass  # already registered by an earlier version
    version = client.create_model_version(model_name, source=f"{run.info.artifact_uri}/adapter",
                                          run_id=run.info.run_id)
    if alias:
        client.set_registered_model_alias(model_name, alias, version.version)
    return int(version.version)


def token_logprobs(model, prompt_ids: list[int], token_ids: list[int],
                   temperature: float = 1.0) -> list[float]:
    """The learner's view of a response: each token's logprob under one forward pass of
    `model` (a transformers causal LM) on prompt + response, its logits divided by the
    sampling temperature, what the engine's must match."""
    import torch

    ids = torch.tensor([list(prompt_ids) + list(token_ids)])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt_ids) - 1:-1] / temperature, dim=-1)
    return logprobs.gather(1, torch.tensor(token_ids)[:, None])[:, 0].tolist()
