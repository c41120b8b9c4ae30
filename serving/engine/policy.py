"""The served policy: the base model, the LoRA adapter (or full checkpoint) on top, its version.

Loading happens in two halves so that nothing half-loaded is ever served: `prepare_*` reads and
checks the files on the caller's thread (a corrupt file fails here, with the model untouched),
and the returned `Swap` is applied by the batcher between two batches, where it takes
milliseconds. A swap that still fails (shapes that do not fit) is rolled back.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from serving.errors import LoadError

log = logging.getLogger("tracetrain.engine")
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


@dataclass
class Swap:
    """A checked checkpoint, ready to become the serving one."""

    kind: str  # "lora" or "full"
    name: str
    path: str
    policy_version: int
    lora_config: object | None = None
    lora_state: dict | None = None
    full_model: torch.nn.Module | None = None


class Policy:
    """What the batcher decodes with. Only the batcher thread calls `apply` and `model`."""

    def __init__(self, model_dir: Path, threads: int | None = None):
        if threads:
            torch.set_num_threads(threads)
        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir).eval()
        self.policy_version = 0
        self.adapter_name: str | None = None
        self.adapter_path: str | None = None
        self._adapters_made = 0
        config = self.model.config
        self.context_length = int(getattr(config, "max_position_embeddings", 2048))
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id
        self.eos_ids = {self.tokenizer.eos_token_id}
        extra = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if extra is not None:
            self.eos_ids.update(extra if isinstance(extra, list) else [extra])

    # ---- checking (caller's thread) ---------------------------------------------------------
    def next_version(self, name: str, explicit: int | None) -> int:
        if explicit is not None:
            return int(explicit)
        digits = re.search(r"(\d+)$", name or "")
        return int(digits.group(1)) if digits else self.policy_version + 1

    def prepare_lora(self, name: str, path: str, version: int | None = None) -> Swap:
        from peft import LoraConfig
        from safetensors.torch import load_file

        folder = Path(path)
        if not (folder / "adapter_config.json").is_file():
            raise LoadError(f"{folder} has no adapter_config.json; expected a PEFT adapter folder")
        try:
            config = LoraConfig.from_pretrained(str(folder))
        except (ValueError, TypeError, json.JSONDecodeError) as exc:
            raise LoadError(f"{folder}/adapter_config.json is not a LoRA config: {exc}") from exc
        weights = next((folder / n for n in ADAPTER_WEIGHTS if (folder / n).is_file()), None)
        if weights is None:
            raise LoadError(f"{folder} has none of {ADAPTER_WEIGHTS}")
        try:
            if weights.suffix == ".safetensors":
                state = load_file(str(weights))
            else:
                state = torch.load(str(weights), map_location="cpu", weights_only=True)
        except Exception as exc:  # safetensors raises its own error types; all mean "corrupt"
            raise LoadError(f"cannot read {weights} ({type(exc).__name__}: {exc})") from exc
        if not state or not any("lora_" in key for key in state):
            raise LoadError(f"{weights} holds no LoRA tensors (keys: {list(state)[:3]})")
        return Swap("lora", name, str(folder), self.next_version(name, version),
                    lora_config=config, lora_state=state)

    def prepare_full(self, name: str, path: str, version: int | None = None) -> Swap:
        try:
            model = AutoModelForCausalLM.from_pretrained(path).eval()
        except (OSError, ValueError, RuntimeError) as exc:
            raise LoadError(f"cannot load a full checkpoint from {path}: {exc}") from exc
        if model.config.vocab_size != self.model.config.vocab_size:
            raise LoadError(f"{path} has vocab {model.config.vocab_size}, the tokenizer "
                            f"{self.model.config.vocab_size}")
        return Swap("full", name, str(path), self.next_version(name, version), full_model=model)

    # ---- swapping (batcher thread, between batches) -----------------------------------------
    def apply(self, swap: Swap) -> None:
        if swap.kind == "full":
            self.model = swap.full_model
            self.adapter_name = None
        else:
            self._apply_lora(swap)
        self.adapter_path = swap.path
        self.policy_version = swap.policy_version
        log.info("serving %s %s from %s as policy_version %d",
                 swap.kind, swap.name, swap.path, swap.policy_version)

    def _apply_lora(self, swap: Swap) -> None:
        from peft import PeftModel, get_peft_model, set_peft_model_state_dict

        self._adapters_made += 1
        new_name = f"a{self._adapters_made}"
        old_name = self.adapter_name
        if isinstance(self.model, PeftModel):
            self.model.add_adapter(new_name, swap.lora_config)
        else:
            self.model = get_peft_model(self.model, swap.lora_config, adapter_name=new_name)
        try:
            result = set_peft_model_state_dict(self.model, swap.lora_state, adapter_name=new_name)
            if result.unexpected_keys:
                raise LoadError(f"{swap.path} has tensors the model lacks: "
                                f"{result.unexpected_keys[:3]}")
        except (RuntimeError, LoadError) as exc:
            # Roll back: the old adapter (or the bare base) keeps serving.
            self.model.delete_adapter(new_name)
            if old_name:
                self.model.set_adapter(old_name)
            raise LoadError(f"adapter {swap.path} does not fit the base model: {exc}") from exc
        self.model.set_adapter(new_name)
        if old_name:
            self.model.delete_adapter(old_name)
        self.model.eval()
        self.adapter_name = new_name
