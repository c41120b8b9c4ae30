"""The publisher's promise under faults: a broker outage and a kill -9 of the producer lose
nothing, repeat nothing and keep per-rollout order. Uses a broker of our own (conftest)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from producers.publisher import Publisher
from producers.records import new_span
from testkit.producers import consume

pytestmark = [pytest.mark.integration, pytest.mark.faults]
CHILD = Path(__file__).with_name("publish_child.py")
N = 5000


def check_arrivals(arrived, expected_seqs: set[int]) -> None:
    seqs = [int(span["attributes"]["seq"]) for _key, span in arrived]
    dupes = [s for s, c in Counter(seqs).items() if c > 1]
    assert not dupes, f"{len(dupes)} spans arrived twice, e.g. {dupes[:5]}"
    assert set(seqs) == expected_seqs, f"missing {sorted(expected_seqs - set(seqs))[:10]}"
    by_rollout = defaultdict(list)
    for key, span in arrived:
        assert key == span["rollout_id"]
        by_rollout[key].append(int(span["attributes"]["seq"]))
    for key, got in by_rollout.items():
        assert got == sorted(got), f"rollout {key} out of order: {got[:20]}"


def test_outage_loses_nothing_and_keeps_order(own_broker, own_settings):
    # A small librdkafka queue so that the outage overflows it into the disk spool.
    settings = own_settings.model_copy(update={"publisher": own_settings.publisher.model_copy(
        update={"queue_max_messages": 500})})
    pub = Publisher(settings, name="outage")
    try:
        for i in range(100):
            pub.publish_span(new_span("llm", f"r{i % 20}", attributes={"seq": str(i)}))
        assert pub.flush(30) == 0
        own_broker.stop()
        worst = 0.0
        for i in range(100, 100 + N):
            t0 = time.perf_counter()
            pub.publish_span(new_span("llm", f"r{i % 20}", attributes={"seq": str(i)}))
            worst = max(worst, time.perf_counter() - t0)
        assert worst * 1000 < settings.publisher.max_block_ms, f"publish blocked {worst:.3f}s"
        assert pub.counts["spooled"] >= N - 500, pub.counts
        assert pub.pending() == N
        own_broker.start()
        assert pub.flush(120) == 0
        assert pub.counts["sent"] == N + 100
    finally:
        pub.close(10)
    arrived = consume(settings.kafka.bootstrap_servers, settings.topics.spans, N + 100)
    check_arrivals(arrived, set(range(N + 100)))
    assert not list((settings.home_dir / "spool" / "outage").glob("seg-*.log")), "spool not emptied"


def _child(settings, spool: Path, mode: str) -> subprocess.Popen:
    arg = json.dumps({"bootstrap": settings.kafka.bootstrap_servers,
                      "prefix": settings.topics.prefix, "spool": str(spool), "n": N, "mode": mode})
    return subprocess.Popen([sys.executable, str(CHILD), arg], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("kill_after", [N, 2500], ids=["after-all", "mid-publishing"])
def test_kill_9_mid_outage_then_restart_delivers_all_once(own_broker, own_settings, tmp_path,
                                                          kill_after):
    spool = tmp_path / "child-spool"
    own_broker.stop()
    child = _child(own_settings, spool, "publish")
    returned = 0
    try:
        while returned < kill_after:
            line = child.stdout.readline()
            assert line, "the publishing child died early"
            if line.startswith("PROGRESS"):
                returned = int(line.split()[1])
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    own_broker.start()
    drainer = _child(own_settings, spool, "drain")
    try:
        out, _ = drainer.communicate(timeout=150)
    finally:
        if drainer.poll() is None:
            drainer.kill()
    assert drainer.returncode == 0 and "DRAINED left=0" in out, out
    arrived = consume(own_settings.kafka.bootstrap_servers, own_settings.topics.spans, returned)
    # Every span whose publish call returned arrives; a few more may have been written
    # before the kill. Publishing is sequential, so what arrives is a prefix of the sequence.
    top = max(int(s["attributes"]["seq"]) for _k, s in arrived) + 1
    assert returned <= top <= N
    check_arrivals(arrived, set(range(top)))
    assert not list(spool.glob("seg-*.log")), "spool not emptied after drain"
