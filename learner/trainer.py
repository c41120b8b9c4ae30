"""The policy under training: base model + LoRA, one long-lived optimizer, one step per batch.

    policy = PolicyTrainer(settings, work_dir)       # learner/loop.py builds one per process
    metrics = policy.train_step(transitions, advantages, weights)
    policy.save(dir, extra_state) / extra_state = policy.load(dir)

Reads the base model from `resolve_base_model(settings.base_model, settings.home)` (or a local
dir). Modes: `rl` runs TRL's GRPO loss (learner/policy_loss.py); `sft` and `kto` run TRL's
SFTTrainer / KTOTrainer losses (learner/offline_modes.py). The optimizer and scheduler are
built once by the TRL trainer (`create_optimizer_and_scheduler`) and stepped per micro-batch,
so their state persists; `save`/`load` carry adapter, optimizer, scheduler and RNG state so a
resumed learner continues exactly. Under torchrun (`ranks`, learner/distributed.py) the model
is wrapped in DistributedDataParallel and each rank takes its rows of every batch, its loss
weighted so that the all-reduced gradient is the single-process one; the leader's `train_step`
and `load` tell the followers to do the same. A `full_finetune` under torchrun is sharded with
FSDP2 instead (`learner.dist_strategy`): the same rows and weights, the gradient reduce-scattered
rather than all-reduced, and checkpoints gathered whole on rank 0 (`full_state`). A step whose loss or gradient is not finite is
not taken (`NonFiniteStep`); `probe_loss` scores fixed texts, so that a broken policy is never
registered. Checkpoint state is read with `torch.load(weights_only=True)` (tensors and plain
values, nothing unpickled that could run code) and the adapter from safetensors.
"""

from __future__ import annotations

import json
import pickle
import random
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from learner.advantages import rollout_weights
from learner.distributed import Ranks, shard_model
from learner.errors import LearnerError, NonFiniteStep
from learner.policy_loss import (
    build_grpo_trainer,
    inputs_from,
    response_logps,
    rl_loss,
    trained_mask,
)
from tracetrain.base_model import resolve_base_model
from tracetrain.modes import LEARNER_MODES, one_of
from tracetrain.settings import Settings

# The probe set: fixed texts every registered version is scored on (`probe_loss`).
PROBE_TEXTS = ("The capital of France is Paris.", "2 + 2 = 4",
               "def add(a, b):\n    return a + b", "Thank you, and have a nice day!")
