"""Publisher throughput: ours (codec + write-ahead spool + delivery tracking) versus bare
confluent-kafka with bare fastavro, same records, same producer settings, same broker.

    .venv/bin/python -m bench.producer [--spans 8000] [--rounds 10]

Starts its own Kafka broker (free ports, temporary state folder) and fresh topics per run;
each round runs both sides, alternating which goes first (the load of a shared machine
drifts). Prints the figures last as one JSON line: ratio (the median over rounds of ours /
bare spans per second, with its quartiles), spans_per_s and mb_per_s (ours, medians), and the
bare figures.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import Producer
from fastavro import parse_schema, schemaless_writer

from infra import processes, topics
from infra.config import KafkaSettings, TopicSettings
from infra.kafka import broker
from producers.publisher import Publisher, producer_config
from producers.records import llm_part, new_span
from schemas import Codec
from tracetrain.settings import Settings, load_settings


@contextmanager
def temp_broker():
    """A broker of its own for a benchmark: yields Settings pointing at it; stopped after."""
    home = Path(tempfile.mkdtemp(prefix="tt-bench-"))
    kafka = KafkaSettings(port=processes.free_port(), controller_port=processes.free_port(),
                          heap_mb=512)
    broker.start(home, kafka, brokers=1)
    kafka = kafka.model_copy(update={"bootstrap_servers": broker.bootstrap(kafka, 1)})
    try:
        yield load_settings().model_copy(update={"kafka": kafka, "home": home})
    finally:
        broker.stop(home)


def with_topics(settings: Settings) -> Settings:
    t = TopicSettings(prefix=f"bench-{uuid.uuid4().hex[:8]}", partitions=4)
    topics.create_topics(settings.kafka.bootstrap_servers, t)
    return settings.model_copy(update={"topics": t})


def sample_spans(n: int) -> list[dict]:
    """LLM spans of a realistic size: ~200 prompt and ~60 response tokens with logprobs."""
    out = []
    for i in range(n):
        out.append(new_span("llm", f"ro-{i % 500}", task_id=f"t-{i % 50}", agent_name="bench",
                            llm=llm_part("smollm2", policy_version=3,
                                         request_messages=json.dumps([{"role": "user",
                                                                       "content": "x" * 400}]),
                                         response_text="y" * 200,
                                         prompt_token_ids=list(range(200)),
                                         response_token_ids=list(range(60)),
                                         response_logprobs=[-0.5] * 60, finish_reason="stop",
                                         prompt_tokens=200, completion_tokens=60)))
    return out


def run_bare(settings: Settings, spans: list[dict]) -> tuple[float, int]:
    schema = Codec().history.current("Span")
    parsed, header = parse_schema(schema.raw), schema.header
    producer = Producer(producer_config(settings))
    topic, nbytes = settings.topics.spans, 0
    t0 = time.perf_counter()
    for span in spans:
        buf = io.BytesIO()
        buf.write(header)
        schemaless_writer(buf, parsed, span)
        value = buf.getvalue()
        nbytes += len(value)
        while True:
            try:
                producer.produce(topic, value, span["rollout_id"].encode())
                break
            except BufferError:
                producer.poll(0.01)
        # No per-message poll: no delivery callbacks are registered, so this is the fastest
        # bare use (and it does none of our bookkeeping).
    left = producer.flush(120)
    elapsed = time.perf_counter() - t0
    assert left == 0, f"bare producer left {left} undelivered"
    return elapsed, nbytes


def run_ours(settings: Settings, spans: list[dict], spool: Path) -> tuple[float, int]:
    pub = Publisher(settings, name="bench", spool_dir=spool)
    codec = pub.codec
    nbytes = sum(len(codec.encode("Span", s)) for s in spans[:100]) * len(spans) // 100
    t0 = time.perf_counter()
    for span in spans:
        pub.publish_span(span)
    left = pub.flush(120)
    elapsed = time.perf_counter() - t0
    pub.close(10)
    assert left == 0, f"publisher left {left} undelivered"
    return elapsed, nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    spans = sample_spans(args.spans)
    bare, ours, mbs = [], [], []
    with temp_broker() as base:
        run_bare(with_topics(base), spans[:2000])  # warm-up: connections, metadata
        for r in range(args.rounds):
            # Alternate which side goes first: on a shared machine the load drifts.
            for side in (("bare", "ours") if r % 2 == 0 else ("ours", "bare")):
                if side == "bare":
                    secs, _ = run_bare(with_topics(base), spans)
                    bare.append(len(spans) / secs)
                else:
                    secs, nbytes = run_ours(with_topics(base), spans,
                                            base.home_dir / f"spool-{r}")
                    ours.append(len(spans) / secs)
                    mbs.append(nbytes / secs / 1e6)
            print(f"round {r + 1}: bare {bare[-1]:,.0f} spans/s, ours {ours[-1]:,.0f} spans/s")
    # Each round's ratio compares two runs a second apart, so a slow spell of the shared
    # machine hits both sides of it; the median of those is steadier than a ratio of medians.
    ratios = sorted(o / b for o, b in zip(ours, bare, strict=True))
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    result = {
        "ratio": round(statistics.median(ratios), 3),
        "ratio_q1": round(q1, 3), "ratio_q3": round(q3, 3),
        "ratio_of_medians": round(statistics.median(ours) / statistics.median(bare), 3),
        "spans_per_s": round(statistics.median(ours)),
        "mb_per_s": round(statistics.median(mbs), 2),
        "bare_spans_per_s": round(statistics.median(bare)),
        "spans": len(spans), "rounds": args.rounds,
        "avg_span_bytes": round(statistics.median(mbs) * 1e6 / statistics.median(ours)),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
