"""The vLLM backend: `vllm serve` with runtime LoRA updating, for GPU machines.

    tracetrain engine --backend vllm       # needs the `gpu` extra: pip install 'tracetrain[gpu]'

Starts `vllm serve <base model dir>` with `--enable-lora --max-lora-rank R`, the logprobs of
the processed (temperature-scaled) distribution that importance sampling needs, and the
environment that lets the reloader swap adapters in place (VLLM_ALLOW_RUNTIME_LORA_UPDATING)
and reload full weights through `/collective_rpc` (VLLM_SERVER_DEV_MODE). The base model is
served under its settings name; each adapter is loaded as `engine.served_name` ("policy") and
as `policy-v<policy_version>`, the name that carries its version to the gateway's spans.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from serving.errors import ServingError
from tracetrain.base_model import resolve_base_model
from tracetrain.settings import Settings


def vllm_env() -> dict[str, str]:
    return {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_SERVER_DEV_MODE": "1"}


def vllm_argv(settings: Settings) -> list[str]:
    engine = settings.engine
    model_dir = resolve_base_model(settings.base_model, settings.home_dir)
    binary = shutil.which("vllm") or str(os.path.join(os.path.dirname(sys.executable), "vllm"))
    return [
        binary, "serve", str(model_dir),
        "--host", engine.host, "--port", str(engine.port),
        "--served-model-name", settings.base_model,
        "--max-model-len", str(engine.max_context),
        "--max-num-seqs", str(max(engine.slots, 8)),
        # three adapters in a batch: the plain name, the versioned one and the previous
        # versioned one (serving/engine_client.py), while calls for it finish
        "--enable-lora", "--max-lora-rank", str(engine.max_lora_rank), "--max-loras", "3",
        "--logprobs-mode", "processed_logprobs",
        *engine.vllm_args,
    ]


def run_vllm(settings: Settings) -> int:
    """Run `vllm serve` in the foreground; its exit status is ours."""
    argv = vllm_argv(settings)
    if not os.path.exists(argv[0]):
        raise ServingError("`vllm` is not installed; the vllm backend needs the gpu extra "
                           "(`uv pip install 'tracetrain[gpu]'`) on a CUDA machine")
    return subprocess.call(argv, env={**os.environ, **vllm_env()})
