"""The served policy: the base model's tokenizer and shape, and how each version's llama-server
is made (the base GGUF, plus a LoRA version's adapter converted to GGUF, or a full checkpoint
converted whole).

Making a version blocks (conversion, server start) and runs off the event loop; whatever it
raises is a LoadError that names the file, and the serving version is untouched by it.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

from serving.engine.upstream import Upstream
from serving.errors import LoadError
from serving.llamacpp.build import find_server
from serving.llamacpp.server import LlamaServer
from serving.llamacpp.weights import base_gguf, hf_to_gguf, lora_to_gguf
from tracetrain.settings.serving import EngineSettings


class Policy:
    def __init__(self, model_dir: Path, settings: EngineSettings, work_dir: Path):
        from transformers import AutoTokenizer

        self.model_dir = Path(model_dir)
        self.settings = settings
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        config = json.loads((self.model_dir / "config.json").read_text())
        self.arch = config.get("model_type", "llama")
        self.n_blocks = int(config["num_hidden_layers"])
        self.n_head = int(config["num_attention_heads"])
        self.n_head_kv = int(config.get("num_key_value_heads") or self.n_head)
        self.context_length = int(config.get("max_position_embeddings", 2048))
        # Prompt token ids must be below both: rows of the embedding and tokens it can decode.
        self.vocab_size = min(int(config.get("vocab_size") or len(self.tokenizer)),
                              len(self.tokenizer))
        self.binary = find_server()
        self.base = base_gguf(self.model_dir, settings.weights)
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._made = itertools.count(1)

    def next_version(self, name: str, explicit: int | None, current: int) -> int:
        if explicit is not None:
            return int(explicit)
        digits = re.search(r"(\d+)$", name or "")
        return int(digits.group(1)) if digits else current + 1

    def _server(self, model: Path, lora: Path | None, label: str) -> LlamaServer:
        s = self.settings
        context = min(s.max_context, self.context_length)
        return LlamaServer(self.binary, model, lora=lora, slots=s.slots, context=context,
                           threads=s.threads, log=self.work_dir / f"llama-server-{label}.log",
                           start_timeout_s=s.start_timeout_s)

    def base_upstream(self) -> Upstream:
        return Upstream(self._server(self.base, None, "base").start(), 0, "base", None)

    def lora_upstream(self, name: str, path: str, version: int) -> Upstream:
        gguf = self.work_dir / f"lora-{next(self._made)}-v{version}.gguf"
        lora_to_gguf(Path(path), gguf, arch=self.arch, n_blocks=self.n_blocks,
                     n_head=self.n_head, n_head_kv=self.n_head_kv)
        return self._start(self._server(self.base, gguf, f"v{version}"), version, name, path,
                           gguf)

    def full_upstream(self, name: str, path: str, version: int) -> Upstream:
        config = Path(path) / "config.json"
        if config.is_file():
            vocab = json.loads(config.read_text()).get("vocab_size")
            if vocab is not None and vocab != len(self.tokenizer):
                raise LoadError(f"{path} has vocab {vocab}, the tokenizer {len(self.tokenizer)}")
        gguf = hf_to_gguf(Path(path), self.work_dir / f"full-{next(self._made)}-v{version}.gguf")
        return self._start(self._server(gguf, None, f"v{version}"), version, name, path, gguf)

    def _start(self, server: LlamaServer, version: int, name: str, path: str,
               gguf: Path) -> Upstream:
        try:
            server.start()
        except Exception:
            gguf.unlink(missing_ok=True)
            raise
        return Upstream(server, version, name, path, files=[gguf])
