"""Trace cleaning: which spans become transitions. Only LLM calls of the trained policy are
kept, selected by model name, policy name and (for multi-agent systems) agent name, each a
regex matched against the whole name (`Writer|Rewriter` trains both and not the Checker).

A selected call without prompt or response token ids cannot be trained on. Re-tokenizing it
from its request messages is deferred (it needs the policy's tokenizer in the worker): such a
call goes to the dead-letter topic with the reason "no token ids".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from streams.errors import StreamsError
from tracetrain.settings.streams import StreamsSettings

Verdict = Literal["keep", "skip", "no token ids"]
NO_TOKEN_IDS = "no token ids"


def _compile(pattern: str | None, what: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise StreamsError(f"TRACETRAIN_STREAMS__SELECT_{what.upper()} {pattern!r} is not a valid regex: {exc}") from exc


@dataclass(frozen=True)
class Selector:
    models: re.Pattern[str] | None = None
    agents: re.Pattern[str] | None = None
    policies: re.Pattern[str] | None = None

    @classmethod
    def from_settings(cls, streams: StreamsSettings) -> Selector:
        return cls(_compile(streams.select_models, "models"), _compile(streams.select_agents, "agents"),
                   _compile(streams.select_policies, "policies"))

    def selects(self, span: dict) -> bool:
        """True for an LLM call of the trained policy by a selected agent."""
        llm = span.get("llm")
        if span.get("kind") != "llm" or llm is None:
            return False
        if self.models is not None and not self.models.fullmatch(llm.get("model") or ""):
            return False
        if self.agents is not None and not self.agents.fullmatch(span.get("agent_name") or ""):
            return False
        policy = span.get("policy_name")
        if self.policies is not None and policy is not None and not self.policies.fullmatch(policy):
            return False
        return True

    def classify(self, span: dict) -> Verdict:
        if not self.selects(span):
            return "skip"
        llm = span["llm"]
        if not llm.get("prompt_token_ids") or not llm.get("response_token_ids"):
            return NO_TOKEN_IDS
        return "keep"
