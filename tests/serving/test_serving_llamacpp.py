"""llama.cpp under the engine: the build's CPU flags, the LoRA-to-GGUF conversion (checked
against PEFT's own forward pass through a real llama-server), and what the conversion refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from serving.errors import LoadError
from serving.llamacpp import build, patches
from serving.llamacpp.weights import lora_to_gguf
from tracetrain.settings.learner import LORA_ALL_LINEAR, LORA_ATTENTION

SHAPE = {"arch": "llama", "n_blocks": 30, "n_head": 9, "n_head_kv": 3}


def test_build_flags_name_their_instruction_sets_and_never_amx_or_native():
    auto, portable = build.cpu_flags("auto"), build.cpu_flags("portable")
    for flags in (auto, portable):
        assert flags["GGML_NATIVE"] == "OFF"
        assert {flags[k] for k in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")} == {"OFF"}
    assert {v for k, v in portable.items() if k.startswith("GGML_AVX")} == {"OFF"}
    cpuinfo = open("/proc/cpuinfo").read()
    assert (auto["GGML_AVX2"] == "ON") == (" avx2" in cpuinfo)
    assert build.build_key(auto) != build.build_key(portable)
    with pytest.raises(build.BuildError, match="'native'"):
        build.cpu_flags("native")



def test_source_patches_apply_once_and_refuse_a_source_without_their_text(tmp_path):
    server = tmp_path / "tools" / "server"
    server.mkdir(parents=True)
    (server / "server-context.cpp").write_text(
        "// before\n" + "// between\n".join(p.old for p in patches.PATCHES) + "// after\n")
    patches.apply(tmp_path)
    once = (server / "server-context.cpp").read_text()
    for patch in patches.PATCHES:
        assert patch.new in once and patch.old not in once
        # the built tree carries it
        assert patch.new in (build.source_dir() / patch.path).read_text()
    patches.apply(tmp_path)
    assert (server / "server-context.cpp").read_text() == once
    (server / "server-context.cpp").write_text("// a newer llama.cpp\n")
    with pytest.raises(patches.PatchError, match="exactly once"):
        patches.apply(tmp_path)


def _adapter(folder, config: dict, tensors: dict | None = None, raw: bytes | None = None):
    from safetensors.numpy import save_file

    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps(config))
    if raw is not None:
        (folder / "adapter_model.safetensors").write_bytes(raw)
    else:
        save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def test_conversion_refuses_what_llama_cpp_cannot_serve(tmp_path):
    lora = {"base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight":
            np.zeros((8, 576), np.float32),
            "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight":
            np.zeros((192, 8), np.float32)}
    cases = {
        "prefix": ({"peft_type": "PREFIX_TUNING"}, lora, None, "expected 'LORA'"),
        "dora": ({"peft_type": "LORA", "use_dora": True, "r": 8}, lora, None, "DoRA"),
        "corrupt": ({"peft_type": "LORA", "r": 8}, None, b"\x10\x00not safetensors",
                    "cannot read"),
        "unknown": ({"peft_type": "LORA", "r": 8},
                    {"base_model.model.model.vision.proj.lora_A.weight":
                     np.zeros((8, 4), np.float32)}, None, "no llama.cpp tensor name"),
    }
    for name, (config, tensors, raw, message) in cases.items():
        folder = _adapter(tmp_path / name, config, tensors, raw)
        target = tmp_path / f"{name}.gguf"
        with pytest.raises(LoadError, match=message):
            lora_to_gguf(folder, target, **SHAPE)
        assert not target.exists() and not list(tmp_path.glob(f"{name}.gguf*"))
    with pytest.raises(LoadError, match="not a PEFT adapter folder"):
        lora_to_gguf(tmp_path, tmp_path / "none.gguf", **SHAPE)


# An adapter on all seven layers at B scale 0.3 makes the model tie its top two tokens to 3
# decimals within 12 greedy steps (measured); at 0.15 it still rewrites what the model says.
@pytest.mark.parametrize(("targets", "scale"), [(LORA_ATTENTION, 0.3), (LORA_ALL_LINEAR, 0.15)],
                         ids=["q-v", "all-linear"])
def test_served_adapter_gives_the_logprobs_peft_computes(base_model_dir, tmp_path, targets,
                                                         scale):
    """q_proj's (and k_proj's) LoRA B must be permuted exactly as llama.cpp permutes q and k
    weights: a wrong row order still loads and generates, but with logprobs far from PEFT's.
    Every layer the learner may adapt (`learner.lora_targets`) must reach llama.cpp's tensor."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serving.llamacpp.server import LlamaServer
    from serving.llamacpp.weights import base_gguf
    from testkit.serving import make_adapters

    adapter = make_adapters(base_model_dir, tmp_path, seeds=[5], scale=scale,
                            targets=targets)[0]
    gguf = lora_to_gguf(adapter, tmp_path / "adapter.gguf", **SHAPE)
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    base = AutoModelForCausalLM.from_pretrained(base_model_dir).eval()
    model = PeftModel.from_pretrained(base, str(adapter)).eval()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Name a fruit."}],
                                           add_generation_prompt=True, return_dict=True)
    prompt = list(prompt["input_ids"])
    body = {"prompt": prompt, "n_predict": 12, "temperature": 0, "n_probs": 1,
            "return_tokens": True}
    with LlamaServer(build.find_server(), base_gguf(base_model_dir, "f32"), lora=gguf,
                     slots=1, context=512) as server:
        answer = server.complete(body)
    tokens = answer["tokens"]
    served = [p["logprob"] for p in answer["completion_probabilities"]]
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
        with model.disable_adapter():
            plain = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    # PEFT's own greedy choice at every step is what llama-server chose
    assert logits[len(prompt) - 1:-1].argmax(-1).tolist() == tokens
    logprobs = torch.log_softmax(logits[len(prompt) - 1:-1], -1)
    expected = logprobs.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
    gaps = [abs(a - b) for a, b in zip(served, expected, strict=True)]
    # llama-server keeps its KV cache in f16, so even the right permutation differs from
    # PEFT's f32 by up to ~0.03 (0.0302 in a clean-clone run of 2026-12-06); a wrong one moves
    # the tokens' logprobs by as much as the adapter itself does (> 0.3, asserted below).
    assert max(gaps) < 0.06, gaps
    # ... and the adapter matters: without it these tokens score differently
    without = torch.log_softmax(plain[len(prompt) - 1:-1], -1).gather(
        1, torch.tensor(tokens)[:, None])[:, 0].tolist()
    assert max(abs(a - b) for a, b in zip(without, expected, strict=True)) > 0.3


