"""Prompt versions in MLflow's prompt registry: each with its measured score and its lineage
as tags, and an alias on the best.

    store = PromptStore(settings)
    version = store.register(text, lineage_tags(...))   # a new version of optimizer.prompt_name
    store.point_alias(version)                          # prompts:/NAME@ALIAS -> that version
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.errors import OptimizerError
from optimizer.rollouts import Rollout
from tracetrain.settings import Settings

# MLflow keeps a tag value up to 5000 characters: the id list is cut to fit, the count is not.
_MAX_TAG = 5000


@dataclass(frozen=True)
class Scored:
    version: int
    text: str
    score: float


def format_ranges(ranges: dict[str, dict[int, tuple[int, int]]]) -> str:
    """`spans:0=0-120,1=0-98;rewards:0=0-50`: per topic, partition=[first-next) offsets."""
    return ";".join(f"{topic}:" + ",".join(f"{p}={a}-{b}" for p, (a, b) in sorted(parts.items()))
                    for topic, parts in sorted(ranges.items()))


def lineage_tags(*, score: float, n_val: int, val_seed: int, parent: int | None,
                 learned_from: list[Rollout], ranges: dict[str, dict[int, tuple[int, int]]],
                 role: str, critique: str = "") -> dict[str, str]:
    """Every version's tags: its score on the validation split, the version it was rewritten
    from, the rollouts whose critique it came from and the topic offsets they were read in."""
    ids = ",".join(r.rollout_id for r in learned_from)
    return {
        "score": f"{score:.6g}",
        "n_val": str(n_val),
        "val_seed": str(val_seed),
        "role": role,  # seed: the prompt the rollouts were made with; candidate: a rewrite
        "parent_version": "" if parent is None else str(parent),
        "rollout_ids": ids[:_MAX_TAG],
        "rollout_count": str(len(learned_from)),
        "rollout_rewards": ",".join(f"{r.reward:g}" for r in learned_from)[:_MAX_TAG],
        "reward_offsets": ",".join(f"{t}:{p}@{o}" for t, p, o in
                                   (r.position for r in learned_from))[:_MAX_TAG],
        "topic_offsets": format_ranges(ranges)[:_MAX_TAG],
        "critique": critique[:_MAX_TAG],
    }


class PromptStore:
    def __init__(self, settings: Settings):
        import mlflow

        mlflow.set_tracking_uri(settings.mlflow.uri)
        self.mlflow, self.uri = mlflow, settings.mlflow.uri
        self.name, self.alias = settings.optimizer.prompt_name, settings.optimizer.alias

    def current(self) -> tuple[int, str] | None:
        """(version, text) the alias points to; None before the first run."""
        from mlflow.exceptions import MlflowException

        try:
            found = self.mlflow.genai.load_prompt(f"prompts:/{self.name}@{self.alias}",
                                                  link_to_model=False)
        except MlflowException:
            return None
        return int(found.version), found.template

    def register(self, text: str, tags: dict[str, str], message: str) -> int:
        from mlflow.exceptions import MlflowException

        try:
            version = self.mlflow.genai.register_prompt(self.name, text, commit_message=message,
                                                        tags=tags)
        except MlflowException as exc:
            raise OptimizerError(f"MLflow at {self.uri} refused prompt {self.name!r}: "
                                 f"{exc.message}") from exc
        return int(version.version)

    def point_alias(self, version: int) -> None:
        self.mlflow.genai.set_prompt_alias(self.name, self.alias, version)

    def tags(self, version: int) -> dict[str, str]:
        return dict(self.mlflow.genai.load_prompt(self.name, version=version,
                                                  link_to_model=False).tags)
