"""The join core's decisions, called directly (no Kafka, no Faust): which events are dead-lettered
and why, when a rollout closes (reward before spans, end marker, time-out only when caught up),
what a close writes under each time-out policy, stalls and retention."""

from __future__ import annotations

import json
import random

import pytest

from streams.cleaning import BAD_TEMPERATURE, NO_TOKEN_IDS
from streams.close_rules import ClosePlan, plan_close
from streams.join_core import RolloutJoin, record_problem
from streams.positions import STALL_S, ReadPositions
from streams.rollout import Rollout
from testkit.workload import _llm_span, _tool_span
from tracetrain.records import MODE_ATTRIBUTE as MODE
from tracetrain.records import TEMPERATURE_ATTRIBUTE as TEMPERATURE
from tracetrain.settings.streams import StreamsSettings

END = "tracetrain.rollout_end"
GRACE_NS = 500_000_000


def llm(rid="r1", sid="s1", start=1, **attributes):
    span = _llm_span(rid, sid, "solver", start, random.Random(sid))
    span["attributes"] = attributes
    return span


def reward(rid="r1", value=1.0, final=True):
    return {"rollout_id": rid, "value": value, "final": final, "timestamp_ns": 5,
            "span_id": None}


def caught_up(core: RolloutJoin, partition: int = 0, ts_ns: int = 10**15) -> None:
    """The partition's watched streams read far past every event, and its end known."""
    for short in ("spans", "air", "rewards"):
        core.positions.read(short, partition, 99, ts_ns, 0.0)
    core.positions.update({(s, partition): 100 for s in ("spans", "air", "rewards")}, {}, 1e12)


def test_records_keyed_elsewhere_or_by_nothing_or_with_nul_ids_are_refused():
    assert record_problem(b"r1", {"rollout_id": "r1"}) is None
    reason, detail = record_problem(b"other", {"rollout_id": "r1"})
    assert reason == "key_mismatch" and "'r1'" in detail
    # no key: the producer's partitioner placed it, maybe away from its rollout's partition
    reason, detail = record_problem(None, {"rollout_id": "r1"})
    assert reason == "key_mismatch" and "no key" in detail
    assert record_problem(b"a\x00b", {"rollout_id": "a\x00b"})[0] == "invalid_rollout_id"


@pytest.mark.parametrize("value", [1e200, -1e7, float("nan"), float("inf"), 10**400])
def test_rewards_and_air_values_outside_the_bound_are_refused(value):
    for record in (reward(value=value), {"rollout_id": "r1", "span_id": "s", "rule": "x",
                                         "value": value, "timestamp_ns": 1}):
        reason, detail = record_problem(b"r1", record)
        assert reason == "reward_out_of_bounds"
        assert "rewards.max_abs" in detail or "finite" in detail, detail
    assert record_problem(b"r1", reward(value=-1e6)) is None  # the default bound itself
    assert record_problem(b"r1", reward(value=5.0), max_reward=4.0)[0] == "reward_out_of_bounds"


def test_credited_returns_beyond_the_bound_dead_letter_the_rollout_on_close():
    """Each reward within the bound, their sum not: no transition the learner must refuse."""
    core = RolloutJoin(StreamsSettings(), max_reward=10.0)
    core.span(llm(), 0, 1, 1.0)
    core.reward(reward(value=8.0, final=False), 0, 2, 1.0)  # rollout-level: adds to the final
    state = core.reward(reward(value=8.0) | {"timestamp_ns": 6}, 0, 3, 1.0).state
    plan = plan_close(state, "final", core.cfg, "spans", "air", core.max_reward)
    assert plan.transitions == []
    [dead] = plan.dead_letters
    assert dead.reason == "reward_out_of_bounds" and "16.0" in dead.detail