def test_sampled_logprobs_are_those_of_the_temperature_sampled_at(base_model_dir):
    """At temperature T the engine reports log-softmax(logits / T), the distribution it sampled
    from and the one the learner scores a transition recorded at T with; greedy reports the raw
    model's. Before, every call reported temperature 1's, whatever it was sampled at."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serving.engine.generation import GenRequest, GenResult, completion_body
    from serving.llamacpp.server import LlamaServer
    from serving.llamacpp.weights import base_gguf
    from testkit.serving import token_logprobs

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32).eval()
    prompt = list(tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write one sentence about the sea."}],
        add_generation_prompt=True, return_dict=True)["input_ids"])
    with LlamaServer(build.find_server(), base_gguf(base_model_dir, "f32"), slots=1,
                     context=512) as server:
        for temperature in (0.5, 0.0):
            served = GenResult()
            served.add(server.complete(completion_body(GenRequest(
                prompt_ids=prompt, max_tokens=24, temperature=temperature, seed=7,
                top_logprobs=2))), 2)
            assert len(served.logprobs) == len(served.token_ids) >= 8
            scored_at = temperature or 1.0
            at_t = token_logprobs(model, prompt, served.token_ids, scored_at)
            gaps = [abs(a - b) for a, b in zip(served.logprobs, at_t, strict=True)]
            assert max(gaps) < 0.03, (temperature, gaps)
            # the alternatives come from the same distribution: the best is at least as likely
            assert all(top[0][1] >= lp - 1e-6 for top, lp in
                       zip(served.top_logprobs, served.logprobs, strict=True))
            if temperature:
                at_1 = token_logprobs(model, prompt, served.token_ids, 1.0)
                assert max(abs(a - b) for a, b in zip(at_1, at_t, strict=True)) > 0.3


def test_a_hugging_face_folder_is_served_with_the_weights_the_learner_loads(base_model_dir,
                                                                           tmp_path):
    """`base_model` as a Hugging Face folder (here a copy of the default model's under another
    name, so it takes the other-model path): the engine serves llama.cpp's conversion of that
    folder, and what it generates scores as transformers scores it from the same folder."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serving.engine.generation import GenRequest, GenResult, completion_body
    from serving.llamacpp.server import LlamaServer
    from serving.llamacpp.weights import base_gguf
    from testkit.serving import token_logprobs

    folder = shutil.copytree(base_model_dir, tmp_path / "my-smollm2")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = list(tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colours."}],
        add_generation_prompt=True, return_dict=True)["input_ids"])
    gguf = base_gguf(folder, "f32")
    try:
        assert "my-smollm2" in gguf.name  # converted from the folder, not the shipped file
        with LlamaServer(build.find_server(), gguf, slots=1, context=512) as server:
            served = GenResult()
            served.add(server.complete(completion_body(GenRequest(
                prompt_ids=prompt, max_tokens=16, temperature=0.0, top_logprobs=1))), 1)
    finally:
        gguf.unlink()  # the build cache keys conversions by source path: this one is a tmp's
    assert len(served.token_ids) >= 8
    scored = token_logprobs(model, prompt, served.token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(served.logprobs, scored, strict=True)) < 0.03
    # greedy: every served token is the one transformers ranks first
    with torch.no_grad():
        logits = model(torch.tensor([prompt + served.token_ids])).logits[0]
    assert logits[len(prompt) - 1:-1].argmax(-1).tolist() == served.token_ids
