"""Settings of the continuous learner: batching, advantages, TRL mode, checkpoints."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from tracetrain.modes import (
    AdvantageMode,
    DistBackend,
    DistStrategy,
    LearnerMode,
    LossNormalisation,
    LossType,
    StalenessPolicy,
    WarmStartSchedule,
)

# PEFT names of SmolLM2's (Llama's) linear layers.
LORA_ATTENTION = ("q_proj", "v_proj")
LORA_ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LearnerSettings(BaseModel):
    group_id: str = Field("tracetrain-learner", description="Consumer group on transitions.")
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(
        8200, ge=0, le=65535, description="`tracetrain learner` serves /metrics, /healthz and "
        "/state here; 0 picks a free port."
    )
    mode: LearnerMode = "rl"
    advantage: AdvantageMode = "group"
    batch_size: int = Field(8, ge=1, description="Transitions per micro-batch.")
    batch_timeout_s: float = Field(30.0, gt=0, description="A partial micro-batch closes after this.")
    group_wait_s: float = Field(
        60.0, ge=0, description="`group` advantages: how long a task's group waits for more rollouts."
    )
    group_size: int = Field(4, ge=2, description="`group` advantages: rollouts that complete a group.")
    baseline_decay: float = Field(0.9, gt=0, lt=1, description="`baseline`: running-mean decay.")
    lr: float = Field(1e-4, gt=0)
    lora_r: int = Field(8, ge=1)
    lora_alpha: int = Field(16, ge=1)
    lora_targets: list[str] = Field(
        default_factory=lambda: list(LORA_ATTENTION), min_length=1,
        description="Linear layers the LoRA adapts (PEFT's target_modules), e.g. "
        "LORA_ALL_LINEAR. The default is attention's q and v; the calc demo adapts all seven "
        "(README, the demo: with a longer warm start its runs ended 0.08 higher), for about "
        "11% more time a step. llama.cpp serves any of them.")
    full_finetune: bool = False
    loss_type: LossType = Field(
        "grpo", description="TRL GRPO loss variant used by the `rl` mode."
    )
    loss_normalisation: LossNormalisation = Field(
        "rollout", description="`rl`: `rollout` weighs every rollout of a micro-batch the same "
        "(LightningRL: a rollout of five calls does not count five times one of one call); "
        "`call` weighs every call the same, then `loss_type` normalises per call or per token."
    )
    epsilon: float = Field(0.2, gt=0, description="PPO-style clip range of the importance ratio.")
    tis_cap: float | None = Field(
        None, gt=1, description="`rl`: truncated importance sampling of the engine/learner "
        "mismatch, rho = learner/behaviour per token truncated here (verl's rollout correction; "
        "e.g. 2.0). Unset: off, as an f32 engine's logprobs match the learner's (ratio std "
        "0.0025) and the correction costs one more forward per step; set it for quantised "
        "weights (q4_1: mean |dlogp| 0.053, max 0.42)."
    )
    beta: float = Field(0.0, ge=0, description="KL weight to the reference (adapter disabled).")
    max_grad_norm: float = Field(1.0, gt=0)
    max_length: int = Field(1024, ge=8, description="Prompt+response tokens kept (prompt cut left).")
    max_step_tokens: int = Field(
        4096, ge=1, description="`rl`: padded prompt+response tokens through one forward and "
        "backward. A micro-batch past it is split into parts whose gradients add up to the "
        "same step: the step's memory grows with these tokens (SmolLM2-135M on CPU: about 2 GB "
        "per 1024), so eight 1024-token transitions would need some 18 GB in one pass."
    )
    sft_min_reward: float = Field(0.5, description="`sft`: transitions at or above this return.")
    # On by default: it changes the cost of a step, not its loss or gradient (equal to TRL's
    # within float rounding), and calc's warm start and rehearsal rows all share their prompt.
    share_prefix: bool = Field(
        True, description="`sft`: the tokens every row of a micro-batch begins with (a calc "
        "batch's system prompt and worked exchange, ~140 of ~200 tokens) go through the model "
        "once rather than once per row (learner/shared_prefix.py); the same loss and gradient "
        "as TRL's. Off: TRL's collator and loss on the whole rows, as for a batch that shares "
        "under 16 tokens.")
    max_staleness: int = Field(4, ge=0, description="Versions behind the current one tolerated.")
    staleness_policy: StalenessPolicy = "drop"
    staleness_weight: float = Field(
        0.5, gt=0, le=1, description="`downweight`: factor per version beyond max_staleness."
    )
    checkpoint_every_steps: int = Field(4, ge=1)
    checkpoint_every_s: float | None = Field(None, gt=0, description="Also checkpoint after T s.")
    threads: int | None = Field(
        None, ge=1, description="torch threads of the learner; unset keeps torch's (all cores)."
    )
    # Under torchrun (learner/distributed.py; a single process uses none of these).
    dist_backend: DistBackend = Field(
        "auto", description="torch.distributed backend of the training collectives: `auto` "
        "is nccl where CUDA is, gloo on CPUs."
    )
    dist_strategy: DistStrategy = Field(
        "auto", description="How the ranks hold the model: `ddp` a whole copy on each (LoRA: "
        "the base is frozen, the adapter small); `fsdp` a 1/N shard of the weights, gradients "
        "and optimizer state on each (FSDP2), for a `full_finetune` whose Adam state (3x the "
        "weights) does not fit one device. `auto`: fsdp for full_finetune, else ddp."
    )
    collective_timeout_s: float = Field(
        300.0, gt=0, description="A gradient all-reduce (or DDP's set-up) that waits this long "
        "for a rank fails, ending the job: a rank that hangs or whose host vanished. Generous: "
        "a rank that died is usually seen at once (its connections close) and torchrun stops "
        "the others."
    )
    follower_wait_s: float = Field(
        3600.0, gt=0, description="How long ranks 1..N-1 wait for rank 0's next command. Rank "
        "0 sends one at least every `batch_timeout_s` while it runs, but a Kafka or MLflow "
        "outage it waits out (a checkpoint's registration) sends none."
    )
    warm_start: Path | None = Field(
        None, description="A JSONL file of demonstrations (TRL's conversational prompt-"
        "completion form) trained on before any traffic, once, when the learner starts with no "
        "registered checkpoint; its result is registered as the first version "
        "(learner/warm_start.py)."
    )
    warm_start_epochs: int = Field(1, ge=1, description="Passes over the warm start's file.")
    warm_start_lr: float | None = Field(
        None, gt=0, description="Learning rate of the warm start's steps (unset: `lr`)."
    )
    warm_start_schedule: WarmStartSchedule = Field(
        "constant", description="The warm start's learning rate over its steps: constant "
        "(`warm_start_lr` throughout) or cosine (a linear rise over its first 5% of steps to "
        "`warm_start_lr`, then a cosine fall to a tenth of it by its last step)."
    )
    warm_start_threads: int | None = Field(
        None, ge=1, description="torch threads during the warm start (unset: `threads`); the "
        "demo gives it every core, as no traffic runs until its version is served."
    )
    rehearsal: Path | None = Field(
        None, description="A JSONL file of demonstrations (the warm start's form) of which "
        "`rehearsal_per_step` are trained in every traffic step beside its transitions, so "
        "traffic cannot pull the policy away from what they teach (learner/rehearsal.py).")
    rehearsal_per_step: int = Field(4, ge=1, description="Demonstrations per traffic step.")
    dedupe_window: int = Field(200_000, ge=1, description="Transition ids remembered for dedupe.")
    seed: int = 0

    @model_validator(mode="after")
    def _fsdp_trains_whole_models(self):
        if self.dist_strategy == "fsdp" and not self.full_finetune:
            raise ValueError("learner.dist_strategy 'fsdp' with learner.full_finetune false: "
                             "expected full_finetune true (a LoRA adapter is small: its ranks "
                             "run ddp, or `auto`)")
        return self

    @property
    def sharded(self) -> bool:
        """Whether ranks under torchrun shard the model (FSDP) rather than copy it (DDP)."""
        return self.dist_strategy == "fsdp" or (self.dist_strategy == "auto" and self.full_finetune)
