"""Benchmark of the streams worker against a bare Faust passthrough, side by side.

    .venv/bin/python -m bench.streams [--rollouts 6000] [--latency-seconds 20]

Starts its own Kafka broker (free ports, temporary home), then for each of
1. passthrough: a bare Faust agent that decodes each span and forwards its bytes, and
2. ours: one `python -m streams` worker (join, AIR, credit, close),
starts the worker, waits until a small warm-up workload has come out of it (group joined,
partitions assigned: Faust's start-up is not what is measured), then produces a backlog of
generated rollouts and times from its first record produced to its last output read
(forwarded spans, or transitions). Throughput is spans of the backlog per second.
3. latency: on our worker, rollouts produced at half our measured rate; for each final
   reward, the time from producing it to its rollout's last transition being read (p50,
   p99). A close waits `close_grace_s` (0.3 s here) of quiet at the head of the log.
Prints the figures last as one JSON line: spans_per_s, passthrough_per_s, ratio,
p50_latency_s, p99_latency_s, and each worker's CPU time per backlog span with their ratio
(cpu_ratio, passthrough / ours): on a shared 2-core machine the wall-clock rates move with
the broker's and the producer's load, the CPU cost per span much less.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.gateway import cpu_seconds
from infra import processes, services, topics
from infra.kafka import broker
from schemas import Codec
from streams.service import STREAMS
from testkit.workload import generate, interleave
from tracetrain.settings import Settings, load_settings, settings_env
from tracetrain.settings.infra import KafkaSettings, TopicSettings


def passthrough_worker() -> None:
    """The bare baseline: decode a span, forward its bytes (run in a child process)."""
    from streams.app import RAW, Worker, faust_app

    settings = load_settings()
    app = faust_app(settings, f"{settings.topics.prefix}-passthrough")
    source, sink = app.topic(settings.topics.spans, **RAW), app.topic(settings.topics.name("passthrough"), **RAW)
    codec = Codec()

    @app.agent(source)
    async def forward(stream):
        async for event in stream.events():
            codec.decode(event.value, "Span")
            await sink.send(key=event.key, value=event.value)

    Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


def _producer(s: Settings) -> Producer:
    return Producer({"bootstrap.servers": s.kafka.bootstrap_servers, "linger.ms": 5,
                     "partitioner": "murmur2_random"})


def _reader(s: Settings, topic: str) -> Consumer:
    consumer = Consumer({"bootstrap.servers": s.kafka.bootstrap_servers, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False})
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    return consumer


def _read(consumer: Consumer, n: int, timeout_s: float) -> float:
    """Read until n more records; the wall time the last of them was read."""
    seen, last = 0, time.time()
    deadline = time.monotonic() + timeout_s
    while seen < n and time.monotonic() < deadline:
        got = sum(m.error() is None for m in consumer.consume(1000, timeout=0.2))
        if got:
            seen, last = seen + got, time.time()
    if seen < n:
        raise RuntimeError(f"only {seen} of {n} records arrived in {timeout_s:.0f}s")
    return last


def _timed_backlog(prod: Producer, records: list[tuple[str, bytes, bytes]], reader: Consumer,
                   warm: list[tuple[str, bytes, bytes]], n_warm: int, n_out: int,
                   pid: int) -> tuple[float, float]:
    """Warm the worker up, then produce `records`; returns the seconds to the last output and
    the worker's CPU seconds meanwhile (the wall time depends on what else the machine runs,
    the CPU time much less)."""
    _produce(prod, warm)
    _read(reader, n_warm, 120)
    start, cpu = time.time(), cpu_seconds(pid)
    _produce(prod, records)
    return _read(reader, n_out, 600) - start, cpu_seconds(pid) - cpu


def _produce(prod: Producer, records: list[tuple[str, bytes, bytes]]) -> None:
    for topic, key, value in records:
        while True:
            try:
                prod.produce(topic, key=key, value=value)
                break
            except BufferError:  # local queue full: let deliveries catch up
                prod.poll(0.05)
        prod.poll(0)
    prod.flush(60)


def _settings(base: Settings, kafka: KafkaSettings, home: Path, prefix: str) -> Settings:
    ts = TopicSettings(prefix=prefix, partitions=4)
    topics.create_topics(kafka.bootstrap_servers, ts)
    if prefix.endswith("pt"):
        from confluent_kafka.admin import NewTopic
        client = topics.admin(kafka.bootstrap_servers)  # held: a collected client kills its futures
        client.create_topics([NewTopic(ts.name("passthrough"), 4, 1)])[ts.name("passthrough")].result(30)
        topics.wait_for_leaders(kafka.bootstrap_servers, [ts.name("passthrough")], 30)
    streams = base.streams.model_copy(update={"web_port": processes.free_port(), "close_grace_s": 0.3,
                                              "idle_timeout_s": 30.0, "timer_interval_s": 0.05})
    return base.model_copy(update={"kafka": kafka, "topics": ts, "home": home, "streams": streams})


def _encoded(codec: Codec, s: Settings, events: list, only_spans: bool = False) -> list:
    return [(s.topics.name(short), key.encode(), codec.encode(name, record))
            for short, key, name, record in events if short == "spans" or not only_spans]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=6000, help="rollouts in the timed backlog")
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--passthrough-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.passthrough_worker:
        return passthrough_worker()
    home = Path(tempfile.mkdtemp(prefix="bench-streams-"))
    kafka = KafkaSettings(port=processes.free_port(), controller_port=processes.free_port())
    broker.start(home, kafka, 1)
    kafka = kafka.model_copy(update={"bootstrap_servers": broker.bootstrap(kafka, 1)})
    codec, base, prod = Codec(), load_settings(), None
    try:
        rollouts = generate(args.rollouts, seed=1, p_never_closed=0.0, p_reward_first=0.0)
        events = interleave(rollouts, seed=1)
        warm_rollouts = generate(20, seed=3, p_never_closed=0.0, p_reward_first=0.0, prefix="warm")
        warm = interleave(warm_rollouts, seed=3)
        n_spans = sum(1 for e in events if e[0] == "spans")
        n_warm_spans = sum(1 for e in warm if e[0] == "spans")

        def llm_calls(gs):
            return sum(1 for g in gs for s in g.spans if s["kind"] == "llm")

        # 1. passthrough
        pt = _settings(base, kafka, home, "bench-pt")
        prod = _producer(pt)
        reader = _reader(pt, pt.topics.name("passthrough"))
        pt_worker = processes.spawn(home, "passthrough", [sys.executable, "-m", "bench.streams", "--passthrough-worker"],
                                    address="-", env=settings_env(pt), cwd=Path(__file__).resolve().parent.parent)
        try:
            seconds, pt_cpu = _timed_backlog(prod, _encoded(codec, pt, events, only_spans=True), reader,
                                             _encoded(codec, pt, warm, only_spans=True), n_warm_spans,
                                             n_spans, pt_worker.pid)
        finally:
            processes.stop(home, "passthrough", timeout_s=5)
            reader.close()
        passthrough = n_spans / seconds

        # 2. ours, same backlog
        ours = _settings(base, kafka, home, "bench-ours")
        prod = _producer(ours)
        reader = _reader(ours, ours.topics.transitions)
        # Unsupervised: the pid whose CPU is measured must be the worker's, not its supervisor's.
        worker = services.start(ours, dataclasses.replace(STREAMS, restart=False),
                                instance="bench-streams", wait=False)
        try:
            seconds, our_cpu = _timed_backlog(prod, _encoded(codec, ours, events), reader,
                                              _encoded(codec, ours, warm), llm_calls(warm_rollouts),
                                              llm_calls(rollouts), worker.pid)
            spans_per_s = n_spans / seconds

            # 3. latency at half our measured rate, same worker, fresh rollouts
            live = generate(100_000, seed=2, p_never_closed=0.0, p_reward_first=0.0, prefix="live")
            interval = (n_spans / len(rollouts)) / (spans_per_s * 0.5)
            sent: dict[str, float] = {}
            latencies: list[float] = []
            start, i = time.time(), 0
            while time.time() - start < args.latency_seconds:
                g = live[i]
                i += 1
                for span in g.spans:
                    prod.produce(ours.topics.spans, key=g.rollout_id.encode(), value=codec.encode("Span", span))
                g.reward["timestamp_ns"] = time.time_ns()
                prod.produce(ours.topics.rewards, key=g.rollout_id.encode(), value=codec.encode("Reward", g.reward))
                prod.poll(0)
                sent[g.rollout_id] = time.time()
                _drain(reader, sent, latencies, codec, timeout=0)
                time.sleep(max(0.0, start + i * interval - time.time()))
            prod.flush(30)
            deadline = time.time() + 60
            while len(latencies) < i and time.time() < deadline:
                _drain(reader, sent, latencies, codec, timeout=0.2)
        finally:
            processes.stop(home, worker.name, timeout_s=5)
            reader.close()
        latencies.sort()
        pct = (lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]) if latencies else (lambda q: float("nan"))
        result = {"spans_per_s": round(spans_per_s, 1), "passthrough_per_s": round(passthrough, 1),
                  "ratio": round(spans_per_s / passthrough, 3), "p50_latency_s": round(pct(0.5), 4),
                  "p99_latency_s": round(pct(0.99), 4), "latency_rollouts": len(latencies),
                  "latency_sent": i, "spans": n_spans,
                  "cpu_us_per_span": round(our_cpu / n_spans * 1e6, 1),
                  "passthrough_cpu_us_per_span": round(pt_cpu / n_spans * 1e6, 1),
                  "cpu_ratio": round(pt_cpu / our_cpu, 3)}
    finally:
        # Destroy the producer before its broker goes, or its reconnect errors follow the JSON.
        prod = None
        broker.stop(home)
    print(json.dumps(result))


def _drain(reader: Consumer, sent: dict, latencies: list, codec: Codec, timeout: float) -> None:
    for msg in reader.consume(1000, timeout=timeout):
        if msg.error() is not None:
            continue
        t = codec.decode(msg.value(), "Transition")
        if t["is_last"] and t["rollout_id"] in sent:
            latencies.append(time.time() - sent.pop(t["rollout_id"]))


if __name__ == "__main__":
    main()
