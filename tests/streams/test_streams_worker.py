"""The real worker process on the real broker: a generated workload of 2,000 rollouts gives
exactly the reference's transitions; bad records on each input topic end in the DLQ with
their reason while good ones keep flowing; multi-agent selection."""

from __future__ import annotations

import collections
import math
import urllib.request

import pytest

from schemas import Codec
from testkit.metrics import check_metrics, get_state
from testkit.streams import consume, produce
from testkit.workload import generate, interleave, reference
from tracetrain.deadletter import read_dead_letter_headers

pytestmark = pytest.mark.integration


def read_transitions(settings, want: dict, timeout_s: float) -> list[dict]:
    codec = Codec()
    # distinct values: a re-emitted duplicate (after a crash) is byte-identical, so it does
    # not count twice; one that differed would, and `check` then names it
    got = consume(settings, "transitions", lambda r: len({v for _, v, _ in r}) >= len(want),
                  timeout_s=timeout_s)
    # a little longer, so that an extra transition would be seen too
    got += consume(settings, "transitions", lambda r: False, timeout_s=2.0)[len(got):]
    return [codec.decode(v, "Transition") for _, v, _ in got]


def worker_report(settings, records) -> str:
    """What the workers and the DLQ say, for a failure message: close reasons, late and
    duplicate counts from /metrics, DLQ reasons, the tail of each worker's log."""
    lines = []
    for record in records:
        try:
            text = urllib.request.urlopen(record.health_url, timeout=5).read().decode()
            lines += [f"{record.name}: {line}" for line in text.splitlines()
                      if line.startswith("tracetrain_streams_") and "_created" not in line]
        except OSError as exc:
            lines.append(f"{record.name}: /metrics unreachable ({exc!r})")
        try:
            with open(record.log, errors="replace") as f:
                lines += [f"{record.name} log: {line.rstrip()}" for line in f.readlines()[-15:]]
        except OSError:
            pass
    dlq = consume(settings, "dlq", lambda r: False, timeout_s=3.0)
    reasons = collections.Counter(read_dead_letter_headers(h)["reason"] for _, _, h in dlq)
    lines.append(f"dlq reasons: {dict(reasons)}")
    return "\n".join(lines)


def check(decoded: list[dict], want: dict, allow_duplicates: bool = False, report=None) -> None:
    by_id: dict[str, dict] = {}
    for t in decoded:
        if t["transition_id"] in by_id:
            assert allow_duplicates, f"transition {t['transition_id']} emitted twice"
            assert by_id[t["transition_id"]] == t, "a duplicate differs from the original"
        by_id[t["transition_id"]] = t
    missing, extra = set(want) - set(by_id), set(by_id) - set(want)
    if (missing or extra) and report is not None:
        print(report())
    assert not missing and not extra, (f"{len(missing)} missing (rollouts "
                                       f"{sorted({want[m]['rollout_id'] for m in missing})[:5]}), {len(extra)} extra")
    for tid, exp in want.items():
        for name, value in exp.items():
            if isinstance(value, float):
                assert math.isclose(by_id[tid][name], value, abs_tol=1e-6), (tid, name)
            else:
                assert by_id[tid][name] == value, (tid, name)


def test_2000_rollouts_and_bad_input(streams_settings, workers):
    worker = workers(streams_settings)
    codec = Codec()
    # Bad records first: the worker must go past them to the good ones.
    reward = {"rollout_id": "x", "value": 1.0, "timestamp_ns": 1}
    bad = [("spans", "bad-1", b"garbage"), ("rewards", "bad-2", b"\xc3\x01garbage!"),
           ("air", "bad-3", b"")]
    bad += [("spans", "x", codec.encode("Reward", reward)), ("rewards", "x", codec.encode("Reward", {**reward, "rollout_id": "y"})[:-3] + b"\xff\xff\xff")]
    bad += [("air", "x", codec.encode("Reward", reward)), ("rewards", "x", codec.encode("AirEvent", {
        "rollout_id": "x", "span_id": "s", "rule": "r", "value": 1.0, "timestamp_ns": 1}))]
    produce(streams_settings, [], raw=bad)
    rollouts = generate(2000, seed=11, p_never_closed=0.03, p_duplicate=0.1, p_reward_first=0.1)
    produce(streams_settings, interleave(rollouts, seed=11))
    want = reference(rollouts, streams_settings.streams)
    check(read_transitions(streams_settings, want, timeout_s=240), want,
          report=lambda: worker_report(streams_settings, [worker]))

    never_closed = sum(g.reward is None for g in rollouts)
    dlq = consume(streams_settings, "dlq", lambda r: len(r) >= len(bad) + never_closed, timeout_s=30)
    letters = [(key, value, read_dead_letter_headers(h)) for key, value, h in dlq]
    reasons = collections.Counter((letter["source_topic"].rsplit(".", 1)[1], letter["reason"])
                                  for _, _, letter in letters)
    assert reasons[("spans", "rollout_timeout")] == never_closed
    assert reasons[("spans", "wrong_schema")] == 1 and reasons[("air", "wrong_schema")] == 1
    assert reasons[("rewards", "wrong_schema")] == 1
    assert reasons[("spans", "bad_magic")] == 1 and reasons[("air", "empty")] == 1
    assert sum(n for (topic, _), n in reasons.items() if topic == "rewards") == 3
    for key, value, letter in letters:
        if key == b"bad-1":
            assert value == b"garbage" and letter["offset"] == 0
            assert "bad_magic" in letter["detail"] and letter["partition"] >= 0


def test_three_agent_rollouts_train_only_selected_agents(streams_settings, workers):
    worker = workers(streams_settings, select_agents="Writer|Rewriter")
    rollouts = generate(60, seed=4, agents=("Writer", "Rewriter", "Checker"), p_never_closed=0.0)
    produce(streams_settings, interleave(rollouts, seed=4))
    settings = streams_settings.model_copy(update={"streams": streams_settings.streams.model_copy(
        update={"select_agents": "Writer|Rewriter"})})
    want = reference(rollouts, settings.streams, trained_agents={"Writer", "Rewriter"})
    assert any(s["agent_name"] == "Checker" for g in rollouts for s in g.spans)
    got = read_transitions(streams_settings, want, timeout_s=90)
    assert {t["agent_name"] for t in got} == {"Writer", "Rewriter"}
    check(got, want)
    # The worker's pages: metric names under the scheme, and the typed state code reads.
    base = f"http://{worker.address}"
    names = check_metrics(base, "streams")
    assert {"tracetrain_streams_output_transitions_total", "tracetrain_streams_lag_records",
            "tracetrain_streams_closed_rollouts_total"} <= names
    state = get_state(base)
    assert state["output_transitions"] == len(want)
    assert state["input_records"]["spans"] >= sum(len(g.spans) for g in rollouts)
    assert sum(state["closed_rollouts"].values()) == len(rollouts)
    assert all(isinstance(lag, int) for parts in state["lag"].values() for lag in parts.values())