@pytest.mark.parametrize("where", ["tool.arguments", "llm.tool_calls"])
def test_json_nested_past_the_decoder_limit_dead_letters_the_span_and_the_join_goes_on(where):
    core = RolloutJoin(StreamsSettings())
    deep = "[" * 100_000 + "]" * 100_000
    if where == "tool.arguments":
        span = _tool_span("r1", "t1", "s0", 1, "tool_ok")
        span["tool"]["arguments"] = deep
    else:
        span = llm(**{"llm.tool_calls": deep})
    applied = core.span(span, 0, 1, 1.0)
    assert applied.outcome == "rejected" and not applied.changed and applied.state is None
    [(reason, detail)] = applied.dead
    assert reason == "json_too_deep" and where.split(".")[-1] in detail
    assert b"r1" not in core.rollouts  # nothing joined, nothing half-joined
    ok = core.span(llm(sid="s2"), 0, 2, 1.0)
    assert ok.changed and ok.new_call == "s2"


def test_a_call_larger_than_a_record_is_dead_lettered_and_not_stored():
    core = RolloutJoin(StreamsSettings(max_record_bytes=16_384))
    big = llm(sid="big")
    big["llm"]["response_token_ids"] = list(range(10_000, 14_000))
    big["llm"]["response_logprobs"] = [-0.123456789] * 4_000
    applied = core.span(big, 0, 1, 1.0)
    assert applied.changed and applied.new_call is None
    [(reason, detail)] = applied.dead
    assert reason == "call_too_large" and "16384" in detail
    assert applied.state.calls == {} and "big" in applied.state.starts
    small = core.span(llm(sid="small"), 0, 2, 1.0)
    assert small.new_call == "small" and core.fits(b"\x00r1\x00small", small.call_bytes)


@pytest.mark.parametrize("policy", ["dlq", "emit"])
def test_a_rollout_outgrowing_a_record_closes_by_policy(policy):
    cfg = StreamsSettings(max_record_bytes=16_384, on_oversize=policy)
    core = RolloutJoin(cfg)
    applied = core.span(llm(), 0, 0, 1.0)
    n = 0
    while not core.outgrown(applied.key, applied.state.to_bytes(with_calls=False)):
        n += 1
        applied = core.span(_tool_span("r1", f"tool-{n:05d}", "s1", n, "tool_ok"), 0, n, 1.0)
        assert n < 1000, "the state never outgrew the limit"
    state = applied.state
    assert len(state.to_bytes(with_calls=False)) + 512 > 16_384
    plan = plan_close(state, "oversize", cfg, "spans", "air")
    if policy == "dlq":
        [dead] = plan.dead_letters
        assert plan.transitions == [] and dead.reason == "rollout_too_large"
        summary = json.loads(dead.body)
        assert summary["span_count"] == n + 1 and len(summary["spans"]) == 100
        assert len(dead.body) < 16_384  # the summary itself fits a record
    else:
        [transition] = plan.transitions
        assert transition["span_id"] == "s1" and plan.dead_letters == []


def test_reward_before_spans_closes_once_the_partition_is_read_past_the_last_span():
    core = RolloutJoin(StreamsSettings())
    applied = core.reward(reward(), 0, ts_ns=10, wall=1.0)
    assert applied.changed and applied.dead == []
    assert core.after_change(applied.key, applied.state, 1.0) is None  # no span yet
    span = core.span(llm(), 0, ts_ns=20, wall=1.1)
    assert span.new_call == "s1"
    assert core.after_change(span.key, span.state, 1.1) is None
    # read up to the last span plus the grace (not past it): still open
    core.positions.read("spans", 0, 5, 20 + GRACE_NS, 1.2)
    core.positions.read("air", 0, 5, 20 + GRACE_NS, 1.2)
    assert list(core.due(frozenset({0}), 1.2, full=False)) == []
    core.positions.read("air", 0, 6, 21 + GRACE_NS, 1.2)
    core.positions.read("spans", 0, 6, 21 + GRACE_NS, 1.2)
    [(key, state, reason)] = list(core.due(frozenset({0}), 1.2, full=False))
    assert (key, reason) == (b"r1", "final")
    [transition] = plan_close(state, reason, core.cfg, "spans", "air").transitions
    assert transition["final_reward"] == 1.0 and transition["is_last"]


