"""The search: critique the worst rollouts, rewrite the system prompt, evaluate each rewrite
on the validation split through the real agent, keep the best by measured reward.

    result = optimise(opts, seed_text, batch, llm, evaluate, store)

Why not a library. `mlflow.genai.optimize_prompts` (MLflow 3.17) calls its reflection model
through LiteLLM or an MLflow AI-gateway endpoint (neither runs here; LiteLLM is not installed),
its MetaPromptOptimizer asks that model for JSON (SmolLM2-135M does not keep to JSON), and it
scores `train_data` rows with scorers, not rollouts read back from Kafka. GEPA 0.1.4 takes a
custom adapter and a plain `str -> str` reflection LM, which would fit the endpoint, but its
loop scores every proposal on a minibatch of the *training* set before the validation set, so
each training item must be re-run and scored with a gold answer; the rollouts on the spans and
rewards topics carry the problem and its reward but no gold answer, so the worst rollouts,
the thing this optimiser learns from, cannot be GEPA's training set, and using labelled
problems instead would leave the Kafka traffic unused. Its default reflection template with a
minibatch of traces also fills much of SmolLM2's 2048-token context. What is left is small:
one critique per round, a few rewrites, each measured on the validation split.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import openai

from optimizer.errors import OptimizerError
from optimizer.registry import PromptStore, Scored, lineage_tags
from optimizer.rollouts import Rollout, RolloutBatch, worst
from tracetrain.settings.optimizer import OptimizerSettings

_SHOWN_CHARS = 160   # of one message in a critique: the context holds worst_k transcripts
_MAX_PROMPT_CHARS = 1500
_MIN_PROMPT_CHARS = 20


@dataclass
class Result:
    seed: Scored
    best: Scored
    candidates: list[Scored] = field(default_factory=list)
    rejected: int = 0          # rewrites that were empty, too long or a repeat
    learned_from: list[Rollout] = field(default_factory=list)

    def summary(self, opts: OptimizerSettings, rollouts_read: int) -> dict:
        return {"prompt": f"prompts:/{opts.prompt_name}@{opts.alias}",
                "seed_version": self.seed.version, "seed_score": round(self.seed.score, 4),
                "best_version": self.best.version, "best_score": round(self.best.score, 4),
                "candidates": [{"version": c.version, "score": round(c.score, 4)}
                               for c in self.candidates],
                "rejected": self.rejected, "rollouts_read": rollouts_read,
                "learned_from": len(self.learned_from), "n_val": opts.n_val}


class OptimiserLlm:
    """Any OpenAI-compatible chat endpoint."""

    def __init__(self, base_url: str, opts: OptimizerSettings):
        self.client = openai.OpenAI(base_url=base_url, api_key=opts.llm_api_key.get_secret_value(),
                                    max_retries=2, timeout=120.0)
        self.base_url, self.opts = base_url, opts

    def ask(self, prompt: str, seed: int) -> str:
        try:
            completion = self.client.chat.completions.create(
                model=self.opts.llm_model, messages=[{"role": "user", "content": prompt}],
                max_tokens=self.opts.llm_max_tokens, temperature=self.opts.llm_temperature,
                seed=seed)
        except openai.OpenAIError as exc:
            raise OptimizerError(f"the optimiser LLM at {self.base_url} "
                                 f"(optimizer.llm_base_url) failed: {exc}") from exc
        return completion.choices[0].message.content or ""


def _shown(rollout: Rollout) -> str:
    lines = [f"Problem: {rollout.question[:_SHOWN_CHARS]}"]
    for message in rollout.transcript[1:]:
        who = "Assistant" if message.get("role") == "assistant" else "Tool"
        lines.append(f"{who}: {str(message.get('content', ''))[:_SHOWN_CHARS]}")
    lines.append(f"Reward: {rollout.reward:g}")
    return "\n".join(lines)


def critique_prompt(system_prompt: str, rollouts: list[Rollout]) -> str:
    shown = "\n\n".join(_shown(r) for r in rollouts)
    return (f"An assistant was given this system prompt:\n\n{system_prompt}\n\n"
            f"Here are attempts that got a low reward (1 is correct, 0 is wrong):\n\n{shown}\n\n"
            "In two sentences, what did the assistant do wrong, and what should the system "
            "prompt tell it to do instead?")


def rewrite_prompt(system_prompt: str, critique: str) -> str:
    return (f"Here is a system prompt:\n\n{system_prompt}\n\nA reviewer found these problems: "
            f"{critique.strip()}\n\nWrite an improved system prompt that fixes them and keeps "
            "every format rule of the original. Write only the new system prompt.")


def clean(text: str) -> str | None:
    """The rewrite as a prompt: fences, quotes and a leading label dropped; None when nothing
    usable is left (empty, or too long for the agent's context)."""
    text = re.sub(r"```[a-z]*", "", text).strip()
    text = re.sub(r"^(new|improved)?\s*system prompt\s*:\s*", "", text, flags=re.IGNORECASE)
    text = text.strip().strip('"').strip()
    if not _MIN_PROMPT_CHARS <= len(text) <= _MAX_PROMPT_CHARS:
        return None
    return text


def require_rollouts(batch: RolloutBatch, opts: OptimizerSettings) -> None:
    if not batch.rollouts:
        raise OptimizerError(
            f"no rollouts of agent {opts.agent!r} with a final reward on the spans and rewards "
            f"topics past consumer group {opts.group_id!r}'s position: send traffic first "
            "(agents through the gateway, or tracetrain demo)")


def optimise(opts: OptimizerSettings, seed: tuple[int | None, str], batch: RolloutBatch,
             llm: OptimiserLlm, evaluate: Callable[[str, str], float],
             store: PromptStore) -> Result:
    """`seed`: (registered version or None, text) the rollouts were made with;
    `evaluate(text, label)`: mean validation reward of the agent with that system prompt."""
    require_rollouts(batch, opts)
    learned_from = worst(batch.rollouts, opts.worst_k)
    common = {"n_val": opts.n_val, "val_seed": opts.val_seed, "ranges": batch.ranges}
    seed_version, seed_text = seed
    seed_score = evaluate(seed_text, "seed prompt")
    if seed_version is None:
        seed_version = store.register(seed_text, lineage_tags(
            score=seed_score, parent=None, learned_from=[], role="seed", **common),
            "the agent's built-in system prompt")
    best = Scored(seed_version, seed_text, seed_score)
    result = Result(seed=best, best=best, learned_from=learned_from)
    seen = {seed_text}
    for round_no in range(opts.rounds):
        critique = llm.ask(critique_prompt(best.text, learned_from), seed=round_no).strip()
        parent = best
        for n in range(opts.candidates):
            text = clean(llm.ask(rewrite_prompt(parent.text, critique), seed=1000 * round_no + n))
            if text is None or text in seen:
                result.rejected += 1
                continue
            seen.add(text)
            score = evaluate(text, f"round {round_no + 1} candidate {n + 1}")
            version = store.register(text, lineage_tags(
                score=score, parent=parent.version, learned_from=learned_from,
                role="candidate", critique=critique, **common),
                f"round {round_no + 1}: rewrite of version {parent.version}")
            candidate = Scored(version, text, score)
            result.candidates.append(candidate)
            if score > best.score:  # strictly better: a tie keeps the prompt already serving
                best = candidate
    result.best = best
    store.point_alias(best.version)
    return result
