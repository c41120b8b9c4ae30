"""The allowed values of every mode, defined once: a `Literal` alias for settings and signatures,
and a tuple of its values for checks and help texts.

    mode: LearnerMode = "rl"                       # tracetrain/settings/learner.py
    if mode not in LEARNER_MODES: ...               # "rl", "sft", "kto"
    help=f"one of {', '.join(LEARNER_MODES)}"
"""

from __future__ import annotations

from typing import Literal, get_args

# learner: what a step trains (policy gradient, fine-tuning on good transitions, KTO on labelled ones)
LearnerMode = Literal["rl", "sft", "kto"]
# learner: the baseline an advantage is taken against (task group, micro-batch, running per agent)
AdvantageMode = Literal["group", "batch", "baseline"]
# learner: TRL's GRPO loss variant of the `rl` mode
LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"]
# learner: how the `rl` loss weighs the calls of a micro-batch
LossNormalisation = Literal["rollout", "call"]
# learner: the torch.distributed backend under torchrun (`auto`: nccl with CUDA, else gloo)
DistBackend = Literal["auto", "gloo", "nccl"]
# learner under torchrun: replicate the model (DDP) or shard it (FSDP); auto: fsdp for full_finetune
DistStrategy = Literal["auto", "ddp", "fsdp"]
# learner: a transition more than max_staleness versions behind
StalenessPolicy = Literal["drop", "downweight"]
# learner: the warm start's learning rate over its steps (constant, or a rise then a cosine fall)
WarmStartSchedule = Literal["constant", "cosine"]
# streams: how a rollout's rewards become each call's return
CreditMode = Literal["identical", "air", "discounted"]
# streams: a rollout that timed out without its final reward
OnTimeout = Literal["dlq", "emit"]
# streams: a rollout whose stored state outgrew a Kafka record
OnOversize = Literal["dlq", "emit"]
# streams: an event for a rollout already closed
LatePolicy = Literal["dlq", "ignore"]
# gateway: a rollout's traffic (the `X-Rollout-Mode` header or `/rollouts/{id}/{mode}/v1/...`):
# `train` is sampled at the configured temperature and trained on, `val` is greedy and never is
RolloutMode = Literal["train", "val"]
# serving: the policy engine
EngineBackend = Literal["embedded", "vllm"]
# serving: the base weights the embedded engine's llama-server loads
EngineWeights = Literal["f32", "q4_1"]
# serving: the registered-model alias the reloader follows
RegistryAlias = Literal["latest", "production"]

LEARNER_MODES: tuple[str, ...] = get_args(LearnerMode)
ADVANTAGE_MODES: tuple[str, ...] = get_args(AdvantageMode)
LOSS_TYPES: tuple[str, ...] = get_args(LossType)
STALENESS_POLICIES: tuple[str, ...] = get_args(StalenessPolicy)
WARM_START_SCHEDULES: tuple[str, ...] = get_args(WarmStartSchedule)
CREDIT_MODES: tuple[str, ...] = get_args(CreditMode)
ON_TIMEOUT: tuple[str, ...] = get_args(OnTimeout)
ON_OVERSIZE: tuple[str, ...] = get_args(OnOversize)
LATE_POLICIES: tuple[str, ...] = get_args(LatePolicy)
ROLLOUT_MODES: tuple[str, ...] = get_args(RolloutMode)
ENGINE_BACKENDS: tuple[str, ...] = get_args(EngineBackend)
ENGINE_WEIGHTS: tuple[str, ...] = get_args(EngineWeights)
REGISTRY_ALIASES: tuple[str, ...] = get_args(RegistryAlias)


def one_of(values: tuple[str, ...]) -> str:
    """'rl, sft or kto': the values for a help text or an error message."""
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"