def test_duplicates_change_nothing_late_and_extra_final_events_are_dead_lettered():
    for policy, dead in (("dlq", [("late_event", "the rollout was already closed")]),
                         ("ignore", [])):
        core = RolloutJoin(StreamsSettings(late_policy=policy))
        core.span(llm(), 0, 1, 1.0)
        dup = core.span(llm(), 0, 2, 1.0)
        assert not dup.changed and dup.outcome == "duplicate" and dup.dead == []
        first = core.reward(reward(), 0, 3, 1.0)
        extra = core.reward(reward(value=0.0) | {"timestamp_ns": 9}, 0, 4, 1.0)
        assert extra.dead == [("extra_final_reward", "the rollout already has a final reward")]
        core.closing(first.key, first.state, "final", 2.0)
        late = core.span(_tool_span("r1", "t2", "s1", 5, "tool_ok"), 0, 5, 3.0)
        assert late.outcome == "late_event" and late.dead == dead and not late.changed
        assert core.reward(reward(value=0.5, final=False), 0, 6, 3.0).dead == dead
        # a span the rollout closed with, read again (a restart before the commit): a duplicate
        again = core.span(llm(), 0, 7, 3.0)
        assert again.outcome == "duplicate" and again.dead == [] and again.late == []


def test_a_trained_call_without_token_ids_is_kept_and_dead_lettered():
    core = RolloutJoin(StreamsSettings())
    span = llm()
    span["llm"]["prompt_token_ids"] = []
    applied = core.span(span, 0, 1, 1.0)
    assert applied.changed and applied.new_call is None
    assert [reason for reason, _ in applied.dead] == [NO_TOKEN_IDS]


def test_tool_spans_derive_air_applied_at_once():
    core = RolloutJoin(StreamsSettings(credit="air"))
    core.span(llm(), 0, 1, 1.0)
    applied = core.span(_tool_span("r1", "t1", "s1", 2, "tool_raised"), 0, 2, 1.0)
    assert [a["rule"] for a in applied.derived] == ["tool_raised"]
    assert applied.new_call is None  # a tool call is not trained on
    inter, unknown = applied.state.intermediate(applied.state.ordered_calls())
    assert inter == [-0.5] and unknown == []


def test_an_end_marker_closes_after_the_grace_in_wall_time():
    core = RolloutJoin(StreamsSettings(close_grace_s=0.5))
    core.quiet_since = 0.0  # the worker started before the rollout
    applied = core.span(llm(**{END: "true"}), 0, 1, wall=10.0)
    assert core.after_change(applied.key, applied.state, 10.0) is None
    assert list(core.due(frozenset({0}), 10.4, full=False)) == []
    assert [r for *_, r in core.due(frozenset({0}), 10.6, full=False)] == ["end"]


def test_idle_rollouts_time_out_only_when_nothing_is_left_to_read():
    cfg = StreamsSettings(idle_timeout_s=60)
    core = RolloutJoin(cfg)
    core.quiet_since = 0.0
    core.span(llm(), 0, 1, wall=1.0)
    # end offsets unknown (or records left): the worker is behind, the rollout is not idle
    assert list(core.due(frozenset({0}), 100.0, full=True)) == []
    core.positions.update({("spans", 0): 50, ("air", 0): 0, ("rewards", 0): 0}, {}, 99.0)
    core.positions.read("spans", 0, 10, 1, 99.0)
    assert list(core.due(frozenset({0}), 100.0, full=True)) == []  # 39 records left
    core.positions.read("spans", 0, 49, 2, 99.0)
    [(_, state, reason)] = list(core.due(frozenset({0}), 100.0, full=True))
    assert reason == "timeout"
    # dlq: no transitions, one summary dead letter; emit: the transitions, no dead letter
    dead = plan_close(state, reason, cfg, "spans", "air")
    assert dead.transitions == []
    assert [(d.reason, d.source_topic) for d in dead.dead_letters] == [("rollout_timeout", "spans")]
    emit = plan_close(state, reason, cfg.model_copy(update={"on_timeout": "emit"}), "spans", "air")
    assert len(emit.transitions) == 1 and emit.dead_letters == []
    lone = RolloutJoin(cfg).reward(reward(final=False), 0, 1, 1.0).state
    assert plan_close(lone, "timeout", cfg, "spans", "air").dead_letters[0].reason == "unknown_rollout"


