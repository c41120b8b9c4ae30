"""Trace cleaning: which spans become transitions. Only LLM calls of the trained policy are
kept, selected by model name, policy name and (for multi-agent systems) agent name, each a
regex matched against the whole name (`Writer|Rewriter` trains both and not the Checker).

A selected call without prompt or response token ids (OTLP, the OTel exporter) is "no token
ids": the join re-tokenises it from its recorded messages (streams/retokenize.py), or, with
`streams.retokenize` off, sends it to the dead-letter topic with that reason.

A call of `val` traffic (span attribute `tracetrain.rollout_mode`, written by the gateway) is
never trained on: its rollout keeps it out of its transitions. A selected call whose
`gen_ai.request.temperature` is not a number >= 0 cannot be scored at the temperature it was
sampled at: it goes to the dead-letter topic with the reason "bad temperature".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from streams.errors import StreamsError
from tracetrain.records import MODE_ATTRIBUTE, TEMPERATURE_ATTRIBUTE
from tracetrain.settings.streams import StreamsSettings

Verdict = Literal["keep", "skip", "no token ids", "val", "bad temperature"]
NO_TOKEN_IDS, VAL, BAD_TEMPERATURE = "no token ids", "val", "bad temperature"


def sampling_temperature(span: dict) -> float | None:
    """The temperature the engine sampled the call at (None: not recorded); ValueError for a
    value that is not a finite number >= 0."""
    raw = (span.get("attributes") or {}).get(TEMPERATURE_ATTRIBUTE)
    if raw is None:
        return None
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise ValueError(raw)
    return value


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
        if (span.get("attributes") or {}).get(MODE_ATTRIBUTE) == VAL:
            return VAL
        try:
            sampling_temperature(span)
        except ValueError:
            return BAD_TEMPERATURE
        llm = span["llm"]
        if not llm.get("prompt_token_ids") or not llm.get("response_token_ids"):
            return NO_TOKEN_IDS
        return "keep"
