"""The rollout state machine against the independent reference, in any order, with
duplicates; closing rules; late events; determinism of what it emits."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.close_rules import plan_close
from streams.join_core import RolloutJoin
from streams.rollout import DUPLICATE, EXTRA_FINAL, LATE, Rollout
from testkit.workload import generate, reference, rollout_events
from tracetrain.settings.streams import StreamsSettings

END = "tracetrain.rollout_end"


def feed(events, streams: StreamsSettings) -> RolloutJoin:
    """The join core as the worker drives it, without Kafka: one partition, record ts = event
    index, every event handed to the core's handler for its topic."""
    core = RolloutJoin(streams)
    handlers = {"spans": core.span, "rewards": core.reward, "air": core.air}
    for ts, (topic, _key, _, record) in enumerate(events):
        handlers[topic](record, 0, ts, 0.0)
    return core


def emitted(core: RolloutJoin, streams) -> dict[str, dict]:
    """What the core closes as "final" once its partition is read far past every event,
    and the transitions those closes write."""
    for short in ("spans", "air"):
        core.positions.read(short, 0, offset=10**9, ts_ns=10**15, wall=0.0)
    out = {}
    for _key, state, reason in list(core.due(frozenset({0}), 100.0, full=True)):
        if reason == "final":
            for t in plan_close(state, reason, streams, "spans", "air").transitions:
                out[t["transition_id"]] = t
    return out


def assert_matches(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for tid, exp in want.items():
        for name, value in exp.items():
            if isinstance(value, float):
                assert math.isclose(got[tid][name], value, abs_tol=1e-9), (tid, name)
            else:
                assert got[tid][name] == value, (tid, name)


@pytest.mark.parametrize("mode", ["identical", "air", "discounted"])
def test_clean_order_matches_reference(mode):
    streams = StreamsSettings(credit=mode, gamma=0.9)
    rollouts = generate(200, seed=1)
    events = [e for g in rollouts for e in rollout_events(g)]
    assert_matches(emitted(feed(events, streams), streams), reference(rollouts, streams))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["identical", "air", "discounted"]))