# Checkpoints written before their RNG state was stored as plain values hold numpy's as an
# array: these are the only non-tensor types read, all of them data, none callable on load.
_NUMPY_STATE = (np._core.multiarray._reconstruct, np.ndarray, np.dtype,
                type(np.dtype(np.uint32)))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class PolicyTrainer:
    def __init__(self, settings: Settings, work_dir: Path, ranks: Ranks | None = None):
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.ranks = ranks
        if ranks is not None and ranks.leader:
            ranks.tell(("build",))  # building wraps the model in DDP: a collective
        self.settings = settings
        self.learner = settings.learner
        if self.learner.threads:
            torch.set_num_threads(self.learner.threads)
        self.model_dir = resolve_base_model(settings.base_model, settings.home_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id or 0
        seed_everything(self.learner.seed)
        base = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        self.vocab_size = base.config.vocab_size
        peft_config = None if self.learner.full_finetune else LoraConfig(
            r=self.learner.lora_r, lora_alpha=self.learner.lora_alpha, lora_dropout=0.0,
            target_modules=list(self.learner.lora_targets), task_type="CAUSAL_LM")
        # The seed is set again right before the adapter is created so its init is reproducible.
        seed_everything(self.learner.seed)
        mode = self.learner.mode
        if mode == "rl":
            self.trl = build_grpo_trainer(base, self.tokenizer, self.learner, work_dir, peft_config)
        elif mode in ("sft", "kto"):
            from learner import offline_modes

            self.trl = offline_modes.build(mode, base, self.tokenizer, self.learner, work_dir,
                                           peft_config)
        else:
            raise LearnerError(f"learner mode {mode!r}: expected {one_of(LEARNER_MODES)}")
        self.model = self.trl.model
        # Sharded before the optimizer is built: it must hold (and size its state by) the shards.
        self.sharded = ranks is not None and self.learner.sharded
        if self.sharded:
            shard_model(self.model, ranks)
        self.device = next(self.model.parameters()).device
        self.trl.create_optimizer_and_scheduler(num_training_steps=10**9)
        self.optimizer, self.scheduler = self.trl.optimizer, self.trl.lr_scheduler
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.ddp = None
        if ranks is not None and not self.sharded:
            from torch.nn.parallel import DistributedDataParallel

            # No buffers to keep in step (rotary tables are computed, the same everywhere).
            self.ddp = DistributedDataParallel(
                self.model, device_ids=[ranks.local_rank] if self.device.type == "cuda" else None,
                broadcast_buffers=False)
        self.step = 0
        seed_everything(self.learner.seed)

    @property
    def is_peft(self) -> bool:
        return hasattr(self.model, "peft_config")

    def inputs(self, transitions: list[dict], advantages: list[float], weights: list[float]):
        return inputs_from(transitions, advantages, weights, self.pad_id, self.learner.max_length,
                           self.device)

    def response_logprob_sums(self, transitions: list[dict]) -> list[float]:
        """Sum of log-probs of each stored response under the current policy (for tests)."""
        self.model.eval()
        inputs = self.inputs(transitions, [0.0] * len(transitions), [1.0] * len(transitions))
        logps = response_logps(self._scorer(), self.model, inputs)
        return (logps * trained_mask(inputs)).sum(1).tolist()

    def _scorer(self):
        if self.learner.mode == "rl":
            return self.trl
        from learner import offline_modes

        return offline_modes.scorer(self)

    def train_step(self, transitions: list[dict], advantages: list[float],
                   weights: list[float], imitate: bool = False) -> dict[str, float]:
        """One optimizer step on `transitions`. `imitate` (the warm start's demonstrations):
        in `rl`, on one rank, the imitation loss with the batch's shared prefix run once
        (offline_modes.shared_imitation) where it takes the batch, rather than the GRPO loss,
        which runs every row whole: with advantage 1 on policy both raise the demonstrations'
        log-probs (GRPO's mean per sequence, imitation's per token), at about half the cost."""
        if self.ranks is not None and self.ranks.leader:
            self.ranks.tell(("step", transitions, advantages, weights))
        started = time.perf_counter()
        self.model.train()
        if self.learner.mode == "rl" and self.learner.loss_normalisation == "rollout":
            weights = [w * r for w, r in zip(weights, rollout_weights(transitions), strict=True)]
        inputs = self.inputs(transitions, advantages, weights)
        imitated = None
        if imitate and self.ranks is None and self.learner.mode == "rl":
            from learner import offline_modes

            imitated = offline_modes.shared_imitation(self, transitions)
        if imitated is not None:
            loss, metrics = imitated
        elif self.ranks is not None:
            loss, metrics = self._ranked_loss(inputs)  # its backward is taken
        elif self.learner.mode == "rl":
            loss, metrics = self._accumulated_loss(inputs, 1.0, self.model)  # backward taken
        else:
            from learner import offline_modes

            loss, metrics = offline_modes.loss(self, transitions, advantages, inputs)
        if loss is None:  # nothing in this batch is trainable in this mode (e.g. sft threshold)
            return {"loss": 0.0, "skipped": 1.0}
        if not torch.isfinite(loss.detach()):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteStep("non_finite_loss", f"the step's loss is {float(loss.detach()):g}")
        if self.ranks is None and (self.learner.mode != "rl" or imitated is not None):
            loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.learner.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):  # sharded: a DTensor, the norm over all shards
            grad_norm = grad_norm.full_tensor()
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteStep("non_finite_grad", f"the step's gradient norm is "
                                f"{float(grad_norm):g}")
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        elapsed = max(time.perf_counter() - started, 1e-9)
        tokens = int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
        rewards = [t["credited_return"] for t in transitions]
        return {
            "loss": float(loss.detach()),
            "mean_reward": sum(rewards) / len(rewards),
            "mean_advantage": sum(advantages) / len(advantages),
            "grad_norm": float(grad_norm),
            "tokens": float(tokens),
            "transitions": float(len(transitions)),
            "tokens_per_s": tokens / elapsed,
            "transitions_per_s": len(transitions) / elapsed,
            # calls the streams stage tokenised from OpenTelemetry spans (no behaviour logprobs)
            "retokenized": float(sum(bool(t.get("retokenized")) for t in transitions)),
            "step_s": elapsed,
            **metrics,
        }

    def _ranked_loss(self, inputs: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """This rank's rows of the batch through DDP, backward taken; the batch's loss (the
        same on every rank). Every rank takes the same number of rows (TRL gathers per-row
        metrics across ranks): a rank short of rows pads with copies of row 0 whose response
        mask is zero, so they weigh nothing in the loss or TRL's metrics. Each rank's loss is
        weighted by its `_share` of the single-process loss, times the ranks (DDP averages
        gradients), so the all-reduced gradient is the one of the whole batch. The backward is
        taken even when a loss is not finite: every rank must join DDP's all-reduce, and every
        rank sees the non-finite total and skips the step."""
        rows = inputs["advantages"].size(0)
        start, stop = self.ranks.shard(rows)
        width = -(-rows // self.ranks.world)
        index = torch.tensor([*range(start, stop), *[0] * (width - (stop - start))],
                             device=self.device)
        part = {k: v[index] if v.dim() and v.size(0) == rows else v for k, v in inputs.items()}
        part["completion_mask"][stop - start:] = 0
        scale = self._share(inputs, start, stop, width,
                            self.trl.accelerator.num_processes) * self.ranks.world
        # FSDP2 averages the reduce-scattered gradients over the ranks as DDP does.
        loss, metrics = self._accumulated_loss(part, scale, self.ddp or self.model)
        return self.ranks.total(loss) / self.ranks.world, metrics

    def _accumulated_loss(self, inputs: dict, scale: float, forward
                          ) -> tuple[torch.Tensor, dict[str, float]]:
        """`rl_loss` of `inputs` times `scale`, its backward taken, in parts of at most
        `learner.max_step_tokens` padded tokens (at least one row each): each part's loss is
        weighted by its `_share`, so the accumulated gradient is the one of a single pass,
        at a part's memory. Under DDP only the last part's backward all-reduces, and every
        rank splits its equal-sized rows alike, so the ranks meet in the same collectives.
        Returns the (detached) scaled loss and the parts' metrics averaged by response tokens."""
        rows = inputs["advantages"].size(0)
        length = inputs["prompt_ids"].size(1) + inputs["completion_ids"].size(1)
        per = max(1, self.learner.max_step_tokens // length)
        bounds = [(a, min(a + per, rows)) for a in range(0, rows, per)]
        tokens = trained_mask(inputs).sum().clamp(min=1)
        total, merged = torch.zeros((), device=self.device), {}
        for i, (a, b) in enumerate(bounds):
            part = inputs if len(bounds) == 1 else {
                k: v[a:b] if v.dim() and v.size(0) == rows else v for k, v in inputs.items()}
            last = i == len(bounds) - 1
            sync = forward.no_sync() if hasattr(forward, "no_sync") and not last else nullcontext()
            with sync:
                loss, metrics = rl_loss(self.trl, self.model, part, self.learner.tis_cap,
                                        forward=forward, rescore=self.sharded)
                scaled = loss * (self._share(inputs, a, b) * scale)
                scaled.backward()
            total += scaled.detach()
            weight = float(trained_mask(part).sum() / tokens)
            for key, value in metrics.items():
                merged[key] = (max(merged.get(key, value), value) if key == "is_ratio_max"
                               else merged.get(key, 0.0) + value * weight)
        return total, merged

    def _share(self, inputs: dict, start: int, stop: int, width: int | None = None,
               processes: int = 1) -> float:
        """The weight, in the loss of all of `inputs` as TRL normalises it, of the loss over
        rows [start, stop): a part of one process, or a rank's rows padded to `width` under
        `processes` ranks."""
        loss_type = self.learner.loss_type
        if loss_type in ("dapo", "cispo"):
            # a sum over tokens / the batch's tokens (`num_items_in_batch`, kept whole) that TRL
            # multiplies by its process count, expecting DDP's average
            return 1.0 / processes
        if loss_type == "bnpo":  # a mean over the trained response tokens
            mask = trained_mask(inputs)
            return float(mask[start:stop].sum() / mask.sum().clamp(min=1))
        # grpo, sapo, dr_grpo: a mean over rows (a rank's padding rows count, weighing nothing)
        return (width or stop - start) / inputs["advantages"].size(0)

    def probe_loss(self) -> float:
        """Mean next-token loss of the policy on PROBE_TEXTS (no gradient): NaN or infinite
        when the weights are broken."""
        if self.sharded and self.ranks.leader:
            self.ranks.tell(("probe",))  # a sharded forward gathers each layer from every rank
        batch = self.tokenizer(list(PROBE_TEXTS), return_tensors="pt", padding=True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        self.model.eval()
        with torch.no_grad():
            out = self.model(input_ids=batch["input_ids"].to(self.device),
                             attention_mask=batch["attention_mask"].to(self.device),
                             labels=labels.to(self.device))
        return float(out.loss)

    # -- checkpoint state --------------------------------------------------------------------

    def save(self, directory: Path, extra_state: dict) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        weights, optimizer = self.full_state()
        if self.is_peft:
            self.model.save_pretrained(directory / "adapter")
        else:
            self.model.save_pretrained(directory / "model", state_dict=weights)
        torch.save({
            "step": self.step,
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            # numpy's state as plain values: weights_only loading reads no arrays
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                    "numpy": _plain_numpy_state()},
            "extra": extra_state,
        }, directory / "trainer_state.pt")

    def load(self, directory: Path) -> dict:
        from safetensors.torch import load_file

        directory = Path(directory)
        if self.is_peft:
            from peft import set_peft_model_state_dict

            self._check_targets(directory / "adapter" / "adapter_config.json")
            weights = load_file(directory / "adapter" / "adapter_model.safetensors")
            set_peft_model_state_dict(self.model, weights)
        else:
            weights = load_file(directory / "model" / "model.safetensors")
            if not self.sharded:
                self.model.load_state_dict(weights, strict=False)
        path = directory / "trainer_state.pt"
        try:
            with torch.serialization.safe_globals(list(_NUMPY_STATE)):
                state = torch.load(path, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise LearnerError(f"checkpoint state {path} holds objects that only unpickling "
                               "could build; refused (expected tensors and plain values, as "
                               f"the learner writes them): {str(exc)[:300]}") from exc
        if self.sharded:  # every rank takes its shards of the whole state (`adopt`)
            shared = {"weights": weights, "optimizer": state["optimizer"],
                      "scheduler": state["scheduler"], "step": state["step"]}
            self.ranks.tell(("state", shared))
            self.adopt(shared)
        else:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        name, keys, *rest = state["rng"]["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
        self.step = state["step"]
        if self.ranks is not None and self.ranks.leader and not self.sharded:
            self.ranks.tell(("state", self.shared_state()))
        return state["extra"]

    def _check_targets(self, config_path: Path) -> None:
        """PEFT loads an adapter of other layers without a word (the missing ones stay fresh)
        and the optimizer then fails on its sizes: say which setting differs instead."""
        saved = json.loads(config_path.read_text()).get("target_modules")
        if saved is not None and sorted(saved) != sorted(self.learner.lora_targets):
            raise LearnerError(
                f"checkpoint {config_path.parent.parent} adapts {sorted(saved)}, but "
                f"learner.lora_targets is {sorted(self.learner.lora_targets)}: expected the "
                "layers it was trained with (set learner.lora_targets to them)")

    def shared_state(self) -> dict:
        """What a follower needs to be this policy: trained weights, optimizer, scheduler, step
        (on the CPU: a follower's device is not the leader's)."""
        return _on_cpu({"weights": self.trainable_state(), "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict(), "step": self.step})

    def adopt(self, state: dict) -> None:
        """Become the policy `shared_state` describes (a follower, after the leader loaded;
        sharded, every rank, from the whole model's state)."""
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            # strict=False: a tied LM head is not in the saved file, as one process saves it
            options = StateDictOptions(full_state_dict=True, strict=False)
            set_model_state_dict(self.model, state["weights"], options=options)
            set_optimizer_state_dict(self.model, self.optimizer,
                                     self._by_name(state["optimizer"]), options=options)
            self.scheduler.load_state_dict(state["scheduler"])
            self.step = state["step"]
            return
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in state["weights"].items():
                params[name].copy_(value)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The trained weights (the adapter under PEFT), for comparing two runs (sharded: the
        whole weights on rank 0, empty elsewhere; a collective)."""
        if self.sharded:
            weights = self.full_state()[0]
            return {n: weights[n] for n, p in self.model.named_parameters()
                    if p.requires_grad and n in weights}
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    def full_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The whole model's weights and optimizer state, keyed as one process keys them.
        Sharded, this gathers every rank's shards: a collective the leader tells the followers
        to join; rank 0 gets the state on the CPU, the others empty dicts."""
        if not self.sharded:
            return self.model.state_dict(), self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        if self.ranks.leader:
            self.ranks.tell(("gather",))
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(self.model, options=options)
        optimizer = get_optimizer_state_dict(self.model, self.optimizer, options=options)
        if getattr(self.model.config, "tie_word_embeddings", False):
            # gathered copies no longer share storage with the embedding, so save_pretrained
            # would write the tied head as a weight of its own, unlike one process's save
            head = self.model.get_output_embeddings()
            for name, module in self.model.named_modules():
                if module is head:
                    weights.pop(f"{name}.weight", None)
        return weights, _by_index(optimizer) if optimizer else {}

    def _by_name(self, optimizer: dict) -> dict:
        """`optimizer.state_dict()`'s numbering (parameters counted through the param groups
        in order) as torch.distributed.checkpoint's parameter names (`_by_index` undone)."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        order = [names[id(p)] for group in self.optimizer.param_groups for p in group["params"]]
        return {"state": {order[i]: v for i, v in optimizer["state"].items()},
                "param_groups": [{**g, "params": [order[i] for i in g["params"]]}
                                 for g in optimizer["param_groups"]]}


def _by_index(optimizer: dict) -> dict:
    """A full optimizer state keyed by parameter names (torch.distributed.checkpoint's) keyed
    as `optimizer.state_dict()` keys it in one process: so a sharded job's checkpoint is the
    one a single process writes, and either resumes the other's."""
    order = [name for group in optimizer["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(order)}
    return {"state": {index[n]: v for n, v in optimizer["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                             for g in optimizer["param_groups"]]}


def _on_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_on_cpu(v) for v in value)
    return value


def _plain_numpy_state() -> tuple:
    name, keys, *rest = np.random.get_state()  # rest: position, has_gauss, cached_gaussian
    return (name, keys.tolist(), *rest)
