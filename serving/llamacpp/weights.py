"""The GGUF files llama-server loads: the base model at a chosen precision, and each LoRA version.

The learner trains on the folder `resolve_base_model` gives; for the default model that is the
shipped Q4_1 GGUF dequantised to float32 by the `gguf` package (inside transformers). A dense
copy of the shipped GGUF, dequantised by the same package with its metadata and tokenizer kept,
therefore holds exactly the learner's numbers: `f32`. `q4_1` serves the shipped file itself
(faster at one request; llama.cpp then also quantises activations in its dot products).
`bench.logprobs` measures what each costs in logprob gap against the learner's forward pass.
Another base model (a Hugging Face folder) is converted by llama.cpp's `convert_hf_to_gguf.py`.

A PEFT LoRA adapter becomes a GGUF LoRA adapter the same way `convert_lora_to_gguf.py` writes
one: tensors renamed by gguf's own HF-to-GGUF name map, `lora_a`/`lora_b` suffixes, the alpha in
the metadata, and the rows of q/k `lora_B` permuted as llama.cpp permutes q/k weights for its
rotary layout (the one step where a wrong guess would silently change the model).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from serving.errors import LoadError
from tracetrain.modes import ENGINE_WEIGHTS as BASE_TYPES

log = logging.getLogger("tracetrain.engine")
_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.default)?\.weight$")


def _copy_fields(reader, writer) -> None:
    import gguf

    skip = {gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE}
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in skip:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)


def dense_copy(source: Path, target: Path) -> Path:
    """`source` with every tensor dequantised to float32, metadata and tokenizer unchanged."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    _copy_fields(reader, writer)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, gguf.quants.dequantize(tensor.data, tensor.tensor_type)
                          .astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(target)
    return target


def hf_to_gguf(folder: Path, target: Path) -> Path:
    """A Hugging Face model folder as one float32 GGUF, by llama.cpp's own
    `convert_hf_to_gguf.py` (from the built source tree). Raises LoadError with the
    converter's last lines."""
    from serving.llamacpp.build import source_dir

    if not (Path(folder) / "config.json").is_file():
        raise LoadError(f"{folder} has no config.json; expected a Hugging Face model folder")
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    done = subprocess.run(
        [sys.executable, str(source_dir() / "convert_hf_to_gguf.py"), str(folder),
         "--outtype", "f32", "--outfile", str(tmp)],
        capture_output=True, text=True, check=False)
    if done.returncode or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        tail = "\n    ".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise LoadError(f"cannot convert {folder} to GGUF:\n    {tail}")
    tmp.rename(target)
    return target


def _fingerprint(paths: list[Path]) -> str:
    from serving.llamacpp.build import LLAMA_CPP_PYTHON

    parts = [LLAMA_CPP_PYTHON]
    for path in paths:
        stat = path.stat()
        parts.append(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def base_gguf(model_dir: Path, weights: str) -> Path:
    """The GGUF the engine serves for the base model in `model_dir` (resolve_base_model's
    folder). The default model: its shipped Q4_1 file ('q4_1') or that file's float32 copy
    ('f32'); another model: its folder converted ('f32'). Copies and conversions are made once
    and kept in the build cache, keyed by the files they come from."""
    from serving.llamacpp.build import cache_root
    from tracetrain.base_model import DEFAULT_MODEL, shipped_gguf

    if weights not in BASE_TYPES:
        raise ValueError(f"engine.weights={weights!r}; expected one of {BASE_TYPES}")
    model_dir = Path(model_dir)
    default = model_dir.name == DEFAULT_MODEL
    if weights == "q4_1":
        if not default:
            raise LoadError(f"engine.weights='q4_1' serves the shipped GGUF of {DEFAULT_MODEL}; "
                            f"{model_dir} is another model: use 'f32'")
        return shipped_gguf()
    sources = [shipped_gguf()] if default else sorted(
        [*model_dir.glob("*.json"), *model_dir.glob("*.safetensors")])
    cache = cache_root() / "gguf"
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{model_dir.name}-{_fingerprint(sources)}.f32.gguf"
    # Engines of several tests or stacks may start at once: convert under a file lock.
    with open(cache / ".convert.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file():
            log.info("writing the f32 GGUF of %s (once; kept in %s)", model_dir.name, cache)
            if default:
                dense_copy(sources[0], target)
            else:
                hf_to_gguf(model_dir, target)
    return target


def _permute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf's LlamaModel.permute)."""
    rows = weight.shape[0]
    return (weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def lora_to_gguf(adapter_dir: Path, target: Path, *, arch: str, n_blocks: int, n_head: int,
                 n_head_kv: int) -> Path:
    """Convert a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) to GGUF.

    Raises LoadError, naming the file, when the folder is not a LoRA adapter this model can
    take; the target is written under a temporary name and renamed only when complete.
    """
    import gguf
    from safetensors.numpy import load_file

    adapter_dir = Path(adapter_dir)
    config_path = adapter_dir / "adapter_config.json"
    weights_path = adapter_dir / "adapter_model.safetensors"
    if not config_path.is_file() or not weights_path.is_file():
        raise LoadError(f"{adapter_dir} is not a PEFT adapter folder: expected "
                        "adapter_config.json and adapter_model.safetensors")
    try:
        config = json.loads(config_path.read_text())
        tensors = load_file(str(weights_path))
    except Exception as exc:  # json and safetensors raise their own types; all mean "corrupt"
        raise LoadError(f"cannot read the adapter in {adapter_dir}: "
                        f"{type(exc).__name__}: {exc}") from exc
    if config.get("peft_type", "LORA") != "LORA":
        raise LoadError(f"{config_path}: peft_type {config.get('peft_type')!r}; expected 'LORA'")
    if config.get("use_dora") or config.get("use_rslora"):
        raise LoadError(f"{config_path}: DoRA and rsLoRA adapters cannot be served by llama.cpp")
    alpha = float(config.get("lora_alpha") or config.get("r") or 0)
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), n_blocks)
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    writer.add_string(gguf.Keys.General.TYPE, gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    count = 0
    for key, value in tensors.items():
        match = _LORA_KEY.match(key)
        if match is None:
            if "lora_" in key:
                raise LoadError(f"{weights_path}: tensor {key!r} is not a LoRA A/B weight")
            continue  # modules_to_save and the like are not LoRA; llama.cpp cannot take them
        module, half = match.groups()
        gguf_name = names.get_name(module + ".weight", try_suffixes=(".weight",))
        if gguf_name is None:
            raise LoadError(f"{weights_path}: {module!r} has no llama.cpp tensor name")
        value = value.astype(np.float32)
        if half == "B" and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = n_head if gguf_name.endswith("attn_q.weight") else n_head_kv
            value = _permute_rows(value, heads)
        writer.add_tensor(f"{gguf_name}.lora_{half.lower()}", value)
        count += 1
    if count == 0 or count % 2:
        raise LoadError(f"{weights_path} holds {count} LoRA tensors; expected A/B pairs")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(target)
    return target