def test_air_for_a_span_the_rollout_lacks_is_dead_lettered_on_close():
    core = RolloutJoin(StreamsSettings(credit="air"))
    core.span(llm(), 0, 1, 1.0)
    core.air({"rollout_id": "r1", "span_id": "ghost", "rule": "x", "value": 1.0,
              "timestamp_ns": 2, "source": "explicit"}, 0, 2, 1.0)
    state = core.reward(reward(), 0, 3, 1.0).state
    caught_up(core)
    [(_, _, reason)] = list(core.due(frozenset({0}), 2.0, full=True))
    plan = plan_close(state, reason, core.cfg, "spans", "air")
    assert [(d.reason, d.source_topic) for d in plan.dead_letters] == [("unknown_span", "air")]
    assert len(plan.transitions) == 1


def test_rollouts_of_other_partitions_are_left_to_their_owner():
    core = RolloutJoin(StreamsSettings())
    core.span(llm(), 3, 1, 1.0)
    core.reward(reward(), 3, 2, 1.0)
    caught_up(core, partition=3)
    assert list(core.due(frozenset({0, 1}), 2.0, full=True)) == []
    assert len(list(core.due(frozenset({3}), 2.0, full=True))) == 1


def test_closed_rollouts_are_forgotten_after_the_retention():
    core = RolloutJoin(StreamsSettings(closed_retention_s=10))
    applied = core.span(llm(), 0, 1, 1.0)
    core.closing(applied.key, applied.state, "final", 100.0)
    assert core.expired(105.0) == []
    assert core.expired(111.0) == [(b"r1", applied.state)] and b"r1" not in core.rollouts


def test_a_partition_with_records_left_and_none_read_for_a_while_is_stalled():
    positions = ReadPositions()
    positions.update({("spans", 0): 10, ("spans", 1): 10}, {("spans", 1): 4}, 0.0)
    positions.read("spans", 0, 3, 1, 0.0)
    assert positions.stalled(frozenset({0, 1}), 0.0) == []  # the clocks start now
    stalled = positions.stalled(frozenset({0, 1}), STALL_S + 1)
    assert ("spans", 0) in stalled and ("spans", 1) in stalled
    assert positions.stalled(frozenset({0, 1}), STALL_S + 2) == []  # once per STALL_S
    # read since its assignment: Faust's buffers may hold the next records, no seek
    assert positions.restart_offset("spans", 0) is None
    assert positions.restart_offset("spans", 1) == 4  # nothing read: from the committed offset
    assert positions.unread("spans", 1) == 6 and positions.unread("rewards", 1) is None


def test_the_sampling_temperature_of_each_call_reaches_its_transition():
    core = RolloutJoin(StreamsSettings())
    spans = [llm(sid="s1", start=1, **{TEMPERATURE: "0.7"}), llm(sid="s2", start=2),
             llm(sid="s3", start=3, **{TEMPERATURE: "0.0"})]
    for i, span in enumerate(spans):
        assert core.span(span, 0, i + 1, 1.0).new_call == span["span_id"]
    state = core.reward(reward(), 0, 9, 1.0).state
    state = Rollout.from_bytes(state.to_bytes())  # as the table stores and restores it
    transitions = plan_close(state, "final", core.cfg, "spans", "air").transitions
    # Greedy stays 0 here (the learner decides how to score it); unrecorded is None.
    assert [t["sampling_temperature"] for t in transitions] == [0.7, None, 0.0]


def test_a_call_with_a_temperature_that_is_not_a_number_is_dead_lettered_not_trained():
    core = RolloutJoin(StreamsSettings())
    for bad in ("hot", "-1", "nan", "inf"):
        applied = core.span(llm(sid=f"s-{bad}", **{TEMPERATURE: bad}), 0, 1, 1.0)
        assert applied.changed and applied.new_call is None
        [(reason, detail)] = applied.dead
        assert reason == BAD_TEMPERATURE and repr(bad) in detail and ">= 0" in detail