def test_any_order_with_duplicates_gives_the_same_transitions(seed, mode):
    streams = StreamsSettings(credit=mode, gamma=0.8)
    rollouts = generate(12, seed=seed, p_duplicate=0.3, p_reward_first=0.3)
    events = [e for g in rollouts for e in rollout_events(g)]
    random.Random(seed).shuffle(events)
    events += random.Random(seed + 1).sample(events, k=len(events) // 4)  # replayed duplicates
    assert_matches(emitted(feed(events, streams), streams), reference(rollouts, streams))


def test_multi_agent_selection_keeps_only_selected_agents():
    streams = StreamsSettings(select_agents="Writer|Rewriter", credit="air")
    rollouts = generate(50, seed=3, agents=("Writer", "Rewriter", "Checker"))
    events = [e for g in rollouts for e in rollout_events(g)]
    got = emitted(feed(events, streams), streams)
    assert {t["agent_name"] for t in got.values()} == {"Writer", "Rewriter"}
    assert_matches(got, reference(rollouts, streams, trained_agents={"Writer", "Rewriter"}))


def _span(sid, start, **attrs):
    return {"span_id": sid, "start_time_ns": start, "attributes": attrs, "kind": "llm",
            "llm": {"model": "m", "prompt_token_ids": [1], "response_token_ids": [2]}}


def test_close_rules():
    grace = 500_000_000
    never, always = (lambda _: False), (lambda _: True)

    def read_to(watermark):  # a partition read up to a record with this timestamp
        return lambda ts: watermark > ts

    reward = {"rollout_id": "r", "value": 1.0, "final": True, "timestamp_ns": 5}
    state = Rollout("r", 0)
    state.add_reward(reward, ts_ns=10, wall=1.0)
    assert state.close_reason(2.0, always, always, 0.5, 60) is None  # no spans yet
    state.add_span(_span("a", 1), True, ts_ns=11, wall=1.1, end_attribute=END)
    # reward came first: wait until the partition is read grace past the last span (ts 11)
    assert state.close_reason(1.2, read_to(11 + grace), never, 0.5, 60) is None
    assert state.close_reason(1.2, read_to(11 + grace + 1), never, 0.5, 60) == "final"
    # at the head of the log: quiet for grace, then nothing left by end offsets asked after it
    assert state.close_reason(1.2, never, always, 0.5, 60) is None
    assert state.close_reason(1.7, never, lambda since: since <= 1.65, 0.5, 60) == "final"
    assert state.close_reason(1.7, never, lambda since: since <= 1.5, 0.5, 60) is None
    assert state.close_reason(1.7, never, never, 0.5, 60) is None

    # Spans first, the reward in the same millisecond as the last span read so far: a record
    # at the reward's timestamp proves nothing (the next span may share it too).
    tie = Rollout("t", 0)
    tie.add_span(_span("a", 1), True, ts_ns=20, wall=1.0, end_attribute=END)
    tie.add_reward({**reward, "rollout_id": "t"}, ts_ns=20, wall=1.0)
    assert tie.close_reason(1.1, read_to(20), never, 0.5, 60) is None
    assert tie.close_reason(1.1, read_to(20), never, 0.0, 60) is None
    assert tie.close_reason(1.1, read_to(20 + grace), never, 0.5, 60) is None
    assert tie.close_reason(1.1, read_to(20 + grace + 1), never, 0.5, 60) == "final"

    ended = Rollout("e", 0)
    ended.add_span(_span("a", 1, **{END: "true"}), True, ts_ns=3, wall=1.0, end_attribute=END)
    assert ended.close_reason(1.2, always, always, 0.5, 60) is None
    assert ended.close_reason(1.6, always, always, 0.5, 60) == "end"
    assert ended.transitions("end", "identical", 1.0, 60)[0]["emitted_ns"] == 3

    idle = Rollout("i", 0)
    idle.add_span(_span("a", 1), True, ts_ns=7, wall=1.0, end_attribute=END)
    assert idle.close_reason(61.5, always, always, 0.5, 60) == "timeout"
    assert idle.close_reason(61.5, always, always, 0.5, 60, quiet_since=30.0) is None
    assert idle.emitted_ns("timeout", 60) == 7 + 60 * 10**9


def test_late_events_duplicates_and_extra_final():
    state = Rollout("r", 2)
    reward = {"rollout_id": "r", "value": 1.0, "final": True, "timestamp_ns": 5}
    assert state.add_span(_span("a", 1), True, 1, 1.0, END) == "added"
    assert state.add_span(_span("a", 1), True, 2, 1.0, END) == DUPLICATE
    assert state.add_reward(reward, 3, 1.0) == "added"
    assert state.add_reward(reward, 4, 1.0) == DUPLICATE
    assert state.add_reward({**reward, "value": 0.0, "timestamp_ns": 9}, 4, 1.0) == EXTRA_FINAL
    first = state.transitions("final", "identical", 1.0, 60)
    assert first[0]["final_reward"] == 1.0
    state.close("final", 2.0)
    restored = Rollout.from_bytes(state.to_bytes())
    assert restored.closed == "final" and restored.partition == 2
    assert restored.add_span(_span("b", 2), True, 5, 3.0, END) == LATE
    assert restored.add_span(_span("a", 1), True, 5, 3.0, END) == DUPLICATE  # closed with it
    assert restored.add_reward(reward, 5, 3.0) == LATE
    assert restored.add_air({"span_id": "a", "rule": "x", "value": 1.0}, 5, 3.0) == LATE
    assert restored.close_reason(1e9, lambda ts: True, lambda since: True, 0, 1) is None


def test_state_roundtrip_gives_identical_transitions():
    streams = StreamsSettings(credit="air")
    rollouts = generate(30, seed=9)
    states = feed([e for g in rollouts for e in rollout_events(g)], streams).rollouts
    for state in states.values():
        again = Rollout.from_bytes(state.to_bytes())
        assert again.transitions("final", "air", 1.0, 5) == state.transitions("final", "air", 1.0, 5)
        # as the join stores it: the small state, and each call apart
        header = state.to_bytes(with_calls=False)
        assert b"prompt_token_ids" not in header
        apart = Rollout.from_bytes(header, {s: state.call_bytes(s) for s in state.calls})
        assert apart.transitions("final", "air", 1.0, 5) == state.transitions("final", "air", 1.0, 5)


def test_air_on_unknown_span_is_reported():
    state = Rollout("r", 0)
    state.add_span(_span("a", 1), True, 1, 1.0, END)
    state.add_air({"span_id": "ghost", "rule": "x", "value": 1.0}, 2, 1.0)
    inter, unknown = state.intermediate(state.ordered_calls())
    assert inter == [0.0] and unknown == ["ghost"]
