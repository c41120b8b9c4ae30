"""Poison input on the real worker and broker: each bad record ends in the DLQ with its reason
and the worker keeps going (same process, good rollouts still come out); a worker that dies
is started again by its supervisor, as `tracetrain up` starts it."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import time
from pathlib import Path

import httpx
import pytest
from test_streams_worker import check, read_transitions, worker_report

from testkit.streams import consume, produce
from testkit.workload import _llm_span, _tool_span, generate, interleave, reference
from tracetrain.deadletter import read_dead_letter_headers

pytestmark = pytest.mark.integration

LIMIT = 60_000  # streams.max_record_bytes of these workers: big records stay cheap to make


def worker_pid(record) -> int:
    """The worker process: the supervisor's child (the record's pid is the supervisor)."""
    children = Path(f"/proc/{record.pid}/task/{record.pid}/children").read_text().split()
    return int(children[0]) if children else record.pid


def poison() -> list[tuple[str, str, str, dict]]:
    deep = "[" * 5_000 + "]" * 5_000  # five times the decoder's limit, well within a record
    tool = _tool_span("p-deep", "t1", "s0", 1, "tool_ok")
    tool["tool"]["arguments"] = deep
    big = _llm_span("p-big", "big-call", "solver", 1, random.Random(1))
    n = 20_000  # as the table would store it, about 8 times LIMIT; as Avro, about 2 times
    big["llm"]["response_token_ids"] = list(range(10_000, 10_000 + n))
    big["llm"]["response_logprobs"] = [-0.123456789] * n
    # 1,200 spans with 60-character ids: a state of about 80 KB
    huge = [_tool_span("p-huge", f"tool-{k:05d}-{'x' * 50}", "s0", k, "tool_ok")
            for k in range(1200)]
    reward = {"rollout_id": "p-nan", "value": float("nan"), "final": True, "timestamp_ns": 1}
    return [("spans", "p-deep", "Span", tool), ("spans", "p-big", "Span", big),
            ("rewards", "p-nan", "Reward", reward),
            ("rewards", "p-1e200", "Reward", {**reward, "rollout_id": "p-1e200", "value": 1e200}),
            ("spans", "elsewhere", "Span", _tool_span("p-key", "t1", "s0", 1, "tool_ok")),
            *[("spans", "p-huge", "Span", span) for span in huge]]


def test_poison_goes_to_the_dlq_with_its_reason_and_the_worker_keeps_going(streams_settings,
                                                                           workers):
    record = workers(streams_settings, max_record_bytes=LIMIT)
    pid = worker_pid(record)
    produce(streams_settings, poison())
    rollouts = generate(80, seed=31, p_never_closed=0.0)
    produce(streams_settings, interleave(rollouts, seed=31))
    want = reference(rollouts, streams_settings.streams)
    check(read_transitions(streams_settings, want, timeout_s=180), want,
          report=lambda: worker_report(streams_settings, [record]))

    expected = {"json_too_deep": 1, "call_too_large": 1, "reward_out_of_bounds": 2,
                "key_mismatch": 1, "rollout_too_large": 1}
    dlq = consume(streams_settings, "dlq",
                  lambda r: sum(1 for *_, h in r if read_dead_letter_headers(h)["reason"]
                                in expected) >= sum(expected.values()), timeout_s=60)
    letters = [(key, value, read_dead_letter_headers(h)) for key, value, h in dlq]
    reasons = collections.Counter(letter["reason"] for *_, letter in letters)
    assert {r: reasons[r] for r in expected} == expected, worker_report(streams_settings, [record])
    by_reason = {letter["reason"]: (key, value, letter) for key, value, letter in letters}
    key, value, letter = by_reason["call_too_large"]
    # the span itself is larger than a record of this worker: sent without it, and said so
    assert key == b"p-big" and value is None and "not copied" in letter["detail"]
    assert letter["offset"] >= 0 and letter["source_topic"] == streams_settings.topics.spans
    key, value, letter = by_reason["json_too_deep"]
    assert key == b"p-deep" and b"[[[[" in value and "tool.arguments" in letter["detail"]
    summary = json.loads(by_reason["rollout_too_large"][1])
    assert summary["rollout_id"] == "p-huge" and len(summary["spans"]) == 100
    assert worker_pid(record) == pid, "the worker was restarted: it did not keep going"


@pytest.mark.faults
def test_a_worker_that_dies_is_started_again_by_its_supervisor(streams_settings, workers):
    record = workers(streams_settings)
    first = worker_pid(record)
    os.kill(first, signal.SIGKILL)  # as the worker's own exit on a failed send would end it
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            back = worker_pid(record) != first and \
                httpx.get(record.health_url, timeout=2).status_code < 500
        except (httpx.HTTPError, FileNotFoundError):
            back = False
        if back:
            break
        time.sleep(0.5)
    assert back, f"the worker was not started again: {Path(record.log).read_text()[-2000:]}"
    rollouts = generate(30, seed=32, p_never_closed=0.0)
    produce(streams_settings, interleave(rollouts, seed=32))
    want = reference(rollouts, streams_settings.streams)
    check(read_transitions(streams_settings, want, timeout_s=120), want, allow_duplicates=True,
          report=lambda: worker_report(streams_settings, [record]))