def test_val_calls_never_become_transitions_and_a_val_rollout_leaves_no_dead_letter():
    core = RolloutJoin(StreamsSettings(idle_timeout_s=1.0))
    val = core.span(llm(sid="v1", **{MODE: "val", TEMPERATURE: "0.0"}), 0, 1, 1.0)
    assert val.changed and val.val and val.new_call is None and val.dead == []
    train = core.span(llm(sid="t1", start=2, **{MODE: "train"}), 0, 2, 1.0)
    assert not train.val and train.new_call == "t1"
    state = core.reward(reward(), 0, 3, 1.0).state
    assert state.val_calls == 1
    [transition] = plan_close(state, "final", core.cfg, "spans", "air").transitions
    assert transition["span_id"] == "t1"
    # A rollout of val traffic alone that never gets a reward times out quietly.
    alone = core.span(llm(rid="rv", sid="v2", **{MODE: "val"}), 0, 4, 1.0).state
    assert plan_close(alone, "timeout", core.cfg, "spans", "air") == ClosePlan(emitted=False)
    # ...while any other rollout that times out is still dead-lettered.
    other = core.span(llm(rid="ro", sid="o1"), 0, 5, 1.0).state
    assert [d.reason for d in plan_close(other, "timeout", core.cfg, "spans",
                                         "air").dead_letters] == ["rollout_timeout"]


def test_a_policy_call_appended_after_its_rollout_closed_gets_its_transition():
    """The loss of the production rehearsal (a broker killed -9): the agent's reward and its
    agent span reached partition 2 right after the failover, the gateway's LLM span of the
    same rollout a second later (its producer's retry); the rollout, quiet and with nothing
    left to read, closed with no call in between. The late call is emitted on its own, once:
    credited with the close's final reward, its id deterministic, a re-read copy a duplicate,
    and a replay from the stored tombstone emits the identical transition."""
    core = RolloutJoin(StreamsSettings(close_grace_s=0.5))
    core.quiet_since = 0.0
    core.reward(reward(value=0.4), 2, 3, 1.268)
    agent = llm(sid="agent")
    agent["kind"], agent["llm"] = "agent", None
    applied = core.span(agent, 2, 3, 1.816)
    assert applied.changed and applied.new_call is None
    assert core.after_change(applied.key, applied.state, 1.816) is None
    core.positions.read("spans", 2, 12, 4, 1.816)
    core.positions.update({("spans", 2): 13, ("air", 2): 0, ("rewards", 2): 6}, {}, 2.35)
    [(key, state, reason)] = list(core.due(frozenset({2}), 2.371, full=False))
    plan = plan_close(state, reason, core.cfg, "spans", "air")
    assert (reason, plan.transitions, plan.emitted) == ("final", [], True)
    core.closing(key, state, reason, 2.371, plan.emitted)
    stored = state.to_bytes(with_calls=False)  # the tombstone in the changelog

    late = core.span(llm(sid="12953a3e4dce9385", start=2), 2, 2, 2.599)
    assert late.outcome == "late_call" and late.dead == [] and not late.changed
    [transition] = late.late
    assert transition["span_id"] == "12953a3e4dce9385" and transition["final_reward"] == 0.4
    assert transition["credited_return"] == 0.4 and transition["turn_index"] == 0
    assert transition["emitted_ns"] == 3  # the final reward's record time, as a close's
    again = core.span(llm(sid="12953a3e4dce9385", start=2), 2, 2, 3.0)
    assert again.outcome == "duplicate" and again.late == [] and again.dead == []
    # A restart that read the tombstone from before the late call emits the same record.
    replay = RolloutJoin(core.cfg, load=lambda k, p: Rollout.from_bytes(stored))
    assert replay.span(llm(sid="12953a3e4dce9385", start=2), 2, 2, 9.0).late == [transition]


def test_a_call_after_a_dead_lettered_close_follows_it_to_the_dead_letter_queue():
    core = RolloutJoin(StreamsSettings(idle_timeout_s=1.0))  # on_timeout: dlq
    state = core.span(llm(), 0, 1, 1.0).state
    plan = plan_close(state, "timeout", core.cfg, "spans", "air")
    assert not plan.emitted and [d.reason for d in plan.dead_letters] == ["rollout_timeout"]
    core.closing(b"r1", state, "timeout", 3.0, plan.emitted)
    late = core.span(llm(sid="s2", start=2), 0, 2, 4.0)
    assert late.outcome == "late_event" and late.late == []
    assert late.dead == [("late_event", "the rollout was already closed")]
