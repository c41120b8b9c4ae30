"""Learner fixtures: a tiny real Llama (2 layers, hidden 32, the SmolLM2 tokenizer) saved once
per session; `tracetrain learner` as a torchrun job of several ranks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tracetrain.settings import settings_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, base_model_dir):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id, max_position_embeddings=256,
    )
    torch.manual_seed(1234)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path



@pytest.fixture(scope="module")
def torchrun(tmp_path_factory):
    """start(settings, ranks, *argv): `tracetrain learner *argv` (or `python -m module *argv`)
    as one torchrun job of `ranks` processes on this machine (gloo on the CPU), with `settings`
    in its environment; a Popen whose `.log` is the job's output. Jobs still running at the
    end are killed, all ranks."""
    jobs: list[subprocess.Popen] = []
    folder = tmp_path_factory.mktemp("torchrun")

    def start(settings, ranks: int, *argv: str, module: str = "") -> subprocess.Popen:
        log = folder / f"torchrun-{len(jobs)}.log"
        with open(log, "w") as out:
            job = subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", str(ranks), "-m",
                 *([module] if module else ["tracetrain.cli", "learner"]), *argv],
                env={**os.environ, **settings_env(settings)}, cwd=ROOT, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)  # its ranks: its group
        job.log = log
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
