"""A generated workload of rollouts, with its expected transitions computed independently of
the join (from what the generator knows it produced), for the integration tests and
`python -m bench.streams`.

Each rollout has 1..8 LLM calls, a tool call after some of them (ok, raised or timed out), a
final reward (sometimes produced before its spans), some duplicated spans, and some rollouts
that never get a reward. Events of about `window` rollouts are interleaved, as concurrent
agents would produce them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from streams.credit import assign
from streams.rollout import transition_id
from tracetrain.settings.streams import StreamsSettings

TOOL_OUTCOMES = ("tool_ok", "tool_raised", "tool_timeout")


@dataclass
class GenRollout:
    rollout_id: str
    spans: list[dict]
    reward: dict | None
    reward_first: bool = False
    duplicated: set[str] = field(default_factory=set)
    tool_rule: dict[str, str] = field(default_factory=dict)  # llm span_id -> AIR rule fired


def _llm_span(rid: str, sid: str, agent: str, start: int, rng: random.Random) -> dict:
    n_prompt, n_resp = rng.randint(3, 12), rng.randint(1, 8)
    return {
        "trace_id": rid, "span_id": sid, "rollout_id": rid, "task_id": f"task-{rid[-2:]}",
        "agent_name": agent, "policy_name": "policy", "kind": "llm",
        "start_time_ns": start, "end_time_ns": start + 400_000, "status": "ok",
        "llm": {"model": "smollm2", "policy_version": 3,
                "prompt_token_ids": [rng.randint(3, 49000) for _ in range(n_prompt)],
                "response_token_ids": [rng.randint(3, 49000) for _ in range(n_resp)],
                # multiples of 1/8 survive Avro's 32-bit float exactly
                "response_logprobs": [-rng.randint(0, 40) / 8 for _ in range(n_resp)]},
    }


def _tool_span(rid: str, sid: str, parent: str, start: int, outcome: str) -> dict:
    status = "ok" if outcome == "tool_ok" else "error"
    message = {"tool_ok": None, "tool_raised": "ZeroDivisionError: division by zero",
               "tool_timeout": "tool call timed out after 30 s"}[outcome]
    return {
        "trace_id": rid, "span_id": sid, "parent_id": parent, "rollout_id": rid,
        "agent_name": "tools", "kind": "tool", "start_time_ns": start,
        "end_time_ns": start + 100_000, "status": status, "error_message": message,
        "tool": {"name": "calc", "arguments": '{"expr": "1+1"}', "result": "2",
                 "ok": outcome == "tool_ok"},
    }


def generate(n: int, seed: int = 0, agents: tuple[str, ...] = ("solver",), p_reward_first: float = 0.1,
             p_duplicate: float = 0.1, p_never_closed: float = 0.05, prefix: str = "r") -> list[GenRollout]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        rid = f"{prefix}-{seed}-{i:06d}"
        base = 1_700_000_000_000_000_000 + i * 1_000_000_000
        spans, tool_rule, duplicated = [], {}, set()
        for k in range(rng.randint(1, 8)):
            sid = f"{rid}-llm{k}"
            spans.append(_llm_span(rid, sid, agents[rng.randrange(len(agents))], base + k * 1_000_000, rng))
            if rng.random() < 0.6:
                outcome = rng.choice(TOOL_OUTCOMES)
                tool_rule[sid] = outcome
                spans.append(_tool_span(rid, f"{rid}-tool{k}", sid, base + k * 1_000_000 + 500_000, outcome))
        for span in spans:
            if rng.random() < p_duplicate:
                duplicated.add(span["span_id"])
        reward = None
        if rng.random() >= p_never_closed:
            reward = {"rollout_id": rid, "value": rng.choice([0.0, 1.0, -1.0, 0.5]), "final": True,
                      "task_id": spans[0]["task_id"], "timestamp_ns": base + 900_000_000}
        out.append(GenRollout(rid, spans, reward, rng.random() < p_reward_first, duplicated, tool_rule))
    return out


def rollout_events(gen: GenRollout) -> list[tuple[str, str, str, dict]]:
    """(topic short name, key, schema name, record) in the order this rollout produces them."""
    events = []
    for span in gen.spans:
        events.append(("spans", gen.rollout_id, "Span", span))
        if span["span_id"] in gen.duplicated:
            events.append(("spans", gen.rollout_id, "Span", span))
    if gen.reward is not None:
        reward = ("rewards", gen.rollout_id, "Reward", gen.reward)
        events = [reward, *events] if gen.reward_first else [*events, reward]
    return events


def interleave(rollouts: list[GenRollout], seed: int = 0, window: int = 16) -> list[tuple[str, str, str, dict]]:
    rng = random.Random(seed + 1)
    pending = [rollout_events(g) for g in rollouts]
    pending.reverse()
    active: list[list] = []
    out = []
    while pending or active:
        while pending and len(active) < window:
            active.append(pending.pop())
        pick = rng.randrange(len(active))
        out.append(active[pick].pop(0))
        if not active[pick]:
            active.pop(pick)
    return out


def reference(rollouts: list[GenRollout], streams: StreamsSettings, trained_agents: set[str] | None = None) -> dict[str, dict]:
    """transition_id -> the fields the join must produce for the rollouts that get a reward."""
    expected = {}
    for gen in rollouts:
        if gen.reward is None:
            continue
        calls = sorted((s for s in gen.spans if s["kind"] == "llm"
                        and (trained_agents is None or s["agent_name"] in trained_agents)),
                       key=lambda s: s["start_time_ns"])
        # A tool's AIR credits its calling span; if that call is not trained, the latest
        # trained call before it (or the first one) gets it.
        inter = [0.0] * len(calls)
        all_llm = sorted((s for s in gen.spans if s["kind"] == "llm"), key=lambda s: s["start_time_ns"])
        for caller in all_llm:
            rule = gen.tool_rule.get(caller["span_id"])
            if rule is None or not calls:
                continue
            before = [i for i, c in enumerate(calls) if c["start_time_ns"] <= caller["start_time_ns"]]
            inter[before[-1] if before else 0] += getattr(streams.air_rules, rule)
        credits = assign(streams.credit, gen.reward["value"], inter, streams.gamma)
        for turn, (call, credit) in enumerate(zip(calls, credits, strict=True)):
            tid = transition_id(gen.rollout_id, call["span_id"])
            expected[tid] = {
                "transition_id": tid, "rollout_id": gen.rollout_id, "span_id": call["span_id"],
                "agent_name": call["agent_name"], "turn_index": turn, "is_last": turn == len(calls) - 1,
                "prompt_token_ids": call["llm"]["prompt_token_ids"],
                "response_token_ids": call["llm"]["response_token_ids"],
                "behaviour_logprobs": call["llm"]["response_logprobs"],
                "final_reward": credit.final_reward, "intermediate_reward": credit.intermediate_reward,
                "credited_return": credit.credited_return,
            }
    return expected
